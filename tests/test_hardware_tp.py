"""The multi-GPU step term (servefleet.hardware_tp): its parts, switch points and limits."""

from __future__ import annotations

import math

import pytest

from servefleet.engine.cost_model import CostModel
from servefleet.hardware import get_gpu
from servefleet.hardware_tp import (
    CUSTOM_ALLREDUCE_MAX_BYTES,
    NCCL_LATENCY_S,
    NO_TP,
    TPCosts,
    algorithm_time,
    allgather_time,
    allreduce_algorithm,
    allreduce_time,
    tp_step,
)
from servefleet.models import load_model

H100 = get_gpu("H100-SXM").interconnect
V100 = get_gpu("V100-SXM2-32G").interconnect  # NVLink 2: custom all-reduce up to TP 4
LLAMA_70B = {"num_layers": 80, "hidden_size": 8192}


def test_tp1_adds_nothing() -> None:
    assert tp_step(1, 80, 256, 8192, 256, H100) is NO_TP
    assert NO_TP.total == 0.0
    assert allreduce_time(1e6, 1, H100) == 0.0
    assert allreduce_algorithm(1e6, 1, H100) == "none"


def test_an_empty_step_adds_nothing() -> None:
    assert tp_step(8, 80, 0, 8192, 0, H100) is NO_TP


def test_algorithm_switches_at_the_custom_buffer_size() -> None:
    assert allreduce_algorithm(64 * 1024, 8, H100) == "oneshot"
    assert allreduce_algorithm(1 * 2**20, 8, H100) == "twoshot"
    assert allreduce_algorithm(1 * 2**20, 2, H100) == "oneshot"
    assert allreduce_algorithm(CUSTOM_ALLREDUCE_MAX_BYTES, 8, H100) == "twoshot"
    assert allreduce_algorithm(CUSTOM_ALLREDUCE_MAX_BYTES + 1, 8, H100) == "nccl"
    # NCCL's fixed time is larger than the two-shot kernel's; the transfer term is the same
    below = allreduce_time(CUSTOM_ALLREDUCE_MAX_BYTES, 8, H100)
    above = allreduce_time(CUSTOM_ALLREDUCE_MAX_BYTES + 2, 8, H100)
    assert above - below == pytest.approx(NCCL_LATENCY_S - H100.twoshot_latency_s, rel=1e-3)
    assert allreduce_time(4 * CUSTOM_ALLREDUCE_MAX_BYTES, 8, H100) > 3 * below


def test_groups_not_all_linked_use_nccl() -> None:
    assert allreduce_algorithm(64 * 1024, 4, V100) == "oneshot"
    assert allreduce_algorithm(64 * 1024, 8, V100) == "nccl"


def test_custom_allreduce_is_the_links_kernel_model() -> None:
    for nbytes in (8 * 1024, 512 * 1024, 4 * 2**20):
        for tp in (2, 4, 8):
            assert allreduce_time(nbytes, tp, H100) == H100.allreduce_time(nbytes, tp)


def test_nccl_matches_vllms_pynccl_timings_within_a_tenth() -> None:
    # vLLM PR #24532, pynccl on 4 H100s: 21 / 23 / 28 / 39 us at 0.5 / 1 / 2 / 4 MiB
    for mib, us in ((0.5, 21), (1, 23), (2, 28), (4, 39)):
        model = algorithm_time("nccl", mib * 2**20, 4, H100) * 1e6
        assert model == pytest.approx(us, rel=0.1)


def test_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="ring"):
        algorithm_time("ring", 1024, 4, H100)


def test_decode_message_size_is_batch_times_hidden_times_two() -> None:
    step = tp_step(4, 80, 64, 8192, 64, H100, TPCosts(sync_s=0.0))
    assert step.allreduce == pytest.approx(160 * H100.allreduce_time(64 * 8192 * 2, 4))
    assert step.sync == 0.0


def test_sync_grows_with_log2_tp_and_the_layer_count() -> None:
    costs = TPCosts(sync_s=2e-6)
    s2 = tp_step(2, **LLAMA_70B, num_tokens=8, num_seqs=8, link=H100, costs=costs).sync
    s8 = tp_step(8, **LLAMA_70B, num_tokens=8, num_seqs=8, link=H100, costs=costs).sync
    assert s2 == pytest.approx(160 * 2e-6)
    assert s8 == pytest.approx(3 * s2)
    half = tp_step(8, 40, 8, 8192, 8, H100, costs).sync
    assert half == pytest.approx(s8 / 2)


def test_executor_is_host_work_per_step_and_sequence() -> None:
    costs = TPCosts(executor_step_s=0.5e-3, executor_per_seq_s=1e-6)
    one = tp_step(2, 32, 1, 4096, 1, H100, costs)
    many = tp_step(2, 32, 256, 4096, 256, H100, costs)
    assert one.executor == pytest.approx(0.501e-3)
    assert many.executor - one.executor == pytest.approx(255e-6)
    # host work is not GPU time: gpu = all-reduce + sync only
    assert many.gpu == pytest.approx(many.allreduce + many.logits_gather + many.sync)
    assert many.total == pytest.approx(many.gpu + many.executor)


def test_logits_are_all_gathered_once_per_step() -> None:
    # 64 sampled tokens x 128,256 logits x 2 bytes, gathered to each of 8 GPUs
    step = tp_step(8, 80, 64, 8192, 64, H100, num_sampled=64, vocab_size=128_256)
    nbytes = 64 * 128_256 * 2
    assert step.logits_gather == pytest.approx(allgather_time(nbytes, 8, H100))
    assert step.logits_gather == pytest.approx(
        NCCL_LATENCY_S + 7 / 8 * nbytes / H100.allreduce_bandwidth
    )
    assert tp_step(8, 80, 64, 8192, 64, H100).logits_gather == 0.0
    assert allgather_time(nbytes, 1, H100) == 0.0


def test_larger_groups_cost_more_per_step_at_decode_sizes() -> None:
    totals = [tp_step(tp, 80, 32, 8192, 32, H100).total for tp in (2, 4, 8)]
    assert totals == sorted(totals)
    assert all(math.isfinite(t) and t > 0 for t in totals)


def _cost_model(tp: int, **kw) -> CostModel:
    return CostModel(load_model("Llama-3.1-70B"), get_gpu("H100-SXM"), tp, "bf16", **kw)


def test_the_cost_model_adds_nothing_at_tp1() -> None:
    cm = _cost_model(1)
    assert cm.multi_gpu(64, 64, 64) is NO_TP
    assert cm.allreduce_time(64) == 0.0
    eff = cm.gpu.efficiency
    assert cm.host_time(64, True) == eff.host_step_s + eff.per_seq_overhead_s * 64


def test_the_cost_model_reads_the_term_through_one_function() -> None:
    cm = _cost_model(4)
    part = cm.multi_gpu(64, 64, 64)
    assert part == tp_step(
        4, 80, 64, 8192, 64, H100, cm.tp_costs, num_sampled=64, vocab_size=128_256
    )
    b = cm.breakdown(64, 64, 64, 64 * 1000, [], 64)
    assert b.allreduce == pytest.approx(part.allreduce + part.sync)
    eff = cm.gpu.efficiency
    assert b.host == pytest.approx(eff.host_step_s + eff.per_seq_overhead_s * 64 + part.executor)
    # the fitted parts off: only the derived all-reduces stay
    off = _cost_model(4, tp_costs=TPCosts(0.0, 0.0, 0.0))
    assert off.allreduce_time(64) == pytest.approx(part.allreduce)
    assert off.host_time(64, True) == pytest.approx(b.host - part.executor)


def test_every_rank_samples_the_whole_vocabulary() -> None:
    # the sampler's bytes do not shrink with TP; the logits' all-gather comes on top
    one, eight = _cost_model(1), _cost_model(8)

    def sampler(cm: CostModel) -> float:
        n, k = cm.lm_head
        return cm.lm_head_time(64) - cm.gemm_time(64, n, k, cm.head_peak, cm.abytes)

    gather = allgather_time(64 * 128_256 * 2, 8, H100)
    assert sampler(eight) == pytest.approx(sampler(one) + gather)
    assert sampler(eight) > sampler(one)
