"""Sessions (history, actual answer lengths, think times) and shared system prompts."""

import numpy as np
import pytest

from servefleet.workload import (
    Segment,
    build_source,
    dry_run,
    load_workload,
    output_key,
    validate_workload,
)
from servefleet.workload.datasets import TraceRecord
from servefleet.workload.trace import TraceSource


def session_spec(turns=3, think=8.2, **extra):
    cls = {"prompt": 100, "output": 50, "session": {"turns": turns, "think_time_mean": think}}
    return validate_workload(
        {
            "name": "chat",
            "arrival": {"type": "poisson", "rate": 1.0},
            "classes": {"chat": cls | extra},
        }
    )


def test_next_turn_resends_history_with_the_actual_answer():
    src = build_source(session_spec(), seed=1)
    first = next(iter(src.initial()))
    assert first.turn == 0 and first.session_id and first.user_id
    assert first.prompt == (Segment(f"u:{first.request_id}", 100, "user"),)
    (second,) = src.on_finish(first, 10.0, 37)  # the server stopped early: 37, not 50
    assert second.request_id == f"{first.request_id}.1" and second.turn == 1
    assert second.prompt == (
        *first.prompt,
        Segment(output_key(first.request_id), 37, "answer"),
        Segment(f"u:{second.request_id}", 100, "user"),
    )
    assert second.arrival_time >= 10.0
    assert (second.session_id, second.user_id) == (first.session_id, first.user_id)
    (third,) = src.on_finish(second, 20.0, 50)
    assert third.prompt_tokens == 100 + 37 + 100 + 50 + 100
    assert src.on_finish(third, 30.0, 50) == []  # the session is over


def test_think_time_is_exponential_with_the_given_mean():
    src = build_source(session_spec(turns=2, think=8.2), seed=2)
    firsts = [s for _, s in zip(range(4000), src.initial(), strict=False)]
    gaps = np.array([src.on_finish(s, 100.0, 5)[0].arrival_time - 100.0 for s in firsts])
    assert gaps.mean() == pytest.approx(8.2, rel=0.05)
    assert gaps.std() == pytest.approx(8.2, rel=0.07)


def test_session_content_does_not_depend_on_finish_order():
    def follow_ups(order):
        src = build_source(session_spec(turns=2), seed=3)
        firsts = [s for _, s in zip(range(20), src.initial(), strict=False)]
        return sorted(
            (f.request_id, f.prompt, f.max_tokens, f.arrival_time - 50.0)
            for s in order(firsts)
            for f in src.on_finish(s, 50.0, 10)
        )

    assert follow_ups(list) == follow_ups(lambda xs: list(reversed(xs)))


def test_every_user_message_has_a_unique_key():
    reqs = dry_run(build_source(session_spec(turns=4), seed=4), until=300.0, latency=2.0)
    keys = [s.key for r in reqs for s in r.prompt if s.kind == "user"]
    last = [r.prompt[-1].key for r in reqs]
    assert len(set(last)) == len(reqs)
    assert all(k.startswith("u:") for k in keys)
    assert max(r.turn for r in reqs) == 3


def test_shared_system_prompt_share_and_groups():
    spec = validate_workload(
        {
            "name": "assist",
            "arrival": {"type": "poisson", "rate": 10.0},
            "classes": {
                "a": {
                    "prompt": 50,
                    "output": 10,
                    "system_prompt": {"tokens": 400, "share": 0.3, "groups": 4},
                }
            },
        }
    )
    reqs = dry_run(build_source(spec, seed=5), until=1000.0)
    systems = [r.prompt[0] for r in reqs if r.prompt[0].kind == "system"]
    assert len(systems) / len(reqs) == pytest.approx(0.3, abs=0.02)
    assert {s.key for s in systems} == {f"sys:assist:{g}" for g in range(4)}
    assert {s.length for s in systems} == {400}


def test_a_session_keeps_its_system_prompt_in_every_turn():
    spec = session_spec(
        turns=3, system_prompt={"tokens": 64, "share": 1.0, "groups": 1, "name": "bot"}
    )
    reqs = dry_run(build_source(spec, seed=6), until=200.0, latency=1.0)
    assert reqs and all(r.prompt[0] == Segment("sys:bot:0", 64, "system") for r in reqs)


def _requests(src, n: int = 2000) -> list:
    """``n`` requests of ``src``, each finished as soon as it is sent with the answer it asked
    for (a closed loop's replacements and sessions' turns included)."""
    out, todo = [], list(zip(range(n), src.initial(), strict=False))
    while todo and len(out) < n:
        _, spec = todo.pop(0)
        out.append(spec)
        todo += [(0, s) for s in src.on_finish(spec, spec.arrival_time, spec.max_tokens)]
    return out


@pytest.mark.parametrize("source", ["enterprise-mix", "trace"])
def test_only_sessions_resend_content(source):
    """The contract the simulator's prefix cache relies on (``RequestSpec``): no prompt holds a
    user segment or the answer of a request without a session."""
    if source == "trace":
        records = [
            TraceRecord(
                timestamp=i * 0.1,
                prompt_tokens=60 + 7 * i,
                output_tokens=5,
                prefix_group=f"g{i % 2}" if i % 3 else None,
                prefix_tokens=20 if i % 3 else 0,
                session_id=f"s{i % 4}" if i % 5 else None,
            )
            for i in range(200)
        ]
        src = TraceSource(records)
    else:
        src = build_source(load_workload(source), seed=5, rate=20.0)
    specs = _requests(src)
    one_off_keys = {
        key
        for s in specs
        if s.session_id is None
        for key in [output_key(s.request_id), *(g.key for g in s.prompt if g.kind == "user")]
    }
    assert any(s.session_id for s in specs) and one_off_keys  # both kinds are there
    held = {s.request_id: {g.key for g in s.prompt} for s in specs}
    for s in specs:
        own = {g.key for g in s.prompt if g.kind == "user"} if s.session_id is None else set()
        assert not (held[s.request_id] - own) & one_off_keys, s.request_id
