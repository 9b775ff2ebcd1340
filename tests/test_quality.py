"""`servefleet quality`: the pure comparison, and the command against real sim-servers — two
identical replicas agree exactly, a replica told to alter a share of its tokens shows that
share, and a task file grades both sides."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from contextlib import ExitStack

import pytest

from live_helpers import start_sim
from servefleet.quality import (
    Answer,
    compare,
    is_correct,
    load_prompts,
    paired_difference,
    summarize,
    wilson,
)

ENV = {**os.environ, "COLUMNS": "200"}


def answer(tokens: list[str], lps: list[float], top: list[dict[str, float]] | None = None):
    return Answer(
        "".join(tokens), tokens, lps, top or [{t: lp} for t, lp in zip(tokens, lps, strict=True)]
    )


def test_identical_answers_match_exactly():
    a = answer([" the", " sky", " is"], [-0.1, -0.5, -0.2])
    row = compare(0, "p", a, answer(list(a.tokens), list(a.logprobs)))
    assert row.exact and row.first_divergence is None and row.differing == 0
    assert row.logprob_deltas == [0.0, 0.0, 0.0] and row.missing_logprobs == 0


def test_divergence_and_logprob_differences_of_the_references_tokens():
    ref = answer([" a", " b", " c", " d"], [-0.1, -0.2, -0.3, -0.4])
    # the candidate takes " x" at index 1, where it gave the reference's " b" -0.9
    cand = answer(
        [" a", " x", " c", " d"],
        [-0.15, -0.6, -0.3, -0.4],
        [{" a": -0.15}, {" x": -0.6, " b": -0.9}, {" c": -0.3}, {" d": -0.4}],
    )
    row = compare(0, "p", ref, cand)
    assert not row.exact and row.first_divergence == 1 and row.differing == 1
    assert row.logprob_deltas == pytest.approx([-0.05, -0.7])  # up to the divergence only
    shorter = compare(1, "p", ref, answer([" a", " b"], [-0.1, -0.2]))
    assert shorter.first_divergence == 2 and shorter.differing == 2
    missing = compare(2, "p", ref, answer([" z"], [-0.1]))
    assert missing.missing_logprobs == 1 and missing.logprob_deltas == []
    s = summarize([row, shorter, missing, compare(3, "p", ref, ref)])
    assert s.exact_match_rate == 0.25 and s.differing_token_share == (1 + 2 + 4) / 16
    assert s.abs_logprob_delta["max"] == pytest.approx(0.7)


def test_accuracy_intervals():
    assert is_correct("The capital is  Canberra.", "canberra")
    w = wilson(8, 10)  # the textbook value: 0.490 … 0.943
    assert (round(w.low, 3), round(w.high, 3)) == (0.49, 0.943)
    d = paired_difference([(True, True)] * 6 + [(True, False)] * 4)
    assert d.value == pytest.approx(-0.4) and d.low < -0.4 < d.high < 0
    assert math.isinf(paired_difference([(True, False)]).high)


def test_prompt_and_task_files(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert [p.text for p in load_prompts(tmp_path / "p.txt")] == ["one", "two"]
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"prompt": "2+2?", "answer": 4}\n{"prompt": "x"}\n')
    assert [(p.text, p.expected) for p in load_prompts(tasks)] == [("2+2?", "4"), ("x", None)]
    tasks.write_text('{"question": "2+2?"}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:1: expected"):
        load_prompts(tasks)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two replicas of one deployment and a third that alters 20 % of its tokens."""
    tmp = tmp_path_factory.mktemp("sims")
    with ExitStack() as stack:
        urls = [
            f"http://127.0.0.1:{start_sim(tmp, name, stack, '--seed', '3', *extra)[1]}"
            for name, extra in (("a", ()), ("b", ()), ("altered", ("--alter-tokens", "0.2")))
        ]
        yield urls


def quality(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "servefleet.cli", "quality", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)


def test_two_identical_replicas_agree_exactly(servers, tmp_path):
    a, b, _ = servers
    p = quality(a, b, "--out", str(tmp_path), "--max-tokens", "32")
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "quality.json").read_text())
    s = data["summary"]
    assert s["prompts"] == 24 and s["errors"] == 0
    assert s["exact_match_rate"] == 1.0 and s["differing_token_share"] == 0.0
    assert s["logprob_deltas"] == 24 * 32 and s["abs_logprob_delta"]["max"] == 0.0
    assert "exact match" in p.stdout and "100.0 %" in p.stdout
    assert 'id="quality"' in (tmp_path / "report.html").read_text()


def test_an_altered_share_of_tokens_is_reported(servers, tmp_path):
    a, _, altered = servers
    p = quality(a, altered, "--out", str(tmp_path), "--endpoint", "completions", "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["differing_token_share"] == pytest.approx(0.2, abs=0.03)  # 24 × 64 tokens
    assert s["exact_match_rate"] < 0.05 and s["diverged"] >= 23
    assert s["abs_logprob_delta"]["max"] > 0.1 and s["missing_logprobs"] == 0


def test_a_task_file_grades_both_sides(servers, tmp_path):
    """Expected answers taken from the reference's own outputs: it is always right, the
    altered replica less often, and the difference's interval says so."""
    a, _, altered = servers
    first = tmp_path / "first"
    assert quality(a, a, "--out", str(first), "--max-tokens", "8").returncode == 0
    rows = json.loads((first / "quality.json").read_text())["prompts"]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"prompt": r["prompt"], "answer": r["reference"]}) + "\n" for r in rows)
    )
    out = tmp_path / "graded"
    p = quality(a, altered, "--prompts", str(tasks), "--max-tokens", "8", "--out", str(out))
    assert p.returncode == 0, p.stderr
    acc = json.loads((out / "quality.json").read_text())["summary"]["accuracy"]
    assert acc["graded"] == 24 and acc["reference"]["value"] == 1.0
    assert acc["candidate"]["value"] < 0.5 and acc["difference"]["high"] < 0
    assert "Accuracy on the task file" in p.stdout
    html = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "report", "html", str(out)],
        capture_output=True, text=True, timeout=60, env=ENV,
    )  # fmt: skip
    assert html.returncode == 0, html.stderr
    assert "Accuracy on the task file" in (out / "report.html").read_text()


def test_unreachable_side_is_a_clear_error(tmp_path):
    p = quality("http://127.0.0.1:9", "http://127.0.0.1:9", "--out", str(tmp_path))
    assert p.returncode == 2 and "cannot compare" in p.stderr
