"""A benchmark's child processes: the port a server prints in its ready line, and a stop.

``servefleet`` servers (sim-server, gateway) print ``... ready ... port=N`` on stdout once they
listen; a benchmark starts them with ``stdout=subprocess.PIPE`` and stderr to a temporary file,
then waits for that line here.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
from typing import IO

READY = re.compile(rb"port=(\d+)")


def wait_port(p: subprocess.Popen, err: IO[bytes], name: str, timeout: float) -> int:
    """The port ``p`` prints in its ready line within ``timeout`` seconds; else exits with what
    it printed on stdout and the end of its stderr (``err``, the file it writes to)."""
    assert p.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    buf, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and sel.select(deadline - time.monotonic()):
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"ready" in buf and (m := READY.search(buf)):
                return int(m.group(1))
    finally:
        sel.close()
    err.seek(0)
    stderr = err.read().decode(errors="replace")
    raise SystemExit(f"{name} did not start: {buf[-500:]!r} {stderr[-2000:]}")


def stop(p: subprocess.Popen, timeout: float) -> None:
    """SIGTERM ``p`` if it still runs, and wait for it; SIGKILL after ``timeout`` seconds."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
