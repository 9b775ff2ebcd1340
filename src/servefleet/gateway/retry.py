"""What to do after an attempt failed, and whom to blame: a pure plan (no sockets, no clock;
the caller passes a uniform random number for the backoff's jitter).

An attempt ends as one of four outcomes (``attempt.py`` classifies the replica's answer):

  OK           the answer (or the whole stream) reached the client
  CLIENT_ERROR the replica refused the request (4xx): the client's problem, passed on
  OVERLOADED   429/503: the replica is busy, not broken; never counted against it
  FAULT        connect error, 5xx, timeout, connection cut, stalled stream: maybe the
               replica's fault, maybe the request's (one that every replica fails on)

Blame is deferred until the next attempt tells which::

    FAULT(reason) on A ──► pending ──┬─ the next attempt, on B, succeeds ─────► blame A
                                     ├─ B fails for another reason ──────────► blame A, B pending
                                     └─ B fails for the same reason ─────────► POISON: answer
                                          the client with it, blame neither, try no third
    connect error on A ──► blame A at once (nothing was sent: it cannot be the request)

and the next step after a failure::

    connect error, fewer than ``replicas`` so far ──► RETRY (or RESUME) elsewhere at once,
                                      using up no attempt and no resumption (nothing was sent)
    not mid-stream, attempts left ──► RETRY elsewhere after backoff (untried replicas first)
    mid-stream, resumes left ───────► RESUME elsewhere from what the client has
    otherwise ──────────────────────► GIVE_UP: 502 (503 when every failure was overload), or
                                      an error event ending a stream; pending faults blamed
"""

from __future__ import annotations

from dataclasses import dataclass, field

OK, CLIENT_ERROR, OVERLOADED, FAULT = "ok", "client_error", "overloaded", "fault"
RETRY, RESUME, POISON, GIVE_UP = "retry", "resume", "poison", "give_up"


@dataclass(frozen=True, slots=True)
class Failure:
    replica: str
    kind: str
    """FAULT or OVERLOADED."""
    reason: str
    """What went wrong, normalised so that two replicas failing alike compare equal
    (``http 500: <message>``, ``disconnected``, ``timeout``, ``stalled``, ...)."""
    mid_stream: bool = False
    """The client already had part of the stream."""
    connect: bool = False
    """Nothing was sent (the connection could not be made)."""


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    delay: float = 0.0
    """Seconds to wait before a RETRY."""
    blame: tuple[str, ...] = ()
    """Replicas whose failure counts now (their breakers, health checks)."""


@dataclass(slots=True)
class RetryPlan:
    max_attempts: int
    """Attempts before the first byte reached the client, the first included."""
    max_resumes: int
    backoff_base: float
    backoff_max: float
    replicas: int = 1
    """Replicas that could serve the request: connect errors beyond this many give up."""
    attempts: int = 0
    connects: int = 0
    """Connect errors so far."""
    resumes: int = 0
    failures: list[Failure] = field(default_factory=list)
    pending: list[Failure] = field(default_factory=list)

    def settled(self) -> tuple[str, ...]:
        """An attempt succeeded (or its replica refused the request, or none is left to try):
        the faults still pending were their replicas' own."""
        blame = tuple(f.replica for f in self.pending)
        self.pending.clear()
        return blame

    def after(self, f: Failure, u: float) -> Step:
        """The step after failure ``f``; ``u`` in [0, 1) jitters the backoff."""
        self.failures.append(f)
        blame: list[str] = []
        if f.kind == FAULT:
            if f.connect:
                blame.append(f.replica)
            elif any(p.reason == f.reason and p.replica != f.replica for p in self.pending):
                others = [p.replica for p in self.pending if p.reason != f.reason]
                self.pending.clear()
                return Step(POISON, blame=tuple(others))
            else:
                blame += [p.replica for p in self.pending if p.reason != f.reason]
                self.pending = [p for p in self.pending if p.reason == f.reason]
                self.pending.append(f)
        if f.connect and f.kind == FAULT:
            self.connects += 1
            if self.connects >= max(1, self.replicas):
                return self._give_up(blame)
            return Step(RESUME if f.mid_stream else RETRY, blame=tuple(blame))
        if f.mid_stream:
            if self.resumes >= self.max_resumes:
                return self._give_up(blame)
            self.resumes += 1
            self.attempts = 0
            return Step(RESUME, blame=tuple(blame))
        self.attempts += 1
        if self.attempts >= self.max_attempts:
            return self._give_up(blame)
        delay = min(self.backoff_max, self.backoff_base * 2 ** (self.attempts - 1))
        return Step(RETRY, delay * (0.5 + 0.5 * u), tuple(blame))

    def _give_up(self, blame: list[str]) -> Step:
        blame += [p.replica for p in self.pending]
        self.pending.clear()
        return Step(GIVE_UP, blame=tuple(blame))

    @property
    def all_overloaded(self) -> bool:
        return bool(self.failures) and all(f.kind == OVERLOADED for f in self.failures)
