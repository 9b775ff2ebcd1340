"""Model specs (dense decoder-only transformers) from a Hugging Face config.json or a preset.

Presets are the public ``config.json`` files stored in ``servefleet/data/models/<name>.json``.
Parameter, FLOP and byte arithmetic is documented in ``docs/models.md``.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

ARCHITECTURES = ("llama", "mistral", "qwen", "qwen2", "qwen3")
"""Supported ``model_type`` values (dense SwiGLU decoders)."""

_ARCH_FROM_CLASS = MappingProxyType(
    {
        "LlamaForCausalLM": "llama",
        "MistralForCausalLM": "mistral",
        "QWenLMHeadModel": "qwen",
        "Qwen2ForCausalLM": "qwen2",
        "Qwen3ForCausalLM": "qwen3",
    }
)

# Keys vLLM reads to derive the default max-model-len; it takes the smallest one present.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)

_WEIGHT_BYTES = MappingProxyType({"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1})
_KV_BYTES = MappingProxyType({"fp32": 4, "fp16": 2, "bf16": 2, "auto": 2, "fp8": 1})
_DTYPE_ALIASES = MappingProxyType(
    {
        "float32": "fp32",
        "float": "fp32",
        "float16": "fp16",
        "half": "fp16",
        "bfloat16": "bf16",
        "fp8_e4m3": "fp8",
        "fp8_e5m2": "fp8",
        "fp8_e4m3fn": "fp8",
    }
)
_POSITIVE_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
_UNQUANTIZED_BYTES = 2
"""Embeddings, lm_head, norms and biases stay 16-bit in fp8/int8 checkpoints."""


class UnknownModelError(ValueError):
    """A model name that is neither a preset, an alias, nor an existing config path."""


def _canonical(dtype: str, table: MappingProxyType[str, int], what: str) -> str:
    key = dtype.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in table:
        raise ValueError(f"unsupported {what} {dtype!r}; use one of: {', '.join(table)}")
    return key


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    """The real MLP width (Qwen v1's config stores twice this)."""
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    torch_dtype: str
    quantization: str | None = None
    """``fp8`` for an fp8 checkpoint (its ``quantization_config``, or a name ending in -FP8):
    vLLM then runs the linear layers in fp8 by default; None for 16-bit weights."""

    def __post_init__(self) -> None:
        for field in _POSITIVE_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"model {self.name}: {field} must be a positive integer, got {value!r}"
                )
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name}: num_attention_heads ({self.num_attention_heads}) is not a "
                f"multiple of num_kv_heads ({self.num_kv_heads})"
            )

    # ---- shapes -------------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def qkv_bias_params(self) -> int:
        return self.q_size + 2 * self.kv_size if self.qkv_bias else 0

    @property
    def linear_weight_params_per_layer(self) -> int:
        """QKV, O and the three SwiGLU matrices, without biases."""
        h = self.hidden_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        return attn + 3 * h * self.intermediate_size

    @property
    def linear_params_per_layer(self) -> int:
        return self.linear_weight_params_per_layer + self.qkv_bias_params

    @property
    def norm_params_per_layer(self) -> int:
        """Two RMSNorms per layer, plus Qwen3's per-head q/k norms."""
        qk_norm = 2 * self.head_dim if self.architecture == "qwen3" else 0
        return 2 * self.hidden_size + qk_norm

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Extra parameters of the LM head: 0 when tied (its FLOPs still apply)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters, the embedding counted once when tied."""
        per_layer = self.linear_params_per_layer + self.norm_params_per_layer
        final_norm = self.hidden_size
        return (
            self.num_layers * per_layer + final_norm + self.embedding_params + self.lm_head_params
        )

    # ---- bytes --------------------------------------------------------------------------------
    def weight_bytes(self, dtype: str) -> int:
        """Weight bytes in ``dtype`` ("fp16", "bf16", "fp32", "fp8", "int8", or "auto").

        fp8/int8: linear weight matrices take 1 byte; embeddings, lm_head, norms and biases stay
        2 bytes; quantization scales are ignored (< 0.1 %).
        """
        key = self._weight_dtype(dtype)
        linear = self.num_layers * self.linear_weight_params_per_layer
        other = self.num_params - linear
        other_bytes = _WEIGHT_BYTES[key] if key in ("fp16", "bf16", "fp32") else _UNQUANTIZED_BYTES
        return linear * _WEIGHT_BYTES[key] + other * other_bytes

    def _weight_dtype(self, dtype: str) -> str:
        if dtype.strip().lower() == "auto":
            dtype = self.torch_dtype
        return _canonical(dtype, _WEIGHT_BYTES, "weight dtype")

    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> int:
        """``2 * layers * kv_heads * head_dim * bytes`` (K and V of every layer)."""
        nbytes = _KV_BYTES[_canonical(kv_dtype, _KV_BYTES, "kv cache dtype")]
        return 2 * self.num_layers * self.kv_size * nbytes

    def attention_kv_bytes(self, context: int, kv_dtype: str = "fp16") -> int:
        """KV bytes one query position reads over ``context`` tokens (all layers)."""
        return context * self.kv_bytes_per_token(kv_dtype)

    # ---- FLOPs --------------------------------------------------------------------------------
    def linear_flops_per_token(self) -> int:
        """2 x linear parameters of all layers (embedding and lm_head excluded)."""
        return 2 * self.num_layers * self.linear_params_per_layer

    def lm_head_flops_per_token(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    def attention_flops(self, num_new_tokens: int, context_before: int) -> float:
        """FLOPs of QK^T and PV for ``num_new_tokens`` queries attending causally to
        ``context_before`` earlier tokens plus themselves."""
        pairs = num_new_tokens * context_before + num_new_tokens * (num_new_tokens + 1) / 2
        return 4.0 * self.num_layers * self.num_attention_heads * self.head_dim * pairs

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Build a spec from a Hugging Face ``config.json`` dict (Llama, Mistral, Qwen v1/2/3)."""
        label = name or config.get("_name_or_path") or "<config>"
        arch = _architecture(config, label)
        if arch == "qwen":
            spec = _from_qwen_v1(config, label)
        else:
            spec = _from_llama_like(config, label, arch)
        quant = _quantization(config, label)
        return replace(spec, quantization=quant) if quant else spec


# ---- config parsing ------------------------------------------------------------------------------


def _require(config: dict[str, Any], label: str, *keys: str) -> Any:
    """The value of the first key present (aliases in order); ValueError naming the key."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    also = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
    raise ValueError(f"model config {label!r} lacks the key {keys[0]!r}{also}")


def _architecture(config: dict[str, Any], label: str) -> str:
    model_type = config.get("model_type")
    if model_type is None:
        classes = config.get("architectures") or []
        model_type = next((_ARCH_FROM_CLASS[c] for c in classes if c in _ARCH_FROM_CLASS), None)
    if model_type is None:
        raise ValueError(f"model config {label!r} lacks the key 'model_type'")
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model config {label!r}: model_type {model_type!r} is not supported "
            f"(supported dense architectures: {', '.join(ARCHITECTURES)})"
        )
    moe = [k for k in ("num_experts", "num_local_experts", "n_routed_experts") if config.get(k)]
    if moe:
        raise ValueError(f"model config {label!r}: mixture-of-experts ({moe[0]}) is not supported")
    return model_type


def _max_len(config: dict[str, Any], label: str) -> int:
    values = [config[k] for k in _MAX_LEN_KEYS if isinstance(config.get(k), int)]
    if not values:
        raise ValueError(f"model config {label!r} lacks the key 'max_position_embeddings'")
    return min(values)


FP8_METHODS = ("fp8", "fbgemm_fp8", "modelopt", "compressed-tensors")
"""``quantization_config.quant_method`` values of fp8 checkpoints (vLLM's names)."""


def _quantization(config: dict[str, Any], label: str) -> str | None:
    """``fp8`` for an fp8 checkpoint; None for 16-bit weights; ValueError for other schemes."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    text = json.dumps(qc).lower()
    if method in FP8_METHODS and ("fp8" in text or "float-quantized" in text or method == "fp8"):
        return "fp8"
    raise ValueError(
        f"model config {label!r}: quantization {method or qc!r} is not modelled (fp8 checkpoints "
        "are; for others simulate the 16-bit model with --dtype)"
    )


def _torch_dtype(config: dict[str, Any]) -> str:
    """``torch_dtype`` (or the newer ``dtype``); Qwen v1's bf16/fp16/fp32 flags; else bfloat16."""
    value = config.get("torch_dtype") or config.get("dtype")
    if isinstance(value, str):
        return value.removeprefix("torch.")
    for flag, dtype in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")):
        if config.get(flag) is True:
            return dtype
    return "bfloat16"


def _head_dim(config: dict[str, Any], label: str, hidden: int, heads: int) -> int:
    explicit = config.get("head_dim")
    if explicit is not None:
        return int(explicit)
    if hidden % heads:
        raise ValueError(
            f"model config {label!r}: hidden_size {hidden} is not divisible by "
            f"num_attention_heads {heads}; give 'head_dim'"
        )
    return hidden // heads


def _from_llama_like(config: dict[str, Any], label: str, arch: str) -> ModelSpec:
    hidden = int(_require(config, label, "hidden_size"))
    heads = int(_require(config, label, "num_attention_heads"))
    qkv_bias = arch == "qwen2" or bool(config.get("attention_bias", False))
    return ModelSpec(
        name=label,
        architecture=arch,
        hidden_size=hidden,
        num_layers=int(_require(config, label, "num_hidden_layers")),
        num_attention_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=_head_dim(config, label, hidden, heads),
        intermediate_size=int(_require(config, label, "intermediate_size")),
        vocab_size=int(_require(config, label, "vocab_size")),
        max_position_embeddings=_max_len(config, label),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        torch_dtype=_torch_dtype(config),
    )


def _from_qwen_v1(config: dict[str, Any], label: str) -> ModelSpec:
    """Qwen v1 (``QWenLMHeadModel``): kv_channels, a doubled intermediate_size, bias on c_attn."""
    hidden = int(_require(config, label, "hidden_size", "n_embd"))
    heads = int(_require(config, label, "num_attention_heads", "n_head"))
    doubled = int(_require(config, label, "intermediate_size", "ffn_hidden_size"))
    return ModelSpec(
        name=label,
        architecture="qwen",
        hidden_size=hidden,
        num_layers=int(_require(config, label, "num_hidden_layers", "n_layer")),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=int(config.get("kv_channels") or hidden // heads),
        intermediate_size=doubled // 2,
        vocab_size=int(_require(config, label, "vocab_size", "padded_vocab_size")),
        max_position_embeddings=_max_len(config, label),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=True,
        torch_dtype=_torch_dtype(config),
    )


# ---- presets -------------------------------------------------------------------------------------

# Preset name -> Hugging Face repositories whose config.json it stands for (architecture-equal).
_PRESET_REPOS = MappingProxyType(
    {
        "Qwen-7B": ("Qwen/Qwen-7B", "Qwen/Qwen-7B-Chat"),
        "Qwen1.5-14B": ("Qwen/Qwen1.5-14B", "Qwen/Qwen1.5-14B-Chat"),
        "Qwen2.5-1.5B": ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B"),
        "Qwen2.5-7B": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
        "Qwen2.5-14B": ("Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B"),
        "Qwen2.5-32B": ("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"),
        "Qwen2.5-72B": ("Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B"),
        "Qwen3-8B": ("Qwen/Qwen3-8B",),
        "Qwen3-14B": ("Qwen/Qwen3-14B",),
        "Qwen3-32B": ("Qwen/Qwen3-32B",),
        "Llama-2-7B": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
        "Llama-2-13B": ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"),
        "Llama-2-70B": ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
        "Llama-3.1-8B": (
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Meta-Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B-Instruct",
        ),
        "Llama-3.1-70B": (
            "meta-llama/Llama-3.1-70B",
            "meta-llama/Llama-3.1-70B-Instruct",
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Meta-Llama-3.1-70B-Instruct",
        ),
        "Mistral-7B-v0.3": ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    }
)
_SUFFIXES = ("-instruct", "-chat", "-hf", "-base")
_FP8_SUFFIXES = ("-fp8-dynamic", "-fp8-static", "-fp8")
"""Name endings of fp8 checkpoints of a preset (``nvidia/Llama-3.1-8B-Instruct-FP8``,
``RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic``)."""


def _norm(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", " ").split())


def _alias_keys(preset: str) -> set[str]:
    keys = {_norm(preset)}
    for repo in _PRESET_REPOS.get(preset, ()):
        keys.add(_norm(repo))
        keys.add(_norm(repo.split("/", 1)[-1]))
    return keys


@cache
def _preset_files() -> MappingProxyType[str, str]:
    """Preset name -> file name, from the packaged ``data/models`` directory."""
    folder = resources.files("servefleet").joinpath("data", "models")
    names = sorted(e.name for e in folder.iterdir() if e.name.endswith(".json"))
    return MappingProxyType({n.removesuffix(".json"): n for n in names})


@cache
def _alias_index() -> MappingProxyType[str, str]:
    index = {key: preset for preset in _preset_files() for key in _alias_keys(preset)}
    return MappingProxyType(index)


def preset_names() -> list[str]:
    return list(_preset_files())


def preset_config(name: str) -> dict[str, Any]:
    """The stored Hugging Face config.json of a preset (a fresh dict)."""
    folder = resources.files("servefleet").joinpath("data", "models")
    return json.loads(folder.joinpath(_preset_files()[_resolve_preset(name)]).read_text())


def _resolve_preset(name: str) -> str:
    index = _alias_index()
    key = _norm(name)
    for s in _FP8_SUFFIXES:
        key = key.removesuffix(s)
    for candidate in (key, key.split("/", 1)[-1]):
        while True:
            if candidate in index:
                return index[candidate]
            stripped = next(
                (candidate.removesuffix(s) for s in _SUFFIXES if candidate.endswith(s)), None
            )
            if stripped is None:
                break
            candidate = stripped
    raise UnknownModelError(_unknown_message(name, index))


def _unknown_message(name: str, index: MappingProxyType[str, str]) -> str:
    close = difflib.get_close_matches(_norm(name), list(index), n=1, cutoff=0.5)
    hint = f" Did you mean {index[close[0]]!r}?" if close else ""
    return (
        f"unknown model {name!r}.{hint} Presets: {', '.join(preset_names())}. "
        "Or pass a path to a config.json (or to a directory that holds one)."
    )


@cache
def _load_preset(preset: str) -> ModelSpec:
    return ModelSpec.from_hf_config(preset_config(preset), name=preset)


def load_config_file(path: str | Path) -> ModelSpec:
    """A spec from a config.json file, or from a directory that holds one."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"no config.json at {path}")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{file} does not hold a JSON object")
    name = file.parent.name if file.name == "config.json" else file.stem
    return ModelSpec.from_hf_config(config, name=name or str(file))


def load_model(name_or_path: str) -> ModelSpec:
    """A preset (case-insensitive; HF repo ids and -Instruct/-Chat variants accepted) or a path to
    a config.json / a directory holding one."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_config_file(path)
    if name_or_path.endswith(".json"):
        raise ValueError(f"no such config file: {name_or_path}")
    spec = _load_preset(_resolve_preset(name_or_path))
    if _fp8_name(name_or_path):
        return replace(spec, name=name_or_path.split("/")[-1], quantization="fp8")
    return spec


def _fp8_name(name: str) -> bool:
    return any(_norm(name).endswith(s) for s in _FP8_SUFFIXES)


def preset_repo(name: str) -> str:
    """The Hugging Face repository whose config.json a preset stores (for ``vllm serve``)."""
    return _PRESET_REPOS[_resolve_preset(name)][0]
