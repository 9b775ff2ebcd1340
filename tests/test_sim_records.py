"""`simulate --records all|sample|none`: records written as requests finish, none kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from itertools import groupby
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.records import read_jsonl
from servefleet.sim.cluster import _chunks
from servefleet.sim.command import run_simulate, write_run
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.record_sink import in_sample
from servefleet.sim.runner import Load
from servefleet.stats import SLO
from servefleet.workload import fixed_workload


def _run(out: Path | None, records: str = "all", jobs: int = 1, on_progress=None):
    dep = resolve_deployment(
        load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), tp=1, num_gpus=2, max_model_len=4096
    )
    return run_simulate(
        dep,
        fixed_workload(600, 40),
        [Load(rate=20.0), Load(concurrency=16)],
        duration=40,
        warmup=5,
        seed=2,
        policy="least-outstanding",
        slo=SLO(),
        records=records,  # type: ignore[arg-type]
        out=out,
        jobs=jobs,
        on_progress=on_progress,
    )


def _points(out: Path) -> list[dict]:
    return json.loads((out / "summary.json").read_text())["points"]


def test_streamed_records_and_summaries_equal_the_kept_ones(tmp_path: Path):
    kept = _run(None)
    write_run(kept, tmp_path / "kept")
    for mode in ("all", "sample", "none"):
        run = _run(tmp_path / mode, mode)
        assert not any(p.records for p in run.points)  # nothing kept in memory
        write_run(run, tmp_path / mode)
        assert _points(tmp_path / mode) == _points(tmp_path / "kept")
        for p in kept.points:
            name = f"records-{p.load.tag}.jsonl.gz"
            want = sorted((r.to_dict() for r in p.records), key=lambda d: d["request_id"])
            if mode == "none":
                assert not (tmp_path / mode / name).exists()
                continue
            got = sorted(
                (r.to_dict() for r in read_jsonl(tmp_path / mode / name)),
                key=lambda d: d["request_id"],
            )
            if mode == "sample":
                want = [d for d in want if in_sample(d["request_id"])]
                assert 0 < len(want) < p.num_records / 20
            assert got == want


def test_the_records_option_on_the_command_line(tmp_path: Path):
    base = ["simulate", "--concurrency", "4", "--duration", "20", "--warmup", "2"]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "servefleet.cli", *base, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        )

    p = cli("--records", "none", "--out", str(tmp_path / "n"))
    assert p.returncode == 0, p.stderr
    assert _points(tmp_path / "n")[0]["records"] > 0
    assert not list((tmp_path / "n").glob("records-*"))
    bad = cli("--records", "some")
    assert (
        bad.returncode == 2
        and "--records must be one of all, sample, none" in bad.stdout + bad.stderr
    )


def test_a_sampled_run_reads_back_with_its_own_summaries(tmp_path: Path):
    from servefleet.report.run import RunError, load_run
    from servefleet.stats import Summary

    run = _run(tmp_path / "s", "sample")
    write_run(run, tmp_path / "s")
    back = load_run(tmp_path / "s")
    by_tag = {pd.tag: pd for pd in back.points}
    for p in run.points:
        pd = by_tag[p.load.tag]
        assert Summary.from_dict(p.summary.to_dict()) == p.summary
        assert back.summary(pd) == p.summary
        assert 0 < len(pd.records) < p.num_records
    other = load_run(tmp_path / "s", slo=SLO(ttft=0.1))
    try:
        other.summary(other.points[0])
    except RunError as e:
        assert "--records all" in str(e)
    else:
        raise AssertionError("a sampled run cannot be re-judged under other SLOs")


def test_points_in_worker_processes_give_the_same_run(tmp_path: Path):
    """And both tell how far each point has got, as it goes: a 1,024-replica point takes
    minutes."""
    progress: dict[int, dict[int, list[float]]] = {1: defaultdict(list), 2: defaultdict(list)}
    one = _run(tmp_path / "one", on_progress=lambda i, t: progress[1][i].append(t))
    two = _run(tmp_path / "two", jobs=2, on_progress=lambda i, t: progress[2][i].append(t))
    for seen in progress.values():
        assert sorted(seen) == [0, 1]
        for times in seen.values():  # about one report per hundredth of the 40 s
            assert times == sorted(times) and times[0] > 0 and times[-1] <= 40
            assert 90 <= len(times) <= 100
    assert progress[1] == progress[2]
    for a, b in zip(one.points, two.points, strict=True):
        assert a.summary == b.summary and a.num_records == b.num_records
        assert a.gpu_busy.to_dict() == b.gpu_busy.to_dict()
        name = f"records-{a.load.tag}.jsonl.gz"
        assert [r.to_dict() for r in read_jsonl(tmp_path / "one" / name)] == [
            r.to_dict() for r in read_jsonl(tmp_path / "two" / name)
        ]


FORKS_SEEN = """
import json, os, sys, threading
seen = []  # threads alive in this process at each fork() it makes
os.register_at_fork(before=lambda: seen.append(threading.active_count()))
from servefleet.cli import app
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    sys.__stderr__.write("FORKS " + json.dumps(seen) + "\\n")
"""


def test_simulate_jobs_forks_no_worker_from_a_process_with_threads(tmp_path: Path):
    """`simulate --jobs` runs under rich's progress display, whose refresh thread holds the
    console's lock while it draws (and in a terminal, sys.stdout/stderr are proxies taking it):
    a worker forked from this process meanwhile inherits those locks held. TTY_COMPATIBLE=1
    makes rich treat stderr as a terminal, as for a user."""
    argv = ["simulate", "--concurrency", "1,2", "--duration", "5", "--warmup", "1",
            "--jobs", "2", "--records", "none", "--out", str(tmp_path / "run")]  # fmt: skip
    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "200"}
    p = subprocess.run(
        [sys.executable, "-c", FORKS_SEEN, *argv], capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    forks = json.loads(p.stderr.rsplit("FORKS ", 1)[1])
    assert all(n == 1 for n in forks), f"forked with {forks} threads alive"
    assert len(_points(tmp_path / "run")) == 2


@given(st.lists(st.integers(0, 3), max_size=12))
def test_chunks_are_the_runs_of_equal_delivery_times(steps):
    """A request's token delivery times (sorted) as chunks: each run of equal times is one
    chunk of that many tokens (the plain rule, itertools.groupby)."""
    times = [0.25 * t for t in sorted(steps)]
    runs = [(t, len(list(g))) for t, g in groupby(times)]
    assert _chunks(times) == ([t for t, _ in runs], [k for _, k in runs])


def test_records_made_on_another_core_are_the_same(tmp_path: Path):
    """``sim.finishing``: a helper process makes the same summary and the same records file,
    in the order the requests finished (a run with rejections, preemptions, sessions and
    classes), and says why when it fails."""
    import pytest

    from servefleet.sim.runner import simulate_point
    from servefleet.workload import load_workload

    dep = resolve_deployment(
        load_model("Qwen1.5-14B"),
        get_gpu("V100-SXM2-32G"),
        tp=2,
        num_gpus=4,
        max_model_len=2048,  # some summaries do not fit: rejected
        gpu_memory_utilization=0.6,
    )
    workload = load_workload("enterprise-mix")

    def point(path: Path, helper: bool, duration: float = 30.0):
        return simulate_point(
            dep,
            workload,
            Load(rate=40.0),
            duration=duration,
            warmup=5,
            seed=1,
            slo=SLO(ttft=0.5, itl=0.05),
            keep_records=False,
            records=(path, "all"),
            records_process=helper,
        )

    here, there = point(tmp_path / "here.jsonl.gz", False), point(tmp_path / "there.jsonl.gz", True)
    assert here.summary == there.summary
    assert (here.num_records, here.last_end) == (there.num_records, there.last_end)
    recs = [r.to_dict() for r in read_jsonl(tmp_path / "here.jsonl.gz")]
    assert recs == [r.to_dict() for r in read_jsonl(tmp_path / "there.jsonl.gz")]
    assert len(recs) == here.num_records
    assert any(r["status"] == "error" for r in recs) and any(r["preemptions"] for r in recs)
    assert any(r["session_id"] for r in recs) and len({r["class_name"] for r in recs}) > 1
    with pytest.raises(RuntimeError, match=r"records process failed(?s:.)*FileNotFoundError"):
        point(tmp_path / "no-such-dir" / "r.jsonl.gz", True, duration=6.0)
