"""Real processes for the gateway tests: sim-servers, gateways, Redis, on loopback.

Every process is waited on by a signal it gives (its ready line, a PING answer, a /ready
or /fleet state), never by sleeping, and is stopped by the test that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

READY = re.compile(rb"ready: listening on (https?)://[^ ]+ port=(\d+)")
MODEL = "Qwen2.5-7B"


class Proc:
    """A child process that prints ``... ready: listening on http://HOST:PORT port=PORT``."""

    def __init__(self, args: list[str], name: str, timeout: float = 30.0) -> None:
        self.name = name
        self.ops: dict[str, str] | None = None
        """Headers for a gateway's /fleet and /metrics (its admin token, when it has one)."""
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115 (closed in stop)
        self.p = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        scheme, self.port = self._wait_ready(timeout)
        self.url = f"{scheme}://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float) -> tuple[str, int]:
        sel = selectors.DefaultSelector()
        assert self.p.stdout is not None
        sel.register(self.p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        try:
            while time.monotonic() < deadline:
                if not sel.select(deadline - time.monotonic()):
                    break
                chunk = os.read(self.p.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                m = READY.search(buf)
                if m:
                    return m.group(1).decode(), int(m.group(2))
        finally:
            sel.close()
        err = self.stderr()[-2000:]
        self.stop()
        raise AssertionError(f"{self.name} gave no ready line: {buf!r} {err}")

    def stderr(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.p.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        if self.p.stdout is not None:
            self.p.stdout.close()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)
        return self.p.returncode


class TestCA:
    """A certificate authority for the tests (trustme): https replicas on 127.0.0.1."""

    _files: tuple[str, str, str] | None = None

    @classmethod
    def files(cls) -> tuple[str, str, str]:
        """(CA bundle, server certificate chain, server key) as files."""
        if cls._files is None:
            import trustme

            ca = trustme.CA()
            cert = ca.issue_cert("127.0.0.1", "localhost")
            d = Path(tempfile.mkdtemp(prefix="test-ca-"))
            ca.cert_pem.write_to_path(str(d / "ca.pem"))
            cert.private_key_pem.write_to_path(str(d / "key.pem"))
            cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
            for pem in cert.cert_chain_pems[1:]:
                pem.write_to_path(str(d / "cert.pem"), append=True)
            cls._files = (str(d / "ca.pem"), str(d / "cert.pem"), str(d / "key.pem"))
        return cls._files


def sim_server(
    *extra: str, time_scale: float = 10.0, startup: float = 0.0, tls: bool = False
) -> Proc:
    if tls:
        _, cert, key = TestCA.files()
        extra = ("--ssl-certfile", cert, "--ssl-keyfile", key, *extra)
    args = [
        sys.executable, "-m", "servefleet.sim.server", "--model", MODEL, "--gpu", "H200-SXM",
        "--port", "0", "--time-scale", str(time_scale), "--startup-time", str(startup),
        "--max-model-len", "4096", "--disable-log-requests", "--log-level", "warning",
        "--admin-token", "sim-admin", *extra,
    ]  # fmt: skip
    return Proc(args, "sim-server")


def gateway(*extra: str, replicas: list[Proc] = (), config: Path | None = None) -> Proc:
    """A gateway in front of ``replicas`` (https ones are trusted through ``TestCA``)."""
    args = [sys.executable, "-m", "servefleet.gateway", "--port", "0", "--log-level", "warning"]
    if any(r.url.startswith("https") for r in replicas):
        conf = Path(tempfile.mkstemp(prefix="gateway-", suffix=".yaml")[1])
        ca = TestCA.files()[0]
        entries = [{"url": r.url, "tls_verify": ca} for r in replicas]
        conf.write_text(json.dumps({"replicas": entries}))
        args += ["--config", str(conf)]
        replicas = ()
    for r in replicas:
        args += ["--replica", r.url]
    if config is not None:
        args += ["--config", str(config)]
    args += [
        "--set", "health.interval=0.1", "--set", "health.timeout=1.0",
        "--set", "health.healthy_threshold=1", "--set", "scrape_interval=0.5", *extra,
    ]  # fmt: skip
    return Proc(args, "gateway")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-")
        self.p = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"redis://127.0.0.1:{self.port}/0"
        wait_for(self._pong, 10.0, "redis PONG")

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            if self.p.poll() is not None:
                raise AssertionError("redis-server exited") from None
            return False

    def stop(self) -> None:
        self.p.send_signal(signal.SIGCONT)  # a stopped server cannot take the SIGTERM
        self.p.terminate()
        self.p.wait(10)


def client_ssl(url: str):
    """The SSL context a test client needs for ``url`` (trusting ``TestCA``), or None."""
    if not url.startswith("https"):
        return None
    import ssl

    return ssl.create_default_context(cafile=TestCA.files()[0])


def wait_for(pred: Callable[[], object], timeout: float, what: str, every: float = 0.02):
    """Poll ``pred`` (a cheap state query, e.g. /fleet) until truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def http(
    method: str,
    url: str,
    body: dict | bytes | None = None,
    headers: dict | None = None,
    timeout: float = 30.0,
):
    """(status, headers, parsed JSON or text); a ``bytes`` body is sent as it is."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=client_ssl(url)) as r:
            raw, status, hdrs = r.read(), r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        raw, status, hdrs = e.read(), e.code, dict(e.headers)
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode(errors="replace")


def fleet(gw: Proc) -> dict:
    return http("GET", gw.url + "/fleet", headers=gw.ops)[2]


def states(gw: Proc) -> dict[str, str]:
    return {r["url"]: r["state"] for r in fleet(gw)["replicas"]}


def wait_ready(gw: Proc, n: int, timeout: float = 20.0) -> None:
    wait_for(lambda: list(states(gw).values()).count("ready") >= n, timeout, f"{n} ready replicas")


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def metrics(p: Proc) -> str:
    return http("GET", p.url + "/metrics", headers=p.ops)[2]


@contextlib.contextmanager
def procs(*ps: Proc) -> Iterator[tuple[Proc, ...]]:
    try:
        yield ps
    finally:
        for p in ps:
            p.stop()


def test_support_parses_metrics():
    text = 'a_total{x="1",y="2"} 3.0\na_total{x="2"} 4.0\na_created 5\n'
    assert metric(text, "a_total") == 7.0
    assert metric(text, "a_total", x="1") == 3.0
