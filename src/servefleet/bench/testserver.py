"""A small OpenAI-compatible server whose token times are known exactly (for accuracy tests).

Every streamed response follows a fixed script, so the truth is known without a model:

* chat: a role-only first chunk right away (it carries no text and must not count as TTFT);
* the first text chunk ``--ttft`` seconds after the request arrived;
* then chunks of ``--chunks`` tokens in turn (e.g. ``1,3,1,2``: some chunks carry several
  tokens), each ``--itl`` × its tokens after the previous one, so every token is ``--itl`` apart;
* a stall of ``--stall`` seconds before every ``--stall-every``-th chunk;
* a usage chunk (``stream_options.include_usage``), per-chunk usage when
  ``continuous_usage_stats`` is asked for, each chunk's ``token_ids`` with ``return_token_ids``
  (vLLM's extensions).

It is HTTP/1.1 written directly on an asyncio ``Protocol`` (keep-alive, chunked responses), so
that the truth is taken where the bytes meet the socket: a request's arrival is the
``data_received`` call that completed it, a chunk's time is just before its ``transport.write``
(``time.perf_counter()``: CLOCK_MONOTONIC, the same system-wide clock as the client's on Linux).
``GET /truth`` returns them per request id (``X-Request-Id``), ``POST /truth/reset`` forgets them.

Faults, per request by header ``X-Test-Fault``: ``http-500``, ``http-429`` (any status),
``stream-error`` (an error event after two chunks), ``drop`` (the connection closes
mid-stream); ``--fail-every N`` makes every N-th request a 500. ``--fast`` sends every token at
once (the fast local server of the client-capacity benchmark). ``/metrics`` serves a few vLLM
metric names, so that scraping can be tested.

    python -m servefleet.bench.testserver --port 0   # prints "... ready: ... port=N"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass, field

WORDS = ("bada", "kitu", "mole", "suna", "reva", "tomi", "lupa", "gane")
"""Every output token is one of these words plus a space (5 characters each)."""
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(slots=True)
class Script:
    ttft: float = 0.02
    itl: float = 0.005
    chunks: tuple[int, ...] = (1, 3, 1, 2)
    stall_every: int = 0
    stall: float = 0.0
    fast: bool = False

    def plan(self, n: int) -> list[tuple[float, int]]:
        """(offset after arrival, tokens) of each text chunk for ``n`` output tokens."""
        out: list[tuple[float, int]] = []
        t, left, i = self.ttft, n, 0
        while left > 0:
            k = min(self.chunks[i % len(self.chunks)], left)
            if i > 0:
                t += self.itl * k
                if self.stall_every and i % self.stall_every == 0:
                    t += self.stall
            out.append((0.0 if self.fast else t, k))
            left -= k
            i += 1
        return out


@dataclass(slots=True)
class Truth:
    recv: float
    chunks: list[tuple[float, int]] = field(default_factory=list)


class TestServer:
    """State shared by the connections: the script, the truth, counters for /metrics."""

    def __init__(self, script: Script, fail_every: int = 0, record_truth: bool = True):
        self.script = script
        self.fail_every = fail_every
        self.record_truth = record_truth
        self.truth: dict[str, Truth] = {}
        self.count = 0
        self.in_flight = 0
        self.completed = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft_obs: list[float] = []

    def metrics_text(self) -> str:
        lab = '{engine="0",model_name="test-model"}'
        lines = [
            f"vllm:num_requests_running{lab} {self.in_flight}",
            f"vllm:num_requests_waiting{lab} 0",
            f"vllm:kv_cache_usage_perc{lab} {min(1.0, self.in_flight / 100)}",
            f"vllm:num_preemptions_total{lab} 0",
            f"vllm:prefix_cache_queries_total{lab} {self.prompt_tokens}",
            f"vllm:prefix_cache_hits_total{lab} {self.prompt_tokens // 2}",
            f"vllm:prompt_tokens_total{lab} {self.prompt_tokens}",
            f"vllm:generation_tokens_total{lab} {self.generation_tokens}",
        ]
        name = "vllm:time_to_first_token_seconds"
        for le in (0.01, 0.02, 0.05, 0.1, 0.5, 1.0, "+Inf"):
            n = sum(1 for v in self.ttft_obs if le == "+Inf" or v <= le)
            lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="test-model"}} {n}')
        lines.append(f"{name}_count{lab} {len(self.ttft_obs)}")
        lines.append(f"{name}_sum{lab} {sum(self.ttft_obs)}")
        return "\n".join(lines) + "\n"


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: requests parsed from the bytes, answered in turn."""

    def __init__(self, server: TestServer):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.queue: list[tuple] = []
        self.handle: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            self.server.in_flight -= 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            try:
                method, path, _ = head[0].split(" ", 2)
            except ValueError:
                self._close()
                return
            headers = {}
            for line in head[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0") or 0)
            if len(self.buf) < end + 4 + n:
                return
            body = self.buf[end + 4 : end + 4 + n]
            self.buf = self.buf[end + 4 + n :]
            self.queue.append((method, path.split("?")[0], headers, body, now))
            self._next()

    def _next(self) -> None:
        if self.busy or not self.queue or self.transport is None:
            return
        self.busy = True
        self._dispatch(*self.queue.pop(0))

    def _done(self, close: bool = False) -> None:
        self.busy = False
        if close:
            self._close()
        else:
            self._next()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- responses ---------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        if self.transport is not None:
            self.transport.write(head + body)
        self._done()

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str) -> None:
        self._json(
            status,
            {"error": {"message": message, "type": "TestError", "param": None, "code": status}},
        )

    def _dispatch(self, method: str, path: str, headers: dict, body: bytes, recv: float) -> None:
        s = self.server
        if method == "GET" and path == "/v1/models":
            return self._json(
                200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]}
            )
        if method == "GET" and path == "/health":
            return self._send(200, b"")
        if method == "GET" and path == "/metrics":
            return self._send(200, s.metrics_text().encode(), "text/plain; version=0.0.4")
        if method == "GET" and path == "/truth":
            return self._json(
                200, {k: {"recv": v.recv, "chunks": v.chunks} for k, v in s.truth.items()}
            )
        if method == "POST" and path == "/truth/reset":
            s.truth.clear()
            return self._json(200, {"reset": True})
        try:
            obj = json.loads(body or b"{}")
        except ValueError:
            return self._error(400, "body is not JSON")
        if method == "POST" and path == "/tokenize":
            text = obj.get("prompt") or " ".join(
                str(m.get("content")) for m in obj.get("messages", [])
            )
            n = len(text.split())
            return self._json(200, {"count": n, "max_model_len": 1 << 20, "tokens": list(range(n))})
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return self._generate(obj, headers, recv, chat=path.endswith("chat/completions"))
        return self._error(404, f"no route {method} {path}")

    def _generate(self, body: dict, headers: dict, recv: float, chat: bool) -> None:
        s = self.server
        s.count += 1
        rid = headers.get("x-request-id") or f"req-{s.count}"
        fault = headers.get("x-test-fault", "")
        if s.fail_every and s.count % s.fail_every == 0:
            fault = "http-500"
        if fault.startswith("http-"):
            code = int(fault[5:])
            return self._error(code, f"injected fault {code}")
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if chat:
            prompt = " ".join(str(m.get("content") or "") for m in body.get("messages", []))
        else:
            p = body.get("prompt", "")
            prompt = p if isinstance(p, str) else " ".join(map(str, p))
        prompt_tokens = len(prompt.split())
        if not body.get("stream"):
            text = "".join(WORDS[i % len(WORDS)] + " " for i in range(n))
            return self._json(
                200,
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "model": "test-model",
                    "choices": [
                        {
                            "index": 0,
                            "text": text,
                            "finish_reason": "length",
                            "message": {"role": "assistant", "content": text},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": n,
                        "total_tokens": prompt_tokens + n,
                    },
                },
            )
        truth = Truth(recv)
        if s.record_truth:
            s.truth[rid] = truth
        opts = dict(body.get("stream_options") or {})
        opts["return_token_ids"] = bool(body.get("return_token_ids"))
        stream = _Stream(self, truth, chat, n, prompt_tokens, opts, fault, s.script.plan(n))
        s.in_flight += 1
        stream.start()


class _Stream:
    """One streamed response: chunks written by timer callbacks at their planned times."""

    def __init__(
        self,
        conn: Connection,
        truth: Truth,
        chat: bool,
        n: int,
        prompt_tokens: int,
        opts: dict,
        fault: str,
        plan: list[tuple[float, int]],
    ):
        self.conn, self.truth, self.chat, self.n = conn, truth, chat, n
        self.prompt_tokens, self.opts, self.fault, self.plan = prompt_tokens, opts, fault, plan
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'{{"id":"x","object":"{obj}","model":"test-model","choices":[{{"index":0,'
        self.usage_head = f'{{"id":"x","object":"{obj}","model":"test-model","choices":[],"usage":'
        self.i = 0
        self.done = 0

    def _write(self, data: bytes) -> float:
        t = time.perf_counter()
        tr = self.conn.transport
        if tr is not None:
            tr.write(b"%x\r\n%s\r\n" % (len(data), data))
        return t

    def _event(self, payload: str) -> float:
        return self._write(f"data: {payload}\n\n".encode())

    def start(self) -> None:
        tr = self.conn.transport
        if tr is None:
            return
        tr.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"X-Servefleet-Replica: test-0\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        if self.chat:
            self._event(
                f'{self.head}"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}'
            )
        self._schedule()

    def _schedule(self) -> None:
        """Write every chunk already due (a loop: a stream far behind its plan must not
        recurse once per chunk), then arm a timer for the next one."""
        while True:
            offset, _ = self.plan[self.i]
            delay = self.truth.recv + offset - time.perf_counter()
            if delay > 0:
                self.conn.handle = self.conn.loop.call_later(delay, self._chunk)
                return
            if not self._emit():
                return

    def _chunk(self) -> None:
        self.conn.handle = None
        if self._emit():
            self._schedule()

    def _emit(self) -> bool:
        """Write the next chunk; False when the stream has ended (or its connection has)."""
        conn = self.conn
        if conn.transport is None:
            return False
        if self.fault == "stream-error" and self.i == 2:
            self._event('{"error":{"message":"injected stream error","code":500}}')
            self._finish()
            return False
        if self.fault == "drop" and self.i == 2:
            self.conn.server.in_flight -= 1
            conn._close()
            return False
        _, k = self.plan[self.i]
        text = "".join(WORDS[(self.done + j) % len(WORDS)] + " " for j in range(k))
        self.done += k
        fr = '"length"' if self.done >= self.n else "null"
        usage = ""
        if self.opts.get("continuous_usage_stats"):
            usage = (
                f',"usage":{{"prompt_tokens":{self.prompt_tokens},"completion_tokens":{self.done}}}'
            )
        ids = ""
        if self.opts.get("return_token_ids"):  # vLLM's extension: the chunk's token ids
            ids = ',"token_ids":' + json.dumps(list(range(self.done - k, self.done)))
        if self.chat:
            payload = (
                f'{self.head}"delta":{{"content":"{text}"}},"finish_reason":{fr}{ids}}}]{usage}}}'
            )
        else:
            payload = f'{self.head}"text":"{text}","finish_reason":{fr}{ids}}}]{usage}}}'
        t = self._event(payload)
        self.truth.chunks.append((t, k))
        if self.i == 0:
            conn.server.ttft_obs.append(t - self.truth.recv)
        self.i += 1
        if self.i < len(self.plan):
            return True
        s = conn.server
        s.prompt_tokens += self.prompt_tokens
        s.generation_tokens += self.n
        s.completed += 1
        if self.opts.get("include_usage"):
            u = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.n,
                "total_tokens": self.prompt_tokens + self.n,
            }
            self._event(self.usage_head + json.dumps(u) + "}")
        self._event("[DONE]")
        self._finish()
        return False

    def _finish(self) -> None:
        self.conn.server.in_flight -= 1
        tr = self.conn.transport
        if tr is not None:
            tr.write(b"0\r\n\r\n")
        self.conn._done()


async def serve(server: TestServer, host: str, port: int, on_ready=None) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Connection(server), host, port, backlog=4096)
    bound = srv.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready(bound, stop)
    else:
        print(f"servefleet test-server ready: http://{host}:{bound} port={bound}", flush=True)
    try:
        await stop.wait()
    finally:
        srv.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m servefleet.bench.testserver",
        description="An OpenAI-compatible server with exactly known token times.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.02, help="seconds to the first text chunk")
    p.add_argument("--itl", type=float, default=0.005, help="seconds between tokens")
    p.add_argument("--chunks", default="1,3,1,2", help="tokens per chunk, in turn")
    p.add_argument("--stall-every", type=int, default=0, help="a stall before every N-th chunk")
    p.add_argument("--stall", type=float, default=0.0, help="seconds of each stall")
    p.add_argument("--fast", action="store_true", help="no delays at all")
    p.add_argument("--fail-every", type=int, default=0, help="every N-th request gets HTTP 500")
    p.add_argument("--no-truth", action="store_true", help="do not record chunk times")
    return p.parse_args(argv)


def script_of(a: argparse.Namespace) -> Script:
    chunks = tuple(int(x) for x in a.chunks.split(",") if x)
    if not chunks or min(chunks) < 1:
        raise SystemExit("--chunks: comma-separated integers >= 1")
    return Script(a.ttft, a.itl, chunks, a.stall_every, a.stall, a.fast)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    server = TestServer(script_of(a), a.fail_every, record_truth=not a.no_truth)
    try:
        import uvloop

        uvloop.run(serve(server, a.host, a.port))
    except ImportError:
        asyncio.run(serve(server, a.host, a.port))
    return 0


class Spawned:
    """A server started as a subprocess: its ``url`` once it printed its ready line."""

    def __init__(self, argv: list[str], timeout: float = 60.0, env: dict | None = None):
        import queue
        import subprocess
        import threading

        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream) -> None:
            for line in stream:
                self.lines.put(line)
            self.lines.put(None)

        threading.Thread(target=pump, args=(self.proc.stdout,), daemon=True).start()
        self.stderr_lines: list[str] = []

        def keep(stream) -> None:
            for line in stream:
                self.stderr_lines.append(line)

        threading.Thread(target=keep, args=(self.proc.stderr,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(
                    f"{' '.join(argv)} printed no ready line: {''.join(self.stderr_lines)[-2000:]}"
                )
            if "port=" in line:
                port = int(line.split("port=")[1].split()[0])
                self.url = f"http://127.0.0.1:{port}"
                return

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Spawned:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def spawn_test_server(*args: str) -> Spawned:
    """``python -m servefleet.bench.testserver --port 0 ARGS``, ready."""
    return Spawned([sys.executable, "-m", "servefleet.bench.testserver", "--port", "0", *args])


def truth_errors(records, truth: dict) -> dict:
    """Measured minus true times, per request (TTFT) and per token (ITL), from records and
    ``GET /truth``. Returns numpy arrays ``ttft_err``, ``itl_err``, ``ttft_true``, ``itl_true``,
    ``ttft_meas``, ``itl_meas`` (seconds)."""
    import numpy as np

    te, ie, tt, it, tm, im = [], [], [], [], [], []
    for r in records:
        t = truth.get(r.request_id)
        if not r.ok or t is None or not t["chunks"] or r.ttft is None:
            continue
        chunks = t["chunks"]
        true_ttft = chunks[0][0] - t["recv"]
        te.append(r.ttft - true_ttft)
        tt.append(true_ttft)
        tm.append(r.ttft)
        if len(chunks) != len(r.chunk_times):
            continue
        for i in range(1, len(chunks)):
            k = chunks[i][1]
            true_gap = (chunks[i][0] - chunks[i - 1][0]) / k
            gap = (r.chunk_times[i] - r.chunk_times[i - 1]) / max(r.chunk_tokens[i], 1)
            ie.extend([gap - true_gap] * k)
            it.extend([true_gap] * k)
            im.extend([gap] * k)
    return {
        k: np.asarray(v)
        for k, v in dict(
            ttft_err=te, itl_err=ie, ttft_true=tt, itl_true=it, ttft_meas=tm, itl_meas=im
        ).items()
    }


if __name__ == "__main__":
    sys.exit(main())
