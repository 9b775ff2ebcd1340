"""Forwarding one generation request: the one path every request takes.

Pick a replica (``router``), try it (``attempt.Attempt``: a ``Result``), and let the pure
``retry.RetryPlan`` say what next — answer, retry elsewhere, resume a stream elsewhere from
what the client has (``stream.StreamState``), or give up — and whom to blame: only the
replica faults it settles on reach a breaker (``on_failure``); a client error, an overloaded
replica, or a request that failed alike on two replicas count against none.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections.abc import Callable

from aiohttp import web

from servefleet.gateway.attempt import Attempt, Call, Outcome, Result
from servefleet.gateway.config import GatewayConfig
from servefleet.gateway.errors import GatewayError
from servefleet.gateway.metrics import GatewayMetrics
from servefleet.gateway.replica import Replica
from servefleet.gateway.retry import (
    CLIENT_ERROR,
    FAULT,
    GIVE_UP,
    OK,
    POISON,
    RESUME,
    Failure,
    RetryPlan,
)
from servefleet.gateway.router import Router


class Forwarder:
    def __init__(
        self,
        cfg: GatewayConfig,
        router: Router,
        metrics: GatewayMetrics,
        on_failure: Callable[[Replica, str], None],
        on_suspect: Callable[[Replica], None],
        on_down: Callable[[Replica, str], None],
    ) -> None:
        self.cfg = cfg
        self.router = router
        self.metrics = metrics
        self.on_failure = on_failure
        """Called with (replica, why) for each failure blamed on a replica."""
        self.on_suspect = on_suspect
        """Called with a replica that failed an attempt, blamed yet or not (a health check)."""
        self.on_down = on_down
        """Called with a replica that refused a connection: down for every request at once."""
        self._rng = random.Random()

    async def forward(self, call: Call) -> tuple[web.StreamResponse, Outcome]:
        cfg = self.cfg
        r = cfg.retry
        replicas = len(self.router.serving(call.parsed.model))
        plan = RetryPlan(
            r.max_attempts, cfg.stream.max_resumes, r.backoff_base, r.backoff_max, replicas
        )
        oc = call.outcome
        tried: set[str] = set()
        """Replicas tried for this request, across resumptions: untried ones go first."""
        deadline = time.monotonic() + cfg.admission.max_queue_wait
        state = call.stream
        reasons: dict[str, str] = {}

        def blame(names: tuple[str, ...]) -> None:
            for name in names:
                rep = self.router.replicas.get(name)
                if rep is not None:
                    self.on_failure(rep, reasons.get(name, "failed"))

        while True:
            try:
                sel = await self.router.pick(call.ctx, call.parsed.model, tried, deadline)
            except GatewayError as exc:
                blame(plan.settled())
                if state is not None and state.open:
                    self.metrics.resumptions.labels("error").inc()
                    return await self._fail(call, f"no replica to go on with: {exc.message}"), oc
                if plan.failures:
                    raise self._give_up(plan, exc.message) from None
                raise
            rep = sel.replica
            tried.add(rep.name)
            oc.attempts += 1
            if oc.replica == "none":
                oc.replica, oc.decision = rep.name, sel.decision
                oc.expected_hit_tokens = sel.expected_hit_tokens
            body = call.body
            if state is not None and state.has_events:
                if state.finished():
                    return await state.finish(), oc
                body = await state.resume_request(
                    call.parsed, functools.partial(self.count, rep, call.parsed.model)
                )
                if body is None:
                    return await state.finish(), oc
            attempt = Attempt(call, rep, body, cfg.stream, sel.predicted_ttft)
            try:
                res = await attempt.run()
            finally:
                self.router.replicas.notify()
            if res.kind in (OK, CLIENT_ERROR):
                blame(plan.settled())
                rep.breaker.record_success()
                return await self._answer(call, rep, res), oc
            if attempt.first and state is not None:
                # it streamed before failing: the failures before it were their replicas'
                # own (a request that fails alike everywhere gets no further on the next)
                blame(plan.settled())
            reasons[rep.name] = res.reason
            self.metrics.attempt_failures.labels(rep.name, res.kind).inc()
            mid = state is not None and state.has_events
            step = plan.after(
                Failure(rep.name, res.kind, res.reason, mid, res.connect), self._rng.random()
            )
            blame(step.blame)
            if res.connect:
                self.on_down(rep, res.reason)
            elif res.kind == FAULT:
                self.on_suspect(rep)
            if step.action == POISON:
                self.metrics.poisoned.inc()
                oc.error = f"failed alike on two replicas: {res.reason}"
                return await self._poison(call, rep, res), oc
            if step.action == GIVE_UP:
                if state is not None and state.open:
                    self.metrics.resumptions.labels("error").inc()
                    why = "too many resumptions" if mid else "every attempt failed"
                    return await self._fail(call, f"replica {rep.name}: {res.reason}; {why}"), oc
                raise self._give_up(plan, f"last: replica {rep.name}: {res.reason}")
            if step.action == RESUME:
                assert state is not None
                if not (cfg.stream.resume and call.parsed.resumable and state.log.kept):
                    self.metrics.resumptions.labels("error").inc()
                    msg = f"replica {rep.name} failed mid-stream ({res.reason}); the request "
                    if state.log.limit and not state.log.kept:
                        msg += "was too long to resume (stream.max_resume_log_bytes)"
                    else:
                        msg += "cannot be resumed"
                    return await self._fail(call, msg), oc
                if not res.connect:  # else the last resumption did not begin: still the same
                    oc.resumes += 1
                    self.metrics.resumptions.labels("resumed").inc()
                continue
            if res.connect:
                continue  # nothing was sent: another replica at once
            self.metrics.retries.labels(res.reason.split(":")[0]).inc()
            await asyncio.sleep(step.delay)

    # -- answers -----------------------------------------------------------------------------
    async def _answer(self, call: Call, rep: Replica, res: Result) -> web.StreamResponse:
        state = call.stream
        oc = call.outcome
        if state is not None and state.open:
            if res.kind == CLIENT_ERROR:  # a continuation refused
                oc.error = f"resume refused: HTTP {res.status}: {res.reason}"
                return await state.fail(oc.error)
            return await state.finish()
        oc.status = res.status
        oc.replica = rep.name
        return res.response(call.headers(rep.name))

    async def _poison(self, call: Call, rep: Replica, res: Result) -> web.StreamResponse:
        """The same failure on two replicas: the request's own. The client gets the replica's
        answer (or, for a cut or a silence, a 502 saying so); no third replica is tried."""
        state = call.stream
        msg = (
            f"The request failed the same way on two replicas ({res.reason}); it was not "
            "tried on others."
        )
        if state is not None and state.open:
            return await state.fail(msg)
        if res.body:
            call.outcome.status = res.status
            call.outcome.replica = rep.name
            return res.response(call.headers(rep.name))
        raise GatewayError(502, msg, "upstream_error")

    async def _fail(self, call: Call, message: str) -> web.StreamResponse:
        assert call.stream is not None
        call.outcome.error = message
        return await call.stream.fail(message)

    @staticmethod
    def _give_up(plan: RetryPlan, last: str) -> GatewayError:
        n = len(plan.failures)
        if plan.all_overloaded:
            return GatewayError(
                503,
                f"Every replica tried ({n}) is overloaded; retry later.",
                "overloaded",
                retry_after=1.0,
            )
        return GatewayError(502, f"The request failed on {n} attempt(s); {last}.", "upstream_error")

    # -- tokens ------------------------------------------------------------------------------
    async def count(self, rep: Replica, model: str | None, text: str) -> int | None:
        """Tokens of ``text`` by the replica's own tokenizer (``/tokenize``), or None."""
        body: dict = {"prompt": text, "add_special_tokens": False}
        if model is not None:
            body["model"] = model
        return await tokenize_count(rep, body, self.cfg.stream.connect_timeout)


async def tokenize_count(rep: Replica, body: dict, timeout: float) -> int | None:
    """``count`` from the replica's ``/tokenize`` for ``body``, or None when it cannot say."""
    try:
        reply = await rep.fetch("POST", "/tokenize", body, timeout=timeout, rid="tokenize")
        if reply.status != 200:
            return None
        count = json.loads(reply.body).get("count")
    except (OSError, TimeoutError, ValueError, AttributeError):
        return None
    return count if isinstance(count, int) else None
