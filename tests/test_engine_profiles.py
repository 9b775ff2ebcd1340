"""What a prediction is for: the vLLM release, the KV-cache dtype, fp8 checkpoints, and what the
server makes of the answers a session resends."""

from __future__ import annotations

import pytest

from servefleet.engine.cost_model import CostModel
from servefleet.engine.versions import vllm_profile
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.resend import EXACT, RANDOM_WEIGHTS, AnswerResend, parse_answer_resend
from servefleet.workload.types import RequestSpec, Segment, output_key


def test_versions_are_named_or_refused():
    assert vllm_profile("0.26.0").async_scheduling
    assert not vllm_profile("v0.11.2").async_scheduling
    with pytest.raises(ValueError, match=r"known: 0\.26"):
        vllm_profile("0.8")


def test_without_async_scheduling_host_work_adds_to_every_step():
    model, gpu = load_model("Qwen2.5-7B"), get_gpu("H200")
    new = resolve_deployment(model, gpu, max_model_len=8192).cost_model()
    old = resolve_deployment(model, gpu, max_model_len=8192, vllm_version="0.11").cost_model()
    step = (64, 64, 64, 64 * 1000, [], 64)
    host = new.host_time(64, True)
    assert old.step_time(*step) == pytest.approx(new.step_time(*step, from_idle=True))
    assert old.step_time(*step) - new.step_time(*step) == pytest.approx(
        min(host, new.breakdown(*step).gpu)
    )


def test_fp8_kv_cache_halves_the_bytes_and_doubles_the_tokens():
    model, gpu = load_model("Llama-3.1-8B"), get_gpu("H200")
    bf16 = resolve_deployment(model, gpu, max_model_len=8192)
    fp8 = resolve_deployment(model, gpu, max_model_len=8192, kv_cache_dtype="fp8_e4m3")
    assert (bf16.kv_dtype, fp8.kv_dtype) == ("bf16", "fp8")
    assert fp8.memory().kv_bytes_per_token * 2 == bf16.memory().kv_bytes_per_token
    assert fp8.memory().kv_tokens == pytest.approx(2 * bf16.memory().kv_tokens, rel=1e-3)
    with pytest.raises(ValueError, match="kv-cache-dtype"):
        resolve_deployment(model, gpu, kv_cache_dtype="int4")


def test_fp8_weights_keep_16_bit_attention_unless_the_cache_is_fp8():
    """vLLM runs FlashAttention on a bf16 cache for fp8 weights; only an fp8 cache on an sm90
    GPU computes attention in fp8. An 8192-token prefill's attention: fp8 weights alone take
    as long as bf16."""
    model, h200, a100 = load_model("Llama-3.1-70B"), get_gpu("H200"), get_gpu("A100")
    chunk = [(8192, 0)]
    bf16 = CostModel(model, h200, 4, "bf16").prefill_attention_time(chunk)
    fp8w = CostModel(model, h200, 4, "fp8").prefill_attention_time(chunk)
    fp8kv = CostModel(model, h200, 4, "fp8", "fp8").prefill_attention_time(chunk)
    assert fp8w == pytest.approx(bf16)
    assert fp8kv == pytest.approx(bf16 / (2 * 0.81), rel=1e-4)  # 1978.9 vs 2 x 989.4
    ampere = CostModel(model, a100, 4, "fp8", "fp8")  # fp8 storage, 16-bit math
    assert ampere.attn_peak == a100.peak_flops("bf16")


def test_fp8_checkpoints_resolve_to_their_preset():
    spec = load_model("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert spec.quantization == "fp8" and spec.num_layers == 32
    assert load_model("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic").quantization == "fp8"
    dep = resolve_deployment(spec, get_gpu("H200"), max_model_len=8192)
    assert (dep.dtype, dep.kv_dtype) == ("fp8", "bf16")
    assert resolve_deployment(spec, get_gpu("A100"), max_model_len=8192).notes


def _turn(answer_tokens: int) -> RequestSpec:
    prompt = (
        Segment("u:r1", 200, "user"),
        Segment(output_key("r1"), answer_tokens, "answer"),
        Segment("u:r1.1", 150, "user"),
    )
    return RequestSpec("r1.1", "sessions", prompt, 100, 10.0, session_id="s-r1", turn=1)


def test_a_trained_model_reuses_the_answer_it_generated():
    spec = _turn(400)
    assert EXACT.apply(spec) is spec


def test_random_weights_reuse_nothing_of_a_resent_answer():
    seen = RANDOM_WEIGHTS.apply(_turn(400))
    assert [s.length for s in seen.prompt] == [200, 2200, 150]
    assert seen.prompt[1].key != output_key("r1")
    partial = AnswerResend(0.5, 1.0).apply(_turn(401))
    assert [(s.key, s.length) for s in partial.prompt[1:3]] == [
        (output_key("r1"), 200),
        (output_key("r1") + "~text", 201),
    ]


def test_resent_answer_profiles_parse():
    assert parse_answer_resend("random-weights") is RANDOM_WEIGHTS
    assert parse_answer_resend("0.9:1.1") == AnswerResend(0.9, 1.1, "0.9:1.1")
    with pytest.raises(ValueError, match="REUSE:RATIO"):
        parse_answer_resend("most")
    with pytest.raises(ValueError, match="reuse"):
        parse_answer_resend("1.5:2")
