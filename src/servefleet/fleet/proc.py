"""One child process: started in its own process group, stdout/stderr to its log file, ready
when it has printed its ready line and answers its health path with 200."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from .commands import Spec
from .hosts import url_host


class Child:
    def __init__(self, spec: Spec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.marker_seen = threading.Event()
        self.restarts = 0
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.marker_seen.clear()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 (owned by the pump)
        log.write(f"--- start {time.strftime('%H:%M:%S')}: {' '.join(self.spec.argv)}\n".encode())
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        try:
            self.proc = subprocess.Popen(
                self.spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        except OSError:
            log.close()
            raise
        self._pump = threading.Thread(target=self._copy, args=(self.proc, log), daemon=True)
        self._pump.start()

    def _copy(self, proc: subprocess.Popen, log) -> None:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if self.spec.ready_marker and self.spec.ready_marker.encode() in line:
                    self.marker_seen.set()
        finally:
            log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, deadline: float, stop: threading.Event | None = None) -> str | None:
        """None once ready; else why not (exited, timed out, stopped)."""
        if self.spec.ready_marker:
            while not self.marker_seen.wait(0.1):
                if (why := self._not_running(deadline, stop)) is not None:
                    return why
        url = f"http://{url_host(self.spec.host)}:{self.spec.port}{self.spec.health_path}"
        while True:
            if health_ok(url):
                return None
            if (why := self._not_running(deadline, stop)) is not None:
                return why
            if stop is not None:
                stop.wait(0.2)
            else:
                time.sleep(0.2)  # between health probes (the signal is the 200)

    def _not_running(self, deadline: float, stop: threading.Event | None) -> str | None:
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            return f"{self.spec.name} exited with code {code} (log: {self.log_path})"
        if stop is not None and stop.is_set():
            return "stopped"
        if time.monotonic() > deadline:
            return f"{self.spec.name} not ready in time (log: {self.log_path})"
        return None

    def terminate(self) -> None:
        if self.alive():
            _killpg(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process group (a hung process may ignore SIGTERM, or be stopped)."""
        if self.alive():
            _killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout: float) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout`` s."""
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _killpg(self.proc.pid, signal.SIGKILL)  # anything it left in its group
        if self._pump is not None:
            self._pump.join(2.0)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def health_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
