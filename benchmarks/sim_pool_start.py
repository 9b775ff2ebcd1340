"""What starting `simulate --jobs` worker processes costs, by start method (Linux).

``python benchmarks/sim_pool_start.py [--jobs 2] [--repeat 5]``: for ``fork``, ``forkserver``
(what ``sim.command.point_pool`` uses, with the simulator preloaded) and ``spawn``, each in a
fresh process that has already imported the simulator (as ``servefleet simulate`` has): the
wall time from creating the pool until every worker has answered a first task, and the CPU
seconds this took in every process involved — this one, the workers, and the fork server —
read from /proc while they are alive. A second pool in the same process shows what is paid
once per process. Methods interleaved; medians; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

METHODS = ("fork", "forkserver", "spawn")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_task(_: int) -> int:
    import servefleet.sim.command  # noqa: F401  (what a worker needs to run a point)

    time.sleep(0.02)  # long enough for the tasks to land on different workers
    return os.getpid()


def _one_pool(method: str, jobs: int) -> tuple[float, float]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["servefleet.sim.command"])
    self0 = _cpu(os.getpid())
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        pids = set(pool.map(_first_task, range(jobs * 4)))
        wall = time.perf_counter() - t0
        cpu = _cpu(os.getpid()) - self0 + sum(_cpu(p) for p in pids)
    return wall, cpu


def _child(method: str, jobs: int) -> None:
    import multiprocessing.forkserver as fs

    import servefleet.sim.command  # noqa: F401  (loaded, as in `servefleet simulate`)

    first = _one_pool(method, jobs)
    server = fs._forkserver._forkserver_pid if method == "forkserver" else None
    server_cpu = _cpu(server) if server else 0.0
    second = _one_pool(method, jobs)
    print(json.dumps({"first": [first[0], first[1] + server_cpu], "second": list(second)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child, a.jobs)
        return
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for _ in range(a.repeat):
        for m in METHODS:
            out = subprocess.run(
                [sys.executable, __file__, "--child", m, "--jobs", str(a.jobs)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[m].append(json.loads(out.stdout))
    print(f"{a.jobs} workers, median of {a.repeat}; load average {os.getloadavg()}")
    print("method      first pool: wall / CPU       a second pool: wall / CPU")
    for m, rs in runs.items():
        med = {k: [statistics.median(r[k][i] for r in rs) for i in (0, 1)] for k in rs[0]}
        f, s = med["first"], med["second"]
        print(f"{m:11s} {f[0]:8.3f} s / {f[1]:6.3f} s    {s[0]:8.3f} s / {s[1]:6.3f} s")


if __name__ == "__main__":
    main()
