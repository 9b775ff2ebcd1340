"""Real processes for the deployment tests: sim-servers, nginx, a gateway; each stopped (its
whole process group) when the ExitStack closes."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

READY = re.compile(r"sim-server ready: .* port=(\d+)")
GATEWAY_READY = re.compile(r"gateway ready: .* port=(\d+)")


def _stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def spawn(argv: list[str], log: Path, stack: ExitStack, sig: int = signal.SIGTERM):
    err = open(log, "w")  # noqa: SIM115
    stack.callback(err.close)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
    )
    stack.callback(_stop_group, proc, sig)
    return proc


def wait_line(proc: subprocess.Popen, pattern: re.Pattern, log: Path, timeout: float = 60) -> int:
    """The port in the process's ready line (its first stdout line)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no ready line: {log.read_text()[-2000:]}"
    m = pattern.search(proc.stdout.readline())
    assert m, log.read_text()[-2000:]
    return int(m.group(1))


def start_sim(
    tmp: Path, name: str, stack: ExitStack, *extra: str, host: str = "127.0.0.1", port: int = 0
) -> tuple[subprocess.Popen, int]:
    """A sim-server of Qwen2.5-7B on an H200 (ready at once unless `extra` says otherwise)."""
    argv = [sys.executable, "-m", "servefleet.sim.server", "--model", "Qwen2.5-7B",
            "--gpu", "H200-SXM", "--host", host, "--port", str(port), *extra]  # fmt: skip
    if "--startup-time" not in extra:
        argv += ["--startup-time", "0"]
    log = tmp / f"sim-{name}.log"
    proc = spawn(argv, log, stack)
    return proc, wait_line(proc, READY, log)


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples at `url`/metrics."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def served(url: str) -> float:
    return metric(url, "vllm:request_success_total")


def wait_until(check, what: str, timeout: float = 20.0, poll: float = 0.05):
    """Poll `check()` until it returns something truthy (a signal: nothing to wait on)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if out := check():
                return out
        except OSError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def start_nginx(prefix: Path, conf_text: str, stack: ExitStack, port: int) -> subprocess.Popen:
    """nginx with `conf_text` in the prefix directory, after `nginx -t` passed."""
    prefix.mkdir(exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(conf_text)
    check = subprocess.run(
        ["nginx", "-t", "-p", str(prefix), "-c", str(conf)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    log = prefix / "stderr.log"
    ng = spawn(["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"], log, stack,
               signal.SIGQUIT)  # fmt: skip

    def up():  # nginx prints no ready line: its health location is the signal
        assert ng.poll() is None, log.read_text()
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/nginx-health", timeout=1)

    wait_until(up, "nginx")
    return ng
