"""The multi-GPU part of one tensor-parallel engine step: what TP > 1 adds to a step's time.

Rule: a step of a replica on ``tp`` GPUs costs, on top of the sharded kernels,

* **all-reduces**: two per layer (after the attention output and the MLP down projections) of
  the step's hidden states, ``tokens x hidden x 2`` bytes each, by the algorithm vLLM picks for
  that size (``allreduce_algorithm``): its one-shot custom kernel for small messages, a two-shot
  kernel (custom, or symmetric memory) up to ``CUSTOM_ALLREDUCE_MAX_BYTES``, NCCL above (the
  prefill steps of thousands of tokens);
* **per-layer synchronisation**: every all-reduce is a barrier, so it waits for the slowest of
  the ``tp`` ranks; the wait grows with the expected maximum of ``tp`` ranks' lateness,
  ``sync_s x log2(tp)`` per all-reduce;
* **the logits' all-gather**: the LM head is split by vocabulary, and every rank samples from
  all of it (vLLM's V1 workers each run the sampler), so the step's ``sampled x vocab x 2``
  bytes of logits are all-gathered through NCCL, ``NCCL_LATENCY_S + (tp - 1) / tp x bytes /
  allreduce_bandwidth``;
* **the executor's step**: the engine core broadcasts the scheduler's output to the ``tp``
  worker processes and gathers the sampled tokens back through shared-memory queues
  (vLLM's multiprocess executor), ``executor_step_s + executor_per_seq_s x sequences``; host
  work, which async scheduling can overlap with the GPU like the rest of the host's step.

At TP = 1 every part is 0 (vLLM runs the model in the engine's own process). Pure: no engine or
simulator import; the link's figures come from ``servefleet.hardware.Interconnect``. Where each
constant comes from: its docstring and docs/validation.md ("Tensor parallelism").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servefleet.hardware import ONESHOT_MAX_BYTES, Interconnect

NCCL_LATENCY_S = 19e-6
"""Fixed time of an NCCL all-reduce in one NVLink host: vLLM's pynccl on 4 H100s takes 21 / 23 /
28 / 39 us at 0.5 / 1 / 2 / 4 MiB (vLLM PR #24532's device-communicator benchmark), a 19 us
intercept with the two-shot transfer term (benchmarks/tp_public/allreduce.csv)."""
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20
"""Largest message vLLM's custom all-reduce takes (its buffer, ``max_size`` 8 MiB in
``custom_all_reduce.py``); larger ones go to NCCL (prefill steps of thousands of tokens)."""


@dataclass(frozen=True, slots=True)
class TPCosts:
    """The per-step multi-GPU constants (see the module's rule)."""

    sync_s: float = 3.5e-6
    """Barrier wait per all-reduce per doubling of the TP group (``log2(tp) x`` this). Fitted to
    the ``fit`` rows of benchmarks/tp_public/data.csv that time a model runner alone (SGLang's
    decode step of Llama-3-8B at TP 1 and 8 on H100s; ``compare.py --fit``), as the TPOT at
    TP > 1 relative to the same series at TP 1."""
    executor_step_s: float = 0.30e-3
    """Host time per step of the executor's broadcast and gather at TP > 1: fitted, with that
    ``sync_s``, to the served ``fit`` rows (vLLM serving Mistral-7B at TP 1/2/4 on H100s). That
    vLLM predates its shared-memory queues (its driver broadcast the step's inputs through
    torch.distributed); vLLM 0.26's may be cheaper (not measured here)."""
    executor_per_seq_s: float = 2.0e-6
    """Host time per scheduled sequence of the broadcast (its pickled request state): assumed."""


DEFAULT_COSTS = TPCosts()


@dataclass(frozen=True, slots=True)
class TPStep:
    """What TP adds to one step, by where it runs."""

    allreduce: float
    """GPU: the all-reduce kernels of all layers."""
    logits_gather: float
    """GPU: the all-gather of the sampled positions' logits."""
    sync: float
    """GPU: the barrier waits of those all-reduces."""
    executor: float
    """Host: broadcast of the scheduler's output and gather of the results."""

    @property
    def gpu(self) -> float:
        return self.allreduce + self.logits_gather + self.sync

    @property
    def total(self) -> float:
        return self.gpu + self.executor


NO_TP = TPStep(0.0, 0.0, 0.0, 0.0)


def allreduce_algorithm(nbytes: float, tp: int, link: Interconnect) -> str:
    """Which all-reduce vLLM runs for ``nbytes`` across ``tp`` GPUs: ``"none"`` at TP = 1;
    ``"oneshot"`` or ``"twoshot"`` (its custom kernels, by the size limits of
    ``servefleet.hardware.ONESHOT_MAX_BYTES``, as ``Interconnect.allreduce_time`` picks them);
    ``"nccl"`` above ``CUSTOM_ALLREDUCE_MAX_BYTES`` or when the group's GPUs are not all linked
    peer to peer (``Interconnect.custom_allreduce_max_tp``)."""
    if tp < 2:
        return "none"
    if tp > link.custom_allreduce_max_tp or nbytes > CUSTOM_ALLREDUCE_MAX_BYTES:
        return "nccl"
    if nbytes < ONESHOT_MAX_BYTES.get(tp, 0):
        return "oneshot"
    return "twoshot"


def algorithm_time(algorithm: str, nbytes: float, tp: int, link: Interconnect) -> float:
    """Seconds of one all-reduce of ``nbytes`` across ``tp`` GPUs by ``algorithm``."""
    bw = link.allreduce_bandwidth
    if algorithm == "none" or tp < 2:
        return 0.0
    if algorithm == "oneshot":
        return link.latency_s + link.latency_per_rank_s * (tp - 2) + (tp - 1) * nbytes / bw
    transfer = 2 * (tp - 1) / tp * nbytes / bw
    if algorithm == "twoshot":
        return link.twoshot_latency_s + transfer
    if algorithm == "nccl":
        return max(NCCL_LATENCY_S, link.twoshot_latency_s) + transfer
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")


def allreduce_time(nbytes: float, tp: int, link: Interconnect) -> float:
    """Seconds of one all-reduce of ``nbytes`` across ``tp`` GPUs on ``link``, by the algorithm
    vLLM picks for that size."""
    return algorithm_time(allreduce_algorithm(nbytes, tp, link), nbytes, tp, link)


def allgather_time(nbytes: float, tp: int, link: Interconnect) -> float:
    """Seconds of an NCCL all-gather whose result is ``nbytes`` on each of ``tp`` GPUs."""
    if tp < 2 or nbytes <= 0:
        return 0.0
    return NCCL_LATENCY_S + (tp - 1) / tp * nbytes / link.allreduce_bandwidth


def tp_step(
    tp: int,
    num_layers: int,
    num_tokens: int,
    hidden_size: int,
    num_seqs: int,
    link: Interconnect,
    costs: TPCosts = DEFAULT_COSTS,
    act_bytes: int = 2,
    num_sampled: int = 0,
    vocab_size: int = 0,
) -> TPStep:
    """The multi-GPU parts of a step of ``num_tokens`` tokens of ``num_seqs`` sequences that
    samples ``num_sampled`` tokens from a ``vocab_size`` vocabulary."""
    if tp < 2 or num_tokens <= 0:
        return NO_TP
    calls = 2 * num_layers
    nbytes = num_tokens * hidden_size * act_bytes
    return TPStep(
        allreduce=calls * allreduce_time(nbytes, tp, link),
        logits_gather=allgather_time(num_sampled * vocab_size * act_bytes, tp, link),
        sync=calls * costs.sync_s * math.log2(tp),
        executor=costs.executor_step_s + costs.executor_per_seq_s * num_seqs,
    )
