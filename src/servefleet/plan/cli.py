"""`servefleet plan`: the command line of the planner (wired into the main app by ``register``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from servefleet import cli_options as opts


def register(app: typer.Typer) -> None:
    """Add the ``plan`` command to ``app``."""
    app.command(name="plan")(plan)


def plan(
    model: Annotated[
        str,
        typer.Option(
            help="What to serve: a preset (`servefleet models`), a Hugging Face repo id of one "
            "(e.g. Qwen/Qwen1.5-14B-Chat: served as named, its preset's shape used for the "
            "arithmetic), or a local checkpoint directory / config.json."
        ),
    ] = "Qwen1.5-14B",
    gpu: Annotated[
        str, typer.Option(help="GPU type (`servefleet gpus` lists them).")
    ] = "V100-SXM2-32G",
    num_gpus: Annotated[int, typer.Option(callback=opts.POSITIVE, help="GPUs per host.")] = 8,
    hosts: Annotated[
        int, typer.Option(callback=opts.POSITIVE, help="Hosts with --num-gpus GPUs each.")
    ] = 1,
    gpu_file: Annotated[Path | None, typer.Option(help="YAML file of extra GPUs.")] = None,
    workload: Annotated[
        str,
        typer.Option(
            help="Workload preset, YAML file (lengths may be `empirical`), a JSONL trace of "
            "observed requests, or trace:FILE (Mooncake JSONL, Azure CSV, servefleet records)."
        ),
    ] = "chat-3tier",
    time_scale: opts.TimeScale = None,
    max_requests: opts.MaxRequests = None,
    trace_block_size: opts.TraceBlockSize = None,
    slo_ttft: Annotated[
        float, typer.Option(callback=opts.POSITIVE, help="TTFT SLO, seconds, at --slo-percentile.")
    ] = 2.0,
    slo_itl: Annotated[
        float,
        typer.Option(
            callback=opts.POSITIVE, help="Inter-token latency SLO, seconds, at --slo-percentile."
        ),
    ] = 0.1,
    slo_percentile: Annotated[
        float, typer.Option(callback=opts.PERCENTILE, help="Percentile the SLOs apply to.")
    ] = 95.0,
    slo_classes: Annotated[
        str | None,
        typer.Option(
            help="Workload classes the SLO applies to, each judged on its own requests: "
            "qa,sessions, or with values of their own: qa:ttft=1:itl=0.05,sessions:ttft=4 "
            "(default: every request, pooled)."
        ),
    ] = None,
    target_rate: Annotated[
        float | None,
        typer.Option(callback=opts.POSITIVE, help="Requests/s to plan GPUs (and cost) for."),
    ] = None,
    gpu_price: Annotated[
        float | None,
        typer.Option(callback=opts.NON_NEGATIVE, help="Dollars per GPU-hour, for cost."),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="auto | fp16 | bf16 | fp8 | int8 (auto: the model's, fp16 without bf16)."
        ),
    ] = "auto",
    max_model_len: Annotated[
        int | None, typer.Option(callback=opts.POSITIVE, help="Fix vLLM --max-model-len.")
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(callback=opts.POSITIVE, help="Fix vLLM --max-num-seqs.")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(callback=opts.POSITIVE, help="Fix vLLM --max-num-batched-tokens.")
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(callback=opts.POSITIVE, help="Fix vLLM --block-size.")
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(callback=opts.FRACTION, help="Fix vLLM --gpu-memory-utilization."),
    ] = None,
    enable_prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="Fix prefix caching (default: from the workload's shared prefixes).",
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            help="vLLM --kv-cache-dtype: auto (the activations' dtype) or fp8 (half the KV bytes "
            "per token: about twice the cache; attention in fp8 on Hopper). Never chosen for "
            "you: fp8 KV changes the model's numerics."
        ),
    ] = "auto",
    policy: Annotated[
        str | None, typer.Option(help="Fix the gateway's routing policy (default: simulated).")
    ] = None,
    claim: Annotated[
        list[str] | None,
        typer.Option(
            help="A number to check against the physical bounds: itl=SECONDS, ttft=SECONDS, "
            "throughput=OUTPUT_TOK_S, rate=REQ_S (repeatable)."
        ),
    ] = None,
    window: Annotated[
        float, typer.Option(callback=opts.POSITIVE, help="Measured simulated seconds per point.")
    ] = 60.0,
    warmup: Annotated[
        float | None,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="Simulated warm-up seconds per point (default: each topology's settle time).",
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(callback=opts.NON_NEGATIVE, help="Seed of every simulation.")
    ] = 0,
    rel_tol: Annotated[
        float, typer.Option(callback=opts.FRACTION, help="Rate search resolution (0.1: 10 %).")
    ] = 0.1,
    jobs: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE,
            help="Points simulated at once, in worker processes (default 2). It shapes the "
            "search, so the same value gives the same plan.",
        ),
    ] = None,
    variants: Annotated[
        bool, typer.Option("--variants/--no-variants", help="Simulate flag variants too.")
    ] = True,
    sustain: Annotated[
        bool,
        typer.Option(
            "--sustain/--no-sustain",
            help="Judge the finalists on long runs and verify the rate on fresh seeds "
            "(--no-sustain: the 60 s screening decides, which overstates what holds).",
        ),
    ] = True,
    band: Annotated[
        bool,
        typer.Option(
            "--band/--no-band",
            help="Screen the chosen topology and the runner-up with the unmeasured GPU "
            "figures at the ends of their plausible ranges.",
        ),
    ] = True,
    engine: Annotated[str, typer.Option(help="fleet.yaml engine: vllm | sim.")] = "vllm",
    endpoint: opts.Endpoint = "chat",
    stream_options: opts.ClientProtocolOption = "sdk",
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Folder for plan.json, plan.md, fleet.yaml and serve.sh.")
    ] = None,
) -> None:
    """Plan a vLLM fleet: precision, TP x replicas, vLLM flags, the rate it sustains.

    Every choice is explained and every candidate simulated: one-minute screening, then long
    runs (the SLO over the window and its end, >= 97 % of the offered requests finished, no
    growing queue), the rate re-checked on fresh seeds before it is printed, with the rate
    where the SLO breaks and the band the unmeasured GPU figures allow. The printed
    `servefleet simulate` line reproduces the prediction exactly. docs/plan.md.
    """
    from servefleet.client_protocol import client_protocol
    from servefleet.plan.flags import Overrides
    from servefleet.plan.planner import Hooks, PlanImpossible, PlanRequest, make_plan
    from servefleet.plan.search import SearchSettings

    console, err = Console(), Console(stderr=True)

    def fail(msg: str, head: str = "error") -> None:
        err.print(f"[bold red]{head}:[/] {msg}", highlight=False)
        raise typer.Exit(2)

    if engine not in ("vllm", "sim"):
        fail(f"--engine must be vllm or sim, got {engine!r}")
    try:
        req = PlanRequest(
            model=model,
            gpu=gpu,
            num_gpus=num_gpus,
            hosts=hosts,
            gpu_file=str(gpu_file) if gpu_file else None,
            workload=workload,
            workload_overrides=opts.trace_overrides(time_scale, max_requests, trace_block_size),
            slo=_slo_target(slo_ttft, slo_itl, slo_percentile, slo_classes),
            target_rate=target_rate,
            gpu_price=gpu_price,
            dtype=dtype,
            overrides=Overrides(
                max_model_len,
                max_num_seqs,
                max_num_batched_tokens,
                block_size,
                gpu_memory_utilization,
                enable_prefix_caching,
                kv_cache_dtype,
            ),
            policy=policy,
            claims=_claims(claim or [], fail),
            settings=SearchSettings(
                window=window, warmup=warmup, seed=seed, rel_tol=rel_tol, sustain=sustain
            ),
            jobs=jobs,
            variants=variants,
            band=band,
            engine=engine,
            client=client_protocol(endpoint, stream_options),
        )
    except ValueError as e:
        fail(str(e))
    progress = Progress(
        SpinnerColumn(finished_text="[green]✓[/]"),
        TextColumn("{task.description}"),
        TextColumn("[dim]{task.completed} points"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    state = {"task": None, "stage": ""}

    def on_stage(name: str, _total: int) -> None:
        progress.start()  # only now: the worker processes are already forked
        if state["task"] is not None:  # the previous stage is over
            done = progress.tasks[state["task"]].completed
            progress.update(state["task"], total=done, completed=done)
        state["stage"] = name
        state["task"] = progress.add_task(f"simulating {name}", total=None)

    def on_point(label: str, o) -> None:
        mark = "[green]✓[/]" if o.ok else "[red]✗[/]"
        progress.update(
            state["task"],
            advance=1,
            description=f"simulating {state['stage']}: {label} at {o.rate:g} req/s {mark}",
        )

    try:
        result = make_plan(req, Hooks(stage=on_stage, point=on_point))
    except PlanImpossible as e:
        progress.stop()
        fail(str(e), "cannot plan")
    except (ValueError, OSError) as e:
        progress.stop()
        fail(str(e))
    finally:
        progress.stop()
    _emit(result, console, as_json, out)


def _slo_target(ttft: float, itl: float, percentile: float, classes: str | None):
    """The plan's SLO: ``--slo-classes`` names the classes judged (each on its own) and may
    give their own values (``qa:ttft=1``); ValueError on a malformed one."""
    from servefleet.plan.search import SLOTarget
    from servefleet.stats import SLO, parse_slo_classes

    default = SLO(ttft, itl)
    named = parse_slo_classes(classes, default)
    if named is None:
        return SLOTarget(ttft, itl, percentile)
    limits = tuple((n, s.ttft, s.itl) for n, s in named.items() if s != default)
    return SLOTarget(ttft, itl, percentile, frozenset(named), limits)


def _claims(items: list[str], fail) -> tuple[tuple[str, float], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out.append((key.strip(), float(value)))
        except ValueError:
            fail(f"--claim takes KEY=NUMBER (itl, ttft, throughput, rate), got {item!r}")
        if not sep:
            fail(f"--claim takes KEY=NUMBER, got {item!r}")
        if not (0 < out[-1][1] < float("inf")):
            fail(f"--claim takes a number > 0, got {item!r}")
    return tuple(out)


def _emit(result, console: Console, as_json: bool, out: Path | None) -> None:
    from servefleet.plan.plan_json import plan_dict
    from servefleet.plan.report import render_group, render_timing

    data = plan_dict(result)
    if as_json:
        print(json.dumps(data, indent=2, default=_plain))
    else:
        console.print(render_group(result), highlight=False)
    if out is not None:
        written = write_plan(result, data, out)
        msg = f"wrote {', '.join(str(p) for p in written)}"
        (Console(stderr=True) if as_json else console).print(msg, highlight=False)
    elif as_json:
        Console(stderr=True).print(render_timing(result))


MARKDOWN_WIDTH = 200
"""plan.md is the plan as printed at this width: every table whole, in one piece."""


def plan_markdown(result) -> str:
    """The plan as the terminal prints it, at ``MARKDOWN_WIDTH`` columns, in a Markdown file."""
    import io

    from servefleet.plan.report import render_group

    console = Console(width=MARKDOWN_WIDTH, record=True, file=io.StringIO(), color_system=None)
    console.print(render_group(result), highlight=False)
    dep = result.deployment
    title = f"# servefleet plan: {dep.replicas} x TP={dep.tp} {dep.model.name} on {dep.gpu.name}"
    return f"{title}\n\n```text\n{console.export_text().rstrip()}\n```\n"


def _plain(o):
    """numpy scalars and arrays as plain JSON values."""
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def write_plan(result, data: dict, out: Path) -> list[Path]:
    """``plan.json``, ``plan.md``, ``fleet.yaml``, ``serve.sh`` (and ``workload.yaml`` for a
    trace)."""
    import yaml

    from servefleet.plan.fleet_yaml import dump_fleet
    from servefleet.plan.render import serve_script

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "plan.json", out / "fleet.yaml", out / "serve.sh", out / "plan.md"]
    paths[0].write_text(json.dumps(data, indent=2, default=_plain))
    paths[3].write_text(plan_markdown(result))
    paths[1].write_text(dump_fleet(result.fleet))
    dep = result.deployment
    title = (
        f"{dep.replicas} x TP={dep.tp} {dep.model.name} on {dep.num_gpus} x {dep.gpu.name} "
        f"(servefleet plan, predicted {result.point.rate:g} req/s under {result.request.slo.describe()})"
    )
    paths[2].write_text(serve_script(result.fleet, title))
    paths[2].chmod(0o755)
    if result.workload.trace is not None:
        wl = out / "workload.yaml"
        wl.write_text(yaml.safe_dump(result.workload.model_dump(mode="json", exclude_none=True)))
        paths.append(wl)
    return paths
