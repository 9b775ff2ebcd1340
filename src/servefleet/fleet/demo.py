"""``servefleet demo``: plan → simulate → up (sim-servers + gateway) → live bench → report.

The whole story of servefleet on no GPU in about two minutes: plan Qwen1.5-14B on 8 x V100 32G;
predict the fleet over a concurrency sweep; start that fleet as sim-server processes behind the
gateway (running ``--time-scale`` times faster than the modelled GPUs); benchmark it live with
``chat-3tier`` through the gateway; write the HTML report, predicted and measured side by side.
Every process it starts is stopped on the way out, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from servefleet import cli_options as opts
from servefleet.plan.fleet_yaml import Fleet, dump_fleet

MODEL, GPU, NUM_GPUS, WORKLOAD = "Qwen1.5-14B", "V100-SXM2-32G", 8, "chat-3tier"


@dataclass(frozen=True)
class DemoSettings:
    sim_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    sim_duration: float = 120.0
    sim_warmup: float = 20.0
    bench_concurrency: tuple[int, ...] = (4, 8)
    bench_duration: float = 20.0
    """Wall seconds of arrivals per live point (× time_scale in model time)."""
    time_scale: float = 2.0
    startup_time: float = 1.0
    plan_window: float = 30.0
    plan_rel_tol: float = 0.25
    seed: int = 0


def local_fleet(fleet: Fleet, ports: list[int]) -> Fleet:
    """The planned fleet as sim-servers on free loopback ports."""
    reps = [r.model_copy(update={"port": p}) for r, p in zip(fleet.replicas, ports, strict=False)]
    gw = fleet.gateway.model_copy(update={"host": "127.0.0.1", "port": ports[len(reps)]})
    return fleet.model_copy(update={"engine": "sim", "replicas": reps, "gateway": gw})


def scaled_measured(bench_dir: Path, scale: float):
    """The measured run with its wall times × ``scale``: the model's time, comparable with
    the prediction (the sim-servers ran ``scale`` times faster than the modelled GPUs)."""
    from dataclasses import replace

    from servefleet.records import read_jsonl
    from servefleet.report.run import run_from_summary

    meta = json.loads((bench_dir / "summary.json").read_text())
    records = {}
    for raw in meta["points"]:
        c = raw["load"]["concurrency"]
        tag = f"c{c}"
        if "window" in raw:
            raw["window"] = {k: v * scale for k, v in raw["window"].items()}
        fname = raw.get("records_file") or f"records-{tag}.jsonl.gz"
        records[tag] = [_scale(r, scale, replace) for r in read_jsonl(bench_dir / fname)]
    data = run_from_summary(meta, bench_dir, records=records)
    data.name = f"measured (live, x{scale:g} time scale undone)"
    return data


def _scale(r, k: float, replace):
    def s(v):
        return None if v is None else v * k

    return replace(
        r,
        scheduled_time=r.scheduled_time * k,
        send_time=r.send_time * k,
        first_token_time=s(r.first_token_time),
        end_time=s(r.end_time),
        chunk_times=[t * k for t in r.chunk_times],
        queue_time=s(r.queue_time),
    )


def run_demo(out: Path, settings: DemoSettings, console: Console, err: Console) -> Path:
    from servefleet.plan.planner import Hooks, PlanRequest, make_plan
    from servefleet.plan.search import SearchSettings
    from servefleet.sim.command import run_simulate, write_run
    from servefleet.sim.runner import Load as SimLoad
    from servefleet.stats import SLO
    from servefleet.workload import load_workload

    from .commands import SimOptions, free_ports
    from .supervisor import Supervisor, Timing

    out.mkdir(parents=True, exist_ok=True)
    s = settings
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    )
    sup: Supervisor | None = None
    stop = threading.Event()
    watcher: threading.Thread | None = None
    with progress:
        try:
            # 1. plan
            t = progress.add_task(f"1/5 planning {MODEL} on {NUM_GPUS} x {GPU}", total=None)
            hooks = Hooks(
                stage=lambda name, n: progress.update(
                    t, total=None, completed=0, description=f"1/5 planning: {name} (points)"
                ),
                point=lambda *a: progress.advance(t),
            )
            req = PlanRequest(
                MODEL,
                GPU,
                NUM_GPUS,
                workload=WORKLOAD,
                engine="sim",
                variants=False,
                jobs=min(2, os.cpu_count() or 1),
                settings=SearchSettings(window=s.plan_window, rel_tol=s.plan_rel_tol, seed=s.seed),
            )
            plan = make_plan(req, hooks)
            dep = plan.deployment
            progress.update(t, total=1, completed=1, description="1/5 planned")
            console.print(
                f"plan: {dep.model.name} {dep.dtype}, {dep.replicas} replicas x TP={dep.tp} on "
                f"{NUM_GPUS} x {GPU}; max-model-len {dep.max_model_len}, max-num-seqs "
                f"{dep.max_num_seqs}, max-num-batched-tokens {dep.max_num_batched_tokens}; "
                f"gateway policy {plan.fleet.gateway.policy.name}",
                highlight=False,
            )
            (out / "fleet.yaml").write_text(dump_fleet(plan.fleet))

            # 2. simulate
            loads = [SimLoad(concurrency=c) for c in s.sim_concurrency]
            t = progress.add_task("2/5 simulating the concurrency sweep", total=len(loads))
            sim_run = run_simulate(
                dep,
                load_workload(WORKLOAD),
                loads,
                duration=s.sim_duration,
                warmup=s.sim_warmup,
                seed=s.seed,
                policy=plan.fleet.gateway.policy.name,
                slo=SLO(2.0, 0.1),
                on_point=lambda i, p: progress.advance(t),
            )
            predicted = write_run(sim_run, out / "predicted")

            # 3. up
            fleet = local_fleet(plan.fleet, free_ports(len(plan.fleet.replicas) + 1))
            t = progress.add_task(
                f"3/5 starting {len(fleet.replicas)} sim-servers (x{s.time_scale:g} speed) "
                "+ gateway",
                total=len(fleet.replicas) + 1,
            )
            sup = Supervisor(
                fleet,
                out / "fleet",
                sim=SimOptions(s.time_scale, s.startup_time),
                timing=Timing(ready_timeout=120.0, drain_timeout=5.0, health_interval=0.5),
                say=lambda m: err.print(m, highlight=False),
            )
            sup.start(on_ready=lambda name: progress.advance(t))
            watcher = threading.Thread(target=sup.supervise, args=(stop,), daemon=True)
            watcher.start()
            console.print(
                f"fleet up: {len(fleet.replicas)} sim-servers behind the gateway at "
                f"{sup.gateway_url} (logs in {out / 'fleet' / 'logs'})",
                highlight=False,
            )

            # 4. bench
            bench_dir = out / "measured"
            t = progress.add_task(
                f"4/5 live {WORKLOAD} through the gateway", total=len(s.bench_concurrency)
            )
            _bench(sup.gateway_url, s, bench_dir, lambda: progress.advance(t))

            # 5. report
            t = progress.add_task("5/5 report", total=1)
            report = _report(predicted, bench_dir, s, out)
            progress.advance(t)
        finally:
            stop.set()
            if watcher is not None:
                watcher.join()
            if sup is not None:
                sup.shutdown(quiet=True)
    return report


def _bench(url: str, s: DemoSettings, out: Path, advance) -> None:
    from servefleet.bench.point import Load, PointSettings
    from servefleet.bench.runs import BenchConfig, run_bench, write_summary
    from servefleet.bench.schedule import StopRule
    from servefleet.stats import SLO
    from servefleet.workload import load_workload

    # SLOs in wall time: the replicas run time_scale times faster than the GPUs they model
    config = BenchConfig(
        base_url=url,
        workload=load_workload(WORKLOAD),
        settings=PointSettings(
            stop=StopRule(duration=s.bench_duration),
            warmup=min(2.0, s.bench_duration / 4),
            seed=s.seed,
            slo=SLO(2.0 / s.time_scale, 0.1 / s.time_scale),
            drain_timeout=60.0,
        ),
        loads=[Load(concurrency=c) for c in s.bench_concurrency],
        out=out,
    )

    async def main():
        return await run_bench(config, on_point=lambda i, p: advance())

    run = asyncio.run(main())
    write_summary(run, out)


def _report(predicted: Path, measured: Path, s: DemoSettings, out: Path) -> Path:
    from servefleet.report.compare import compare_html, figures_of
    from servefleet.report.run import load_run

    a = load_run(predicted)
    a.name = "predicted (simulate)"
    b = scaled_measured(measured, s.time_scale)
    html = compare_html(a, b, figures_of(None))
    note = (
        f"<p><b>servefleet demo</b>: {MODEL} on {NUM_GPUS} x {GPU}, workload {WORKLOAD}. "
        f"A = the simulator's prediction; B = measured live through the gateway in front of "
        f"sim-server processes that ran {s.time_scale:g}x faster than the modelled GPUs "
        f"(--time-scale {s.time_scale:g}); B's times are multiplied by {s.time_scale:g} to be "
        "comparable. Start-up was shortened to "
        f"{s.startup_time:g} s (a real vllm serve loads for minutes).</p>"
    )
    html = html.replace("<h1>Compare</h1>", "<h1>Compare</h1>" + note, 1)
    path = out / "report.html"
    path.write_text(html)
    return path


def demo(
    out: Annotated[
        Path | None, typer.Option(help="Folder for everything (default runs/demo-<time>).")
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(
            callback=opts.POSITIVE, help="Sim-servers run this many times faster than the GPUs."
        ),
    ] = 2.0,
    bench_duration: Annotated[
        float,
        typer.Option(
            callback=opts.POSITIVE, help="Wall seconds of arrivals per live benchmark point."
        ),
    ] = 20.0,
) -> None:
    """The end-to-end demo, no GPU needed (about two minutes): plan 8 x V100 32G for
    Qwen1.5-14B, simulate it, start it as sim-servers behind the gateway, benchmark it live,
    and write the HTML report with predicted and measured side by side."""
    from .commands import FleetError

    console, err = Console(), Console(stderr=True)
    if time_scale <= 0 or bench_duration <= 0:
        err.print("[bold red]error:[/] --time-scale and --bench-duration must be > 0")
        raise typer.Exit(2)
    out = out or Path("runs") / f"demo-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    settings = DemoSettings(time_scale=time_scale, bench_duration=bench_duration)
    console.print(
        f"servefleet demo: {MODEL} on {NUM_GPUS} x {GPU} (no GPU needed). The live fleet runs "
        f"as sim-server processes {time_scale:g}x faster than the modelled GPUs "
        f"(--time-scale {time_scale:g}); measured times are scaled back for the comparison.",
        highlight=False,
    )

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        report = run_demo(out, settings, console, err)
    except KeyboardInterrupt:
        err.print(f"interrupted: every process the demo started is stopped; partial files in {out}")
        raise typer.Exit(130) from None
    except (FleetError, ValueError) as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2) from None
    finally:
        signal.signal(signal.SIGTERM, old)
    console.print(
        f"report: [bold]{report}[/] (predicted and measured side by side; open it in a browser)\n"
        f"everything else in {out}/: fleet.yaml, predicted/, measured/, fleet/logs/",
        highlight=False,
    )
