"""Discrete-event simulation of N engine replicas behind a router, on a simulated clock.

Events are arrivals (from a ``WorkloadSource``), step ends and the API servers' work finishing.
A request goes through its replica's API server (``Frontend``) to the scheduler; an idle replica
with work starts a step at once, and the next when it ends; a step's tokens go back through the
API server, and reach the client (are recorded) when it has sent them. The same routing policy
objects as the gateway's decide where each request goes. A replica's quiet steps (nothing but
decodes: ``ReplicaEngine.quiet_durations``) share one event (``QuietRun``). Each replica's
engine is the fast path or the plain rule (``ClusterSim(fast=...)``, ``sim.replicas``).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from servefleet.client_protocol import SDK_CHAT, ClientProtocol
from servefleet.engine.config import SchedulerConfig
from servefleet.engine.cost_model import CostModel
from servefleet.fastpath.contract import OwnContent
from servefleet.records import RequestRecord
from servefleet.routing.base import (
    PENDING_PREFILLS,
    PREFIX_HASHES,
    ReplicaView,
    RequestContext,
    RoutingPolicy,
)
from servefleet.routing.load_index import LoadIndex
from servefleet.routing.prefix import segment_prefix_hashes
from servefleet.sim.client_protocol import stream_work
from servefleet.sim.frontend import NOTHING, Delivery, Frontend
from servefleet.sim.replicas import ReplicaEngine, ReplicaRequest, ReplicaStep, replica_engine
from servefleet.sim.resend import EXACT, AnswerResend
from servefleet.workload.types import RequestSpec, WorkloadSource

# Final: compiled code reads these as constants (docs/simulate.md, "A compiled core")
heappush: Final = heapq.heappush
heappop: Final = heapq.heappop
bisect_right: Final = bisect.bisect_right
_STEP_END: Final = 0
_ARRIVAL: Final = 1
_ENQUEUE: Final = 2
_FRONTEND: Final = 3
MAX_CONSECUTIVE_REJECTIONS: Final = 10_000
QUIET_RUN_LIMIT: Final = 32
"""The most quiet steps planned at once (a run cut short has planned some in vain)."""


class StepLog:
    """When each step of one replica ended and when the API server had sent its tokens to
    the clients (columns, one row per step; typed arrays, 8 bytes a value), when each step
    started, and the peak KV cache usage.

    A step starts when the one before it ends, unless it waited (an idle engine, a GPU shared
    with other replicas): only those starts are kept (``_gap_steps``, ``_gap_starts``). So
    a step writes one value, its end; its delivery time is written when the API server sends
    its tokens (0 until then, and for a step with none). The columns are written by index and
    doubled when full (docs/simulate.md, "A compiled core"); ``rows`` of them are used."""

    __slots__ = (
        "_delivered",
        "_end",
        "_gap_starts",
        "_gap_steps",
        "_last_end",
        "peak_kv_usage",
        "rows",
    )

    def __init__(self) -> None:
        self._end = array("d", bytes(8 * 64))
        self._delivered = array("d", bytes(8 * 64))
        """When the API server had sent the step's tokens to the clients."""
        self._gap_steps = array("q")
        """The steps that did not start when the one before them ended, in order."""
        self._gap_starts = array("d")
        """When each of them started."""
        self._last_end = -math.inf
        """The last step's end (``_end[rows - 1]``, kept as a float: an array read from
        compiled code boxes it)."""
        self.rows = 0
        self.peak_kv_usage = 0.0

    @property
    def start(self) -> array:
        starts = array("d", [0.0]) + self._end[: max(self.rows - 1, 0)]
        for step, t in zip(self._gap_steps, self._gap_starts, strict=True):
            starts[step] = t
        return starts[: self.rows]

    @property
    def end(self) -> array:
        return self._end[: self.rows]

    @property
    def delivered(self) -> array:
        """When each step's tokens were sent; a step that sent none: its end."""
        delivered, end = self._delivered[: self.rows], self._end
        for i in range(self.rows):
            if delivered[i] == 0.0:  # never sent (steps end after 0)
                delivered[i] = end[i]
        return delivered

    def add(self, start: float, duration: float, kv_usage: float) -> None:
        i = self.rows
        n = len(self._end)
        if i == n:  # full: double the columns
            self._end += self._end
            self._delivered.frombytes(bytes(8 * n))
        if start != self._last_end:
            self._gap_steps.append(i)
            self._gap_starts.append(start)
        end = start + duration
        self._end[i] = end
        self._last_end = end
        self.rows = i + 1
        if kv_usage > self.peak_kv_usage:
            self.peak_kv_usage = kv_usage

    def deliver(self, first: int, last: int, t: float) -> None:
        """Steps ``first..last``'s tokens were sent at ``t``."""
        if first == last:
            self._delivered[first] = t
        else:
            self._delivered[first : last + 1] = array("d", [t]) * (last + 1 - first)

    def started(self, step: int) -> float:
        gaps = self._gap_steps
        j = bisect_right(gaps, step) - 1
        if j >= 0 and gaps[j] == step:
            return self._gap_starts[j]
        return self._end[step - 1]

    def delivered_at(self, step: int) -> float:
        return self._delivered[step]

    def delivered_rows(self, start: int, end: int) -> bytes:
        """The delivery times of steps ``start..end-1`` (doubles)."""
        return self._delivered[start:end].tobytes()


@dataclass(slots=True)
class SharedGPU:
    """GPUs that several replicas share: their steps take turns (CUDA time-slices the
    contexts of different processes; their kernels do not overlap). A step is scheduled when
    its engine is free and runs when the GPU is."""

    switch_s: float = 0.0
    """Time lost when the GPU turns from one replica's step to another's."""
    free_at: float = 0.0
    last: str | None = None

    def run(self, ready: float, duration: float, owner: str) -> float:
        """Start ``owner``'s step, ready at ``ready``: returns when it starts."""
        start = max(ready, self.free_at)
        if self.last is not None and self.last != owner:
            start += self.switch_s
        self.last = owner
        self.free_at = start + duration
        return start


class QuietRun:
    """A replica's quiet steps (``ReplicaEngine.quiet_durations``), run lazily: one event at the
    last one's end, not one a step. Each step is run (``ReplicaEngine.quiet_step``, its log row) when
    the one before it ends and its tokens are streamed then, as the event of each would do,
    whenever the replica is next touched (``ClusterSim._run_to``) or at the run's end. A
    request reaching the scheduler cuts the run where it could join (``ReplicaEngine.still_quiet``)."""

    __slots__ = ("durations", "end", "i", "k", "n", "step")

    def __init__(self, durations: list[float], step: int, n: int, start: float) -> None:
        self.durations = durations
        self.k = len(durations)
        """Steps in the run (fewer once cut)."""
        self.i = 0
        """The step in flight (run, its tokens not streamed yet), an index of ``durations``."""
        self.step = step
        """Its engine step index."""
        self.n = n
        """Requests in each step (each decodes and samples one token)."""
        self.end = start + durations[0]
        """When the step in flight ends."""

    def last_end(self) -> float:
        """When the run's last step ends (added up step after step, as they are run)."""
        end = self.end
        for j in range(self.i + 1, self.k):
            end = end + self.durations[j]
        return end

    def cut(self, k: int) -> float:
        """Keep the steps before ``k`` (more than ``i``); returns when the last ends."""
        self.k = k
        return self.last_end()


@dataclass(slots=True)
class SimReplica:
    name: str
    config: SchedulerConfig
    cost: CostModel
    pool: str = "default"
    gpu: SharedGPU | None = None
    """Set when the replica shares its GPUs with others."""
    client: ClientProtocol = SDK_CHAT
    """How its clients stream (the API server's work per chunk and token)."""
    engine: ReplicaEngine = field(init=False)
    """Made by the ``ClusterSim`` that runs it (``sim.replicas.replica_engine``)."""
    view: ReplicaView = field(init=False)
    log: StepLog = field(default_factory=StepLog)
    busy: bool = False
    frontend: Frontend = field(init=False)
    frontend_due: float | None = None
    """When the pending ``_FRONTEND`` event of this replica is (others are stale); None: none."""
    result: ReplicaStep | None = None
    """The step in flight, unless it is a quiet run's."""
    run: QuietRun | None = None
    """The quiet run in flight."""
    end_seq: int = -1
    """The sequence number of the ``_STEP_END`` event of the step in flight (a quiet run cut
    short leaves a stale one)."""
    rows_sent: int = 0
    """The log's rows before this one went out with finished requests (``FinishedRequest``)."""

    def __post_init__(self) -> None:
        eff = self.cost.eff
        chunk_s, token_s = stream_work(eff, self.client)
        self.frontend = Frontend(
            eff.request_latency_s,
            eff.frontend_request_s,
            eff.frontend_prompt_token_s,
            chunk_s,
            token_s,
        )
        cfg = self.config
        self.view = ReplicaView(
            self.name,
            self.pool,
            cost=self.cost,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
        )


class _InFlight:
    """A request routed and not finished (a plain class with its own ``__init__``:
    docs/simulate.md, "A compiled core")."""

    __slots__ = ("replica", "request", "sent", "spec")

    def __init__(
        self, spec: RequestSpec, replica: SimReplica, request: ReplicaRequest, sent: RequestSpec
    ) -> None:
        self.spec = spec
        """The request as the server sees it (resent answers re-tokenized)."""
        self.replica = replica
        self.request = request
        self.sent = sent
        """The request as the workload made it (its next turn is built from this)."""


class FinishedRequest(NamedTuple):
    """A request's record before its token times are found and grouped into stream chunks
    (the fields of ``RequestRecord``, with the steps that made its tokens in place of the
    chunks): what the event loop hands on as a request finishes, a tuple, made in the loop and
    sent to another process as it is (docs/simulate.md, "Records on a second core"). ``TokenTimes`` and ``record_of`` make the record, here or there, from the
    finished requests in the order they came.

    A request's token times are the delivery times of its steps in its replica's log. Each
    finished request carries the rows of that log its replica's earlier ones did not (all
    final: the API server sends steps in order); ``TokenTimes`` keeps them and reads the
    request's steps there. A few rows a request, read while they are fresh, instead of its
    every token's time read from a log gone cold (on a large fleet) and sent on."""

    request_id: str
    class_name: str
    scheduled_time: float
    send_time: float
    rows: bytes
    """The delivery times (doubles) of the replica's steps from the first one no request
    carried before to this request's last (``StepLog.delivered_rows``)."""
    runs: list[list[int]]
    """The steps that emitted its tokens, as runs ``[first_step, count]``."""
    end_time: float | None
    prompt_tokens: int
    output_tokens: int
    target_prompt_tokens: int | None
    target_output_tokens: int | None
    cached_tokens: int | None = None
    preemptions: int | None = None
    recomputed_tokens: int | None = None
    queue_time: float | None = None
    finish_reason: str | None = None
    status: str = "ok"
    error: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    turn: int = 0
    replica: str | None = None


class TokenTimes:
    """When each step of each replica had its tokens sent, as far as the finished requests
    handed to it (all, in the order they finished) have carried it: ``of(f)`` takes in the
    rows ``f`` carries and answers when each of its tokens was sent."""

    __slots__ = ("_delivered",)

    def __init__(self) -> None:
        self._delivered: dict[str, array] = {}
        """Replica -> its steps' delivery times, from step 0."""

    def of(self, f: FinishedRequest) -> array:
        """When each of ``f``'s tokens reached the client, in order."""
        times = array("d")
        if f.replica is None:
            return times  # rejected before any replica saw it: no tokens
        column = self._delivered.get(f.replica)
        if column is None:
            column = self._delivered[f.replica] = array("d")
        if f.rows:
            column.frombytes(f.rows)
        for first, count in f.runs:
            times += column[first : first + count]
        return times


def record_of(f: FinishedRequest, token_times: array) -> RequestRecord:
    """The request's record, from its tokens' times (``TokenTimes.of``): tokens sent
    together make one chunk (``_chunks``)."""
    times: list[float] = token_times.tolist()
    chunk_times, chunk_tokens = _chunks(times)
    return RequestRecord(
        request_id=f.request_id,
        class_name=f.class_name,
        scheduled_time=f.scheduled_time,
        send_time=f.send_time,
        first_token_time=times[0] if times else None,
        end_time=f.end_time,
        chunk_times=chunk_times,
        chunk_tokens=chunk_tokens,
        prompt_tokens=f.prompt_tokens,
        output_tokens=f.output_tokens,
        target_prompt_tokens=f.target_prompt_tokens,
        target_output_tokens=f.target_output_tokens,
        cached_tokens=f.cached_tokens,
        preemptions=f.preemptions,
        recomputed_tokens=f.recomputed_tokens,
        queue_time=f.queue_time,
        finish_reason=f.finish_reason,
        status=f.status,  # type: ignore[arg-type]
        error=f.error,
        session_id=f.session_id,
        user_id=f.user_id,
        turn=f.turn,
        replica=f.replica,
    )


@dataclass(slots=True)
class SimResult:
    records: list[RequestRecord]
    """Every request's record in the order they finished (empty when ``on_record`` took them)."""
    replicas: list[SimReplica]
    end_time: float
    """Simulated time when the last event happened."""
    arrivals_stopped_at: float
    stopped_at: float | None = None
    """Set when ``run`` gave up early (``stop_waiting``): requests in flight then have no
    record."""
    events: int = 0
    """Events handled (stale ones included)."""


def rejection_error(why: str, replica: str | None) -> str:
    """A rejected request's error as the live world's client records it: a replica refuses
    what it cannot serve with vLLM's HTTP 400; with no replica to route to, the gateway answers
    HTTP 503."""
    return f"HTTP {400 if replica is not None else 503}: {why}"


class ClusterSim:
    """Run a workload through replicas: one record per request sent, given to ``on_record`` as
    the request finishes (default: kept in ``SimResult.records``), or, with ``on_finished``,
    the ``FinishedRequest`` it is made from (for ``record_of`` elsewhere). ``fast``: each
    replica runs the fast path; False: the plain rule (``sim.replicas``: the same results, an
    event a step, for tests and checks)."""

    def __init__(
        self,
        replicas: Sequence[SimReplica],
        policy: RoutingPolicy,
        source: WorkloadSource,
        answers: AnswerResend = EXACT,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_finished: Callable[[FinishedRequest], None] | None = None,
        fast: bool = True,
    ) -> None:
        if not replicas:
            raise ValueError("a cluster needs at least one replica")
        if on_record is not None and on_finished is not None:
            raise ValueError("give on_record or on_finished, not both")
        if len({r.name for r in replicas}) < len(replicas):
            raise ValueError("replica names must differ (records and token times name them)")
        self.replicas = list(replicas)
        contract = OwnContent()  # what the requests own, fleet-wide (``fastpath.contract``)
        for r in self.replicas:
            r.engine = replica_engine(r.config, r.cost, fast, contract)
        self.policy = policy
        self.source = source
        self.answers = answers
        """How the servers tokenize the answers a session resends (``sim.resend``)."""
        self._exact_answers = answers.exact
        """Every request is sent as it is (no call per request to find that out)."""
        self._events: list[tuple[float, int, int, Any]] = []
        """(time, kind, sequence, payload): a kind's payload is what its handler takes."""
        self._seq = 0
        """The next event's sequence number (ties in time and kind go first in, first out)."""
        self._in_flight: dict[str, _InFlight] = {}
        self._records: list[RequestRecord] = []
        self._on_record = on_record or self._records.append
        self._on_finished = on_finished
        self._token_times = TokenTimes()
        """For the records made here (without ``on_finished``)."""
        self._rejections = 0
        self._duration = 0.0
        self._by_view = {id(r.view): r for r in self.replicas}
        self._tracks_prefills = PENDING_PREFILLS in policy.needs
        self._views = LoadIndex(
            [r.view for r in self.replicas], tracks_prefills=self._tracks_prefills
        )
        """What the policy picks from, kept up to date as requests are routed and finish."""
        self._wants_prefixes = PREFIX_HASHES in policy.needs
        self._awaiting_first = 0
        """Requests routed and not yet given their first token (a request is one until its
        first token's step ends: ``Request.num_output_tokens`` is then no longer 0): the sum of
        the views' ``pending_prefills``, kept for ``stop_waiting`` at every arrival."""

    # -- event plumbing --------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> int:
        seq = self._seq
        self._seq = seq + 1
        heappush(self._events, (t, kind, seq, payload))
        return seq

    def run(
        self,
        duration: float,
        max_requests: int | None = None,
        stop_waiting: int | None = None,
        on_progress: Callable[[float], None] | None = None,
    ) -> SimResult:
        """Send arrivals until ``duration`` simulated seconds (or ``max_requests``), then let
        every request in flight finish. ``stop_waiting``: give up as soon as more requests than
        this wait for their first token at an arrival (a run clearly failing its TTFT SLO).
        ``on_progress(t)``: told the simulated time at the first arrival past each hundredth of
        ``duration`` (for a progress display; not while the requests in flight finish).

        Python's cyclic garbage collector is off during the run: the run makes next to no
        cyclic garbage (``tests/test_sim.py`` checks), while the collector would rescan every
        live object of the fleet again and again (docs/simulate.md, "How it is made fast")."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(duration, max_requests, stop_waiting, on_progress)
        finally:
            if collecting:
                gc.enable()

    def _run(
        self,
        duration: float,
        max_requests: int | None,
        stop_waiting: int | None,
        on_progress: Callable[[float], None] | None,
    ) -> SimResult:
        self._duration = duration
        initial: Iterator[RequestSpec] = iter(self.source.initial())
        sent = 0
        self._next_initial(initial, duration)
        t = 0.0
        events = 0
        tick = duration / 100
        report = on_progress if on_progress is not None and tick > 0 else None
        next_report = tick if report is not None else math.inf
        while self._events:
            t, kind, seq, payload = heappop(self._events)
            events += 1
            if kind == _STEP_END:
                self._on_step_end(t, seq, payload)
            elif kind == _FRONTEND:
                self._on_frontend(t, payload)
            elif kind == _ENQUEUE:
                self._enqueue(t, *payload)
            else:
                spec, from_initial = payload
                if from_initial:
                    self._next_initial(initial, duration)
                if max_requests is not None and sent >= max_requests:
                    continue
                sent += 1
                if report is not None and t >= next_report:
                    report(t)
                    next_report = (t // tick + 1) * tick
                self._on_arrival(t, spec)
                if stop_waiting is not None and self._awaiting_first > stop_waiting:
                    self._sent_tokens_logged(until=t)
                    return SimResult(
                        self._records, self.replicas, t, duration, stopped_at=t, events=events
                    )
        self._sent_tokens_logged()
        return SimResult(self._records, self.replicas, t, duration, events=events)

    def _sent_tokens_logged(self, until: float = math.inf) -> None:
        """Time the deliveries no event was needed for (``_frontend_changed``), done before
        ``until``, in the logs (every task done before it that matters to others has had its
        event, so only these are left)."""
        for replica in self.replicas:
            self._run_to(replica, until)
            self._frontend_work(until, replica, inclusive=False)

    def _next_initial(self, it: Iterator[RequestSpec], duration: float) -> None:
        spec = next(it, None)
        if spec is not None and spec.arrival_time < duration:
            self._push(spec.arrival_time, _ARRIVAL, (spec, True))

    # -- arrivals --------------------------------------------------------------------------
    def _on_arrival(self, t: float, sent: RequestSpec) -> None:
        spec = sent if self._exact_answers else self.answers.apply(sent)
        prompt_tokens = spec.prompt_tokens  # a sum over the segments: once
        hashes = segment_prefix_hashes(spec.prompt, spec.request_id) if self._wants_prefixes else ()
        ctx = RequestContext(
            spec.request_id,
            prompt_tokens,
            spec.max_tokens,
            spec.session_id or spec.user_id,
            hashes,
        )
        choice = self.policy.select(self._views, ctx)
        replica = self._by_view.get(id(choice.replica)) if choice is not None else None
        if replica is None:
            self._reject(t, spec, sent, "no replica available")
            return
        engine = replica.engine
        why = engine.validate(prompt_tokens, spec.max_tokens)
        if why is not None:
            self._reject(t, spec, sent, why, replica.name)
            return
        self._rejections = 0
        req = engine.new_request(
            spec.request_id,
            spec.prompt,
            prompt_tokens,
            spec.max_tokens,
            spec.session_id is not None,
            t,
        )
        self._in_flight[spec.request_id] = _InFlight(spec, replica, req, sent)
        view = replica.view
        view.in_flight += 1
        view.in_flight_tokens += prompt_tokens + spec.max_tokens
        view.pending_prefills += 1
        view.pending_prefill_tokens += prompt_tokens
        self._views.update(view)
        self._awaiting_first += 1
        self.policy.on_routed(view, ctx)
        self._run_to(replica, t)
        self._frontend_work(t, replica, inclusive=False)
        replica.frontend.admit(t, prompt_tokens, req)
        self._frontend_changed(replica)

    # -- the API servers -------------------------------------------------------------------
    def _frontend_changed(self, replica: SimReplica) -> None:
        """Keep one event at the API server's next task that matters to others (none while it
        only sends tokens: those are timed when the API server is next touched)."""
        due = replica.frontend.next_event()
        if due == math.inf:
            replica.frontend_due = None
        elif due != replica.frontend_due:
            replica.frontend_due = due
            self._push(due, _FRONTEND, replica)

    def _on_frontend(self, t: float, replica: SimReplica) -> None:
        self._run_to(replica, t)
        if t != replica.frontend_due:
            return  # stale: the API server's work changed since
        replica.frontend_due = None
        self._frontend_work(t, replica, inclusive=True)
        self._frontend_changed(replica)

    def _frontend_work(self, t: float, replica: SimReplica, inclusive: bool) -> None:
        """The API server's work done by ``t`` (before it, unless ``inclusive``: at equal times
        step ends and arrivals come first), each piece at its own time."""
        admitted, delivered = replica.frontend.advance(t, inclusive)
        latency = replica.frontend.latency_s
        for done, req in admitted:
            if latency > 0:
                self._push(done + latency, _ENQUEUE, (replica, req))
            else:
                self._enqueue(done, replica, req)
        for d in delivered:
            self._deliver(replica, d)

    def _deliver(self, replica: SimReplica, d: Delivery) -> None:
        """The API server has sent steps ``d.first_step..d.last_step``'s tokens at ``d.time``."""
        replica.log.deliver(d.first_step, d.last_step, d.time)
        for req in d.finished:
            self._finish(d.time, replica, req)

    def _enqueue(self, t: float, replica: SimReplica, req: ReplicaRequest) -> None:
        """The request reaches the replica's scheduler (after its front end)."""
        self._run_to(replica, t)
        replica.engine.add_request(req)
        run = replica.run
        if run is not None:
            keep = run.i + 1 + replica.engine.still_quiet(run.k - run.i - 1)
            if keep < run.k:  # the steps from ``keep`` on are no longer quiet
                replica.end_seq = self._push(run.cut(keep), _STEP_END, replica)
        elif not replica.busy:
            self._start_step(t, replica, from_idle=True)

    def _emit(self, f: FinishedRequest) -> None:
        if self._on_finished is not None:
            self._on_finished(f)
        else:
            self._on_record(record_of(f, self._token_times.of(f)))

    def _reject(
        self, t: float, spec: RequestSpec, sent: RequestSpec, why: str, replica: str | None = None
    ) -> None:
        self._rejections += 1
        if self._rejections > MAX_CONSECUTIVE_REJECTIONS:
            raise ValueError(f"the workload's requests cannot be served: {why}")
        self._emit(
            FinishedRequest(
                request_id=spec.request_id,
                class_name=spec.class_name,
                scheduled_time=spec.arrival_time,
                send_time=t,
                rows=b"",
                runs=[],
                end_time=t,
                prompt_tokens=spec.prompt_tokens,
                output_tokens=0,
                target_prompt_tokens=sent.prompt_tokens,
                target_output_tokens=spec.max_tokens,
                status="error",
                error=rejection_error(why, replica),
                session_id=spec.session_id,
                user_id=spec.user_id,
                turn=spec.turn,
                replica=replica,
            )
        )
        self._follow_ups(sent, t, 0)

    def _follow_ups(self, spec: RequestSpec, t: float, output_tokens: int) -> None:
        for nxt in self.source.on_finish(spec, t, output_tokens):
            if nxt.arrival_time < self._duration:
                self._push(max(nxt.arrival_time, t), _ARRIVAL, (nxt, False))

    # -- steps -----------------------------------------------------------------------------
    def _start_step(self, t: float, replica: SimReplica, from_idle: bool = False) -> None:
        engine = replica.engine
        if replica.gpu is None and not from_idle:
            durations = engine.quiet_durations(QUIET_RUN_LIMIT)
            if durations:
                run = QuietRun(durations, engine.step_index, engine.num_running, t)
                replica.run = run
                replica.busy = True
                replica.log.add(t, durations[0], engine.quiet_step(durations[0]))
                replica.end_seq = self._push(run.last_end(), _STEP_END, replica)
                return
        result = engine.step(from_idle)
        if result is None:
            replica.busy = False
            return
        replica.busy = True
        if replica.gpu is not None:
            t = replica.gpu.run(t, result.duration, replica.name)
        replica.log.add(t, result.duration, result.kv_usage)
        replica.result = result
        replica.end_seq = self._push(t + result.duration, _STEP_END, replica)

    def _run_to(self, replica: SimReplica, t: float) -> None:
        """Bring ``replica``'s quiet run up to ``t``: the steps that ended by then (before the
        run's last) have their tokens streamed, and the next step run, each at its end."""
        run = replica.run
        if run is None:
            return
        while run.i + 1 < run.k and run.end <= t:
            end = run.end
            self._stream(end, replica, run.step, run.n, NOTHING)
            assert run.i + 1 < run.k, "a quiet run was cut while its tokens were streamed"
            run.i += 1
            run.step += 1
            d = run.durations[run.i]
            replica.log.add(end, d, replica.engine.quiet_step(d))
            run.end = end + d

    def _on_step_end(self, t: float, seq: int, replica: SimReplica) -> None:
        if seq != replica.end_seq:
            return  # a quiet run's, cut short since
        run = replica.run
        if run is not None:
            self._run_to(replica, t)
            assert run.end == t and run.i + 1 == run.k
            replica.run = None
            self._stream(t, replica, run.step, run.n, NOTHING)
            self._start_step(t, replica)
            return
        result = replica.result
        assert result is not None
        replica.result = None
        for req in result.output.first_tokens:
            self._prefill_done(replica.view, req)
        out = result.output
        if out.num_sampled or result.finished:
            self._stream(t, replica, result.step, out.num_sampled, result.finished)
        self._start_step(t, replica)

    def _stream(
        self, t: float, replica: SimReplica, step: int, num_sampled: int, finished: list
    ) -> None:
        """Step ``step`` ended at ``t``: its tokens go to the API server."""
        self._frontend_work(t, replica, inclusive=False)
        replica.frontend.stream(t, step, num_sampled, finished)
        self._frontend_changed(replica)

    def _prefill_done(self, view: ReplicaView, req: ReplicaRequest) -> None:
        """``req`` got its first token (once: the step that made it ended)."""
        self._awaiting_first -= 1
        view.pending_prefills -= 1
        view.pending_prefill_tokens -= req.num_prompt_tokens
        if self._tracks_prefills:
            self._views.update(view)

    def _finish(self, t: float, replica: SimReplica, req: ReplicaRequest) -> None:
        fl = self._in_flight.pop(req.request_id)
        spec = fl.spec
        view = replica.view
        if req.num_output_tokens == 0:  # finished before its first token
            self._prefill_done(view, req)
        view.in_flight -= 1
        view.in_flight_tokens -= req.num_prompt_tokens + spec.max_tokens
        self._views.update(view)
        target_prompt = req.num_prompt_tokens if fl.sent is spec else fl.sent.prompt_tokens
        self._emit(self._finished(replica, spec, target_prompt, req))
        self._follow_ups(fl.sent, t, req.num_output_tokens)

    def _finished(
        self, replica: SimReplica, spec: RequestSpec, target_prompt: int, req: ReplicaRequest
    ) -> FinishedRequest:
        log, runs = replica.log, req.token_runs
        last = runs[-1][0] + runs[-1][1] if runs else 0  # after its last step
        rows = b""
        if last > replica.rows_sent:  # the steps up to its last are all delivered
            rows = log.delivered_rows(replica.rows_sent, last)
            replica.rows_sent = last
        first_sched = req.first_scheduled_step
        # positional, in the fields' order (docs/simulate.md, "A compiled core")
        return FinishedRequest(
            spec.request_id,
            spec.class_name,
            spec.arrival_time,  # scheduled_time
            req.arrival_time,  # send_time
            rows,
            runs,
            log.delivered_at(last - 1) if runs else None,  # end_time
            req.num_prompt_tokens,
            req.num_output_tokens,
            target_prompt,
            spec.max_tokens,  # target_output_tokens
            req.num_cached_tokens,
            req.num_preemptions,
            req.num_recomputed_tokens,
            (replica.log.started(first_sched) - req.arrival_time)  # queue_time
            if first_sched is not None
            else None,
            req.status.finish_reason,
            "ok",
            None,  # error
            spec.session_id,
            spec.user_id,
            spec.turn,
            replica.name,
        )


def _chunks(times: list[float]) -> tuple[list[float], list[int]]:
    """Token delivery times (in order) as stream chunks: tokens sent together make one chunk.

    Loops over the list with a ``float`` "previous", never ``float | None``
    (docs/simulate.md, "A compiled core")."""
    prev = -math.inf
    for t in times:  # usually none are equal
        if t == prev:
            break
        prev = t
    else:
        return times, [1] * len(times)
    chunk_times: list[float] = []
    chunk_tokens: list[int] = []
    prev = -math.inf
    for t in times:
        if t == prev:
            chunk_tokens[-1] += 1
        else:
            chunk_times.append(t)
            chunk_tokens.append(1)
            prev = t
    return chunk_times, chunk_tokens
