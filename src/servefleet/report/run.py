"""A run on disk (``servefleet bench`` or ``servefleet simulate`` output), read back.

Both write ``summary.json`` and ``records-<point>.jsonl.gz``. Reports recompute every figure
from the records (``PointData.summary``), with the measurement window and SLOs the run used, so a
report can be re-rendered from the raw records at any time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from servefleet.client_protocol import of_run
from servefleet.records import RequestRecord, read_jsonl
from servefleet.stats import DEFAULT_MAX_ERROR_RATE, SLO, Summary, Window, class_slos, summarize


class RunError(ValueError):
    """A path that is not a readable run: the message says what is missing."""


@dataclass(slots=True)
class PointData:
    label: str
    concurrency: int | None
    rate: float | None
    window: Window
    raw: dict
    """The point as summary.json has it (selfcheck, server, ... when a bench run)."""
    records_path: Path | None = None
    all_records: bool = True
    """False when the run wrote a sample of the records or none (``simulate --records``):
    summaries then come from summary.json, under the run's own SLOs only."""
    _records: list[RequestRecord] | None = None
    _summary: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, float]:
        return (
            ("c", float(self.concurrency))
            if self.concurrency is not None
            else ("r", float(self.rate or 0))
        )

    @property
    def value(self) -> float:
        return float(self.concurrency if self.concurrency is not None else self.rate or 0)

    @property
    def tag(self) -> str:
        """File-name tag: ``c8``, ``r2.5``."""
        return f"c{self.concurrency}" if self.concurrency is not None else f"r{self.rate:g}"

    @property
    def records(self) -> list[RequestRecord]:
        """The point's records (with ``all_records`` False: those the run wrote, maybe none)."""
        if self._records is None:
            if self.records_path is None or not self.records_path.is_file():
                if not self.all_records:
                    return []
                raise RunError(f"{self.records_path}: records file missing for point {self.label}")
            self._records = list(read_jsonl(self.records_path))
        return self._records

    def summary(self, slo: SLO, class_slos: dict[str, SLO] | None = None) -> Summary:
        k = _slo_key(slo, class_slos)
        if k not in self._summary:
            if not self.all_records:
                raise RunError(
                    f"point {self.label}: the run kept only some records (simulate --records), "
                    "so its summary is for its own SLOs only; re-run it with --records all"
                )
            self._summary[k] = summarize(self.records, self.window, slo, class_slos=class_slos)
        return self._summary[k]

    def use_summary(self, slo: SLO, class_slos: dict[str, SLO] | None, s: Summary) -> None:
        """Take ``s`` as the summary under these SLOs (computed as the run went)."""
        self._summary[_slo_key(slo, class_slos)] = s


def _slo_key(slo: SLO, class_slos: dict[str, SLO] | None) -> tuple:
    return (slo.ttft, slo.itl, tuple(sorted((class_slos or {}).items())))


@dataclass(slots=True)
class RunData:
    name: str
    kind: str
    """``bench`` or ``simulate``."""
    meta: dict
    points: list[PointData]
    slo: SLO
    path: Path | None = None
    class_slos: dict[str, SLO] = field(default_factory=dict)
    """Classes whose SLOs differ from ``slo`` (the workload spec's ``classes.<name>.slo``, and
    the values of ``--slo-classes``)."""
    slo_classes: dict[str, SLO] | None = None
    """The classes the run's SLOs are judged on, each on its own (``--slo-classes``; None:
    every request, pooled)."""

    @property
    def max_error_rate(self) -> float:
        return (self.meta.get("settings") or {}).get("max_error_rate", DEFAULT_MAX_ERROR_RATE)

    @property
    def complete(self) -> bool:
        """Every planned point ran to its end. Runs written before this flag existed count as
        complete unless they say they were interrupted."""
        return bool(self.meta.get("complete", not self.meta.get("interrupted", False)))

    def summary(self, p: PointData) -> Summary:
        """A point's summary under this run's SLOs (recomputed from the records)."""
        return p.summary(self.slo, self.class_slos)

    def failed(self, p: PointData) -> bool:
        """More than the run's --max-error-rate of the point's requests failed."""
        return self.summary(p).failed_point(self.max_error_rate)

    @property
    def axis(self) -> str:
        return "rate" if self.points and self.points[0].rate is not None else "concurrency"

    @property
    def title(self) -> str:
        m = self.meta
        if self.kind == "simulate":
            d = m.get("deployment", {})
            where = f"{d.get('model')} on {d.get('replicas')} x TP={d.get('tp')} {d.get('gpu')} (simulated)"
        else:
            t = m.get("target", {})
            where = f"{t.get('model')} at {t.get('url')} (measured)"
        return f"{where} — {m.get('workload', {}).get('name', '?')}"

    @property
    def client_protocol(self) -> str | None:
        """How the client streamed: ``client_protocol(meta)``."""
        return client_protocol(self.meta)

    def sorted_points(self) -> list[PointData]:
        return sorted(self.points, key=lambda p: p.value)


def client_protocol(meta: dict) -> str | None:
    """How a run's client streamed, as reports name it (``servefleet.client_protocol.of_run``);
    None where a run does not say (a simulation written before it did)."""
    protocol = of_run(meta)
    return protocol.describe() if protocol is not None else None


def load_run(path: Path | str, slo: SLO | None = None, records: dict | None = None) -> RunData:
    """Read a run folder (or its summary.json). ``records`` (tag → list) supplies records
    in memory instead of reading the files."""
    p = Path(path)
    summary_file = p if p.is_file() else p / "summary.json"
    if not p.exists():
        raise RunError(f"{p}: no such run folder")
    if not summary_file.is_file():
        raise RunError(
            f"{p}: not a run folder (no summary.json); give the --out folder of "
            "`servefleet bench` or `servefleet simulate`"
        )
    try:
        meta = json.loads(summary_file.read_text())
    except ValueError as e:
        raise RunError(f"{summary_file}: not valid JSON: {e}") from None
    return run_from_summary(meta, summary_file.parent, slo, records)


def run_from_summary(
    meta: dict,
    folder: Path | None,
    slo: SLO | None = None,
    records: dict | None = None,
    summaries: dict[str, Summary] | None = None,
) -> RunData:
    """``summaries`` (tag → Summary) are the points' summaries under the run's own SLOs, as
    the run computed them (no need to recompute them from the records)."""
    if not isinstance(meta, dict) or "points" not in meta:
        raise RunError(f"{folder}: summary.json has no points")
    kind = meta.get("kind", "simulate")
    settings = meta.get("settings", {})
    s = settings.get("slo") or {}
    slo = slo or SLO(s.get("ttft", 2.0), s.get("itl", 0.1))
    points = []
    for raw in meta["points"]:
        load = raw.get("load") or {}
        c, r = load.get("concurrency"), load.get("rate")
        tag = f"c{c}" if c is not None else f"r{r:g}"
        if "window" in raw:
            w = Window(raw["window"]["start"], raw["window"]["end"])
        else:
            w = Window(settings.get("warmup", 0.0), settings.get("duration") or 1e18)
        label = raw.get("label") or (f"c={c}" if c is not None else f"{r:g} req/s")
        pd = PointData(label, c, r, w, raw)
        fname = raw.get("records_file") or f"records-{tag}.jsonl.gz"
        if records is not None and tag in records:
            pd._records = list(records[tag])
        elif folder is not None:
            pd.records_path = folder / fname
        pd.all_records = settings.get("records", "all") == "all"
        points.append(pd)
    name = folder.name if folder is not None else kind
    named = settings.get("slo_classes")
    slo_classes = (
        None if named is None else {n: SLO(v.get("ttft"), v.get("itl")) for n, v in named.items()}
    )
    own_classes = {**class_slos(meta.get("workload"), slo), **(slo_classes or {})}
    run = RunData(name, kind, meta, points, slo, folder, own_classes, slo_classes)
    own = SLO(s.get("ttft", 2.0), s.get("itl", 0.1))
    for pd in points:
        tag = pd.tag
        if summaries is not None and tag in summaries:
            pd.use_summary(own, run.class_slos, summaries[tag])
        elif not pd.all_records and "summary" in pd.raw:
            pd.use_summary(own, run.class_slos, Summary.from_dict(pd.raw["summary"]))
    return run
