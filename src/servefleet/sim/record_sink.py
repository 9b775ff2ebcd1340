"""Which request records a simulation writes (``--records``), written as requests finish.

A large simulated fleet finishes millions of requests; keeping their records until the end
would make memory grow with the run. The summary comes from streaming accumulators
(``servefleet.stream_stats``); the records go to disk as they finish: all of them, a sample,
or none (then ``summary.json`` holds every figure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from servefleet.records import JsonlWriter, RequestRecord
from servefleet.routing.base import stable_hash

RecordsMode = Literal["all", "sample", "none"]
RECORDS_MODES: tuple[str, ...] = get_args(RecordsMode)
SAMPLE_EVERY = 100
"""``sample`` keeps one request in this many, chosen by a hash of its id (so every point and
every run of the same workload keep the same ones)."""


def in_sample(request_id: str) -> bool:
    return stable_hash(request_id) % SAMPLE_EVERY == 0


class RecordSink:
    """Writes the records ``mode`` asks for to ``path`` as they come (``None``: writes none)."""

    def __init__(self, path: Path, mode: RecordsMode) -> None:
        if mode not in RECORDS_MODES:
            raise ValueError(f"records must be one of {', '.join(RECORDS_MODES)}, got {mode!r}")
        self.mode = mode
        self.path = path if mode != "none" else None
        self._writer = JsonlWriter(path) if self.path is not None else None

    def __call__(self, r: RequestRecord) -> None:
        if self._writer is not None and (self.mode == "all" or in_sample(r.request_id)):
            self._writer.write(r)

    @property
    def written(self) -> int:
        return self._writer.count if self._writer is not None else 0

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
