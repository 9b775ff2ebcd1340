"""The `servefleet` command line: parse, validate, call the module, print."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from servefleet import cli_options as opts
from servefleet.cli_options import fail as _fail
from servefleet.report.fit import Fitted

app = typer.Typer(
    name="servefleet",
    help="Put an LLM online on a fixed pool of GPUs with vLLM, and prove how well it runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = opts.err

GiB = 1 << 30


@app.command()
def simulate(
    model: opts.Model = opts.DEFAULT_MODEL,
    gpu: opts.Gpu = opts.DEFAULT_GPU,
    num_gpus: Annotated[int, typer.Option(callback=opts.POSITIVE, help="GPUs in the pool.")] = 8,
    tp: Annotated[
        int,
        typer.Option(
            "--tp", "--tensor-parallel-size", help="GPUs per replica.", callback=opts.POSITIVE
        ),
    ] = 2,
    replicas: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE, help="Replicas (default: num-gpus / tp x replicas-per-gpu)."
        ),
    ] = None,
    replicas_per_gpu: Annotated[
        int,
        typer.Option(
            callback=opts.POSITIVE,
            help="Replicas sharing each GPU (each gets --gpu-memory-utilization of its memory; "
            "their steps take turns on it).",
        ),
    ] = 1,
    fleet: Annotated[
        Path | None,
        typer.Option(
            help="Simulate the fleet of a fleet.yaml: its model, GPU, replicas, vLLM flags and "
            "gateway policy replace the deployment options above.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="auto | fp16 | bf16 | fp8 | int8 (auto: the model's, fp16 where bf16 is missing)."
        ),
    ] = "auto",
    max_model_len: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE, help="vLLM --max-model-len (default 4096, the seed scenario's)."
        ),
    ] = 4096,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE, help="vLLM --max-num-seqs (default: vLLM's for the GPU)."
        ),
    ] = 256,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE,
            help="vLLM --max-num-batched-tokens (default: vLLM's for the GPU).",
        ),
    ] = None,
    gpu_memory_utilization: Annotated[
        float, typer.Option(callback=opts.FRACTION, help="vLLM --gpu-memory-utilization.")
    ] = 0.9,
    block_size: Annotated[
        int, typer.Option(callback=opts.POSITIVE, help="vLLM --block-size.")
    ] = 16,
    enable_prefix_caching: Annotated[bool, typer.Option(help="vLLM prefix caching.")] = True,
    enforce_eager: Annotated[
        bool, typer.Option(help="No CUDA graphs (vLLM --enforce-eager).")
    ] = False,
    kv_cache_dtype: opts.KvCacheDtype = "auto",
    vllm_version: opts.VllmVersion = opts.DEFAULT_VLLM_VERSION,
    endpoint: opts.Endpoint = "chat",
    client_protocol: opts.ClientProtocolOption = "sdk",
    resent_answers: Annotated[
        str,
        typer.Option(
            help="What the server makes of the answers a session resends as text: exact (a "
            "trained model: the text re-tokenizes to the ids it generated), random-weights "
            "(vLLM --load-format dummy with the test tokenizer: no reuse, 5.5 tokens per "
            "generated token) or REUSE:RATIO. A --fleet with --load-format dummy implies "
            "random-weights."
        ),
    ] = "exact",
    workload: opts.Workload = opts.DEFAULT_WORKLOAD,
    input_len: opts.InputLen = None,
    output_len: opts.OutputLen = None,
    time_scale: opts.TimeScale = None,
    max_requests: opts.MaxRequests = None,
    trace_block_size: opts.TraceBlockSize = None,
    concurrency: opts.Concurrency = None,
    rate: opts.Rate = None,
    duration: Annotated[
        float, typer.Option(callback=opts.POSITIVE, help="Simulated seconds of arrivals per point.")
    ] = 300.0,
    warmup: Annotated[
        float,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="Simulated seconds left out of the metrics at the start.",
        ),
    ] = 30.0,
    policy: Annotated[
        str, typer.Option(help="Routing policy across replicas.")
    ] = "least-outstanding",
    long_replicas: Annotated[
        int,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="The last N replicas form the `long` pool (for the length-pools policies; "
            "fleet.yaml: `pool: long`).",
        ),
    ] = 0,
    slo_ttft: opts.SloTtft = opts.DEFAULT_SLO_TTFT,
    slo_itl: opts.SloItl = opts.DEFAULT_SLO_ITL,
    slo_classes: opts.SloClasses = None,
    seed: opts.Seed = opts.DEFAULT_SEED,
    gpu_file: opts.GpuFile = None,
    gpu_param: Annotated[
        list[str] | None,
        typer.Option(
            help="Set one of the GPU's engine-model figures, NAME=VALUE (repeatable), e.g. "
            "efficiency.attn_decode_bw=0.375: the names of `hardware.parameter_bands`, as a "
            "plan's band prints them (its pessimistic corner's line carries them)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for summary.json and the records (default runs/simulate-<time>)."
        ),
    ] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="Print the memory breakdown per GPU.")
    ] = False,
    records: Annotated[
        str,
        typer.Option(
            help="Request records to write, as requests finish: all | sample (1 in 100, by "
            "request id) | none (summary.json only). Summaries never need them in memory."
        ),
    ] = "all",
    jobs: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE,
            help="Points simulated at once, in worker processes (default: one per CPU). "
            "Results do not depend on it. A large point run alone makes its records on a "
            "second core.",
        ),
    ] = None,
) -> None:
    """Predict how a fleet of vLLM replicas performs on a workload, in seconds of CPU.

    With no options it runs the seed scenario: 8 x V100-SXM2-32G, Qwen1.5-14B in fp16,
    4 replicas x TP=2, max-model-len 4096, max-num-seqs 256, prefix caching on, the chat-3tier
    mix, at fleet-wide concurrency 1 ... 128.
    """
    from servefleet.sim.command import run_simulate, write_run
    from servefleet.sim.resend import parse_answer_resend
    from servefleet.stats import SLO

    try:
        answers = parse_answer_resend(resent_answers)
    except ValueError as e:
        _fail(f"--resent-answers {e}")
    if fleet is not None:
        model, gpu, settings, policy, long_replicas = _fleet_settings(fleet)
        if resent_answers != "exact":
            settings["answers"] = answers
    else:
        settings = dict(
            tp=tp,
            replicas=replicas,
            replicas_per_gpu=replicas_per_gpu,
            num_gpus=num_gpus,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            kv_cache_dtype=kv_cache_dtype,
            answers=answers,
        )
    settings["vllm_version"] = vllm_version
    settings["client"] = _client(endpoint, client_protocol)
    dep = _deployment(model, gpu, gpu_file, **settings)
    if gpu_param:
        dep = _with_gpu_params(dep, gpu_param)
    trace = opts.trace_overrides(time_scale, max_requests, trace_block_size)
    spec = opts.workload_spec(workload, input_len, output_len, trace)
    loads = opts.loads(concurrency, rate, spec)
    duration = _whole_burst_periods(spec, loads, duration, warmup)
    named = opts.slo_classes(slo_classes, spec, SLO(slo_ttft, slo_itl))
    _print_deployment(dep)
    if explain:
        _print_memory(dep, spec)
    from servefleet.sim.record_sink import RECORDS_MODES

    if records not in RECORDS_MODES:
        _fail(f"--records must be one of {', '.join(RECORDS_MODES)}, got {records!r}")
    out = out or opts.default_out("simulate")
    with _progress() as progress:
        shown = SimProgress(progress, [load.label for load in loads], duration)
        try:
            run = run_simulate(
                dep,
                spec,
                loads,
                duration=duration,
                warmup=warmup,
                seed=seed,
                policy=policy,
                slo=SLO(slo_ttft, slo_itl),
                slo_classes=named,
                long_replicas=long_replicas,
                on_point=shown.point_done,
                on_progress=shown.simulated,
                records=records,  # type: ignore[arg-type]
                out=out,
                jobs=max(1, jobs if jobs is not None else os.cpu_count() or 1),
            )
        except ValueError as e:
            _fail(str(e))
    write_run(run, out)
    print_simulate_report(run, out)
    console.print(f"records and summary in {out}/ (simulated in {run.wall_seconds:.1f} s)")


def _client(endpoint: str, stream_options: str):
    """The ``ClientProtocol`` of ``--endpoint`` and ``--client-protocol``."""
    from servefleet.client_protocol import client_protocol

    try:
        return client_protocol(endpoint, stream_options)
    except ValueError as e:
        _fail(str(e))


def _with_gpu_params(dep, items: list[str]):
    """``dep`` with the ``--gpu-param NAME=VALUE`` figures of its GPU replaced."""
    from servefleet.hardware import with_parameters

    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            _fail(f"--gpu-param takes NAME=NUMBER, got {item!r}")
        if not sep or not values[name.strip()] > 0:
            _fail(f"--gpu-param takes NAME=NUMBER (> 0), got {item!r}")
    try:
        return dep.with_(gpu=with_parameters(dep.gpu, values))
    except ValueError as e:
        _fail(f"--gpu-param: {e}")


def _whole_burst_periods(spec, loads, duration: float, warmup: float) -> float:
    """``duration``, extended (and said so) until every rate's window after the warm-up holds
    one whole burst period (``workload.windows``)."""
    from servefleet.workload.windows import whole_period_duration

    checks = [
        c
        for load in loads
        if load.rate is not None
        and (c := whole_period_duration(spec, load.rate, duration, warmup)) is not None
    ]
    longest = max(checks, key=lambda c: c.duration, default=None)
    if longest is None or not longest.extended:
        return duration
    err.print(f"[yellow]note:[/] {longest.describe()}", highlight=False)
    return longest.duration


def print_simulate_report(run, out: Path) -> None:
    """The run as `servefleet report show` prints it: header, verdict, the sweep, per class
    and per session turn, the modelled GPU busy share (records kept in memory)."""
    from servefleet.report.run import run_from_summary
    from servefleet.report.terminal import print_run

    tags = {
        p.load.tag: sorted(p.records, key=lambda r: r.send_time)
        for p in run.points
        if len(p.records) == p.num_records  # else on disk, as the run wrote them
    }
    summaries = {p.load.tag: p.summary for p in run.points}
    print_run(run_from_summary(run.summary_dict(), out, records=tags, summaries=summaries), console)


def _fleet_settings(path: Path) -> tuple[str, str, dict, str, int]:
    """model, GPU, deployment settings, routing policy and replicas of the `long` pool of a
    fleet.yaml."""
    from servefleet.plan.fleet_yaml import load_fleet

    try:
        f = load_fleet(path)
        long = sum(r.pool == "long" for r in f.replicas)
        return f.model.name, f.gpus.type, f.deployment_settings(), f.gateway.policy.name, long
    except ValueError as e:
        _fail(f"--fleet {e}")


def _deployment(model: str, gpu: str, gpu_file: Path | None, **settings):
    """The deployment of ``model`` on ``gpu`` with vLLM ``settings``; fail if it does not fit."""
    from servefleet.hardware import GPUCatalog
    from servefleet.models import load_model
    from servefleet.sim.deployment import resolve_deployment

    try:
        catalog = GPUCatalog.builtin()
        if gpu_file:
            catalog = catalog.with_yaml(gpu_file)
        dep = resolve_deployment(load_model(model), catalog.get(gpu), **settings)
        mem = dep.memory()
        if not mem.fits:
            _fail(dep.why_not_fits(mem))
    except ValueError as e:
        _fail(str(e))
    return dep


class SimProgress:
    """One bar for a sweep: the simulated seconds of arrivals of every point (``duration``
    each; points in worker processes report as they go), with the time left at this pace
    (the drain after the arrivals, a few per cent, is not counted)."""

    def __init__(self, progress: Progress, labels: list[str], duration: float) -> None:
        self.progress, self.labels, self.duration = progress, labels, duration
        self.simulated_s = [0.0] * len(labels)
        self.done = 0
        self.task = progress.add_task(self._describe(), total=len(labels) * duration)

    def _describe(self) -> str:
        if len(self.labels) == 1:
            return f"simulating {self.labels[0]}"
        return f"simulating {len(self.labels)} points, {self.done} done"

    def simulated(self, i: int, t: float) -> None:
        """Point ``i`` has simulated ``t`` seconds (from any thread)."""
        self.simulated_s[i] = min(max(self.simulated_s[i], t), self.duration)
        self.progress.update(self.task, completed=sum(self.simulated_s))

    def point_done(self, i: int, _result: object) -> None:
        self.simulated_s[i] = self.duration
        self.done += 1
        self.progress.update(
            self.task, completed=sum(self.simulated_s), description=self._describe()
        )


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} simulated s"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )


def _print_deployment(dep) -> None:
    console.print(
        f"[bold]{dep.model.name}[/] {dep.dtype} on {dep.num_gpus} x {dep.gpu.name}: "
        f"{dep.replicas} replica(s) x TP={dep.tp}"
        f"{f' ({dep.replicas_per_gpu} per GPU)' if dep.replicas_per_gpu > 1 else ''}; "
        f"max-model-len {dep.max_model_len}, "
        f"max-num-seqs {dep.max_num_seqs}, max-num-batched-tokens {dep.max_num_batched_tokens}, "
        f"block-size {dep.block_size}, prefix caching {'on' if dep.enable_prefix_caching else 'off'}, "
        f"KV cache {dep.kv_dtype}; as vLLM {dep.vllm_version}"
        f"{'' if dep.answers.exact else f'; resent answers: {dep.answers.name}'}; "
        f"clients stream {dep.client.describe()}"
    )
    for note in dep.notes:
        console.print(f"[yellow]note:[/] {note}")


def _print_memory(dep, spec) -> None:
    mem = dep.memory()
    t = Table(title=f"memory per GPU (TP={dep.tp})", title_justify="left", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left")
    rows = [
        ("GPU memory", mem.total, "as CUDA reports it"),
        (f"x gpu_memory_utilization {dep.gpu_memory_utilization}", mem.budget, "what vLLM may use"),
        ("- weights", mem.weights, f"{dep.model.num_params / 1e9:.2f}B params in {dep.dtype} / TP"),
        (
            "- activation peak",
            mem.activation_peak,
            f"profiling run of {dep.max_num_batched_tokens} tokens + sampler",
        ),
        ("- non-torch (CUDA, NCCL)", mem.non_torch, "vLLM 0.26 on the H200 (+ NCCL, assumed)"),
        (
            "(CUDA graphs, outside the budget)",
            mem.cuda_graphs,
            "as vLLM 0.26 logs for a 7B" if mem.cuda_graphs else "eager",
        ),
        ("= KV cache", mem.kv_cache, f"{mem.kv_bytes_per_token:,} bytes per token per GPU"),
    ]
    for name, b, why in rows:
        t.add_row(name, f"{b / GiB:,.2f} GiB", why)
    t.add_row(
        "KV blocks",
        f"{mem.num_gpu_blocks:,}",
        f"of {dep.block_size} tokens = {mem.kv_tokens:,} tokens",
    )
    mean = _mean_request_tokens(spec)
    if mean:
        t.add_row(
            "max concurrency",
            f"{mem.max_concurrency(mean):,.0f}",
            f"per replica at the workload's mean of {mean:,.0f} tokens (prompt + output)",
        )
    console.print(t)


def _mean_request_tokens(spec) -> float | None:
    """Mean prompt + output tokens of the workload's first 400 requests (a dry run)."""
    from servefleet.workload import build_source, dry_run

    reqs = dry_run(build_source(spec, seed=0, concurrency=1), until=400.0, latency=1.0)
    return sum(r.prompt_tokens + r.max_tokens for r in reqs) / len(reqs) if reqs else None


@app.command()
def gpus(gpu_file: opts.GpuFile = None) -> None:
    """List the GPU catalog: memory, bandwidth, tensor FLOP/s, interconnect."""
    from servefleet.hardware import GPUCatalog

    try:
        catalog = (
            GPUCatalog.builtin() if gpu_file is None else GPUCatalog.builtin().with_yaml(gpu_file)
        )
    except ValueError as e:
        _fail(str(e))
    t = Table(header_style="bold underline", box=None, pad_edge=False)
    for c in (
        "GPU",
        "memory GiB",
        "HBM TB/s",
        "fp16 TFLOP/s",
        "bf16",
        "fp8",
        "CC",
        "attention",
        "interconnect",
    ):
        t.add_column(c)
    for g in catalog:
        t.add_row(
            g.name,
            f"{g.memory_bytes / GiB:.1f}",
            f"{g.hbm_bandwidth / 1e12:.2f}",
            f"{g.flops['fp16'] / 1e12:.0f}",
            "yes" if g.bf16 else "no",
            f"{g.flops['fp8'] / 1e12:.0f}" if "fp8" in g.flops else "-",
            ".".join(map(str, g.compute_capability)),
            g.attention_backend,
            re.split(r",|:| \(", g.interconnect.description, maxsplit=1)[0],
        )
    console.print(Fitted(t))
    console.print("interconnect: the GPUs' links; `servefleet plan` prints their full description.")


@app.command()
def models() -> None:
    """List the bundled model presets and what they weigh."""
    from servefleet.models import load_model, preset_names

    t = Table(header_style="bold")
    for c in ("model", "params", "layers", "heads / kv", "fp16 GiB", "KV bytes/token", "max len"):
        t.add_column(c)
    for name in preset_names():
        m = load_model(name)
        t.add_row(
            m.name,
            f"{m.num_params / 1e9:.2f}B",
            str(m.num_layers),
            f"{m.num_attention_heads} / {m.num_kv_heads}",
            f"{m.weight_bytes('fp16') / GiB:.1f}",
            f"{m.kv_bytes_per_token('fp16'):,}",
            f"{m.max_position_embeddings:,}",
        )
    console.print(Fitted(t))


@app.command()
def workloads() -> None:
    """List the workload presets."""
    from servefleet.workload import PRESETS, describe_workload, load_workload

    for name in PRESETS:
        try:
            console.print(f"[bold]{name}[/]\n{describe_workload(load_workload(name))}\n")
        except Exception as e:  # presets that need a file (sharegpt, trace)
            console.print(f"[bold]{name}[/]\n  {e}\n")


def _register_commands() -> None:
    """Commands that live with their modules (each module's cli.py owns its options)."""
    from servefleet.bench.cli import register as bench
    from servefleet.bench.cli import register_quality as quality
    from servefleet.fleet.cli import register as fleet
    from servefleet.gateway.cli import register as gateway
    from servefleet.plan.cli import register as plan
    from servefleet.report.cli import register as report
    from servefleet.sim.server.cli import add_cli as sim_server

    for register in (plan, fleet, sim_server, gateway, bench, quality, report):
        register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
