"""Is a replica process that is alive still doing its job? Pure: the caller probes its health
path and passes the answers and the time in.

  started ──(health 200)──► ready ──(no 200 for ``unhealthy_after`` s)──► restart "stopped answering"
  started ──(no 200 within ``ready_timeout`` s)──────────────────────► restart "never ready"

A process that exits is the supervisor's plain restart; this catches the ones that do not:
hung (SIGSTOP, a deadlock), or stuck while loading.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Liveness:
    ready_timeout: float
    unhealthy_after: float
    started_at: float = 0.0
    ready: bool = False
    last_ok: float = 0.0

    def restarted(self, now: float) -> None:
        self.started_at, self.ready, self.last_ok = now, False, now

    def observe(self, now: float, healthy: bool) -> str | None:
        """Why the process must be restarted now, or None."""
        if healthy:
            self.ready, self.last_ok = True, now
            return None
        if not self.ready:
            if now - self.started_at > self.ready_timeout:
                return f"not ready {self.ready_timeout:g} s after its start"
            return None
        if now - self.last_ok > self.unhealthy_after:
            return f"alive but its health check failed for {now - self.last_ok:.0f} s"
        return None
