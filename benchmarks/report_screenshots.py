"""The screenshots of docs/report.md, from the report's own HTML pieces, in headless Chromium:

* ``docs/report-top.png``: header, verdict and summary of the H200 vLLM run
  (benchmarks/real_gpu/data/h200-baselines/bench-vllm, committed);
* ``docs/report-gpu.png``: per-class tables and the plots over time (requests in flight, GPU
  busy share) of enterprise-mix simulated at 0.5 and 1 req/s (the seed fleet; ~2 s of CPU).

    python benchmarks/report_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from servefleet.report.html import (
    CHECK_JS,
    PAGE_CSS,
    group_tables,
    header_html,
    html_table,
    time_charts,
    verdict_html,
)
from servefleet.report.run import load_run
from servefleet.report.svg import CSS as SVG_CSS
from servefleet.report.tables import sweep_table

REPO = Path(__file__).resolve().parents[1]
VLLM_RUN = REPO / "benchmarks/real_gpu/data/h200-baselines/bench-vllm"


def page(title: str, parts: list[str]) -> str:
    return "\n".join(
        [
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>',
            f"<script>{CHECK_JS}</script><style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
            *parts,
            '<p id="sf-check"></p></body></html>',
        ]
    )


def shoot(html: str, out: Path, size: str, tmp: Path) -> None:
    exe = (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if exe is None:
        sys.exit("chromium is needed (apt-get install chromium)")
    src = tmp / (out.stem + ".html")
    src.write_text(html, encoding="utf-8")
    subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp / 'profile'}", f"--window-size={size}",
         f"--screenshot={out}", src.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    print(f"{out}: {out.stat().st_size / 1024:.0f} KiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=REPO / "docs")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run = load_run(VLLM_RUN)
        top = [f"<h1>{run.title}</h1>", header_html(run), verdict_html(run)]
        top.append(html_table(sweep_table(run)))
        shoot(page("top", top), a.out / "report-top.png", "1250,640", tmp)
        sim = tmp / "mix"
        subprocess.run(
            [sys.executable, "-m", "servefleet.cli", "simulate", "--workload", "enterprise-mix",
             "--rate", "0.5,1", "--duration", "60", "--warmup", "10", "--out", str(sim)],
            capture_output=True, check=True, timeout=300,
        )  # fmt: skip
        mix = load_run(sim)
        charts = time_charts(mix)
        parts = [*[html_table(t) for t in group_tables(mix)[:2]], '<div class="grid">']
        parts += [charts[0], charts[2], "</div>"]
        shoot(page("per class, GPU", parts), a.out / "report-gpu.png", "1300,900", tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
