"""Reports: pure functions of records — terminal, Markdown, JSON, HTML (checked in headless
Chromium), and compare (a simulated run against a measured one on the same workload spec)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.bench.testserver import Spawned, spawn_test_server
from servefleet.records import RequestRecord, write_jsonl
from servefleet.report.html import render_html
from servefleet.report.run import load_run
from servefleet.report.svg import LEGEND_CHAR_PX, legend_layout

ENV = {**os.environ, "COLUMNS": "220"}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "run"
    with spawn_test_server("--ttft", "0.005", "--itl", "0.002") as s:
        p = cli(
            "bench",
            "--url",
            s.url,
            "--input-len",
            "20",
            "--output-len",
            "12",
            "--concurrency",
            "1,4",
            "--duration",
            "1.2",
            "--warmup",
            "0.2",
            "--out",
            str(out),
        )
    assert p.returncode == 0, p.stderr
    return out


def test_show_table_markdown_json_are_recomputed_from_the_records(bench_run):
    p = cli("report", "show", str(bench_run))
    assert p.returncode == 0 and "c=4" in p.stdout and "client self-checks" in p.stdout
    md = cli("report", "show", str(bench_run), "--format", "markdown").stdout
    assert md.startswith("# ") and "| load |" in md and "| c=4" in md
    js = json.loads(cli("report", "show", str(bench_run), "--format", "json").stdout)
    stored = json.loads((bench_run / "summary.json").read_text())
    assert [pt["summary"]["num_requests"] for pt in js["points"]] == [
        pt["summary"]["num_requests"] for pt in stored["points"]
    ]
    strict = json.loads(
        cli("report", "show", str(bench_run), "--format", "json", "--slo-ttft", "0.000001").stdout
    )
    assert strict["points"][1]["summary"]["goodput"] == 0  # re-rendered under another SLO


def chromium() -> str | None:
    return (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )


def browser_flags(tmp_path: Path) -> list[str]:
    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]


def rendered(page: Path, tmp_path: Path) -> dict:
    """Open ``page`` in headless Chromium: the attributes of its ``#sf-check`` (plots that
    rendered, empty ones, script errors)."""
    dom = subprocess.run(
        [*browser_flags(tmp_path), "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
    )
    m = re.search(r'<p id="sf-check"([^>]*)>', dom.stdout)
    assert m, dom.stderr[-2000:]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))


def test_html_report_opens_in_headless_chromium_with_every_plot_and_no_errors(bench_run, tmp_path):
    p = cli("report", "html", str(bench_run))
    assert p.returncode == 0, p.stderr
    page = bench_run / "report.html"
    html = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # self-contained
    n_plots = html.count('class="plot"')
    assert n_plots == 9
    attrs = rendered(page, tmp_path)
    assert attrs.get("data-plots-ok") == str(n_plots), attrs
    assert attrs.get("data-plots-bad") == "" and attrs.get("data-errors") == "[]", attrs
    assert 'id="verdict"' in html and "(log scale)" in html  # verdict; log-scale latency CDFs
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            *browser_flags(tmp_path),
            "--hide-scrollbars",
            "--window-size=1300,3200",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=90,
    )
    assert shot.is_file() and shot.stat().st_size > 50_000  # a page of plots, not a blank one


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory) -> Path:
    """enterprise-mix simulated (three classes, sessions, bursts of summaries) at two rates; the
    60 s asked for is extended until the window holds one whole burst period."""
    out = tmp_path_factory.mktemp("mix") / "run"
    p = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "simulate", "--workload", "enterprise-mix",
         "--rate", "2,4", "--duration", "60", "--warmup", "10", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "class qa" in p.stdout and "class summaries" in p.stdout  # per class, in the terminal
    assert "--duration extended from 60 s to" in " ".join(p.stderr.split())
    return out


def test_per_class_results_and_modelled_gpu_busy_in_simulate_outputs(mix_run, tmp_path):
    s = json.loads((mix_run / "summary.json").read_text())
    pt = s["points"][0]
    classes = pt["summary"]["by_class"]
    assert set(classes) == {"qa", "summaries", "sessions"}
    assert sum(c["num_requests"] for c in classes.values()) == pt["summary"]["num_requests"]
    # the window holds a whole burst period: one burst of 120 summaries is measured
    assert s["settings"]["duration"] > 60
    assert classes["summaries"]["ttft"]["count"] >= 120
    busy = pt["gpu_busy"]
    assert busy["kind"] == "modelled" and len(busy["figures"]) == 4  # one per replica
    assert all(0 < f["utilization_mean"] <= 100 for f in busy["figures"].values())
    md = cli("report", "show", str(mix_run), "--format", "markdown").stdout
    assert "### class qa" in md and "## Verdict" in md and "- **deployment**:" in md
    html = render_html(load_run(mix_run))
    assert html.count('data-plot="gpu-utilization"') == 1 and "class summaries" in html
    page = tmp_path / "mix.html"
    page.write_text(html)
    attrs = rendered(page, tmp_path)
    assert attrs.get("data-plots-ok") == str(html.count('class="plot"')), attrs
    assert attrs.get("data-errors") == "[]", attrs


def test_legend_entries_never_overlap():
    names = [
        "c=1",
        "a much longer series name for the legend",
        "P99",
        "B: bench-run-2026-12-03",
        "x",
    ]
    pos = legend_layout(names, 400)
    for (x0, r0), (x1, r1), name in zip(pos, pos[1:], names, strict=False):
        assert r1 > r0 or x1 >= x0 + 28 + LEGEND_CHAR_PX * len(name)
    assert all(
        x + 28 + LEGEND_CHAR_PX * len(n) <= 400 + 60 or x == 0
        for (x, _), n in zip(pos, names, strict=True)
    )


def synthetic_sweep(folder: Path) -> Path:
    """A concurrency sweep that saturates at 4: throughput flat after, TTFT exploding."""
    points = []
    for c in (1, 2, 4, 8, 16):
        recs = []
        ttft = 0.1 if c <= 4 else 0.1 * c
        per_s = min(c, 4)
        for i in range(40 * per_s):
            t = i / per_s * 0.25
            recs.append(
                RequestRecord(
                    f"r{i}",
                    "c",
                    t,
                    t,
                    first_token_time=t + ttft,
                    end_time=t + ttft + 0.9,
                    chunk_times=[t + ttft + k * 0.1 for k in range(10)],
                    chunk_tokens=[1] * 10,
                    prompt_tokens=10,
                    output_tokens=10,
                )
            )
        write_jsonl(recs, folder / f"records-c{c}.jsonl.gz")
        points.append({"load": {"concurrency": c, "rate": None}, "summary": {}})
    (folder / "summary.json").write_text(
        json.dumps(
            {
                "kind": "simulate",
                "deployment": {"model": "m", "replicas": 1, "tp": 1, "gpu": "g"},
                "workload": {"name": "w"},
                "settings": {"warmup": 0.0, "duration": 10.0, "slo": {"ttft": 2.0, "itl": 0.1}},
                "points": points,
            }
        )
    )
    return folder


def test_knee_is_marked_in_the_plots_and_tables(tmp_path):
    run = load_run(synthetic_sweep(tmp_path))
    html = render_html(run)
    assert html.count('data-knee="1"') == 4  # throughput, requests, TTFT and ITL plots
    assert '<tr class="knee"><td>c=8 ◀ knee' in html
    p = cli("report", "show", str(tmp_path))
    assert "knee at c=8" in p.stdout


def test_compare_lines_up_a_simulation_with_a_bench_run_against_the_sim_server(tmp_path):
    """One workload spec through `servefleet simulate` and through `servefleet bench` against
    the sim-server (same model, GPU and engine settings): `report compare` lines them up."""
    sim, meas = tmp_path / "sim", tmp_path / "bench"
    common = [
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--concurrency",
        "1,4",
        "--duration",
        "3",
        "--warmup",
        "0.5",
    ]
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "servefleet.cli",
            "simulate",
            "--model",
            "Qwen2.5-7B",
            "--gpu",
            "H200-SXM",
            "--num-gpus",
            "1",
            "--tp",
            "1",
            "--max-num-seqs",
            "256",
            *common,
            "--out",
            str(sim),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert p.returncode == 0, p.stderr
    argv = [
        sys.executable,
        "-m",
        "servefleet.sim.server",
        "--model",
        "Qwen2.5-7B",
        "--gpu",
        "H200-SXM",
        "--port",
        "0",
        "--startup-time",
        "0",
        "--max-num-seqs",
        "256",
        "--max-model-len",
        "4096",
    ]
    with Spawned(argv) as server:
        p = cli(
            "bench", "--url", server.url, "--endpoint", "completions", *common, "--out", str(meas)
        )
    assert p.returncode == 0, p.stderr
    p = cli("report", "compare", str(sim), str(meas), "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["points"]
    assert [r["label"] for r in rows] == ["c=1", "c=4"] and all(
        r["in_a"] and r["in_b"] for r in rows
    )
    for r in rows:  # the sim-server runs the simulator's engine model: figures agree roughly
        assert 0.5 < r["output_throughput"]["ratio"] < 2.0, r
        assert 0.5 < r["itl_p50"]["ratio"] < 2.0, r
    table = cli("report", "compare", str(sim), str(meas), "--html", str(tmp_path / "cmp.html"))
    assert "B÷A" in table.stdout and "c=4" in table.stdout and (tmp_path / "cmp.html").is_file()


def test_compare_and_show_refuse_bad_input_clearly(tmp_path, bench_run):
    p = cli("report", "show", str(tmp_path / "nope"))
    assert p.returncode == 2 and "no such run folder" in p.stderr
    (tmp_path / "empty").mkdir()
    p = cli("report", "html", str(tmp_path / "empty"))
    assert p.returncode == 2 and "not a run folder" in p.stderr
    rate_run = synthetic_sweep(tmp_path / "empty")
    s = json.loads((rate_run / "summary.json").read_text())
    for pt in s["points"]:
        pt["load"] = {"concurrency": None, "rate": float(pt["load"]["concurrency"])}
    (rate_run / "summary.json").write_text(json.dumps(s))
    for c in (1, 2, 4, 8, 16):
        (rate_run / f"records-c{c}.jsonl.gz").rename(rate_run / f"records-r{c}.jsonl.gz")
    p = cli("report", "compare", str(bench_run), str(rate_run))
    assert p.returncode == 2 and "cannot line up a concurrency sweep" in p.stderr


def test_compare_aligns_all_points_interpolating_where_loads_differ(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = load_run(synthetic_sweep(tmp_path / "a"))  # c = 1, 2, 4, 8, 16
    b_dir = synthetic_sweep(tmp_path / "b")
    s = json.loads((b_dir / "summary.json").read_text())
    s["points"] = [pt for pt in s["points"] if pt["load"]["concurrency"] in (2, 8)]
    (b_dir / "summary.json").write_text(json.dumps(s))
    b = load_run(b_dir)
    from servefleet.report.compare import BY_KEY, align, verdicts

    figs = [BY_KEY["output_throughput"], BY_KEY["ttft_p95"]]
    rows = align(a, b, figs)
    assert [r.label for r in rows] == ["c=1", "c=2", "c=4", "c=8", "c=16"]
    c4 = rows[2].cells["output_throughput"]
    assert c4.a_exact and not c4.b_exact and c4.b is not None  # B interpolated between 2 and 8
    assert rows[0].cells["output_throughput"].b is None  # outside B's range: never extrapolated
    assert rows[1].cells["ttft_p95"].ratio == pytest.approx(1.0)
    v = verdicts(rows, figs)
    assert v[0].startswith("out tok/s: A and B agree within") and "over 3 load(s)" in v[0]
    text = cli("report", "compare", str(tmp_path / "a"), str(b_dir)).stdout
    assert "~" in text and "(A only)" in text and "agree within" in text


def test_a_narrow_terminal_keeps_every_figure_whole():
    """In a console narrower than the table, columns with nothing to show are left out (and
    named), header words stack, figures are never cut, SLO reasons go under the table."""
    from rich.console import Console

    from servefleet.report.tables import TableData
    from servefleet.report.terminal import rich_table

    head = ["load", "ok/sent", "failed", "TTFT p50/p95/p99", "prefix hit", "re-prefill", "SLOs"]
    rows = [
        ["c=64", "1234/1234", "0", "467/991/1,296", "0.0%", "0.0%", "met"],
        ["c=128 ◀ knee", "1533/1533", "0", "870/4,891/6,985", "0.0%", "5.9%",
         "missed: TTFT P95 4.89 s > 2 s"],
    ]  # fmt: skip
    t = TableData("summary", "seed", head, rows, ["", "knee"], "times in ms")
    wide, narrow = Console(width=200, record=True), Console(width=60, record=True)
    wide.print(rich_table(t, wide.width))
    narrow.print(rich_table(t, narrow.width))
    assert "prefix hit" in wide.export_text()  # room enough: everything as it is
    text = narrow.export_text()
    assert "…" not in text and "870/4,891/6,985" in text and "1533/1533" in text
    assert "left out, nothing to show: failed, prefix hit" in " ".join(text.split())
    assert "c=128 missed: TTFT P95 4.89 s > 2 s" in " ".join(text.split())
    assert "re-prefill" not in text  # kept, its header stacked ("re-" over "prefill")
    assert "5.9%" in text


def test_a_large_fleet_shows_its_gpus_folded_not_one_row_each(tmp_path):
    """20 replicas: the GPU table shows all of them in one row (mean of means, largest of
    maxima), then the least and the most busy, not 20 rows."""
    from servefleet.report.tables import gpu_table

    out = tmp_path / "big"
    args = ["--model", "Llama-2-7B", "--gpu", "A100-80G-SXM", "--num-gpus", "20", "--tp", "1"]
    args += ["--input-len", "200", "--output-len", "50", "--rate", "30", "--duration", "20"]
    args += ["--warmup", "2"]
    p = subprocess.run(
        [sys.executable, "-m", "servefleet.cli", "simulate", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"COLUMNS": "200"},
    )
    assert p.returncode == 0, p.stderr
    assert "replica-7 " not in p.stdout and "all 20" in p.stdout
    run = load_run(out)
    figures = run.sorted_points()[0].raw["gpu_busy"]["figures"]
    assert len(figures) == 20
    t = gpu_table(run)
    assert t is not None and [r[1].split(":")[0] for r in t.rows] == [
        "all 20",
        "least busy",
        "most busy",
    ]
    means = [f["utilization_mean"] for f in figures.values()]
    assert t.rows[0][4].split(" / ")[0] == f"{sum(means) / len(means):,.0f} %"
    assert (
        t.rows[0][4].split(" / ")[1]
        == f"{max(f['utilization_max'] for f in figures.values()):,.0f} %"
    )
    assert t.rows[1][4].split(" / ")[0] == f"{min(means):,.0f} %"
    assert "more than 16 GPUs" in t.caption


def test_report_names_the_client_protocol_and_compare_warns_when_two_runs_differ(tmp_path):
    """The bench streams as the OpenAI SDK does by default (usage in the last chunk only) and
    asks for usage on every chunk only with --usage-per-chunk; the report says which, and
    `report compare` warns when two runs used different protocols (against the sim-server)."""
    argv = [
        sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B", "--gpu",
        "H200-SXM", "--port", "0", "--startup-time", "0", "--max-model-len", "4096",
    ]  # fmt: skip
    common = ["--input-len", "32", "--output-len", "16", "--concurrency", "2",
              "--duration", "1", "--warmup", "0"]  # fmt: skip
    sdk, per_chunk = tmp_path / "sdk", tmp_path / "per-chunk"
    with Spawned(argv) as server:
        for out, extra in ((sdk, []), (per_chunk, ["--usage-per-chunk"])):
            p = cli("bench", "--url", server.url, *common, *extra, "--out", str(out))
            assert p.returncode == 0, p.stderr
    a, b = (json.loads((d / "summary.json").read_text()) for d in (sdk, per_chunk))
    assert a["settings"]["continuous_usage"] is False and b["settings"]["continuous_usage"]
    for d in (sdk, per_chunk):  # tokens counted right either way
        assert all(r.output_tokens == 16 for p in load_run(d).points for r in p.records)
    show = cli("report", "show", str(sdk), "--format", "markdown").stdout
    assert "chat, usage in the last chunk only (OpenAI SDK)" in show
    p = cli("report", "compare", str(sdk), str(per_chunk), "--format", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["b"]["client_protocol"] == "chat, usage on every chunk"
    assert len(out["warnings"]) == 1 and "different client protocols" in out["warnings"][0]
    assert "warning:" in cli("report", "compare", str(sdk), str(per_chunk)).stdout
    same = json.loads(cli("report", "compare", str(sdk), str(sdk), "--format", "json").stdout)
    assert same["warnings"] == []
