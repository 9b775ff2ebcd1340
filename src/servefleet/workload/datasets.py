"""Files of observed traffic: empirical lengths, ShareGPT conversations, JSONL traces.

Every reader names the file (and the line, or the entry) in its errors. Parsed files are cached by
(path, modification time, token counter), so describing and building a workload reads each once.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

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


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: str | None = None
    prefix_tokens: int = 0
    session_id: str | None = None


def load_trace(path: str | Path) -> list[TraceRecord]:
    """One JSON object per line (see docs/workload.md), sorted by timestamp (stable)."""
    return _load_trace(str(path), _stamp(path))


@functools.lru_cache(maxsize=8)
def _load_trace(path: str, _stamp: int) -> list[TraceRecord]:
    records = []
    for no, line in enumerate(_read_text(path, "trace").splitlines(), 1):
        if line.strip():
            records.append(_trace_record(line, f"{path}:{no}"))
    if not records:
        raise WorkloadError(f"{path}: the trace is empty; write one JSON object per line")
    return sorted(records, key=lambda r: r.timestamp)


def _trace_record(line: str, where: str) -> TraceRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
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
