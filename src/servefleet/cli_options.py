"""Options that several commands share (`simulate`, `bench`, ...), declared once.

Each option is a ``typing.Annotated`` alias that carries its ``typer.Option``, next to the
default it goes with, so that a command writes ``workload: Workload = DEFAULT_WORKLOAD`` and
the flag, help text and default are the same everywhere. The functions below turn the raw
values into what the commands run (a workload, load points) and fail with one message each.

Only typer and rich are imported at the top: `servefleet --help` stays fast.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

err = Console(stderr=True)

DEFAULT_MODEL = "Qwen1.5-14B"
DEFAULT_GPU = "V100-SXM2-32G"
DEFAULT_WORKLOAD = "chat-3tier"
DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128"
DEFAULT_SLO_TTFT = 2.0
DEFAULT_SLO_ITL = 0.1
DEFAULT_SEED = 0


def _range(test: Callable[[float], bool], words: str) -> Callable:
    """A typer callback that refuses a value (or any item of a list) failing ``test``: the
    command stops with "Invalid value for '--flag': must be <words>, got X" and exit code 2."""

    def check(value):
        for v in value if isinstance(value, list | tuple) else [value]:
            if v is not None and not (math.isfinite(v) and test(v)):
                raise typer.BadParameter(f"must be {words}, got {v:g}")
        return value

    return check


POSITIVE = _range(lambda v: v > 0, "greater than 0")
"""Callback of a numeric flag that must be > 0 (a count, a length, a rate, a duration)."""
NON_NEGATIVE = _range(lambda v: v >= 0, "0 or more")
FRACTION = _range(lambda v: 0 < v <= 1, "greater than 0 and at most 1")
PERCENTILE = _range(lambda v: 0 < v < 100, "between 0 and 100")


# The deployment.
Model = Annotated[str, typer.Option(help="Preset name or path to a config.json.")]
Gpu = Annotated[str, typer.Option(help="GPU type (`servefleet gpus` lists them).")]
GpuFile = Annotated[Path | None, typer.Option(help="YAML file of extra GPUs.")]
KvCacheDtype = Annotated[
    str,
    typer.Option(
        help="vLLM --kv-cache-dtype: auto (the activations' dtype, bf16/fp16 also for fp8 "
        "weights) or fp8 (half the bytes per token; attention in fp8 on H100/H200)."
    ),
]
VllmVersion = Annotated[
    str,
    typer.Option(
        help="The vLLM release to predict: 0.26 (measured), 0.19 (the last for V100s; 0.26's "
        "model) or 0.11 (no async scheduling); others are refused."
    ),
]
DEFAULT_VLLM_VERSION = "0.26"
Endpoint = Annotated[
    str,
    typer.Option(
        help="The OpenAI endpoint the clients stream from: chat (/v1/chat/completions) or "
        "completions (/v1/completions); with --client-protocol it sets the API server's work "
        "per chunk."
    ),
]
ClientProtocolOption = Annotated[
    str,
    typer.Option(
        "--client-protocol",
        help="How the clients stream: sdk (usage in the last chunk only, what the OpenAI SDK "
        "sends) or usage-per-chunk (vLLM's continuous_usage_stats). It sets the API server's work per "
        "chunk; recorded in the outputs.",
    ),
]


# The workload and the load.
Workload = Annotated[
    str,
    typer.Option(
        help="Workload preset, YAML file (`servefleet workloads`), or trace:FILE (a Mooncake "
        "JSONL, an Azure CSV, servefleet records or a servefleet trace; docs/workload.md)."
    ),
]
TimeScale = Annotated[
    float | None,
    typer.Option(
        help="A trace's gaps multiplied by this (0.5 replays twice as fast).", callback=POSITIVE
    ),
]
MaxRequests = Annotated[
    int | None,
    typer.Option(help="Replay only a trace's first N requests (in time order).", callback=POSITIVE),
]
TraceBlockSize = Annotated[
    int | None,
    typer.Option(
        help="Tokens per hash_ids block of a Mooncake trace (default 512).", callback=POSITIVE
    ),
]
InputLen = Annotated[
    int | None,
    typer.Option(
        help="Fixed prompt length (with --output-len), instead of --workload.", callback=POSITIVE
    ),
]
OutputLen = Annotated[
    int | None,
    typer.Option(help="Fixed output length (with --input-len).", callback=POSITIVE),
]
Concurrency = Annotated[
    str | None,
    typer.Option(
        help="Closed-loop concurrencies (requests in flight at once, all replicas together), "
        f"comma-separated (default {DEFAULT_CONCURRENCY})."
    ),
]
Rate = Annotated[
    str | None,
    typer.Option(
        help="Open-loop request rates (req/s), comma-separated; instead of --concurrency."
    ),
]

# Goodput and reproducibility.
SloTtft = Annotated[
    float,
    typer.Option(help="TTFT SLO in seconds, per request (for goodput).", callback=POSITIVE),
]
SloItl = Annotated[
    float,
    typer.Option(
        help="Inter-token latency SLO in seconds, on each request's TPOT (for goodput).",
        callback=POSITIVE,
    ),
]
SloClasses = Annotated[
    str | None,
    typer.Option(
        help="Judge the SLOs on these workload classes only, each class on its own requests: "
        "qa,sessions (each with its workload SLO, else --slo-ttft/--slo-itl) or "
        "qa:ttft=1:itl=0.05,sessions:ttft=4 (default: every request, pooled)."
    ),
]
Seed = Annotated[
    int,
    typer.Option(
        help="Seed of every random choice: same seed, same requests.", callback=NON_NEGATIVE
    ),
]


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``error: msg`` on stderr and leave with ``code`` (2: bad input)."""
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(code)


def numbers(text: str, kind: type, flag: str) -> list:
    """``"1,2, 4"`` -> ``[1, 2, 4]`` of ``kind``, all positive; else fail naming ``flag``."""
    try:
        vals = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        fail(f"{flag} takes a comma-separated list of numbers, got {text!r}")
    if not vals or any(v <= 0 for v in vals):
        fail(f"{flag} needs positive numbers, got {text!r}")
    return vals


def trace_overrides(
    time_scale: float | None, max_requests: int | None, trace_block_size: int | None
) -> dict | None:
    """``--time-scale``, ``--max-requests``, ``--trace-block-size`` as overrides of a workload's
    ``trace:`` (None when none is given)."""
    given = {
        "time_scale": time_scale,
        "max_requests": max_requests,
        "block_size": trace_block_size,
    }
    trace = {k: v for k, v in given.items() if v is not None}
    return {"trace": trace} if trace else None


def workload_spec(
    workload: str,
    input_len: int | None,
    output_len: int | None,
    trace: dict | None = None,
):
    """The ``WorkloadSpec`` of ``--workload``, or of ``--input-len/--output-len`` when given;
    ``trace``: overrides of its trace (``trace_overrides``)."""
    from servefleet.workload import WorkloadError, fixed_workload, load_workload

    if (input_len is None) != (output_len is None):
        fail("--input-len and --output-len go together")
    try:
        if input_len is not None and output_len is not None:
            spec = fixed_workload(input_len, output_len)
        else:
            spec = load_workload(workload)
        if trace and spec.trace is not None:
            return load_workload(workload, overrides=trace)
    except WorkloadError as e:
        fail(str(e))
    if trace:
        names = {"block_size": "trace-block-size"}
        flags = ", ".join("--" + names.get(k, k.replace("_", "-")) for k in trace["trace"])
        fail(f"{flags}: only for a trace (--workload trace:FILE)")
    return spec


def slo_classes(text: str | None, spec, slo) -> dict | None:
    """``--slo-classes`` as {class: SLO} (``stats.parse_slo_classes``), every name a class of
    the workload ``spec``; None when not given."""
    from servefleet.stats import class_slos, parse_slo_classes

    try:
        named = parse_slo_classes(text, slo, class_slos(spec.model_dump(mode="json"), slo))
    except ValueError as e:
        fail(str(e))
    unknown = [n for n in named or () if n not in spec.classes]
    if unknown:
        fail(
            f"--slo-classes: {', '.join(unknown)} not classes of {spec.name} "
            f"({', '.join(spec.classes) or 'none'})"
        )
    return named


def slo_classes_dict(named: dict | None) -> dict | None:
    """{class: {ttft, itl}}: how summary.json keeps ``--slo-classes``."""
    if named is None:
        return None
    return {n: {"ttft": s.ttft, "itl": s.itl} for n, s in named.items()}


def loads(concurrency: str | None, rate: str | None, workload=None) -> list:
    """The load points of ``--concurrency`` or ``--rate`` (default: DEFAULT_CONCURRENCY; for
    a trace ``workload``: its own rate, which replays it at its recorded times)."""
    from servefleet.workload.types import Load

    if concurrency and rate:
        fail("give --concurrency or --rate, not both")
    if rate:
        return [Load(rate=r) for r in numbers(rate, float, "--rate")]
    if not concurrency and workload is not None and workload.trace is not None:
        from servefleet.workload import recorded_rate

        recorded = recorded_rate(workload)
        if recorded is None:
            fail("the trace spans no time: give --concurrency to replay it as a closed loop")
        return [Load(rate=recorded)]
    return [
        Load(concurrency=c)
        for c in numbers(concurrency or DEFAULT_CONCURRENCY, int, "--concurrency")
    ]


def default_out(command: str) -> Path:
    """``runs/<command>-<local time>``: where a run's records go when ``--out`` is not given."""
    return Path("runs") / f"{command}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
