"""Metric definitions (docs/metrics.md) on hand-made records, and the knee rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servefleet.records import RequestRecord, read_jsonl, write_jsonl
from servefleet.stats import (
    SLO,
    Window,
    find_knee,
    group_order,
    meets_slo,
    ratio,
    slo_failures,
    summarize,
    token_gaps,
    token_gaps_of,
)


def rec(rid="a", send=0.0, chunks=((0.5, 1), (0.6, 1), (0.9, 3)), **kw) -> RequestRecord:
    times = [t for t, _ in chunks]
    toks = [k for _, k in chunks]
    return RequestRecord(
        rid,
        "c",
        send,
        send,
        first_token_time=times[0],
        end_time=times[-1],
        chunk_times=times,
        chunk_tokens=toks,
        prompt_tokens=100,
        output_tokens=sum(toks),
        **kw,
    )


def test_itl_splits_multi_token_chunks_and_keeps_chunk_gaps():
    itl, gaps = token_gaps(rec())
    assert gaps.tolist() == pytest.approx([0.1, 0.3])
    assert itl.tolist() == pytest.approx([0.1, 0.1, 0.1, 0.1])  # 0.3 s over 3 tokens


def test_ttft_tpot_e2e_definitions():
    r = rec(send=0.2)
    assert r.ttft == pytest.approx(0.3)
    assert r.e2e_latency == pytest.approx(0.7)
    assert r.tpot == pytest.approx((0.9 - 0.5) / 4)


def test_throughput_counts_tokens_inside_the_window_only():
    s = summarize([rec()], Window(0.0, 0.7))
    assert s.output_throughput == pytest.approx(2 / 0.7)  # chunks at 0.5 and 0.6
    assert s.request_throughput == 0.0  # it ended at 0.9


def test_goodput_and_errors():
    good = rec("g")
    slow = rec("s", chunks=((3.0, 1), (3.1, 1)))
    bad = RequestRecord("e", "c", 0.0, 0.0, status="error", error="HTTP 429")
    s = summarize([good, slow, bad], Window(0, 10), SLO(ttft=2.0, itl=0.1))
    assert s.num_requests == 3 and s.num_ok == 2
    assert s.errors == {"HTTP 429": 1}
    assert s.goodput == pytest.approx(1 / 10)


def test_records_round_trip_gzip(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    write_jsonl([rec("a"), rec("b")], path)
    back = list(read_jsonl(path))
    assert [r.to_dict() for r in back] == [rec("a").to_dict(), rec("b").to_dict()]
    (tmp_path / "bad.jsonl").write_text('{"request_id": "x", "nope": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        list(read_jsonl(tmp_path / "bad.jsonl"))


def test_knee_rule():
    loads = [1, 2, 4, 8, 16]
    thr = [100, 195, 380, 420, 430]
    ttft = [0.2, 0.2, 0.25, 0.9, 3.0]
    assert find_knee(loads, thr, ttft) == 3  # +10% for +100% load while TTFT P95 x3.6
    assert find_knee(loads, [100, 200, 400, 800, 1600], ttft) is None


def test_each_class_is_judged_by_its_own_slos_and_summarised_apart():
    from servefleet.stats import class_slos, slo_failures
    from servefleet.workload import WorkloadSpec

    spec = WorkloadSpec.model_validate(
        {
            "arrival": {"type": "poisson", "rate": 1},
            "classes": {
                "qa": {"prompt": 10, "output": 5, "slo": {"ttft": 0.2}},
                "batch": {"prompt": 10, "output": 5},
            },
        }
    )
    slos = class_slos(spec.model_dump(mode="json"), SLO(ttft=2.0, itl=0.1))
    assert slos == {"qa": SLO(ttft=0.2, itl=0.1)}  # a field left out is the run's
    fast = rec("q1", chunks=((0.1, 1), (0.2, 1)))
    slow = rec("q2", chunks=((0.5, 1), (0.6, 1)))  # TTFT 0.5 s: too slow for qa, fine for batch
    batch = RequestRecord(**{**slow.to_dict(), "request_id": "b1", "class_name": "batch"})
    qa = [RequestRecord(**{**r.to_dict(), "class_name": "qa"}) for r in (fast, slow)]
    s = summarize([*qa, batch], Window(0, 10), SLO(ttft=2.0, itl=0.1), class_slos=slos)
    assert s.goodput == pytest.approx(2 / 10)  # q2 misses qa's 0.2 s; b1 meets batch's 2 s
    assert set(s.by_class) == {"batch", "qa"} and s.by_class["qa"].num_requests == 2
    assert s.by_class["qa"].slo == SLO(ttft=0.2, itl=0.1)
    assert slo_failures(s.by_class["qa"], slos["qa"]) == ["TTFT P95 480 ms > 200 ms"]
    assert slo_failures(s.by_class["batch"], SLO(ttft=2.0, itl=0.1)) == []


def test_session_turns_are_summarised_per_depth():
    recs = [rec(f"s{i}", turn=i % 3, session_id=f"u{i // 3}") for i in range(9)]
    s = summarize(recs, Window(0, 10))
    assert list(s.by_turn) == ["turn 1", "turn 2", "turn 3"]
    assert all(g.num_requests == 3 for g in s.by_turn.values())


def test_session_turns_count_only_requests_of_a_session():
    """Requests outside any session (turn 0 too) are no session's first turn."""
    sessions = [rec(f"s{i}", turn=i % 3, session_id=f"u{i // 3}") for i in range(6)]
    alone = [rec(f"q{i}") for i in range(50)]
    for s in (summarize([*sessions, *alone], Window(0, 10)), _streamed([*sessions, *alone])):
        assert list(s.by_turn) == ["turn 1", "turn 2", "turn 3"]
        assert [g.num_requests for g in s.by_turn.values()] == [2, 2, 2]
        assert s.num_requests == 56


def _streamed(records):
    from servefleet.stream_stats import SummaryStream

    stream = SummaryStream(Window(0, 10), SLO(), {})
    for r in records:
        stream.add(r)
    return stream.summary()


def test_groups_sort_turns_by_number_then_classes_by_name():
    names = ["summaries", "turn 10+", "turn 2", "chat", "turn 1"]
    assert sorted(names, key=group_order) == ["turn 1", "turn 2", "turn 10+", "chat", "summaries"]


def test_a_ratio_of_nothing_is_unknown_not_zero():
    assert ratio(1, 4) == 0.25 and ratio(0, 4) == 0.0
    assert ratio(1, 0) is None and ratio(0, 0) is None


@given(
    st.lists(
        st.lists(st.tuples(st.floats(0, 5), st.integers(0, 4)), max_size=6),
        max_size=8,
    )
)
def test_token_gaps_of_requests_back_to_back_are_each_requests_gaps_in_turn(requests):
    """The plain rule, one request at a time in Python: a gap between each request's
    consecutive chunks (none across two requests), split evenly over the chunk's tokens."""
    times, tokens, counts = [], [], []
    want_itl, want_gaps = [], []
    for chunks in requests:
        t, prev = 0.0, None
        for gap, k in chunks:
            t += gap
            if prev is not None:
                want_gaps.append(t - prev)
                want_itl += [(t - prev) / max(k, 1)] * max(k, 1)
            prev = t
            times.append(t)
            tokens.append(k)
        counts.append(len(chunks))
    itl, gaps = token_gaps_of(times, tokens, counts)
    assert gaps.tolist() == want_gaps
    assert itl.tolist() == want_itl


def test_slo_classes_parse_names_and_values():
    from servefleet.stats import parse_slo_classes, slo_classes_text

    default = SLO(2.0, 0.1)
    own = {"sessions": SLO(4.0, 0.1)}
    got = parse_slo_classes("qa:ttft=1:itl=0.05, sessions", default, own)
    assert got == {"qa": SLO(1.0, 0.05), "sessions": SLO(4.0, 0.1)}
    assert slo_classes_text(got, default) == "qa:ttft=1:itl=0.05,sessions:ttft=4"
    assert parse_slo_classes(None, default) is None and parse_slo_classes(" ", default) is None
    for bad in ("qa:ttft", "qa:speed=1", "qa:ttft=0", "qa:ttft=x", ",qa"):
        with pytest.raises(ValueError, match="--slo-classes"):
            parse_slo_classes(bad, default)


def test_named_classes_are_judged_each_on_its_own():
    """Pooled, the fast class hides the slow one; judged on its own, the slow one fails."""
    fast = [RequestRecord(**{**rec(f"q{i}").to_dict(), "class_name": "qa"}) for i in range(40)]
    slow = [
        RequestRecord(
            **{
                **rec(f"s{i}", chunks=((5.0, 1), (5.05, 1), (5.1, 1))).to_dict(),
                "class_name": "sessions",
            }
        )
        for i in range(2)
    ]
    s = summarize([*fast, *slow], Window(0, 10))
    slo = SLO(ttft=2.0, itl=0.2)
    assert slo_failures(s, slo) == []  # pooled: P95 of 42 TTFTs is a fast one
    classes = {"qa": slo, "sessions": slo}
    assert slo_failures(s, slo, classes=classes) == ["class sessions: TTFT P95 5 s > 2 s"]
    assert not meets_slo(s, slo, classes=classes)
    assert meets_slo(s, slo, classes={"qa": slo})
    assert slo_failures(s, slo, classes={"sessions": SLO(ttft=6.0, itl=0.2)}) == []


def test_a_corrupt_or_truncated_records_file_is_named_with_its_line(tmp_path):
    plain = tmp_path / "records.jsonl.gz"
    plain.write_text('{"not": "gzip"}\n')  # a plain file under a .gz name
    with pytest.raises(ValueError, match=r"records\.jsonl\.gz:1: cannot read the records: .*gzip"):
        list(read_jsonl(plain))
    good = tmp_path / "good.jsonl.gz"
    rec = RequestRecord(request_id="a", class_name="c", scheduled_time=0.0, send_time=0.0)
    write_jsonl([rec] * 2000, good)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut\.jsonl\.gz:\d+: cannot read the records"):
        list(read_jsonl(cut))
    with pytest.raises(ValueError, match=r"missing\.jsonl: no such records file"):
        list(read_jsonl(tmp_path / "missing.jsonl"))
