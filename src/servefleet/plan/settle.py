"""The one measurement that settles a ranking the model cannot: one replica of each topology
on one node, each served with the plan's flags and benchmarked with the planned workload and
SLO by ``servefleet bench``'s SLO search; the topology with the higher rate per GPU wins."""

from __future__ import annotations

import shlex

from servefleet.sim.deployment import Deployment
from servefleet.stats import slo_classes_text

from .fleet_yaml import Fleet
from .search import SLOTarget

PORT = 8001
WINDOW = 600
WARMUP = 60


def settle_commands(
    fleet: Fleet, deps: list[tuple[Deployment, float]], workload: str, slo: SLOTarget
) -> list[str]:
    """For each (deployment, its planned fleet rate): the ``vllm serve`` line of one replica
    (GPUs 0..tp-1 of the node) and the ``servefleet bench`` line that finds its sustainable
    rate, starting at its planned share."""
    lines = []
    for dep, rate in deps:
        one = fleet.model_copy(deep=True)
        replica = one.replicas[0].model_copy(
            update={"tp": dep.tp, "gpu_ids": list(range(dep.tp)), "port": PORT, "host": "localhost"}
        )
        one.vllm.max_num_seqs = dep.max_num_seqs
        one.vllm.max_num_batched_tokens = dep.max_num_batched_tokens
        one.replicas = [replica]
        bench = [
            "servefleet bench",
            f"--url http://localhost:{PORT}",
            f"--model {shlex.quote(one.model.name)}",
            f"--workload {shlex.quote(workload)}",
            "--slo-search",
            f"--search-start {rate / dep.replicas:.3g}",
            f"--duration {WINDOW + WARMUP}",
            f"--warmup {WARMUP}",
        ]
        if slo.ttft is not None:
            bench.append(f"--slo-ttft {slo.ttft:g}")
        if slo.itl is not None:
            bench.append(f"--slo-itl {slo.itl:g}")
        if (named := slo.slo_classes()) is not None:
            text = slo_classes_text(named, slo.stats_slo())
            bench.append(f"--slo-classes {shlex.quote(text)}")
        bench.append(f"--out settle-tp{dep.tp}")
        lines.append(f"# one replica of TP={dep.tp} ({dep.tp} GPUs); stop it before the next")
        lines.append(one.serve_command(replica))
        lines.append(" ".join(bench))
    lines.append(
        "# compare the two runs' sustained req/s per GPU (servefleet report show settle-tp*)"
    )
    return lines
