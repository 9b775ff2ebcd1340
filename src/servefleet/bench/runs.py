"""Runs: one point, a sweep of concurrencies or rates, or an SLO search — and their files.

A run writes, into its folder, after every point (so an interrupted run keeps what it has):
``summary.json`` (the settings, the workload spec, each point's summary, self-checks and server
metrics, the knee) and ``records-<point>.jsonl.gz`` (one ``RequestRecord`` per request sent),
the same layout as ``servefleet simulate --out``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servefleet.bench.calibrate import Calibration, calibrate, discover_model
from servefleet.bench.client import Client
from servefleet.bench.gpu import GpuSampler, auto_url
from servefleet.bench.point import LiveStats, Load, PointResult, PointSettings, run_point
from servefleet.bench.prompts import PromptRenderer
from servefleet.bench.requests import Target
from servefleet.bench.schedule import StopRule
from servefleet.bench.scrape import Scraper
from servefleet.bench.search import SloSearch
from servefleet.bench.serverinfo import server_info
from servefleet.records import write_jsonl
from servefleet.stats import KneeRule, find_knee, meets_slo
from servefleet.workload import WorkloadSpec
from servefleet.workload.windows import whole_period_duration


@dataclass(slots=True)
class BenchConfig:
    base_url: str
    workload: WorkloadSpec
    settings: PointSettings
    loads: list[Load] = field(default_factory=list)
    search: SloSearch | None = None
    model: str | None = None
    endpoint: str = "chat"
    reuse_connections: bool = True
    max_connections: int = 0
    timeout: float = 600.0
    api_key: str | None = None
    admin_token: str | None = None
    """A servefleet gateway's admin token, for its ``/fleet`` and ``/metrics`` (needed when it
    listens beyond loopback)."""
    scrape: bool = True
    scrape_replicas: bool = True
    tokenizer: Path | None = None
    ignore_eos: bool = True
    continuous_usage: bool = False
    gpu_metrics: str | None = "auto"
    """A DCGM-named /metrics URL to sample the GPUs from; ``auto``: the target host's port
    9400 when it answers (``servefleet up``, dcgm-exporter); None: no GPU telemetry."""
    out: Path | None = None
    whole_burst_periods: bool = True
    """Extend a rate's duration until its window holds one whole burst period."""


@dataclass(slots=True)
class BenchRun:
    config: BenchConfig
    target: Target
    calibration: Calibration
    points: list[PointResult] = field(default_factory=list)
    interrupted: bool = False
    complete: bool = False
    """Every point planned ran to its end (False until then: a run killed mid-way, even by
    SIGKILL, leaves ``complete: false`` in its summary.json)."""
    knee: int | None = None
    knee_rule: KneeRule = field(default_factory=KneeRule)
    started_at: float = field(default_factory=time.time)
    server_info: dict = field(default_factory=dict)
    """What the target said about itself (``bench.serverinfo``): the report's header."""
    gpu_note: str | None = None
    """Where the GPU telemetry came from, or why there is none (one line)."""
    server_note: str | None = None
    """Why the target's own view cannot be read (a gateway refusing ``/fleet``), one line."""

    def update_knee(self) -> None:
        pts = sorted(range(len(self.points)), key=lambda i: self.points[i].load.value)
        if len(pts) < 2 or self.config.search is not None:
            self.knee = None
            return
        k = find_knee(
            [self.points[i].load.value for i in pts],
            [self.points[i].summary.output_throughput for i in pts],
            [self.points[i].summary.ttft.p95 for i in pts],
            self.knee_rule,
        )
        self.knee = None if k is None else pts[k]

    def summary_dict(self) -> dict:
        c = self.config
        s = c.settings
        return {
            "kind": "bench",
            "target": {"url": c.base_url, "model": self.target.model, "endpoint": c.endpoint},
            "workload": c.workload.model_dump(mode="json"),
            "settings": {
                "duration": s.stop.duration,
                "max_requests": s.stop.max_requests,
                "warmup": s.warmup,
                "cooldown": s.cooldown,
                "drain_timeout": s.drain_timeout,
                "seed": s.seed,
                "slo": {"ttft": s.slo.ttft, "itl": s.slo.itl},
                **(
                    {}
                    if s.slo_classes is None
                    else {
                        "slo_classes": {
                            n: {"ttft": c.ttft, "itl": c.itl} for n, c in s.slo_classes.items()
                        }
                    }
                ),
                "max_error_rate": s.max_error_rate,
                "reuse_connections": c.reuse_connections,
                "max_connections": c.max_connections,
                "ignore_eos": c.ignore_eos,
                "continuous_usage": c.continuous_usage,
            },
            "server_info": self.server_info,
            "gpu_telemetry": self.gpu_note,
            "server_note": self.server_note,
            "calibration": {
                "tokens_per_word": self.calibration.tokens_per_word,
                "method": self.calibration.method,
            },
            "knee": self.knee,
            "knee_rule": self.knee_rule.describe(),
            "search": c.search.to_dict() if c.search is not None else None,
            "interrupted": self.interrupted,
            "complete": self.complete,
            "points_planned": len(c.loads) if c.search is None else None,
            "started_at": self.started_at,
            "points": [point_dict(p, s.max_error_rate) for p in self.points],
        }


def point_dict(p: PointResult, max_error_rate: float) -> dict:
    ok = [r for r in p.records if r.ok]
    target = [r.target_prompt_tokens for r in ok if r.target_prompt_tokens is not None]
    return {
        "load": p.load.to_dict(),
        "label": p.load.label,
        "records_file": f"records-{p.load.tag}.jsonl.gz",
        "records": len(p.records),
        "window": {"start": p.window.start, "end": p.window.end},
        "summary": p.summary.to_dict(),
        "selfcheck": p.selfcheck.to_dict(),
        "server": p.server.to_dict() if p.server is not None else None,
        "prefix_hit": p.prefix_hit.to_dict(),
        "prompt_tokens": {
            "target_mean": float(np.mean(target)) if target else None,
            "actual_mean": float(np.mean([r.prompt_tokens for r in ok])) if ok else None,
        },
        "interrupted": p.interrupted,
        "failed": p.summary.failed_point(max_error_rate),
        "wall_seconds": p.wall_seconds,
        "notes": p.notes,
        "telemetry": p.telemetry,
    }


def write_point(run: BenchRun, p: PointResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(p.records, out / f"records-{p.load.tag}.jsonl.gz")
    write_summary(run, out)


def write_summary(run: BenchRun, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(run.summary_dict(), indent=2))
    os.replace(tmp, out / "summary.json")


async def run_bench(
    config: BenchConfig,
    *,
    stop_event: asyncio.Event | None = None,
    live: LiveStats | None = None,
    on_point_start: Callable[[int, Load], None] | None = None,
    on_point: Callable[[int, PointResult], None] | None = None,
    on_ready: Callable[[BenchRun], None] | None = None,
) -> BenchRun:
    """Run every point of ``config`` (a list of loads, or an SLO search) in turn."""
    stop_event = stop_event or asyncio.Event()
    client = Client(
        max_connections=config.max_connections,
        reuse_connections=config.reuse_connections,
        timeout=config.timeout,
        api_key=config.api_key,
    )
    await client.start()
    try:
        session = client.session
        assert session is not None
        model = config.model or await discover_model(session, config.base_url)
        cal = await calibrate(
            session,
            config.base_url,
            model,
            endpoint=config.endpoint,
            tokenizer=config.tokenizer,
            headers=client.base_headers(),
        )
        target = Target(
            config.base_url, model, config.endpoint, config.ignore_eos, config.continuous_usage
        )
        run = BenchRun(config, target, cal)
        run.server_info, run.server_note = await server_info(
            session, config.base_url, config.admin_token
        )
        gpu = await gpu_sampler(config, session, run)
        if config.out is not None:  # complete: false from the start, whatever kills the run
            write_summary(run, config.out)
        if on_ready:
            on_ready(run)
        scraper = (
            Scraper(
                config.base_url,
                session,
                replicas=config.scrape_replicas,
                token=config.admin_token,
            )
            if config.scrape
            else None
        )
        run_salt = secrets.token_hex(4)
        i = 0
        while not stop_event.is_set():
            load = _next_load(config, i)
            if load is None:
                break
            if on_point_start:
                on_point_start(i, load)
            # Fresh text per point (and per run): the server's prefix cache keeps what earlier
            # points sent, and the same workload seed would send it again.
            renderer = PromptRenderer(cal.tokens_per_word, namespace=f"{run_salt}/{i}/")
            settings, window_note = whole_burst_period(
                config.workload, config.settings, load, config.whole_burst_periods
            )
            p = await run_point(
                load,
                config.workload,
                settings,
                target=target,
                client=client,
                renderer=renderer,
                scraper=scraper,
                stop_event=stop_event,
                live=live,
                gpu=gpu,
            )
            if window_note:
                p.notes.insert(0, window_note)
            run.points.append(p)
            if config.search is not None and not p.interrupted:
                config.search.report(
                    load.value,
                    meets_slo(
                        p.summary,
                        config.settings.slo,
                        config.settings.max_error_rate,
                        config.settings.slo_classes,
                    ),
                )
            run.interrupted = p.interrupted
            run.update_knee()
            if config.out is not None:
                write_point(run, p, config.out)
            if on_point:
                on_point(i, p)
            i += 1
        run.complete = not run.interrupted and not stop_event.is_set()
        if config.out is not None:
            write_summary(run, config.out)
        return run
    finally:
        await client.stop()


async def gpu_sampler(config: BenchConfig, session, run: BenchRun) -> GpuSampler | None:
    """The GPU telemetry endpoint to sample, if it answers (``run.gpu_note`` says what was
    found, in one line)."""
    if not config.gpu_metrics:
        run.gpu_note = "GPU telemetry off (--gpu-metrics none)"
        return None
    url = auto_url(config.base_url) if config.gpu_metrics == "auto" else config.gpu_metrics
    sampler = GpuSampler(url, session)
    why = await sampler.probe()
    if why is None:
        run.gpu_note = f"GPU telemetry from {url}"
        return sampler
    run.gpu_note = f"no GPU telemetry: {why}"
    return None


def whole_burst_period(
    workload: WorkloadSpec, settings: PointSettings, load: Load, extend: bool = True
) -> tuple[PointSettings, str | None]:
    """The settings of a point at ``load``: a duration long enough that the window after the
    warm-up holds one whole burst period of the workload at that rate (``workload.windows``),
    and the note that says it was extended (None: as asked). ``extend`` False keeps the
    duration and the note says the window is short."""
    if load.rate is None or settings.stop.duration is None:
        return settings, None
    check = whole_period_duration(
        workload, load.rate, settings.stop.duration, settings.warmup, settings.cooldown
    )
    if check is None or not check.extended:
        return settings, None
    if not extend:
        return settings, (
            f"the window after the warm-up is shorter than one burst period ({check.period:.4g} "
            "s at this rate): it may hold no burst, and its latencies may not show them"
        )
    stop = StopRule(check.duration, settings.stop.max_requests)
    return dataclasses.replace(settings, stop=stop), check.describe()


def _next_load(config: BenchConfig, i: int) -> Load | None:
    if config.search is not None:
        r = config.search.next_rate()
        return None if r is None else Load(rate=round(r, 6))
    return config.loads[i] if i < len(config.loads) else None
