"""The per-request record that both worlds write (simulate and bench), and every report reads.

Times are seconds since the start of the run on a monotonic clock (simulated or wall). Raw
timings are kept; every metric is derived from them (see ``servefleet.stats`` and
``docs/metrics.md``).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

Status = Literal["ok", "error", "aborted"]
SCHEMA_VERSION = 1


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    class_name: str
    scheduled_time: float
    """When the workload wanted the request sent."""
    send_time: float
    """When it was actually sent (simulated: equal to ``scheduled_time``)."""
    first_token_time: float | None = None
    """First chunk that carries output text (never a role-only chunk)."""
    end_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    """Arrival time of each chunk that carried output tokens, the first one included."""
    chunk_tokens: list[int] = field(default_factory=list)
    """Output tokens carried by each chunk (same length as ``chunk_times``)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    target_prompt_tokens: int | None = None
    target_output_tokens: int | None = None
    cached_tokens: int | None = None
    preemptions: int | None = None
    recomputed_tokens: int | None = None
    """Prompt/output tokens prefilled again after a preemption (simulator only)."""
    queue_time: float | None = None
    """Time spent waiting for a first schedule, when the server (or simulator) reports it."""
    finish_reason: str | None = None
    status: Status = "ok"
    error: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    turn: int = 0
    replica: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.send_time

    @property
    def e2e_latency(self) -> float | None:
        if self.end_time is None:
            return None
        return self.end_time - self.send_time

    @property
    def tpot(self) -> float | None:
        """(e2e − ttft) / (n − 1); undefined for fewer than two output tokens."""
        if self.end_time is None or self.first_token_time is None or self.output_tokens < 2:
            return None
        return (self.end_time - self.first_token_time) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        """A plain dict of the fields (lists are shared, not copied)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown record fields: {sorted(unknown)}")
        return cls(**d)


_FIELD_NAMES = tuple(f.name for f in fields(RequestRecord))


def write_jsonl(records: Iterable[RequestRecord], path: Path | str) -> int:
    with JsonlWriter(path) as w:
        for r in records:
            w.write(r)
    return w.count


class JsonlWriter:
    """Records appended one at a time to a JSON-lines file (gzip-compressed for ``.gz``), for
    runs that write each record as it finishes instead of keeping them."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.count = 0
        self._f = _open(self.path, "wt")

    def write(self, r: RequestRecord) -> None:
        self._f.write(json.dumps(r.to_dict(), separators=(",", ":")))
        self._f.write("\n")
        self.count += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: Path | str) -> Iterator[RequestRecord]:
    """The records of a file; every error names the file and the line it stopped at."""
    lineno = 0
    try:
        with _open(Path(path), "rt") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    yield RequestRecord.from_dict(json.loads(line))
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{path}:{lineno}: not a request record: {e}") from e
    except FileNotFoundError:
        raise ValueError(f"{path}: no such records file") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        # a corrupt or truncated file (gzip's "Not a gzipped file", a cut-off stream)
        raise ValueError(f"{path}:{lineno + 1}: cannot read the records: {e}") from e


GZIP_LEVEL = 1
"""Records are mostly digits, which compress about as well at any level, while a higher level
costs several times the CPU (figures in benchmarks/RESULTS.md)."""


def _open(path: Path, mode: str):
    """Plain or gzip-compressed (``.gz``) text."""
    if path.suffix == ".gz":
        return gzip.open(path, mode, compresslevel=GZIP_LEVEL, encoding="utf-8")
    return path.open(mode, encoding="utf-8")
