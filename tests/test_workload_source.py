"""The source: determinism, merging, closed loops, rate scaling, presets' mixes."""

from collections import Counter
from itertools import islice

import numpy as np
import pytest

from servefleet.workload import (
    WorkloadError,
    build_source,
    dry_run,
    fixed_workload,
    load_workload,
    presets,
    validate_workload,
)


def key(r):
    return (
        r.request_id,
        r.class_name,
        r.prompt,
        r.max_tokens,
        r.arrival_time,
        r.session_id,
        r.user_id,
    )


def test_same_seed_same_run():
    spec = load_workload("enterprise-mix")
    a = [key(r) for r in dry_run(build_source(spec, seed=11), until=60.0, latency=1.0)]
    b = [key(r) for r in dry_run(build_source(spec, seed=11), until=60.0, latency=1.0)]
    c = [key(r) for r in dry_run(build_source(spec, seed=12), until=60.0, latency=1.0)]
    assert a == b and a != c


def test_initial_is_in_time_order_with_sequential_ids():
    reqs = list(islice(build_source(load_workload("enterprise-mix"), seed=1).initial(), 5000))
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times)
    assert [r.request_id for r in reqs[:3]] == ["r000000", "r000001", "r000002"]


def test_chat_3tier_lengths_are_exact_and_equal_mix():
    reqs = list(islice(build_source(load_workload("chat-3tier"), seed=2).initial(), 9000))
    shapes = Counter((r.prompt_tokens, r.max_tokens) for r in reqs)
    assert set(shapes) == {(1300, 300), (400, 500), (2000, 200)}
    for n in shapes.values():
        assert n / len(reqs) == pytest.approx(1 / 3, abs=0.02)
    assert len(reqs) / reqs[-1].arrival_time == pytest.approx(presets.CHAT_3TIER_RATE, rel=0.05)


def test_enterprise_mix_shares_and_session_context():
    reqs = dry_run(build_source(load_workload("enterprise-mix"), seed=3), until=1500.0, latency=1.5)
    shares = Counter(r.class_name for r in reqs)
    for name, share in presets.SHARES.items():
        assert shares[name] / len(reqs) == pytest.approx(share, abs=0.015)
    assert len(reqs) / 1500.0 == pytest.approx(presets.TOTAL_RATE, rel=0.03)
    last = [r for r in reqs if r.class_name == "sessions" and r.turn == presets.SESSION_TURNS - 1]
    context = np.mean([r.prompt_tokens + r.max_tokens for r in last])
    assert context == pytest.approx(3200, rel=0.03)
    qa = [r for r in reqs if r.class_name == "qa"]
    assert {(r.prompt_tokens, r.max_tokens) for r in qa} == {(287, 156)}


def test_rate_override_scales_every_open_process_and_keeps_the_mix():
    spec = load_workload("enterprise-mix")
    reqs = dry_run(build_source(spec, seed=4, rate=10.0), until=3000.0, latency=1.0)
    assert len(reqs) / 3000.0 == pytest.approx(10.0, rel=0.05)
    shares = Counter(r.class_name for r in reqs)
    for name, share in presets.SHARES.items():
        assert shares[name] / len(reqs) == pytest.approx(share, abs=0.03)
    burst = Counter(r.arrival_time for r in reqs if r.class_name == "summaries")
    assert set(burst.values()) == {presets.SUMMARY_BURST}  # bursts keep their size


def test_per_class_processes_merge_in_time_order():
    spec = validate_workload(
        {
            "arrival": {"type": "constant", "rate": 2.0},
            "classes": {
                "steady": {"prompt": 10, "output": 5},
                "spiky": {
                    "prompt": 20,
                    "output": 5,
                    "arrival": {"type": "bursts", "count": 3, "period": 1.25},
                },
            },
        }
    )
    reqs = list(islice(build_source(spec, seed=0).initial(), 12))
    assert [(r.arrival_time, r.class_name) for r in reqs] == [
        (0.0, "steady"), (0.0, "spiky"), (0.0, "spiky"), (0.0, "spiky"),
        (0.5, "steady"), (1.0, "steady"),
        (1.25, "spiky"), (1.25, "spiky"), (1.25, "spiky"),
        (1.5, "steady"), (2.0, "steady"), (2.5, "steady"),
    ]  # fmt: skip


def test_closed_loop_replaces_at_finish_time():
    src = build_source(fixed_workload(128, 16), seed=5, concurrency=4)
    first = list(src.initial())
    assert len(first) == 4 and {r.arrival_time for r in first} == {0.0}
    assert len({r.user_id for r in first}) == 4
    (nxt,) = src.on_finish(first[2], 3.5, 16)
    assert nxt.arrival_time == 3.5 and nxt.user_id == first[2].user_id
    assert nxt.request_id not in {r.request_id for r in first}


def in_flight_max(reqs, latency):
    events = sorted(
        [(r.arrival_time, 1) for r in reqs] + [(r.arrival_time + latency, -1) for r in reqs]
    )
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_closed_loop_draws_classes_by_weight_and_sessions_keep_their_slot():
    spec = load_workload("enterprise-mix")
    reqs = dry_run(build_source(spec, seed=6, concurrency=8), until=2000.0, latency=1.0)
    assert in_flight_max(reqs, 1.0) <= 8
    shares = Counter(r.class_name for r in reqs)
    assert shares["summaries"] / len(reqs) == pytest.approx(0.23, abs=0.03)
    assert shares["sessions"] / len(reqs) == pytest.approx(0.15, abs=0.03)
    plain = dry_run(
        build_source(load_workload("chat-3tier"), seed=6, concurrency=8), until=50.0, latency=1.0
    )
    assert len(plain) == 8 * 50  # always 8 in flight, back to back


def test_closed_arrival_in_yaml_and_determinism_per_user():
    spec = validate_workload(
        {
            "arrival": {"type": "closed", "concurrency": 3},
            "classes": {"a": {"prompt": 5, "output": 5}},
        }
    )
    reqs = dry_run(build_source(spec, seed=7), until=10.0, latency=2.0)
    assert len(reqs) == 15 and [r.arrival_time for r in reqs[:3]] == [0.0, 0.0, 0.0]


def test_rate_and_concurrency_are_exclusive_and_checked():
    spec = fixed_workload(10, 10)
    with pytest.raises(WorkloadError, match="not both"):
        build_source(spec, seed=0, rate=1.0, concurrency=2)
    with pytest.raises(WorkloadError, match="rate must be > 0"):
        build_source(spec, seed=0, rate=0.0)
    with pytest.raises(WorkloadError, match="seed"):
        build_source(spec, seed=-1)
    closed = validate_workload(
        {
            "arrival": {"type": "closed", "concurrency": 2},
            "classes": {"a": {"prompt": 5, "output": 5}},
        }
    )
    with pytest.raises(WorkloadError, match="closed loop"):
        build_source(closed, seed=0, rate=5.0)


def test_users_population():
    spec = validate_workload(
        {
            "users": 5,
            "arrival": {"type": "poisson", "rate": 5.0},
            "classes": {"a": {"prompt": 5, "output": 5}},
        }
    )
    reqs = list(islice(build_source(spec, seed=8).initial(), 500))
    assert {r.user_id for r in reqs} == {f"u{i}" for i in range(5)}
