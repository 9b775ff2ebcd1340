"""A run's ``Summary`` from records seen one at a time, in memory that does not grow with them.

``summarize`` (``servefleet.stats``) needs every record of a run at once; a simulated fleet of
hundreds of replicas finishes millions of requests and hundreds of millions of tokens. Here
each record is folded into counters and distributions as it finishes, and can then be dropped:

* counts and sums (requests, errors, tokens in the window, goodput, cached and recomputed
  tokens) are exact;
* each distribution (TTFT, ITL, TPOT, ...) keeps its values while there are at most
  ``EXACT_VALUES`` (2M) of them and is then exact: the same ``Distribution`` as ``summarize``
  gives, bit for bit (the values are kept in the same order). Past that it moves into a
  DDSketch (Masson, Rim, Lee, VLDB 2019; the ``ddsketch`` package): count, mean and max stay
  exact, and every percentile is within ``RELATIVE_ACCURACY`` (0.5 %) of the value at rank
  ``floor(q·(n−1))`` of the sorted values (``np.percentile`` interpolates between that value
  and the next one). Memory: a bin per 1 % step of the values' range, about 1,600 bins from
  0.1 ms to 1,000 s.

The metric definitions are those of ``servefleet.stats`` (which records count for which
metric, ``token_gaps_of``, ``SLO.met``, ``error_kind``); ``tests/test_stream_stats.py`` checks
that the result equals ``summarize`` on the same records.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from itertools import chain

import numpy as np
from ddsketch import LogarithmicMapping
from ddsketch.ddsketch import BaseDDSketch
from ddsketch.store import DenseStore

from servefleet.records import RequestRecord
from servefleet.stats import (
    SLO,
    Distribution,
    Summary,
    Window,
    cancelled,
    error_kind,
    group_order,
    ratio,
    token_gaps_of,
    turn_group,
)

EXACT_VALUES = 1 << 21
"""Values a distribution keeps (16 MiB of float64) before it moves into a sketch."""
RELATIVE_ACCURACY = 0.005
"""The sketch's guarantee on every percentile, relative to the value."""
_BATCH = 1 << 16
"""Values gathered before they are binned together (numpy, not one Python call each)."""


class Quantiles:
    """The distribution of a stream of numbers: exact while small, a DDSketch past
    ``exact_values`` (see the module's docstring)."""

    __slots__ = (
        "_mapping",
        "_neg",
        "_pos",
        "_zeros",
        "buf",
        "count",
        "exact_values",
        "max",
        "total",
    )

    def __init__(self, exact_values: int = EXACT_VALUES) -> None:
        self.exact_values = exact_values
        self.buf = array("d")
        """The values (exact) or those not binned yet (sketch)."""
        self.count = 0
        self.total = 0.0
        """Sum of the binned values (sketch only)."""
        self.max = -math.inf
        """Max of the binned values (sketch only)."""
        self._mapping: LogarithmicMapping | None = None
        self._pos = DenseStore()
        self._neg = DenseStore()
        self._zeros = 0

    @property
    def exact(self) -> bool:
        return self._mapping is None

    def add(self, value: float) -> None:
        self.buf.append(value)
        self.count += 1
        if len(self.buf) >= self._limit():
            self._bin()

    def extend(self, values: np.ndarray) -> None:
        """Add float64 ``values``, in order."""
        self.buf.frombytes(np.ascontiguousarray(values, dtype=float).tobytes())
        self.count += len(values)
        if len(self.buf) >= self._limit():
            self._bin()

    def _limit(self) -> int:
        return self.exact_values + 1 if self._mapping is None else _BATCH

    def _bin(self) -> None:
        """Move the buffered values into the sketch's bins (starting the sketch if needed)."""
        if self._mapping is None:
            self._mapping = LogarithmicMapping(RELATIVE_ACCURACY)
        a = np.frombuffer(self.buf, dtype=float)
        if a.size:
            self.total += float(a.sum())
            self.max = max(self.max, float(a.max()))
            tiny = self._mapping.min_possible
            self._zeros += int(np.count_nonzero(np.abs(a) <= tiny))
            self._add_keys(self._pos, a[a > tiny])
            self._add_keys(self._neg, -a[a < -tiny])
        self.buf = array("d")

    def _add_keys(self, store: DenseStore, v: np.ndarray) -> None:
        """``store.add(mapping.key(x))`` for each ``x`` of ``v``, one call per distinct key.
        The key is the mapping's (``ceil(log_gamma(x))``), computed by numpy; where its
        rounding differs from ``math.log``'s, the value lands in the next bin, whose
        representative is also within the accuracy of it."""
        if not v.size:
            return
        keys = np.ceil(np.log2(v) * self._multiplier()).astype(np.int64)
        low = int(keys.min())
        counts = np.bincount(keys - low)
        present = np.flatnonzero(counts)
        for k, c in zip((present + low).tolist(), counts[present].tolist(), strict=True):
            store.add(k, c)

    def _multiplier(self) -> float:
        """``LogarithmicMapping``'s factor from log2(x) to log_gamma(x), as it computes it."""
        alpha = RELATIVE_ACCURACY
        return math.log(2) / math.log1p(2 * alpha / (1 - alpha))

    def distribution(self) -> Distribution:
        if self._mapping is None:
            return Distribution.of(np.frombuffer(self.buf, dtype=float))
        self._bin()
        sketch = BaseDDSketch(self._mapping, self._pos, self._neg, self._zeros)
        ps = (sketch.get_quantile_value(p / 100) for p in (50, 90, 95, 99))
        return Distribution(self.count, self.total / self.count, *ps, self.max)


def tokens_in_window(r: RequestRecord, w: Window) -> int:
    """Output tokens of ``r`` whose chunk arrived inside ``w`` (chunk times are sorted)."""
    times = r.chunk_times
    if not times:
        return 0
    lo = 0 if times[0] >= w.start else bisect_left(times, w.start)
    hi = len(times) if times[-1] < w.end else bisect_left(times, w.end)
    return sum(r.chunk_tokens[lo:hi])


class SummaryStream:
    """``summarize(records, window, slo, class_slos=...)``, fed one record at a time with
    ``add``. ``by_class`` / ``by_turn`` False skip groups the caller knows cannot arise (one
    class; no sessions): each group keeps its own distributions."""

    def __init__(
        self,
        window: Window,
        slo: SLO | None = None,
        class_slos: Mapping[str, SLO] | None = None,
        *,
        by_class: bool = True,
        by_turn: bool = True,
    ) -> None:
        self.window = window
        self.slo = slo or SLO()
        self.class_slos = dict(class_slos or {})
        self.records = 0
        """Records added (the point's requests)."""
        self.last_end = -math.inf
        """The latest end time of any record."""
        self.num_ok = 0
        self.num_failed = 0
        self.num_cancelled = 0
        self.window_requests = 0
        self.window_ok = 0
        self.num_ended = 0
        self.num_good = 0
        self.out_tokens = 0
        self.in_tokens = 0
        self.prompt_sum = 0
        self.cached = (0, 0)
        self.recomputed = (0, 0)
        self.preempt = (0, 0)
        """(records that report it, their sum)."""
        self.errors: Counter[str] = Counter()
        self.error_kinds: Counter[str] = Counter()
        names = ("ttft", "itl", "chunk_gap", "tpot", "e2e_latency", "queue_time")
        self.dists = {n: Quantiles() for n in (*names, "prompt_tokens", "output_tokens")}
        self._by_class: dict[str, SummaryStream] | None = {} if by_class else None
        self._by_turn: dict[str, SummaryStream] | None = {} if by_turn else None
        self._chunk_times: list[list[float]] = []
        self._chunk_tokens: list[list[int] | None] = []
        """Each record's chunk tokens, None where every chunk carried one token (most)."""
        self._chunks = 0
        """The chunks of the records whose token gaps are not in ``dists`` yet (their gaps are
        taken about ``_BATCH`` values at a time: numpy calls for many records, not for each)."""

    def add(self, r: RequestRecord) -> None:
        self._add(r)
        if self._by_class is not None:
            self._group(self._by_class, r.class_name).add(r)
        if self._by_turn is not None and r.session_id is not None:
            self._group(self._by_turn, turn_group(r)).add(r)

    def _group(self, groups: dict[str, SummaryStream], name: str) -> SummaryStream:
        g = groups.get(name)
        if g is None:
            slo = self.class_slos.get(name, self.slo)
            g = groups[name] = SummaryStream(
                self.window, slo, self.class_slos, by_class=False, by_turn=False
            )
        return g

    def _add(self, r: RequestRecord) -> None:
        w = self.window
        self.records += 1
        if r.end_time is not None and r.end_time > self.last_end:
            self.last_end = r.end_time
        self.out_tokens += tokens_in_window(r, w)
        ok = r.ok
        if ok:
            self.num_ok += 1
            if r.end_time is not None and w.start <= r.end_time < w.end:
                self.num_ended += 1
                self.in_tokens += r.prompt_tokens
                self.num_good += self.class_slos.get(r.class_name, self.slo).met(r)
        elif cancelled(r):
            self.num_cancelled += 1
        else:
            self.num_failed += 1
            self.errors[r.error or r.status] += 1
            self.error_kinds[error_kind(r)] += 1
        if not w.start <= r.send_time < w.end:
            return
        self.window_requests += 1
        if r.preemptions is not None:
            self.preempt = (self.preempt[0] + 1, self.preempt[1] + r.preemptions)
        if not ok:
            return
        self.window_ok += 1
        d = self.dists
        for name in ("ttft", "tpot", "e2e_latency", "queue_time"):
            v = getattr(r, name)
            if v is not None:
                d[name].add(v)
        d["prompt_tokens"].add(r.prompt_tokens)
        d["output_tokens"].add(r.output_tokens)
        if len(r.chunk_times) >= 2:
            self._chunk_times.append(r.chunk_times)
            tokens = r.chunk_tokens
            self._chunk_tokens.append(None if tokens.count(1) == len(tokens) else tokens)
            self._chunks += len(r.chunk_times)
            if self._chunks >= _BATCH:
                self._add_gaps()
        self.prompt_sum += r.prompt_tokens
        if r.cached_tokens is not None:
            self.cached = (self.cached[0] + 1, self.cached[1] + r.cached_tokens)
        if r.recomputed_tokens is not None:
            self.recomputed = (self.recomputed[0] + 1, self.recomputed[1] + r.recomputed_tokens)

    def _add_gaps(self) -> None:
        """Move the pending records' token gaps into the ITL and chunk-gap distributions."""
        if not self._chunks:
            return
        n, times = self._chunks, self._chunk_times
        counts = [len(t) for t in times]
        tokens = np.ones(n, dtype=np.int64)
        at = 0
        for k, toks in zip(counts, self._chunk_tokens, strict=True):
            if toks is not None:
                tokens[at : at + k] = toks
            at += k
        itl, gaps = token_gaps_of(
            np.fromiter(chain.from_iterable(times), dtype=float, count=n), tokens, counts
        )
        self.dists["itl"].extend(itl)
        self.dists["chunk_gap"].extend(gaps)
        self._chunk_times, self._chunk_tokens, self._chunks = [], [], 0

    @property
    def exact(self) -> bool:
        """True while every distribution is exact (no sketch yet)."""
        self._add_gaps()
        groups = [*(self._by_class or {}).values(), *(self._by_turn or {}).values()]
        return all(q.exact for q in self.dists.values()) and all(g.exact for g in groups)

    def summary(self) -> Summary:
        self._add_gaps()
        length = max(self.window.length, 1e-9)
        d = {name: q.distribution() for name, q in self.dists.items()}
        (n_cached, cached), (n_rec, recomputed) = self.cached, self.recomputed
        prompt_sum = self.prompt_sum
        return Summary(
            window=self.window,
            num_requests=self.records,
            num_ok=self.num_ok,
            errors=dict(self.errors),
            request_throughput=self.num_ended / length,
            output_throughput=self.out_tokens / length,
            total_throughput=(self.out_tokens + self.in_tokens) / length,
            goodput=self.num_good / length,
            **d,
            cached_ratio=ratio(cached, prompt_sum) if n_cached else None,
            preemptions=self.preempt[1] if self.preempt[0] else None,
            recomputed_ratio=ratio(recomputed, prompt_sum - cached + recomputed) if n_rec else None,
            slo=self.slo,
            error_kinds=dict(self.error_kinds),
            num_failed=self.num_failed,
            num_cancelled=self.num_cancelled,
            window_requests=self.window_requests,
            window_ok=self.window_ok,
            by_class=_summaries(self._by_class),
            by_turn=_summaries(self._by_turn),
        )


def _summaries(groups: dict[str, SummaryStream] | None) -> dict[str, Summary]:
    """Each group's summary in ``summarize``'s order; none unless there are two groups."""
    if not groups or len(groups) < 2:
        return {}
    return {name: groups[name].summary() for name in sorted(groups, key=group_order)}
