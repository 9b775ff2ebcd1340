"""Files of observed traffic: empirical lengths, ShareGPT conversations, traces (servefleet's
JSONL, Mooncake's JSONL, Azure's CSV, servefleet's own request records).

Every reader names the file (and the line, or the entry) in its errors. Parsed files are cached by
(path, modification time, token counter), so describing and building a workload reads each once.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Literal

import numpy as np

from servefleet.records import read_jsonl

from .errors import WorkloadError

TokenCounter = Callable[[str], int]


def whitespace_tokens(text: str) -> int:
    """The default token counter: whitespace-separated words."""
    return len(text.split())


def _read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: {what} file not found; check the path") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read {what} file: {e.strerror}") from None


def _load_json(path: str | Path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None


def _stamp(path: str | Path) -> int:
    try:
        return Path(path).stat().st_mtime_ns
    except OSError:
        return -1  # the reader reports the missing file


def _positive_int(value, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    return value


# ---- empirical lengths ------------------------------------------------------------------------


def load_lengths(path: str | Path) -> np.ndarray:
    """Observed lengths: one integer per line (blank lines and ``#`` comments skipped) or a JSON
    list of integers."""
    return _load_lengths(str(path), _stamp(path))


@functools.lru_cache(maxsize=32)
def _load_lengths(path: str, _stamp: int) -> np.ndarray:
    text = _read_text(path, "lengths")
    if text.lstrip().startswith("["):
        data = _load_json(path, text)
        values = [_positive_int(v, f"{path}: item {i}", "length") for i, v in enumerate(data)]
    else:
        values = []
        for no, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                v = int(line) if line.lstrip("-").isdigit() else line
                values.append(_positive_int(v, f"{path}:{no}", "length"))
    if not values:
        raise WorkloadError(f"{path}: no lengths found; write one integer per line")
    return np.asarray(values, dtype=np.int64)


# ---- ShareGPT ---------------------------------------------------------------------------------

_HUMAN = {"human", "user"}
_GPT = {"gpt", "assistant", "chatgpt"}


def load_sharegpt(
    path: str | Path, count_tokens: TokenCounter = whitespace_tokens
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) from the first human message of each conversation and
    the reply that follows it; conversations without such a pair, or with an empty side, are
    skipped."""
    return _load_sharegpt(str(path), _stamp(path), count_tokens)


@functools.lru_cache(maxsize=8)
def _load_sharegpt(path: str, _stamp: int, count_tokens: TokenCounter):
    data = _load_json(path, _read_text(path, "ShareGPT"))
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON list of {{'conversations': [...]}} entries")
    prompts, outputs = [], []
    for i, entry in enumerate(data):
        pair = _first_pair(entry, f"{path}: entry {i}")
        if pair is not None:
            p, o = count_tokens(pair[0]), count_tokens(pair[1])
            if p > 0 and o > 0:
                prompts.append(p)
                outputs.append(o)
    if not prompts:
        raise WorkloadError(f"{path}: no (human, gpt) message pairs found")
    return np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


def _first_pair(entry, where: str) -> tuple[str, str] | None:
    conv = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(conv, list):
        raise WorkloadError(f"{where}: expected an object with a 'conversations' list")
    for a, b in pairwise(conv):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            raise WorkloadError(f"{where}: each message must be {{'from': ..., 'value': ...}}")
        if a.get("from") in _HUMAN and b.get("from") in _GPT:
            return str(a.get("value", "")), str(b.get("value", ""))
    return None


# ---- traces -----------------------------------------------------------------------------------

TraceFormat = Literal["auto", "servefleet", "mooncake", "azure", "records"]
TRACE_FORMATS: tuple[str, ...] = ("servefleet", "mooncake", "azure", "records")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake's published traces."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp: float
    """Seconds (any origin)."""
    prompt_tokens: int
    output_tokens: int
    prefix_group: str | None = None
    prefix_tokens: int = 0
    session_id: str | None = None
    blocks: tuple[int, ...] = ()
    """Hashes of the prompt's blocks of ``block_size`` tokens (Mooncake's ``hash_ids``): equal
    hashes hold equal tokens; the last block may be partial."""


def load_trace(
    path: str | Path, format: TraceFormat = "auto", block_size: int = MOONCAKE_BLOCK_TOKENS
) -> list[TraceRecord]:
    """The requests of a trace file, sorted by timestamp (stable). ``format`` ``auto``: ``.csv``
    is Azure's; a JSONL file is told by the fields of its first record (``hash_ids`` or
    ``input_length``: Mooncake; ``request_id`` and ``scheduled_time``: servefleet's records;
    else servefleet's trace). See docs/workload.md."""
    return _load_trace(str(path), _stamp(path), format, block_size)


@functools.lru_cache(maxsize=8)
def _load_trace(path: str, _stamp: int, format: str, block_size: int) -> list[TraceRecord]:
    if not Path(path).is_file():
        raise WorkloadError(f"{path}: trace file not found; check the path")
    text = _read_text(path, "trace") if not path.endswith(".gz") else None
    fmt = format if format != "auto" else _detect(path, text)
    if fmt == "records":
        records = _records_trace(path)
    elif fmt == "azure":
        records = _azure_trace(path, text or "")
    else:
        read = _mooncake_record if fmt == "mooncake" else _trace_record
        records = []
        for no, line in enumerate((text or "").splitlines(), 1):
            if line.strip():
                records.append(read(line, f"{path}:{no}", block_size))
    if not records:
        raise WorkloadError(f"{path}: the trace is empty; write one request per line")
    return sorted(records, key=lambda r: r.timestamp)


def _detect(path: str, text: str | None) -> str:
    if path.endswith((".csv", ".csv.gz")):
        return "azure"
    if text is None:
        return "records"  # a .jsonl.gz: what runs write
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        if "hash_ids" in obj or "input_length" in obj:
            return "mooncake"
        if "request_id" in obj and "scheduled_time" in obj:
            return "records"
    return "servefleet"


def _json_object(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    return obj


def _number(value, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{where}: {name} must be a number, got {value!r}")
    return float(value)


def _trace_record(line: str, where: str, block_size: int = 0) -> TraceRecord:
    obj = _json_object(line, where)
    for key in ("timestamp", "prompt_tokens", "output_tokens"):
        if key not in obj:
            raise WorkloadError(f"{where}: missing field {key!r}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise WorkloadError(f"{where}: timestamp must be a number of seconds, got {ts!r}")
    prompt = _positive_int(obj["prompt_tokens"], where, "prompt_tokens")
    output = _positive_int(obj["output_tokens"], where, "output_tokens")
    group, prefix = obj.get("prefix_group"), obj.get("prefix_tokens", 0)
    if prefix and group is None:
        raise WorkloadError(f"{where}: prefix_tokens needs a prefix_group naming the shared prefix")
    if prefix is None or (isinstance(prefix, int) and not isinstance(prefix, bool) and prefix == 0):
        prefix = 0
    elif _positive_int(prefix, where, "prefix_tokens") > prompt:
        raise WorkloadError(f"{where}: prefix_tokens ({prefix}) exceeds prompt_tokens ({prompt})")
    session = obj.get("session_id")
    return TraceRecord(
        float(ts),
        prompt,
        output,
        None if group is None else str(group),
        prefix,
        None if session is None else str(session),
    )


def _mooncake_record(line: str, where: str, block_size: int) -> TraceRecord:
    """``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``: block i of
    the prompt (``block_size`` tokens, the last one maybe partial) has hash ``hash_ids[i]``."""
    obj = _json_object(line, where)
    for key in ("timestamp", "input_length", "output_length"):
        if key not in obj:
            raise WorkloadError(f"{where}: missing field {key!r}")
    ts = _number(obj["timestamp"], where, "timestamp (milliseconds)")
    prompt = _positive_int(obj["input_length"], where, "input_length")
    output = _positive_int(obj["output_length"], where, "output_length")
    ids = obj.get("hash_ids") or []
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers, got {ids!r}")
    if len(ids) > -(-prompt // block_size):
        raise WorkloadError(
            f"{where}: {len(ids)} hash_ids of {block_size} tokens exceed input_length {prompt}; "
            "give the trace's block size (--trace-block-size, `trace.block_size`)"
        )
    return TraceRecord(ts / 1000.0, prompt, output, blocks=tuple(ids))


_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _azure_trace(path: str, text: str) -> list[TraceRecord]:
    """``TIMESTAMP,ContextTokens,GeneratedTokens``: a date-time (``2023-11-16
    18:15:46.6805900``) or seconds; a request that generated 0 tokens is asked for 1."""
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in _AZURE_COLUMNS if c not in header]
    if missing:
        raise WorkloadError(
            f"{path}:1: missing column(s) {', '.join(missing)}; expected a header "
            f"{','.join(_AZURE_COLUMNS)}"
        )
    at = [header.index(c) for c in _AZURE_COLUMNS]
    records = []
    for no, row in enumerate(reader, 2):
        if not any(cell.strip() for cell in row):
            continue
        where = f"{path}:{no}"
        if len(row) < len(header):
            raise WorkloadError(f"{where}: expected {len(header)} columns, got {len(row)}")
        ts, ctx, gen = (row[i].strip() for i in at)
        prompt = _positive_int(_int(ctx), where, "ContextTokens")
        generated = _int(gen)
        if not isinstance(generated, int) or generated < 0:
            raise WorkloadError(f"{where}: GeneratedTokens must be an integer >= 0, got {gen!r}")
        records.append(TraceRecord(_azure_time(ts, where), prompt, max(1, generated)))
    return records


def _int(text: str) -> int | str:
    return int(text) if text.lstrip("-").isdigit() else text


def _azure_time(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise WorkloadError(
            f"{where}: TIMESTAMP must be a date-time or seconds, got {text!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def _records_trace(path: str) -> list[TraceRecord]:
    """servefleet's request records (``records.jsonl[.gz]`` of a bench or simulate run): each
    request as it was scheduled, with the lengths the run asked for."""
    out = []
    try:
        for r in read_jsonl(path):
            prompt = r.target_prompt_tokens or r.prompt_tokens
            output = r.target_output_tokens or r.output_tokens
            if prompt < 1:
                raise WorkloadError(f"{path}: request {r.request_id} has no prompt tokens")
            out.append(
                TraceRecord(r.scheduled_time, prompt, max(1, output), session_id=r.session_id)
            )
    except (ValueError, OSError) as e:
        if isinstance(e, WorkloadError):
            raise
        raise WorkloadError(str(e) if isinstance(e, ValueError) else f"{path}: {e}") from None
    return out
