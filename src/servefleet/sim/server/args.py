"""Command-line arguments of the sim-server: `vllm serve`'s names for what it models.

``parse_args(argv)`` turns a command line into a validated ``SimServerArgs`` (pydantic), the
same for ``python -m servefleet.sim.server`` and ``servefleet sim-server`` (``add_cli``).
Flags of `vllm serve` that the sim-server does not model are accepted and reported as ignored
(``IGNORED_VALUE_FLAGS``, ``IGNORED_SWITCHES``); anything else is an error that says so.
"""

import argparse
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_GPU = "H200-SXM"

IGNORED_VALUE_FLAGS = (
    "--allowed-headers", "--allowed-methods", "--allowed-origins", "--api-server-count",
    "--chat-template", "--chat-template-content-format", "--code-revision",
    "--collect-detailed-traces", "--compilation-config", "-O", "--config-format",
    "--cpu-offload-gb", "--cuda-graph-sizes", "--default-chat-template-kwargs", "--device",
    "--distributed-executor-backend", "--download-dir", "--generation-config", "--hf-overrides",
    "--hf-token", "--kv-transfer-config", "--limit-mm-per-prompt",
    "--load-format", "--logits-processor-pattern", "--long-prefill-token-threshold",
    "--lora-modules", "--max-cudagraph-capture-size", "--max-logprobs", "--max-lora-rank",
    "--max-loras", "--max-num-partial-prefills", "--max-parallel-loading-workers",
    "--max-seq-len-to-capture", "--middleware", "--mm-processor-kwargs",
    "--num-gpu-blocks-override", "--otlp-traces-endpoint", "--override-generation-config",
    "--preemption-mode", "--quantization", "-q", "--reasoning-parser", "--response-role",
    "--revision", "--root-path", "--rope-scaling", "--rope-theta", "--scheduling-policy",
    "--speculative-config", "--ssl-ca-certs",
    "--stream-interval", "--structured-outputs-config", "--swap-space", "--tokenizer-mode",
    "--tokenizer-revision", "--tool-call-parser", "--tool-parser-plugin", "--uvicorn-log-level",
    "--worker-cls",
)  # fmt: skip
"""`vllm serve` flags taking a value that are accepted and ignored (nothing they change is
modelled)."""
IGNORED_SWITCHES = (
    "--async-scheduling", "--no-async-scheduling", "--disable-cascade-attn",
    "--disable-custom-all-reduce", "--disable-fastapi-docs", "--disable-frontend-multiprocessing",
    "--disable-log-stats", "--disable-sliding-window", "--disable-uvicorn-access-log",
    "--enable-auto-tool-choice", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
    "--enable-expert-parallel", "--enable-log-outputs", "--enable-lora",
    "--enable-request-id-headers", "--enable-server-load-tracking", "--enable-sleep-mode",
    "--skip-tokenizer-init", "--trust-remote-code", "--use-tqdm-on-load",
    "--no-use-tqdm-on-load",
)  # fmt: skip
"""`vllm serve` switches (no value) that are accepted and ignored."""


class SimServerArgs(BaseModel):
    """Everything the sim-server needs; field names are the flags' with ``_``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    served_model_name: list[str] | None = None
    gpu: str = DEFAULT_GPU
    tensor_parallel_size: int = Field(default=1, ge=1)
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    block_size: int = Field(default=16, ge=1)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    tokenizer: str | None = None
    seed: int = 0
    enable_prompt_tokens_details: bool = False
    enable_force_include_usage: bool = False
    log_requests: bool = True
    # -- the sim-server's own --------------------------------------------------------------
    time_scale: float = Field(default=1.0, gt=0)
    startup_time: float | None = Field(default=None, ge=0)
    admin_token: str | None = None
    fault_slowdown: float = Field(default=1.0, gt=0)
    fault_fail_fraction: float = Field(default=0.0, ge=0, le=1)
    fault_exit_after_tokens: int | None = Field(default=None, ge=1)
    alter_tokens: float = Field(default=0.0, ge=0, le=1)
    body_timeout: float = Field(default=30.0, gt=0)
    log_level: str = "info"
    ignored_flags: list[str] = Field(default_factory=list)

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        aliases = {"half": "fp16", "float16": "fp16", "bfloat16": "bf16", "float": "fp16"}
        v = aliases.get(v, v)
        if v not in ("auto", "fp16", "bf16", "fp8", "int8"):
            raise ValueError(f"--dtype {v!r}: use auto, half/float16, bfloat16, fp8 or int8")
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.lower()
        if v not in ("debug", "info", "warning", "error"):
            raise ValueError("--log-level: debug, info, warning or error")
        return v

    @property
    def served_names(self) -> list[str]:
        return self.served_model_name or [self.model]


_LEN = re.compile(r"^(\d+)([kKmM]?)$")


def _human_int(text: str) -> int:
    """``4096``, ``32k`` (x1000), ``32K`` (x1024), ``1m``/``1M`` (as vLLM reads them)."""
    m = _LEN.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as 4096 or 32k, got {text!r}"
        )
    n, unit = int(m.group(1)), m.group(2)
    return n * {"": 1, "k": 1000, "K": 1024, "m": 1_000_000, "M": 1 << 20}[unit]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="servefleet sim-server",
        description=(
            "A simulated vLLM replica: speaks vLLM's OpenAI-compatible HTTP API, with the timing "
            "of the engine model for the given model and GPU. Flags carry `vllm serve`'s names."
        ),
        epilog=(
            "Accepted and ignored `vllm serve` flags (nothing they change is modelled): "
            + " ".join(IGNORED_VALUE_FLAGS + IGNORED_SWITCHES)
            + ". Refused: --pipeline-parallel-size/-pp and --data-parallel-size/-dp above 1 "
            "(start one sim-server per replica instead)."
        ),
        allow_abbrev=False,
    )
    v = p.add_argument_group("vllm serve flags that are modelled")
    v.add_argument("model_tag", nargs="?", help="The model, as `vllm serve MODEL` takes it.")
    v.add_argument("--model", help="Preset name, HF repo id, or path to a config.json.")
    v.add_argument("--served-model-name", nargs="+", help="Name(s) the API answers to.")
    v.add_argument(
        "--tensor-parallel-size", "-tp", "--tp", type=int, default=1, dest="tensor_parallel_size"
    )
    v.add_argument("--dtype", default="auto")
    v.add_argument("--kv-cache-dtype", default="auto", help="auto or fp8 (bytes and FLOP rate).")
    v.add_argument("--max-model-len", type=_human_int)
    v.add_argument("--max-num-seqs", type=int)
    v.add_argument("--max-num-batched-tokens", type=_human_int)
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    v.add_argument("--enforce-eager", action="store_true")
    v.add_argument("--host", default="127.0.0.1", help="Default 127.0.0.1 (vLLM: all).")
    v.add_argument("--port", type=int, default=8000, help="0 picks a free port.")
    v.add_argument("--api-key", help="Require `Authorization: Bearer KEY` on /v1 routes.")
    v.add_argument("--ssl-certfile", help="Serve HTTPS with this certificate (PEM).")
    v.add_argument("--ssl-keyfile", help="The certificate's private key (PEM).")
    v.add_argument(
        "--tokenizer",
        help="Local Hugging Face tokenizer directory (default: the built-in word tokenizer).",
    )
    v.add_argument("--seed", type=int, default=0, help="Seeds the pseudo-output and faults.")
    v.add_argument("--enable-prompt-tokens-details", action="store_true")
    v.add_argument("--enable-force-include-usage", action="store_true")
    v.add_argument("--disable-log-requests", action="store_true")
    v.add_argument("--enable-log-requests", action="store_true")
    v.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    v.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    s = p.add_argument_group("the sim-server's own flags")
    s.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU type (default {DEFAULT_GPU}).")
    s.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="Run this many times faster than the modelled GPU (divides step durations).",
    )
    s.add_argument(
        "--startup-time",
        type=float,
        help="Seconds /health answers 503 (loading); default: the predicted vLLM start-up "
        "(weights load + compile + CUDA graphs) divided by --time-scale; 0 allowed.",
    )
    s.add_argument("--admin-token", help="Enables /admin/* with `Authorization: Bearer TOKEN`.")
    s.add_argument("--fault-slowdown", type=float, default=1.0, help="Steps last N x longer.")
    s.add_argument(
        "--fault-fail-fraction", type=float, default=0.0, help="Answer this fraction with 500."
    )
    s.add_argument(
        "--fault-exit-after-tokens",
        type=int,
        help="Exit the process once any sequence has streamed this many tokens.",
    )
    s.add_argument(
        "--alter-tokens",
        type=float,
        default=0.0,
        help="A test stand-in for a lower precision: this share of output tokens (chosen by "
        "--seed) is the runner-up token instead, its logprob swapped with the top one's "
        "(`servefleet quality` measures it).",
    )
    s.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="Seconds to wait for a request body its Content-Length announces: then 408 and "
        "the connection closed (default 30).",
    )
    s.add_argument("--log-level", default="info")
    for flag in IGNORED_VALUE_FLAGS:
        p.add_argument(flag, dest=f"ignored{flag}", default=None, help=argparse.SUPPRESS)
    for flag in IGNORED_SWITCHES:
        p.add_argument(
            flag, dest=f"ignored{flag}", action="store_true", default=None, help=argparse.SUPPRESS
        )
    return p


class ArgsError(ValueError):
    """A command line that cannot be served, with the fix in the message."""


def parse_args(argv: Sequence[str]) -> SimServerArgs:
    parser = build_parser()
    ns, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise ArgsError(
            f"unknown flag(s) {' '.join(unknown)}: not a `vllm serve` flag the sim-server knows "
            "(`--help` lists the modelled ones and the ignored ones)"
        )
    model = ns.model or ns.model_tag
    if ns.model and ns.model_tag and ns.model != ns.model_tag:
        raise ArgsError(f"two models given: {ns.model_tag!r} and --model {ns.model!r}")
    if not model:
        raise ArgsError("no model: give `sim-server MODEL` or --model MODEL (e.g. Qwen2.5-7B)")
    if ns.pipeline_parallel_size != 1 or ns.data_parallel_size != 1:
        raise ArgsError(
            "--pipeline-parallel-size and --data-parallel-size above 1 are not modelled; "
            "use --tensor-parallel-size, or start one sim-server per replica"
        )
    ignored = [
        k.removeprefix("ignored")
        for k, val in vars(ns).items()
        if k.startswith("ignored") and val is not None
    ]
    try:
        return SimServerArgs(
            model=model,
            served_model_name=ns.served_model_name,
            gpu=ns.gpu,
            tensor_parallel_size=ns.tensor_parallel_size,
            dtype=ns.dtype,
            kv_cache_dtype=ns.kv_cache_dtype,
            max_model_len=ns.max_model_len,
            max_num_seqs=ns.max_num_seqs,
            max_num_batched_tokens=ns.max_num_batched_tokens,
            gpu_memory_utilization=ns.gpu_memory_utilization,
            block_size=ns.block_size,
            enable_prefix_caching=ns.enable_prefix_caching,
            enforce_eager=ns.enforce_eager,
            host=ns.host,
            port=ns.port,
            api_key=ns.api_key,
            ssl_certfile=ns.ssl_certfile,
            ssl_keyfile=ns.ssl_keyfile,
            tokenizer=ns.tokenizer,
            seed=ns.seed,
            enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
            enable_force_include_usage=ns.enable_force_include_usage,
            log_requests=not ns.disable_log_requests or ns.enable_log_requests,
            time_scale=ns.time_scale,
            startup_time=ns.startup_time,
            admin_token=ns.admin_token,
            fault_slowdown=ns.fault_slowdown,
            fault_fail_fraction=ns.fault_fail_fraction,
            fault_exit_after_tokens=ns.fault_exit_after_tokens,
            alter_tokens=ns.alter_tokens,
            body_timeout=ns.body_timeout,
            log_level=ns.log_level,
            ignored_flags=ignored,
        )
    except ValidationError as exc:
        problems = []
        for e in exc.errors(include_url=False):
            flag = "--" + "-".join(str(x) for x in e["loc"]).replace("_", "-")
            problems.append(f"{flag}: {str(e['msg']).removeprefix('Value error, ')}")
        raise ArgsError("; ".join(problems)) from None
