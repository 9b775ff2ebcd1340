"""ShareGPT files and JSONL traces."""

import json

import pytest

from servefleet.workload import (
    Segment,
    WorkloadError,
    build_source,
    describe_workload,
    dry_run,
    load_workload,
    output_key,
)
from servefleet.workload.datasets import load_sharegpt, load_trace


def sharegpt_file(tmp_path):
    data = [
        {"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "a b"}]},
        {"conversations": [{"from": "human", "value": "only a question"}]},
        {"conversations": [{"from": "system", "value": "x"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there you"}]},
    ]  # fmt: skip
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_pairs_with_default_and_custom_counters(tmp_path):
    path = sharegpt_file(tmp_path)
    prompts, outputs = load_sharegpt(path)
    assert list(zip(prompts, outputs, strict=True)) == [(3, 2), (1, 3)]
    prompts, _ = load_sharegpt(path, len)  # characters
    assert list(prompts) == [len("one two three"), 2]


def test_sharegpt_preset_replays_the_pairs(tmp_path):
    spec = load_workload(f"sharegpt:{sharegpt_file(tmp_path)}")
    reqs = list(zip(range(200), build_source(spec, seed=1).initial(), strict=False))
    assert {(r.prompt_tokens, r.max_tokens) for _, r in reqs} == {(3, 2), (1, 3)}
    assert "prompt 2" in describe_workload(spec)


def test_sharegpt_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": [}]')
    with pytest.raises(WorkloadError, match=r"bad\.json:1:\d+: invalid JSON"):
        load_sharegpt(bad)
    bad.write_text('[{"conversations": []}, {"turns": []}]')
    with pytest.raises(WorkloadError, match=r"entry 1.*conversations"):
        load_sharegpt(bad)
    with pytest.raises(WorkloadError, match="not found"):
        load_sharegpt(tmp_path / "none.json")


def trace_file(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


ROWS = [
    {"timestamp": 100.0, "prompt_tokens": 500, "output_tokens": 20, "prefix_group": "faq", "prefix_tokens": 300},
    {"timestamp": 101.0, "prompt_tokens": 200, "output_tokens": 30, "session_id": "s1"},
    {"timestamp": 103.0, "prompt_tokens": 280, "output_tokens": 10, "session_id": "s1"},
    {"timestamp": 104.0, "prompt_tokens": 400, "output_tokens": 10, "prefix_group": "faq", "prefix_tokens": 300},
]  # fmt: skip


def trace_spec(tmp_path, rows=ROWS, scale=0.5):
    path = trace_file(tmp_path, rows)
    return load_workload(
        "chat-3tier",
        overrides={
            "classes": None,
            "arrival": None,
            "trace": {"path": str(path), "time_scale": scale},
        },
    )


def test_trace_replay_times_prefixes_and_sessions(tmp_path):
    reqs = list(build_source(trace_spec(tmp_path), seed=0).initial())
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 1.5, 2.0]
    assert [r.request_id for r in reqs] == ["r000000", "r000001", "r000002", "r000003"]
    assert reqs[0].prompt == (
        Segment("pfx:faq:300", 300, "system"),
        Segment("u:r000000", 200, "user"),
    )
    assert reqs[0].prompt[0] == reqs[3].prompt[0]  # shared prefix, same key
    assert reqs[2].prompt == (
        *reqs[1].prompt,
        Segment(output_key("r000001"), 30, "answer"),
        Segment("u:r000002", 50, "user"),
    )
    assert reqs[2].session_id == "s1" and reqs[2].prompt_tokens == 280
    assert [r.max_tokens for r in reqs] == [20, 30, 10, 10]


def test_trace_rate_override_and_closed_loop(tmp_path):
    spec = trace_spec(tmp_path)
    reqs = list(build_source(spec, seed=0, rate=3.0).initial())
    assert reqs[-1].arrival_time == pytest.approx(1.0)  # 3 gaps at 3 req/s
    closed = build_source(spec, seed=0, concurrency=2)
    first = list(closed.initial())
    assert [r.arrival_time for r in first] == [0.0, 0.0]
    done = dry_run(build_source(spec, seed=0, concurrency=2), until=100.0, latency=1.0)
    assert len(done) == 4 and done[-1].arrival_time == 1.0
    assert "4 requests" in describe_workload(spec)


def test_trace_errors_name_file_and_line(tmp_path):
    rows = [ROWS[0], "{not json", ROWS[1]]
    with pytest.raises(WorkloadError, match=r"trace\.jsonl:2: invalid JSON"):
        load_trace(trace_file(tmp_path, rows))
    rows = [ROWS[0], {"timestamp": 1.0, "prompt_tokens": 5}]
    with pytest.raises(WorkloadError, match=r"trace\.jsonl:2: missing field 'output_tokens'"):
        load_trace(trace_file(tmp_path, rows))
    rows = [
        {
            "timestamp": 1.0,
            "prompt_tokens": 5,
            "output_tokens": 1,
            "prefix_group": "g",
            "prefix_tokens": 9,
        }
    ]
    with pytest.raises(WorkloadError, match=r"trace\.jsonl:1: prefix_tokens \(9\) exceeds"):
        load_trace(trace_file(tmp_path, rows))
    with pytest.raises(WorkloadError, match=r"trace\.path.*file not found"):
        load_workload(
            "chat-3tier",
            overrides={"classes": None, "arrival": None, "trace": {"path": "/no/such.jsonl"}},
        )
