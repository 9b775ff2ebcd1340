"""Structured logs: one JSON object per line on stderr, never any prompt or output text."""

from __future__ import annotations

import json
import logging
import sys
import time

log = logging.getLogger("servefleet.gateway")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(time.time(), 6),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False


def event(level: int, name: str, **fields: object) -> None:
    if log.isEnabledFor(level):
        log.log(level, name, extra={"fields": fields})
