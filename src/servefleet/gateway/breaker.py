"""Per-replica circuit breaker fed by passive outlier detection (the outcomes of real
requests). Pure: the caller passes the monotonic time in.

closed ──(``threshold`` failures in a row)──► open ──(ejection time passed)──► half-open
closed ──(``trip``: a sure fault, e.g. the replica stopped streaming)──► open
half-open ──(the one trial request succeeds)──► closed;  ──(it fails)──► open, time doubled.

Only failures the gateway blames on the replica reach it (``retry.py``): never a client's
bad request, an overloaded replica, or a request that fails alike on two replicas.
"""

from __future__ import annotations

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
STATE_VALUE = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class CircuitBreaker:
    __slots__ = (
        "base_ejection",
        "consecutive_failures",
        "ejections",
        "max_ejection",
        "open_until",
        "state",
        "threshold",
        "trial_in_flight",
    )

    def __init__(self, threshold: int = 5, base_ejection: float = 2.0, max_ejection: float = 60.0):
        self.threshold = threshold
        self.base_ejection = base_ejection
        self.max_ejection = max_ejection
        self.state = CLOSED
        self.consecutive_failures = 0
        self.ejections = 0
        """Times opened since the last close (the backoff exponent)."""
        self.open_until = 0.0
        self.trial_in_flight = False

    def allows(self, now: float) -> bool:
        """May a request be sent now? (Moves open → half-open when the time is up.)"""
        if self.state == CLOSED:
            return True
        if self.state == OPEN:
            if now < self.open_until:
                return False
            self.state = HALF_OPEN
            self.trial_in_flight = False
        return not self.trial_in_flight

    def on_sent(self) -> None:
        if self.state == HALF_OPEN:
            self.trial_in_flight = True

    def record_success(self) -> bool:
        """True when this closed the breaker."""
        self.consecutive_failures = 0
        if self.state != CLOSED:
            self.state = CLOSED
            self.ejections = 0
            self.trial_in_flight = False
            return True
        return False

    def record_failure(self, now: float) -> bool:
        """True when this opened the breaker (an ejection)."""
        self.consecutive_failures += 1
        if self.state == HALF_OPEN or (
            self.state == CLOSED and self.consecutive_failures >= self.threshold
        ):
            self._open(now)
            return True
        return False

    def trip(self, now: float) -> bool:
        """Open now, whatever the count (True when it was not open already)."""
        if self.state == OPEN:
            return False
        self.consecutive_failures += 1
        self._open(now)
        return True

    def _open(self, now: float) -> None:
        self.ejections += 1
        wait = min(self.max_ejection, self.base_ejection * 2 ** (self.ejections - 1))
        self.state = OPEN
        self.open_until = now + wait
        self.trial_in_flight = False

    def reset(self) -> None:
        self.state = CLOSED
        self.consecutive_failures = 0
        self.ejections = 0
        self.trial_in_flight = False
