"""Model specs: HF config parsing, parameter counts, bytes and FLOPs, presets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from servefleet.models import (
    ModelSpec,
    UnknownModelError,
    load_model,
    preset_config,
    preset_names,
    preset_repo,
)

# Published sizes (model cards / papers), in billions of parameters.
PUBLISHED_B = {
    "Qwen-7B": 7.72,
    "Qwen1.5-14B": 14.2,
    "Qwen2.5-7B": 7.62,
    "Qwen2.5-14B": 14.7,
    "Qwen2.5-32B": 32.5,
    "Qwen2.5-72B": 72.7,
    "Qwen3-8B": 8.2,
    "Qwen3-14B": 14.8,
    "Qwen3-32B": 32.8,
    "Llama-2-7B": 6.74,
    "Llama-2-13B": 13.0,
    "Llama-2-70B": 69.0,
    "Llama-3.1-8B": 8.03,
    "Llama-3.1-70B": 70.6,
    "Mistral-7B-v0.3": 7.25,
}


def tiny(**overrides: Any) -> dict[str, Any]:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    config.update(overrides)
    return config


def test_presets_listed_and_complete() -> None:
    assert set(PUBLISHED_B) <= set(preset_names())


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_param_count_within_2_percent_of_published(name: str) -> None:
    spec = load_model(name)
    assert spec.num_params / 1e9 == pytest.approx(PUBLISHED_B[name], rel=0.02)
    assert spec.name == name


def test_qwen15_14b_kv_bytes_per_token() -> None:
    spec = load_model("Qwen1.5-14B")
    assert spec.kv_bytes_per_token("fp16") == 819_200  # 40 x 40 x 128 x 2 x 2
    assert spec.kv_bytes_per_token() == 819_200
    assert spec.kv_bytes_per_token("fp8") == 409_600
    assert spec.kv_bytes_per_token("auto") == 819_200
    assert spec.attention_kv_bytes(1000) == 819_200_000
    with pytest.raises(ValueError, match="kv cache dtype 'int3'"):
        spec.kv_bytes_per_token("int3")


def test_qwen15_14b_anchors() -> None:
    spec = load_model("qwen1.5-14b")
    assert (spec.hidden_size, spec.num_layers, spec.num_attention_heads) == (5120, 40, 40)
    assert (spec.num_kv_heads, spec.head_dim, spec.intermediate_size) == (40, 128, 13696)
    assert (spec.vocab_size, spec.max_position_embeddings) == (152064, 32768)
    assert spec.qkv_bias is True
    assert spec.torch_dtype == "bfloat16"


def test_qwen25_7b_anchors() -> None:
    spec = load_model("Qwen/Qwen2.5-7B-Instruct")
    assert (spec.hidden_size, spec.num_layers, spec.num_attention_heads) == (3584, 28, 28)
    assert (spec.num_kv_heads, spec.intermediate_size, spec.vocab_size) == (4, 18944, 152064)
    assert spec.max_position_embeddings == 32768  # Instruct's config.json
    assert spec.tie_word_embeddings is False
    assert spec.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2


def test_qwen_v1_halves_intermediate_and_uses_seq_length() -> None:
    spec = load_model("Qwen-7B")
    raw = preset_config("Qwen-7B")
    assert raw["intermediate_size"] == 22016
    assert spec.architecture == "qwen"
    assert spec.intermediate_size == 11008
    assert spec.head_dim == 128  # kv_channels
    assert spec.num_kv_heads == 32
    assert spec.vocab_size == 151936
    assert spec.max_position_embeddings == 8192  # seq_length, as vLLM derives max-model-len
    assert spec.qkv_bias is True  # c_attn has a bias even with no_bias=true
    assert spec.torch_dtype == "bfloat16"


def test_qwen_v1_old_key_names() -> None:
    config = {
        "model_type": "qwen",
        "n_embd": 4096,
        "n_head": 32,
        "n_layer": 32,
        "ffn_hidden_size": 22016,
        "kv_channels": 128,
        "padded_vocab_size": 151936,
        "seq_length": 2048,
        "fp16": True,
    }
    spec = ModelSpec.from_hf_config(config, name="qwen-old")
    assert spec.intermediate_size == 11008
    assert spec.max_position_embeddings == 2048
    assert spec.torch_dtype == "float16"
    assert spec.num_params == load_model("Qwen-7B").num_params


def test_qwen3_explicit_head_dim() -> None:
    spec = load_model("Qwen3-32B")
    assert spec.hidden_size == 5120
    assert spec.num_attention_heads == 64
    assert spec.head_dim == 128  # not 5120 / 64 = 80
    assert spec.q_size == 8192
    assert spec.kv_size == 1024
    assert spec.qkv_bias is False
    assert spec.norm_params_per_layer == 2 * 5120 + 2 * 128  # q_norm and k_norm
    derived = ModelSpec.from_hf_config({**preset_config("Qwen3-32B"), "head_dim": None})
    assert derived.head_dim == 80


def test_tied_embeddings_counted_once_but_lm_head_flops_apply() -> None:
    untied = ModelSpec.from_hf_config(tiny(), name="untied")
    tied = ModelSpec.from_hf_config(tiny(tie_word_embeddings=True), name="tied")
    assert untied.num_params - tied.num_params == 1000 * 64
    assert tied.lm_head_params == 0
    assert untied.lm_head_params == 1000 * 64
    assert tied.lm_head_flops_per_token() == untied.lm_head_flops_per_token() == 2 * 64 * 1000


def test_parameter_arithmetic_by_hand() -> None:
    spec = ModelSpec.from_hf_config(tiny(model_type="qwen2"), name="t")
    h, q, kv, inter = 64, 4 * 16, 2 * 16, 128
    linear = h * (q + 2 * kv) + (q + 2 * kv) + q * h + 3 * h * inter
    assert spec.linear_params_per_layer == linear
    assert spec.num_params == 2 * (linear + 2 * h) + h + 2 * 1000 * h
    assert spec.linear_flops_per_token() == 2 * 2 * linear


def test_gqa_and_head_dim_default() -> None:
    spec = ModelSpec.from_hf_config(tiny(num_key_value_heads=None), name="mha")
    assert spec.num_kv_heads == 4
    assert spec.head_dim == 16
    llama3 = load_model("Llama-3.1-8B")
    assert llama3.num_kv_heads == 8
    assert llama3.kv_bytes_per_token() == 131_072


def test_weight_bytes_by_dtype() -> None:
    spec = load_model("Llama-3.1-8B")
    assert spec.weight_bytes("fp16") == 2 * spec.num_params
    assert spec.weight_bytes("bfloat16") == 2 * spec.num_params
    assert spec.weight_bytes("auto") == 2 * spec.num_params
    assert spec.weight_bytes("fp32") == 4 * spec.num_params
    linear = spec.num_layers * spec.linear_weight_params_per_layer
    assert spec.weight_bytes("fp8") == linear + 2 * (spec.num_params - linear)
    assert spec.weight_bytes("int8") == spec.weight_bytes("fp8")
    with pytest.raises(ValueError, match="weight dtype 'int2'"):
        spec.weight_bytes("int2")


def brute_force_attention_flops(spec: ModelSpec, new: int, before: int) -> int:
    """Count query-key pairs one by one: each costs 2*head_dim for QK^T and 2*head_dim for PV."""
    pairs = sum(1 for i in range(new) for j in range(before + new) if j <= before + i)
    return pairs * 4 * spec.head_dim * spec.num_attention_heads * spec.num_layers


@pytest.mark.parametrize(("new", "before"), [(1, 0), (1, 7), (5, 0), (5, 3), (16, 100), (0, 9)])
def test_attention_flops_matches_brute_force(new: int, before: int) -> None:
    spec = ModelSpec.from_hf_config(tiny(), name="t")
    assert spec.attention_flops(new, before) == brute_force_attention_flops(spec, new, before)


def test_attention_flops_chunking_adds_up() -> None:
    spec = load_model("Qwen2.5-7B")
    whole = spec.attention_flops(1000, 0)
    chunks = spec.attention_flops(600, 0) + spec.attention_flops(400, 600)
    assert chunks == pytest.approx(whole)


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("Qwen/Qwen1.5-14B", "Qwen1.5-14B"),
        ("qwen1.5-14b-chat", "Qwen1.5-14B"),
        ("QWEN1.5-14B", "Qwen1.5-14B"),
        ("Qwen/Qwen2.5-72B-Instruct", "Qwen2.5-72B"),
        ("meta-llama/Llama-2-70b-chat-hf", "Llama-2-70B"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral-7B-v0.3"),
        ("Qwen/Qwen-7B-Chat", "Qwen-7B"),
    ],
)
def test_preset_aliases(alias: str, preset: str) -> None:
    assert load_model(alias).name == preset


def test_unknown_model_lists_presets_and_closest_match() -> None:
    with pytest.raises(UnknownModelError) as info:
        load_model("Qwen2.5-8B")
    message = str(info.value)
    assert "Did you mean 'Qwen2.5-7B'" in message
    for name in PUBLISHED_B:
        assert name in message
    assert "config.json" in message


def test_load_from_config_file_and_directory(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(preset_config("Qwen2.5-14B")))
    from_dir = load_model(str(folder))
    from_file = load_model(str(folder / "config.json"))
    assert from_dir.name == from_file.name == "my-model"
    assert from_dir.num_params == load_model("Qwen2.5-14B").num_params
    with pytest.raises(ValueError, match="no such config file"):
        load_model(str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_model(str(tmp_path))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    "key", ["hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"]
)
def test_missing_key_is_named(key: str) -> None:
    config = tiny()
    del config[key]
    with pytest.raises(ValueError, match=f"lacks the key '{key}'"):
        ModelSpec.from_hf_config(config, name="broken")


def test_unsupported_and_inconsistent_configs() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        ModelSpec.from_hf_config(tiny(model_type="gpt2"))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        ModelSpec.from_hf_config(tiny(num_local_experts=8))
    with pytest.raises(ValueError, match="lacks the key 'model_type'"):
        ModelSpec.from_hf_config({k: v for k, v in tiny().items() if k != "model_type"})
    inferred = tiny(architectures=["Qwen2ForCausalLM"])
    del inferred["model_type"]
    assert ModelSpec.from_hf_config(inferred).architecture == "qwen2"
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        ModelSpec.from_hf_config(tiny(num_key_value_heads=3))
    with pytest.raises(ValueError, match="not divisible"):
        ModelSpec.from_hf_config(tiny(hidden_size=66))
    with pytest.raises(ValueError, match="must be a positive integer"):
        ModelSpec.from_hf_config(tiny(vocab_size=0))


def test_dtype_key_variants() -> None:
    assert ModelSpec.from_hf_config(tiny(torch_dtype=None, dtype="bfloat16")).torch_dtype == (
        "bfloat16"
    )
    assert ModelSpec.from_hf_config(tiny(torch_dtype="torch.float16")).torch_dtype == "float16"


def test_spec_is_frozen_and_cached() -> None:
    spec = load_model("Llama-2-7B")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.hidden_size = 1  # type: ignore[misc]
    assert load_model("llama-2-7b") is spec
    assert preset_config("Llama-2-7B") is not preset_config("Llama-2-7B")


def test_preset_repo() -> None:
    assert preset_repo("qwen2.5-7b") == "Qwen/Qwen2.5-7B-Instruct"
    assert preset_repo("Qwen/Qwen1.5-14B-Chat") == "Qwen/Qwen1.5-14B"
    assert all("/" in preset_repo(name) for name in preset_names())
