"""The state file of a running ``servefleet up`` (``<state-dir>/state.json``), read by
``servefleet status`` and ``servefleet down`` from another terminal."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from pathlib import Path

from .hosts import url_host
from .proc import health_ok

STATE_FILE = "state.json"
PID_FILE = "up.pid"


def write_state(state_dir: Path, state: dict) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_dir / STATE_FILE)


def read_state(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False
    except OSError:
        return True


def running_supervisor(state_dir: Path) -> int | None:
    try:
        pid = int((state_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) and pid != os.getpid() else None


def status_rows(state: dict) -> list[dict]:
    rows = []
    for p in state.get("processes", []):
        alive = pid_alive(p.get("pid"))
        url = f"http://{url_host(p.get('host', '127.0.0.1'))}:{p['port']}{p.get('health_path', '/health')}"
        ready = alive and health_ok(url, timeout=1.0)
        rows.append({**p, "alive": alive, "ready": ready})
    return rows


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit (pidfd: woken by its exit)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        end = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        return not pid_alive(pid)
    try:
        select.select([fd], [], [], timeout)
        return not pid_alive(pid)
    finally:
        os.close(fd)


def down(state_dir: Path, timeout: float = 60.0) -> str:
    """Ask the supervisor to drain and stop; kill what is left after ``timeout``."""
    pid = running_supervisor(state_dir)
    state = read_state(state_dir) or {}
    if pid is None:
        left = [p for p in state.get("processes", []) if pid_alive(p.get("pid"))]
        for p in left:
            _kill_group(p["pid"], signal.SIGKILL)
        return f"no `servefleet up` running in {state_dir}" + (
            f"; killed {len(left)} leftover process(es)" if left else ""
        )
    os.kill(pid, signal.SIGTERM)
    if wait_exit(pid, timeout):
        return f"stopped the fleet of {state_dir} (supervisor pid {pid})"
    for p in state.get("processes", []):
        _kill_group(p["pid"], signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return f"the fleet did not stop within {timeout:g} s: killed it (supervisor pid {pid})"


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
