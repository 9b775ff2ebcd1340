"""The engine loop: one asyncio task runs the engine model's steps in wall-clock time.

Each turn: ``engine.step()`` schedules a batch and advances it (the sampled token ids are
generated now, so the prefix cache can hash them); the loop then waits until the step's end on
an absolute schedule (``start + duration * slowdown / time_scale``; the next step starts where
this one ends, so lateness never accumulates into the model's time), measures how late it woke
(the lag), and delivers the step's tokens: text, stop strings, metrics, and a wake-up in the
queue of the HTTP request each sequence belongs to. With nothing to run it sleeps on an
``asyncio.Event`` until a request arrives (no polling); the first step after idling starts at
the arrival time of the request that woke it.

A request aborted by a client disconnect leaves the engine at once (its KV blocks are freed
before the next scrape of ``vllm:kv_cache_usage_perc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from array import array
from collections.abc import Callable

from servefleet.engine import Engine, Request
from servefleet.engine.request import RequestStatus
from servefleet.sim.server.faults import FAULT_EXIT_CODE, Faults
from servefleet.sim.server.metrics import ServerMetrics
from servefleet.sim.server.textgen import OutputText
from servefleet.sim.server.timing import Waiter, clock

log = logging.getLogger("servefleet.sim.server")

LAG_WINDOW = 100_000
"""Steps whose lag is kept for the percentiles of ``/sim/stats``."""
GUARD_S = 0.5e-3
"""Handlers do not start writing within the waiter's margin plus this of a step's end."""
FEW_SEQS = 8
"""With this many sequences or fewer, handlers never hold back (their writes are short)."""
LATE_WRITE_INTERVAL_S = 0.05
"""While the loop is behind its schedule (overloaded: a small CPU, many streams, or steps
shorter than its own cost at a high --time-scale), a stream writes at most this often."""


class Seq:
    """One sequence (one choice of one HTTP request) inside the engine."""

    __slots__ = (
        "deltas",
        "done",
        "finish_reason",
        "gen",
        "http_id",
        "index",
        "max_tokens",
        "n_computed",
        "n_out",
        "n_sent",
        "num_cached",
        "req",
        "sink",
        "stop_reason",
        "streaming",
        "t_arrival",
        "t_first",
        "t_last",
        "t_scheduled",
    )

    def __init__(
        self,
        req: Request,
        gen: OutputText,
        sink: asyncio.Queue[Seq],
        index: int,
        streaming: bool,
        http_id: str,
        t_arrival: float,
    ) -> None:
        self.req = req
        self.gen = gen
        self.sink = sink
        """The HTTP request's queue: the loop puts the sequence there when it has news."""
        self.index = index
        self.streaming = streaming
        self.http_id = http_id
        self.max_tokens = req.max_tokens
        self.n_computed = 0
        """Output tokens the engine has sampled (ids known)."""
        self.n_out = 0
        """Output tokens delivered (their step has ended)."""
        self.n_sent = 0
        """Output tokens the HTTP handler has written out."""
        self.deltas: list[str] = []
        """Text of each delivered token not yet taken by the handler."""
        self.done = False
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.num_cached = 0
        self.t_arrival = t_arrival
        self.t_scheduled: float | None = None
        self.t_first: float | None = None
        self.t_last: float | None = None

    def take_text(self, limit: int | None = None) -> str:
        """The delivered text not yet taken, of at most ``limit`` tokens (one delta each)."""
        d = self.deltas
        if not d:
            return ""
        if limit is not None and limit < len(d):
            text = "".join(d[:limit])
            del d[:limit]
            return text
        text = d[0] if len(d) == 1 else "".join(d)
        d.clear()
        return text


class EngineLoop:
    def __init__(
        self,
        engine: Engine,
        metrics: ServerMetrics,
        faults: Faults,
        time_scale: float = 1.0,
        on_finish: Callable[[Seq], None] | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.metrics = metrics
        self.faults = faults
        self.time_scale = time_scale
        self.on_finish = on_finish
        self.seqs: dict[str, Seq] = {}
        self._wake = asyncio.Event()
        self._idle = True
        self._wake_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiter: Waiter | None = None
        self.lags = array("d", bytes(8 * LAG_WINDOW))
        """The last ``LAG_WINDOW`` steps' lags, a ring allocated (and touched) whole at start,
        so that the replica's memory does not grow while it fills."""
        self.lag_count = 0
        self.lag_last = 0.0
        self.lag_max = 0.0
        self.steps = 0
        self.tokens_delivered = 0
        self.model_busy = 0.0
        self._kv_queries = 0
        self._kv_hits = 0
        self.deadline = float("inf")
        """Modelled end of the step in flight (when its tokens are due)."""
        self.step_wall = 0.0
        self._delivered: asyncio.Future[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._waiter = Waiter()
            self._task = asyncio.create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for seq in list(self.seqs.values()):
            self.abort(seq)
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None

    # -- requests --------------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        self.seqs[seq.req.request_id] = seq
        self.engine.add_request(seq.req)
        if self._idle and self._wake_at is None:
            self._wake_at = seq.t_arrival
        self._wake.set()

    def abort(self, seq: Seq) -> None:
        """The client went away (or the server stops): free the sequence's KV now."""
        if seq.done:
            return
        self.engine.abort_request(seq.req.request_id)
        self._finish(seq, "abort", clock())
        seq.sink.put_nowait(seq)

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        engine, faults, waiter = self.engine, self.faults, self._waiter
        assert waiter is not None
        t = clock()
        idle = True
        while True:
            if not engine.has_unfinished:
                t, idle = await self._sleep_idle(), True
                continue
            if faults.stall_until > t:
                await faults.wait_out_stall(clock)
                t = max(t, clock())
            res = engine.step(from_idle=idle)
            if res is None:  # nothing can run until something changes (an abort or arrival)
                t, idle = await self._sleep_idle(), True
                continue
            idle = False
            assert res.output.reqs is not None  # the plain engine lists its requests
            sampled = self._on_computed(res.output.reqs, t)
            wall = self.step_wall = res.duration * faults.slowdown / self.time_scale
            t_end = self.deadline = t + wall
            await waiter.until(t_end, wall / 4)
            if faults.stall_until > t_end:  # a stall set during the step holds its tokens
                self.deadline = faults.stall_until
                await faults.wait_out_stall(clock)
                t_end = max(t_end, clock())
            now = clock()
            self.deadline = float("inf")
            if self._delivered is not None:  # handlers held back go first (fairness)
                if not self._delivered.done():
                    self._delivered.set_result(None)
                self._delivered = None
            self._record_step(res, now - t_end)
            self._deliver(sampled, now)
            t = t_end

    async def right_of_way(self, last_write: float) -> None:
        """Awaited by a stream handler before it writes (its previous write was at
        ``last_write``); returns when it may write.

        asyncio has no priorities: a burst of handler callbacks runs to its end before a timer
        can fire, and 256 writes take longer than a step on a small machine. So the engine loop
        gets the right of way: no write starts within the guard time before a step's tokens are
        due (the handler writes right after the delivery, its tokens in one chunk, as vLLM's do
        when its API server lags the engine); and while the loop is behind its schedule, a
        stream writes at most every ``LATE_WRITE_INTERVAL_S`` (sleeping in between, not woken
        by every step), so the loop can catch up instead of spiralling. With a few sequences
        none of this applies."""
        while len(self.seqs) > FEW_SEQS:
            waiter = self._waiter
            guard = min(GUARD_S + (waiter.margin if waiter else 0.0), self.step_wall / 4)
            now = clock()
            late = now - self.deadline
            if late < -guard:
                return
            if late > 0:
                wait = last_write + LATE_WRITE_INTERVAL_S - now
                if wait <= 0:
                    return
                await asyncio.sleep(wait)
                continue
            if self._delivered is None:
                self._delivered = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._delivered)  # shared: a disconnect must not cancel it

    async def _sleep_idle(self) -> float:
        self._idle = True
        self._wake.clear()
        self._wake_at = None
        await self._wake.wait()
        self._idle = False
        start = self._wake_at if self._wake_at is not None else clock()
        self._wake_at = None
        return start

    def _on_computed(self, reqs: list[Request], t_start: float) -> list[Seq]:
        """Right after ``step()``: give every newly sampled token its id (the prefix cache
        hashes full blocks of real ids), note first scheduling."""
        seqs = self.seqs
        sampled = []
        for req in reqs:
            seq = seqs.get(req.request_id)
            if seq is None:
                continue
            if seq.t_scheduled is None:
                seq.t_scheduled = t_start
                seq.num_cached = req.num_cached_tokens or 0
            n = req.num_output_tokens
            if seq.n_computed < n:
                ids = req.content.ids  # type: ignore[attr-defined]
                while seq.n_computed < n:
                    ids.append(seq.gen.token_id(seq.n_computed))
                    seq.n_computed += 1
                sampled.append(seq)
        return sampled

    def _record_step(self, res, lag: float) -> None:
        m = self.metrics
        self.steps += 1
        self.model_busy += res.duration
        self.lag_last = lag
        self.lags[self.lag_count % LAG_WINDOW] = lag
        self.lag_count += 1
        if lag > self.lag_max:
            self.lag_max = lag
            m.lag_max.set(lag)
        m.step_lag.observe(lag)
        m.steps.inc()
        m.record_busy(res.duration)
        out = res.output
        m.iteration_tokens.observe(out.num_tokens)
        if out.preempted:
            m.num_preemptions.inc(len(out.preempted))
        stats = self.engine.scheduler.kv.stats
        if stats.queries != self._kv_queries:
            m.prefix_cache_queries.inc(stats.queries - self._kv_queries)
            m.prefix_cache_hits.inc(stats.hits - self._kv_hits)
            self._kv_queries, self._kv_hits = stats.queries, stats.hits

    def _deliver(self, sampled: list[Seq], now: float) -> None:
        m = self.metrics
        itl = m.inter_token_latency
        exit_after = self.faults.exit_after_tokens
        n_tokens = 0
        for seq in sampled:
            if seq.done:
                continue
            k = seq.n_out
            seq.n_out = k + 1
            n_tokens += 1
            req = seq.req
            token_id = req.content.ids[req.num_prompt_tokens + k]  # type: ignore[attr-defined]
            seq.deltas.append(seq.gen.advance(k, token_id))
            if k == 0:
                self._first_token(seq, now)
            else:
                itl.observe(now - seq.t_last)
            seq.t_last = now
            if seq.gen.stop_reason is not None:
                seq.stop_reason = seq.gen.stop_reason
                self.engine.stop_request(req.request_id)
                self._finish(seq, "stop", now)
            elif seq.n_out >= seq.max_tokens or req.status == RequestStatus.FINISHED_LENGTH:
                seq.deltas[-1] += seq.gen.flush()  # text held back for stop strings
                self._finish(seq, "length", now)
            seq.sink.put_nowait(seq)
            if exit_after is not None and seq.n_out >= exit_after and not seq.streaming:
                fault_exit(f"exit_after_tokens={exit_after} reached by {seq.http_id}")
        if n_tokens:
            self.tokens_delivered += n_tokens
            m.generation_tokens.inc(n_tokens)

    def _first_token(self, seq: Seq, now: float) -> None:
        m = self.metrics
        seq.t_first = now
        m.time_to_first_token.observe(now - seq.t_arrival)
        prompt = seq.req.num_prompt_tokens
        cached = seq.num_cached
        m.prompt_tokens.inc(prompt)
        m.prompt_tokens_by_source["local_compute"].inc(prompt - cached)
        if cached:
            m.prompt_tokens_by_source["local_cache_hit"].inc(cached)
            m.prompt_tokens_cached.inc(cached)

    def _finish(self, seq: Seq, reason: str, now: float) -> None:
        seq.done = True
        seq.finish_reason = reason
        self.seqs.pop(seq.req.request_id, None)
        m = self.metrics
        m.request_success[reason].inc()
        m.e2e_request_latency.observe(now - seq.t_arrival)
        if seq.t_scheduled is not None:
            m.request_queue_time.observe(max(0.0, seq.t_scheduled - seq.t_arrival))
        if seq.t_first is not None and seq.t_scheduled is not None:
            last = seq.t_last if seq.t_last is not None else now
            m.request_prefill_time.observe(seq.t_first - seq.t_scheduled)
            m.request_decode_time.observe(last - seq.t_first)
            m.request_inference_time.observe(last - seq.t_scheduled)
            if seq.n_out > 1:
                m.request_time_per_output_token.observe((last - seq.t_first) / (seq.n_out - 1))
        m.request_prompt_tokens.observe(seq.req.num_prompt_tokens)
        m.request_generation_tokens.observe(seq.n_out)
        m.request_params_max_tokens.observe(seq.max_tokens)
        m.request_max_num_generation_tokens.observe(seq.max_tokens)
        m.request_prefill_kv_computed_tokens.observe(seq.req.num_prompt_tokens - seq.num_cached)
        if seq.req.num_recomputed_tokens:
            m.recomputed_tokens.inc(seq.req.num_recomputed_tokens)
        if self.on_finish is not None:
            self.on_finish(seq)

    # -- introspection ---------------------------------------------------------------------
    def stats(self) -> dict[str, float | int]:
        n = min(self.lag_count, LAG_WINDOW)
        lags = sorted(self.lags[:n])

        def pct(p: float) -> float:
            return lags[min(n - 1, int(p * n))] if n else 0.0

        waiter = self._waiter
        return {
            "steps": self.steps,
            "tokens_delivered": self.tokens_delivered,
            "model_busy_seconds": self.model_busy,
            "lag_window_steps": n,
            "lag_p50_seconds": pct(0.50),
            "lag_p99_seconds": pct(0.99),
            "lag_max_seconds": lags[-1] if n else 0.0,
            "lag_max_since_start_seconds": self.lag_max,
            "spin_margin_seconds": waiter.margin if waiter else 0.0,
            "spin_yields": waiter.yields if waiter else 0,
            "running": self.engine.num_running,
            "waiting": self.engine.num_waiting,
            "kv_cache_usage": self.engine.kv_usage,
            "process_cpu_seconds": time.process_time(),
        }

    def reset_stats(self) -> None:
        self.lags.clear()
        self.lag_max = 0.0


def fault_exit(reason: str) -> None:
    """Die now, as a crashed replica does: no shutdown, connections cut."""
    log.error("fault_exit", extra={"fields": {"reason": reason, "exit_code": FAULT_EXIT_CODE}})
    for h in logging.getLogger().handlers + log.handlers:
        h.flush()
    os._exit(FAULT_EXIT_CODE)
