"""``python -m servefleet.telemetry [--port 9400] [--gpus 0,1]``: serve this host's GPUs
(NVML) with DCGM exporter names until Ctrl-C — what ``servefleet up`` serves, for a server it
did not start (``transformers serve``, a hand-run ``vllm serve``)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from servefleet.telemetry.exporter import DEFAULT_PORT, serve_gpu_metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servefleet.telemetry", description=__doc__)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--gpus", default="", help="GPU indices to serve (default: every GPU)")
    a = p.parse_args(argv)
    gpus = {int(g): "" for g in a.gpus.split(",") if g.strip()}
    got = serve_gpu_metrics(gpus, a.port, a.host)
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 1
    print(f"GPU telemetry (NVML) at {got.url}", flush=True)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    got.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
