"""Structured logs: one JSON object per line on stderr, never any prompt or output text and
never a traceback (an exception is logged as its type and where it was raised). aiohttp's own
loggers (a handler that failed, a connection it dropped) go through the same formatter."""

from __future__ import annotations

import json
import logging
import sys
import time

log = logging.getLogger("servefleet.gateway")
AIOHTTP_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal")


def where(exc: BaseException) -> dict[str, str]:
    """An exception as log fields: its type and the file:line it was raised at — not its
    message or arguments, which may carry request text."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    at = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb else ""
    return {"error": type(exc).__name__, "at": at}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(time.time(), 6),
            "level": record.levelname.lower(),
            "event": record.getMessage() if record.name == log.name else record.msg,
        }
        if record.name != log.name:
            out["logger"] = record.name
            if not isinstance(out["event"], str):
                out["event"] = type(out["event"]).__name__
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            out.update(where(record.exc_info[1]))
        return json.dumps(out, default=str)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
    for name in AIOHTTP_LOGGERS:
        other = logging.getLogger(name)
        other.handlers[:] = [handler]
        other.setLevel(max(logging.WARNING, log.level))
        other.propagate = False


def event(level: int, name: str, **fields: object) -> None:
    if log.isEnabledFor(level):
        log.log(level, name, extra={"fields": fields})
