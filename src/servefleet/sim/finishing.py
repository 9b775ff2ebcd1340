"""What happens to a request once it has finished: its record is made (``record_of``), added to
the point's streaming summary and written to the records file. In this process, or in a helper
process on another core while the event loop goes on (``FinishingProcess``).

The event loop hands each finished request on as a ``FinishedRequest`` (its fields, its steps
and the log rows it carries: ``TokenTimes`` finds its token times from them); everything after
that needs nothing from the loop, so it can run beside it. On a
large fleet it is a fifth to a third of a point's time (docs/simulate.md, "How it is made fast").
Both ways run the same ``Finishing``; the helper gets the finished requests in batches through
a pipe, in the order they finished, and sends back what ``close`` returns.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from servefleet.records import RequestRecord
from servefleet.sim.cluster import FinishedRequest, TokenTimes, record_of
from servefleet.sim.record_sink import RecordSink, RecordsMode
from servefleet.stats import Summary
from servefleet.stream_stats import SummaryStream

BATCH = 256
"""Finished requests sent to the helper at a time (one pickle and one pipe write each)."""

MIN_REQUESTS = 20_000
"""A point expected to finish fewer requests than this keeps its records in its own process:
the helper's start (~0.3 s, its imports) would cost more than it saves."""


@dataclass(slots=True)
class Finished:
    """What a point's finished requests came to."""

    summary: Summary
    records: int
    """Requests that finished (every record, written or not)."""
    last_end: float
    """The latest end time of any record (-inf if none)."""
    kept: list[RequestRecord] = field(default_factory=list)
    """Every record, in the order they finished, if ``Finishing`` was asked to keep them."""


class Finishing:
    """Makes each finished request's record and hands it to the summary, the records file
    (``records``: its path and which records) and, with ``keep``, a list."""

    def __init__(
        self,
        stream: SummaryStream,
        records: tuple[Path, RecordsMode] | None = None,
        keep: bool = False,
    ) -> None:
        self.stream = stream
        self.times = TokenTimes()
        self.sink = RecordSink(*records) if records is not None else None
        self.kept: list[RequestRecord] | None = [] if keep else None

    def __call__(self, f: FinishedRequest) -> None:
        r = record_of(f, self.times.of(f))
        self.stream.add(r)
        if self.kept is not None:
            self.kept.append(r)
        if self.sink is not None:
            self.sink(r)

    def close(self) -> Finished:
        if self.sink is not None:
            self.sink.close()
        s = self.stream
        return Finished(s.summary(), s.records, s.last_end, self.kept or [])

    def abort(self) -> None:
        """The point failed: close the records file as it is."""
        if self.sink is not None:
            self.sink.close()


def spare_core() -> bool:
    """This process may use a second core (its CPU affinity allows two)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # no sched_getaffinity (macOS)
        return (os.cpu_count() or 1) >= 2


class FinishingProcess:
    """A ``Finishing`` in a helper process: call it with each ``FinishedRequest`` (batched,
    sent through a pipe), then ``close`` for its result. If the helper fails, the next call or
    ``close`` raises ``RuntimeError`` with its traceback.

    The helper is spawned (a fresh interpreter: ~0.3 s of imports), never forked from this
    process (``sim.command.point_pool`` says why), and is this process's own child, so its
    CPU time counts in this process's children's (``getrusage``, ``wait4``)."""

    def __init__(
        self, stream: SummaryStream, records: tuple[Path, RecordsMode] | None = None
    ) -> None:
        ctx: Any = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        self._conn = ours
        self._batch: list[FinishedRequest] = []
        self._proc = ctx.Process(
            target=_serve, args=(theirs, stream, records), name="servefleet-records", daemon=True
        )
        self._proc.start()
        theirs.close()

    def __call__(self, f: FinishedRequest) -> None:
        self._batch.append(f)
        if len(self._batch) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        data = pickle.dumps([_packed(f) for f in self._batch], pickle.HIGHEST_PROTOCOL)
        self._batch = []
        try:
            self._conn.send_bytes(data)
        except OSError:  # the helper is gone: say why
            self._fail()

    def close(self) -> Finished:
        if self._batch:
            self._flush()
        try:
            self._conn.send_bytes(b"")
            ok, value = self._conn.recv()
        except (OSError, EOFError):
            self._fail()
        self._proc.join()
        self._conn.close()
        if not ok:
            raise RuntimeError(f"the records process failed:\n{value}")
        return value

    def abort(self) -> None:
        """Stop the helper (the point failed; what it wrote stays as it is)."""
        self._conn.close()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()

    def _fail(self) -> None:
        why = "it exited"
        try:
            if self._conn.poll(5):
                ok, value = self._conn.recv()
                if not ok:
                    why = value
        except (OSError, EOFError):
            pass
        self.abort()
        raise RuntimeError(f"the records process failed:\n{why}")


def _packed(f: FinishedRequest) -> tuple:
    """``f`` as a plain tuple for the pipe (``_unpacked`` makes it a ``FinishedRequest``
    again): a named tuple is pickled through its ``__reduce__``, a plain one is not."""
    return tuple(f)


def _unpacked(row: tuple) -> FinishedRequest:
    return FinishedRequest(*row)


def _serve(
    conn: Connection, stream: SummaryStream, records: tuple[Path, RecordsMode] | None
) -> None:
    """The helper: finish every request it is sent until an empty message, then send
    ``(True, Finished)`` (or ``(False, traceback)`` if anything failed)."""
    try:
        finishing = Finishing(stream, records)
        while data := conn.recv_bytes():
            for row in pickle.loads(data):
                finishing(_unpacked(row))
        reply: tuple[bool, object] = (True, finishing.close())
    except BaseException:
        reply = (False, traceback.format_exc())
    with contextlib.suppress(OSError):  # nobody left to tell
        conn.send(reply)
