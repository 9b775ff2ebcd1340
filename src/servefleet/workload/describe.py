"""One line per class of a workload (share of requests, mean lengths, arrival process), or a
summary of the trace it replays: what ``servefleet workloads`` and the reports print."""

from __future__ import annotations

from .classes import RequestClass
from .datasets import TokenCounter, TraceRecord, whitespace_tokens
from .source import Group, build_groups
from .spec import WorkloadSpec


def describe_workload(spec: WorkloadSpec, count_tokens: TokenCounter = whitespace_tokens) -> str:
    if spec.trace is not None:
        return _describe_trace(spec)
    groups = build_groups(spec, count_tokens)
    rates = {n: r for g in groups if not g.closed for n, r in g.request_rates().items()}
    any_closed = any(g.closed for g in groups)
    total_w = sum([c.weight for g in groups for c in g.classes])
    total_r = sum(rates.values())
    head = f"{spec.name}: " + (f"{total_r:.4g} req/s nominal" if not any_closed else "closed loop")
    lines = [head + (" (shares by weight)" if any_closed else "")]
    for g in groups:
        for c in g.classes:
            share = c.weight / total_w if any_closed else rates[c.name] / total_r
            lines.append(_describe_class(c, g, share, rates.get(c.name)))
    return "\n".join(lines)


def _describe_class(c: RequestClass, g: Group, share: float, rate: float | None) -> str:
    p, o = c.lengths.mean()
    text = f"  {c.name:<14} {share:6.1%}  prompt {p:.0f}  output {o:.0f}"
    if c.system_prompt is not None:
        sp = c.system_prompt
        text += f"  system {sp.tokens}×{sp.share:.0%} ({sp.groups} shared)"
    if c.session is not None:
        t = c.session.turns.mean()
        ctx = t * (p + o) + (
            c.system_prompt.tokens * c.system_prompt.share if c.system_prompt else 0
        )
        text += (
            f"  session {t:.3g} turns, think {c.session.think_time_mean:g} s, context ≈{ctx:.0f}"
        )
    text += f"  | {g.process.describe()}"
    if len(g.classes) > 1:
        text += f" (shared by {len(g.classes)} classes)"
    return text + (f" → {rate:.4g} req/s" if rate is not None else "")


def _describe_trace(spec: WorkloadSpec) -> str:
    trace = spec.trace
    assert trace is not None  # describe_workload calls it only for a trace
    recs = trace.records()
    span = (recs[-1].timestamp - recs[0].timestamp) * trace.time_scale
    p = sum(r.prompt_tokens for r in recs) / len(recs)
    o = sum(r.output_tokens for r in recs) / len(recs)
    text = (
        f"{spec.name}: trace {trace.path}: {len(recs)} requests over {span:.1f} s"
        f"  prompt {p:.0f}  output {o:.0f}"
    )
    if any(r.blocks for r in recs):
        text += f"  shared blocks {block_reuse(recs, trace.block_size):.1%} of prompt tokens"
    return text


def block_reuse(records: list[TraceRecord], block_size: int) -> float:
    """The share of prompt tokens in blocks that an earlier record's prompt began the same way
    with (the same hashes up to and including that block): the prefix-cache hit ratio of a
    cache that never evicts and of requests that never overlap."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, block hash) -> node: a prefix tree
    hit = total = 0
    for r in records:
        total += r.prompt_tokens
        node = -1
        for i, h in enumerate(r.blocks):
            child = nodes.get((node, h))
            if child is not None:
                hit += min(block_size, r.prompt_tokens - i * block_size)
            else:  # a new prefix: every block after it is new too
                child = nodes[(node, h)] = len(nodes)
            node = child
    return hit / total if total else 0.0
