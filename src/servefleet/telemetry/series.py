"""GPU samples taken during a point, as time series and per-point figures (pure).

Two sources give the same shape (``GpuSeries.to_dict()``, kept per point in summary.json):

* **measured**: scrapes of a DCGM-named endpoint (``servefleet up``'s, or a dcgm-exporter):
  utilization %, memory used (MiB), power (W), SM clock (MHz) per GPU;
* **modelled**: the sim-server's ``servefleet:sim_gpu_busy_seconds`` counter per replica,
  whose rate is the share of wall time a modelled engine step ran (utilization's counterpart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from servefleet.telemetry.exporter import FB_USED, POWER, SM_CLOCK, UTIL

FIELDS = {UTIL: "utilization", FB_USED: "memory_used", POWER: "power", SM_CLOCK: "sm_clock"}
"""DCGM name → series name."""
SIM_BUSY = "servefleet:sim_gpu_busy_seconds"


def parse_gpu_metrics(text: str) -> dict[str, dict]:
    """DCGM-named samples by GPU (key: its UUID, else ``gpu<index>``): each GPU's labels
    (``gpu``, ``modelName``, ``replica``) and readings (``utilization``, ...)."""
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = FIELDS.get(s.name)
            if name is None:
                continue
            lab = s.labels
            key = lab.get("UUID") or f"gpu{lab.get('gpu', '?')}"
            g = out.setdefault(
                key,
                {
                    "gpu": lab.get("gpu", ""),
                    "name": lab.get("modelName", ""),
                    "replica": lab.get("replica", ""),
                    "host": lab.get("Hostname", ""),
                    "readings": {},
                },
            )
            g["readings"][name] = float(s.value)
    return out


@dataclass(slots=True)
class GpuSeries:
    """Time series of every GPU seen during one point (times: seconds since its start)."""

    source: str
    kind: str = "measured"
    """``measured`` (NVML/DCGM) or ``modelled`` (the sim-server's busy time)."""
    t: list[float] = field(default_factory=list)
    gpus: dict[str, dict] = field(default_factory=dict)
    """Key → labels (gpu index, model name, the replicas on it)."""
    values: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)
    """Series name → GPU key → one value per sample (None where the GPU said nothing)."""

    def add(self, t: float, parsed: Mapping[str, dict]) -> None:
        """One scrape (``parse_gpu_metrics``) at ``t``."""
        n = len(self.t)
        self.t.append(t)
        for key, g in parsed.items():
            self.gpus.setdefault(key, {k: v for k, v in g.items() if k != "readings"})
            for name, v in g["readings"].items():
                col = self.values.setdefault(name, {}).setdefault(key, [])
                col.extend([None] * (n - len(col)))
                col.append(v)
        for cols in self.values.values():
            for col in cols.values():
                col.extend([None] * (n + 1 - len(col)))

    def figures(self) -> dict[str, dict[str, float | None]]:
        """Per GPU: mean and peak utilization, peak memory used, mean power, mean SM clock."""
        out = {}
        for key in self.gpus:

            def col(name: str, key=key) -> np.ndarray:
                v = self.values.get(name, {}).get(key, [])
                return np.asarray([x for x in v if x is not None], dtype=float)

            u, m, p, c = col("utilization"), col("memory_used"), col("power"), col("sm_clock")
            out[key] = {
                "utilization_mean": float(u.mean()) if u.size else None,
                "utilization_max": float(u.max()) if u.size else None,
                "memory_used_max": float(m.max()) if m.size else None,
                "power_mean": float(p.mean()) if p.size else None,
                "power_max": float(p.max()) if p.size else None,
                "sm_clock_mean": float(c.mean()) if c.size else None,
            }
        return out

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "kind": self.kind,
            "t": [round(x, 3) for x in self.t],
            "gpus": self.gpus,
            "values": self.values,
            "figures": self.figures(),
        }


def busy_series(
    source: str, times: Sequence[float], counters: Sequence[Mapping[str, float]]
) -> GpuSeries | None:
    """The modelled busy fraction (in %) of each replica between consecutive samples of its
    ``servefleet:sim_gpu_busy_seconds`` counter (``counters``: replica → counter value, one
    mapping per sample at ``times``); None when no replica has the counter."""
    keys = sorted({k for c in counters for k in c})
    if not keys or len(times) < 2:
        return None
    s = GpuSeries(source, "modelled")
    for i in range(1, len(times)):
        dt = times[i] - times[i - 1]
        parsed = {}
        for k in keys:
            a, b = counters[i - 1].get(k), counters[i].get(k)
            if a is None or b is None or dt <= 0 or b < a:
                continue
            parsed[k] = {
                "gpu": "",
                "name": "modelled",
                "replica": k,
                "readings": {"utilization": min(100.0, 100.0 * (b - a) / dt)},
            }
        s.add((times[i] + times[i - 1]) / 2, parsed)
    return s
