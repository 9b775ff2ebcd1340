"""Structured logs: one JSON object per line on stderr, never with prompt or output text.

``log.info("event_name", extra={"fields": {...}})`` writes
``{"ts": ..., "level": "info", "logger": ..., "event": "event_name", ...fields}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr for the sim-server's loggers (and aiohttp's errors)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("servefleet.sim.server", "aiohttp.server", "aiohttp.web"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.propagate = False
    logging.getLogger("servefleet.sim.server").setLevel(level.upper())
    logging.getLogger("aiohttp.server").setLevel(logging.ERROR)
    logging.getLogger("aiohttp.web").setLevel(logging.ERROR)
