"""One benchmark point: the schedule (when), the client (how) and the stop rule (until), joined.

Sending follows the absolute schedule of the workload: each request is rendered before its time
comes, then sent when ``t0 + arrival_time`` is reached (no drift from relative sleeps). Every
request sent gets a record, whatever happens to it. When the stop rule says so, sending ends and
the requests in flight finish (up to ``drain_timeout``; then they are aborted). An interrupt
(``stop_event``, set on Ctrl-C) ends sending and aborts what is in flight at once.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from servefleet.bench.client import Client
from servefleet.bench.gpu import GpuSampler, modelled_busy
from servefleet.bench.prompts import PromptRenderer
from servefleet.bench.requests import Target, build_request
from servefleet.bench.schedule import Schedule, StopRule
from servefleet.bench.scrape import ClientTokens, Scraper, ServerView, server_delta
from servefleet.bench.selfcheck import CpuMeter, LoopMonitor, SelfCheck, evaluate
from servefleet.prefix_hit import PrefixHit, prefix_hit
from servefleet.records import RequestRecord
from servefleet.stats import (
    CANCELLED,
    DEFAULT_MAX_ERROR_RATE,
    SLO,
    Summary,
    Window,
    summarize,
)
from servefleet.workload import WorkloadSpec, build_source, output_key
from servefleet.workload.types import Load

DRAIN_TIMEOUT = "aborted: still running after the drain timeout"
EARLY_OK = 0.0002
"""Send up to this early rather than sleep again (timers have ~1 ms granularity)."""


@dataclass(slots=True)
class PointSettings:
    stop: StopRule
    warmup: float = 0.0
    cooldown: float = 0.0
    drain_timeout: float | None = 120.0
    seed: int = 0
    slo: SLO = field(default_factory=SLO)
    class_slos: dict[str, SLO] = field(default_factory=dict)
    """Classes with SLOs of their own (the workload spec's ``classes.<name>.slo``)."""
    slo_classes: dict[str, SLO] | None = None
    """The classes the SLOs are judged on, each on its own (``--slo-classes``; None: every
    request)."""
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    """A point where more of its requests failed is marked failed."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.cooldown < 0:
            raise ValueError("warm-up and cool-down must be >= 0 s")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"--max-error-rate {self.max_error_rate:g}: give a share, 0 to 1")
        d = self.stop.duration
        if d is not None and self.warmup + self.cooldown >= d:
            raise ValueError(
                f"warm-up ({self.warmup:g} s) + cool-down ({self.cooldown:g} s) must be shorter "
                f"than the duration ({d:g} s)"
            )


@dataclass(slots=True)
class LiveStats:
    """Running counts for the progress display."""

    label: str = ""
    planned: float | None = None
    started: float = field(default_factory=time.perf_counter)
    sent: int = 0
    done: int = 0
    errors: int = 0
    last_error: str | None = None
    tokens: int = 0
    ttfts: deque = field(default_factory=lambda: deque(maxlen=2000))
    token_marks: deque = field(default_factory=lambda: deque(maxlen=4096))
    on_first_done: Callable[[RequestRecord], None] | None = None
    """Called when the first request of a point has finished (the CLI prints a line)."""

    @property
    def in_flight(self) -> int:
        return self.sent - self.done

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def on_tokens(self, k: int) -> None:
        self.tokens += k
        self.token_marks.append((time.perf_counter(), k))

    def token_rate(self, span: float = 5.0) -> float:
        now = time.perf_counter()
        n = sum(k for t, k in self.token_marks if t >= now - span)
        return n / min(span, max(self.elapsed, 1e-3))


@dataclass(slots=True)
class PointResult:
    load: Load
    records: list[RequestRecord]
    window: Window
    summary: Summary
    selfcheck: SelfCheck
    server: ServerView | None
    interrupted: bool
    wall_seconds: float
    notes: list[str] = field(default_factory=list)
    telemetry: dict | None = None
    """GPU telemetry sampled during the point (``servefleet.telemetry``), when available."""
    prefix_hit: PrefixHit = field(default_factory=lambda: PrefixHit(None, None))
    """Prompt tokens served from the prefix cache ÷ prompt tokens, and where that came from."""


def client_tokens(records: list[RequestRecord]) -> ClientTokens:
    """The client's side of the re-prefill derivation: its prompt tokens, and the longest
    context one of its requests could have had (prompt + output, or the targets)."""
    longest = 0
    for r in records:
        prompt = r.prompt_tokens or r.target_prompt_tokens or 0
        out = max(r.output_tokens, r.target_output_tokens or 0)
        longest = max(longest, prompt + out)
    return ClientTokens(sum(r.prompt_tokens for r in records if r.ok), longest)


class _Waker:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.fut: asyncio.Future | None = None

    def wake(self) -> None:
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        self.fut = self.loop.create_future()
        h = self.loop.call_later(timeout, self.wake) if timeout is not None else None
        try:
            await self.fut
        finally:
            if h is not None:
                h.cancel()
            self.fut = None


async def run_point(
    load: Load,
    workload: WorkloadSpec,
    settings: PointSettings,
    *,
    target: Target,
    client: Client,
    renderer: PromptRenderer,
    scraper: Scraper | None = None,
    stop_event: asyncio.Event | None = None,
    live: LiveStats | None = None,
    gpu: GpuSampler | None = None,
) -> PointResult:
    """Run one point (see the module docstring); every request sent is in the result."""
    run = _PointRun(load, workload, settings, target, client, renderer, scraper, stop_event, live)
    run.gpu = gpu
    gc.collect()
    gc.freeze()  # what exists now is never scanned again: shorter collections while timing
    try:
        return await run.run()
    finally:
        gc.unfreeze()


class _PointRun:
    def __init__(
        self, load, workload, settings, target, client, renderer, scraper, stop_event, live
    ):
        self.load, self.settings, self.target = load, settings, target
        self.client, self.renderer, self.scraper = client, renderer, scraper
        self.sched = Schedule(
            build_source(workload, seed=settings.seed, rate=load.rate, concurrency=load.concurrency)
        )
        self.stop_event = stop_event or asyncio.Event()
        self.live = live or LiveStats()
        self.live.label, self.live.planned = load.label, settings.stop.duration
        self.live.sent = self.live.done = self.live.errors = self.live.tokens = 0
        self.live.last_error = None
        self.live.ttfts.clear()
        self.live.token_marks.clear()
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.headers = client.base_headers()
        self.notes: list[str] = []
        self.gpu: GpuSampler | None = None

    async def _one(self, req, spec) -> None:
        live = self.live
        try:
            out = await self.client.send(req, on_chunk=live.on_tokens)
        finally:
            live.done += 1
        rec = out.record
        if live.done == 1 and live.on_first_done is not None:
            live.on_first_done(rec)
        if not rec.ok:
            live.errors += 1
            live.last_error = rec.error
        elif rec.ttft is not None:
            live.ttfts.append(rec.ttft)
        if req.keep_text:
            self.renderer.remember_answer(output_key(spec.request_id), out.text)
        self.sched.finished(spec, rec.end_time or 0.0, rec.output_tokens if rec.ok else 0)
        self.waker.wake()

    async def run(self) -> PointResult:
        loop = self.loop = asyncio.get_running_loop()
        self.waker = _Waker(loop)
        stop_waiter = loop.create_task(self.stop_event.wait())
        stop_waiter.add_done_callback(lambda _: self.waker.wake())
        before = await self.scraper.scrape() if self.scraper else None
        t0 = time.perf_counter()  # the point's clock: every time of the point is since t0
        if self.scraper:
            self.scraper.start(t0)
        if self.gpu is not None:
            self.gpu.start(t0)
        monitor = LoopMonitor()
        monitor.start()
        cpu = CpuMeter()
        try:
            _, sending_ended = await self._send(t0)
            interrupted = await self._drain(stop_waiter)
        finally:
            stop_waiter.cancel()
            await monitor.stop()
        wall = time.perf_counter() - self.client.t0
        cpu_frac, rq_wait = cpu.fraction(), cpu.runqueue_wait()
        gpu_series = await self.gpu.stop() if self.gpu is not None else None
        view = await self._server_view(before)
        if gpu_series is None and self.scraper is not None:
            gpu_series = modelled_busy(self.scraper)
        s = self.settings
        if s.stop.duration is not None:
            end = s.stop.duration
        else:  # a request count: up to the last send
            end = max((r.send_time for r in self.records), default=sending_ended) + 1e-6
        if interrupted:
            end = min(end, sending_ended)
        window = Window(s.warmup, max(end - s.cooldown, s.warmup + 1e-6))
        records = sorted(self.records, key=lambda r: r.send_time)
        summary = summarize(records, window, s.slo, class_slos=s.class_slos)
        hit = prefix_hit(records, view.to_dict() if view is not None else None)
        if hit.note:
            self.notes.append(hit.note)
        if records and summary.window_requests == 0:
            self.notes.append(
                f"no request was sent inside the measurement window [{window.start:g}, "
                f"{window.end:g}) s: shorten the warm-up or cool-down"
            )
        check = evaluate(
            records,
            window,
            monitor.lags,
            cpu_frac,
            open_loop=self.load.rate is not None,
            runqueue_wait=rq_wait,
            ttft_p50=summary.ttft.p50,
            itl_p50=summary.itl.p50,
        )
        return PointResult(
            self.load,
            records,
            window,
            summary,
            check,
            view,
            interrupted,
            wall,
            self.notes,
            gpu_series.to_dict() if gpu_series is not None else None,
            hit,
        )

    async def _send(self, t0: float) -> tuple[float, float]:
        """Send on schedule from ``t0`` until the stop rule (or an interrupt); (last arrival
        sent, when sending ended)."""
        sched, live, waker, stop = self.sched, self.live, self.waker, self.settings.stop
        self.client.t0 = t0
        live.started = t0
        built: tuple | None = None
        last_send = 0.0
        while not self.stop_event.is_set():
            nxt = sched.peek()
            if nxt is None:
                if not self.tasks:
                    break
                await waker.wait(None)
                continue
            if stop.done(nxt.arrival_time, live.sent):
                break
            if built is None or built[0] is not nxt:  # render before its time comes
                built = (nxt, build_request(nxt, self.target, self.renderer, self.headers))
            delay = nxt.arrival_time - (time.perf_counter() - t0)
            if delay > EARLY_OK:
                await waker.wait(delay)
                continue  # re-check: a finish may have released an earlier request
            sched.pop()
            req = built[1]
            built = None
            self.records.append(req.record)
            live.sent += 1
            last_send = nxt.arrival_time
            task = self.loop.create_task(self._one(req, nxt))
            self.tasks.add(task)
            task.add_done_callback(self._task_done)
        return last_send, time.perf_counter() - t0

    def _task_done(self, task: asyncio.Task) -> None:
        """A request's task is over: when it was the last one of a source with nothing left
        to send (a trace's end), sending stops now, not at the next wake-up."""
        self.tasks.discard(task)
        self.waker.wake()

    async def _drain(self, stop_waiter: asyncio.Task) -> bool:
        """Let requests in flight finish (until the drain timeout or an interrupt, then abort
        them); whether the point was interrupted."""
        tasks = self.tasks
        interrupted = self.stop_event.is_set()
        if tasks and not interrupted:
            waiter = self.loop.create_task(
                asyncio.wait(set(tasks), timeout=self.settings.drain_timeout)
            )
            await asyncio.wait({waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            interrupted = self.stop_event.is_set()
        if tasks:
            if not interrupted:
                self.notes.append(
                    f"{len(tasks)} request(s) still running after the drain timeout: aborted"
                )
            running = list(tasks)
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        # Ctrl-C: the client's choice (cancelled, not counted against the server); the drain
        # timeout: the server's slowness (a failure).
        label = CANCELLED if interrupted else DRAIN_TIMEOUT
        for r in self.records:
            if r.end_time is None:  # cancelled before it could start
                r.end_time = r.send_time
                if r.ok:
                    r.status, r.error = "aborted", label
            elif r.status == "aborted" and r.error == CANCELLED:
                r.error = label
        return interrupted

    async def _server_view(self, before) -> ServerView | None:
        if not self.scraper:
            return None
        await self.scraper.stop()
        after = await self.scraper.scrape()
        if before is not None and after is not None:
            return server_delta(before, after, self.scraper.samples, client_tokens(self.records))
        if self.scraper.note:
            self.notes.append(f"server metrics: {self.scraper.note}")
        return None
