"""`servefleet bench`: benchmark an OpenAI-compatible server with a workload."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servefleet import cli_options as opts
from servefleet.cli_options import fail as _fail

console = Console()
err = opts.err


def bench(
    url: Annotated[
        str, typer.Option(help="Base URL of the server (OpenAI API under /v1).")
    ] = "http://127.0.0.1:8000",
    model: Annotated[
        str | None, typer.Option(help="Model to ask for (default: the first of /v1/models).")
    ] = None,
    endpoint: Annotated[
        str, typer.Option(help="chat (/v1/chat/completions) or completions (/v1/completions).")
    ] = "chat",
    workload: opts.Workload = opts.DEFAULT_WORKLOAD,
    input_len: opts.InputLen = None,
    output_len: opts.OutputLen = None,
    time_scale: opts.TimeScale = None,
    max_requests: opts.MaxRequests = None,
    trace_block_size: opts.TraceBlockSize = None,
    concurrency: opts.Concurrency = None,
    rate: opts.Rate = None,
    slo_search: Annotated[
        bool,
        typer.Option(
            "--slo-search",
            help="Find the highest rate whose SLOs hold: P95 TTFT within --slo-ttft, P95 ITL "
            "within --slo-itl, at most 1 % of requests failed (doubling, then bisection).",
        ),
    ] = False,
    search_start: Annotated[
        float, typer.Option(callback=opts.POSITIVE, help="First rate of the SLO search (req/s).")
    ] = 1.0,
    search_tolerance: Annotated[
        float,
        typer.Option(
            callback=opts.FRACTION,
            help="SLO search stops when the bracket is this narrow (relative).",
        ),
    ] = 0.1,
    search_max_points: Annotated[
        int, typer.Option(callback=opts.POSITIVE, help="At most this many points in an SLO search.")
    ] = 12,
    duration: Annotated[
        float | None,
        typer.Option(callback=opts.NON_NEGATIVE, help="Seconds of arrivals per point."),
    ] = 60.0,
    requests: Annotated[
        int | None,
        typer.Option(
            callback=opts.POSITIVE,
            help="Stop each point after this many requests (with or instead of --duration; --duration 0 for count only; a trace with --duration 0: all its requests).",
        ),
    ] = None,
    warmup: Annotated[
        float | None,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="Seconds at the start of each point left out of the metrics (default: 10 % of "
            "--duration, at most 5 s; 0 with a request count alone).",
        ),
    ] = None,
    cooldown: Annotated[
        float,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="Seconds at the end of the arrivals left out of the metrics.",
        ),
    ] = 0.0,
    drain_timeout: Annotated[
        float,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="Seconds to let requests in flight finish after the arrivals end.",
        ),
    ] = 120.0,
    slo_ttft: opts.SloTtft = opts.DEFAULT_SLO_TTFT,
    slo_itl: opts.SloItl = opts.DEFAULT_SLO_ITL,
    slo_classes: opts.SloClasses = None,
    whole_burst_periods: Annotated[
        bool,
        typer.Option(
            "--whole-burst-periods/--no-whole-burst-periods",
            help="At a rate, extend --duration until the window after the warm-up holds one "
            "whole burst period of the workload (else it may hold no burst); off: keep "
            "--duration, and the point's notes say its window is short.",
        ),
    ] = True,
    max_error_rate: Annotated[
        float,
        typer.Option(
            callback=opts.NON_NEGATIVE,
            help="A point where a larger share of its requests failed (warm-up and cool-down "
            "included) is marked FAILED, and the exit status is 1.",
        ),
    ] = 0.01,
    seed: opts.Seed = opts.DEFAULT_SEED,
    reuse_connections: Annotated[
        bool, typer.Option(help="Keep-alive connections (off: a new connection per request).")
    ] = True,
    max_connections: Annotated[
        int, typer.Option(callback=opts.NON_NEGATIVE, help="Connection pool size (0: unlimited).")
    ] = 0,
    timeout: Annotated[
        float, typer.Option(callback=opts.POSITIVE, help="Seconds a single request may take.")
    ] = 600.0,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="Bearer token.")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="SERVEFLEET_ADMIN_TOKEN",
            show_envvar=True,
            help="A servefleet gateway's admin token, sent with its GET /fleet and /metrics "
            "(never to the replicas): a gateway listening beyond loopback shows them only "
            "with it.",
        ),
    ] = None,
    scrape: Annotated[
        bool, typer.Option(help="Read the server's /metrics before and after each point.")
    ] = True,
    scrape_replicas: Annotated[
        bool,
        typer.Option(
            help="When the server is a servefleet gateway (it answers GET /fleet), scrape each "
            "replica's /metrics and sum them (the gateway's own has no vLLM metrics)."
        ),
    ] = True,
    gpu_metrics: Annotated[
        str,
        typer.Option(
            help="GPU telemetry to record per point: a /metrics URL with DCGM names (`servefleet "
            "up` serves one on port 9400, as NVIDIA's dcgm-exporter does); auto: the target "
            "host's port 9400 if it answers; none: off."
        ),
    ] = "auto",
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Local tokenizer.json to size prompts (when the server has no /tokenize)."
        ),
    ] = None,
    ignore_eos: Annotated[
        bool, typer.Option(help="Send ignore_eos so outputs have the workload's length (vLLM).")
    ] = True,
    usage_per_chunk: Annotated[
        bool,
        typer.Option(
            "--usage-per-chunk/--no-usage-per-chunk",
            "--continuous-usage/--no-continuous-usage",
            help="Ask for usage on every chunk (vLLM's stream_options.continuous_usage_stats): "
            "exact tokens per chunk, but vLLM's API server then does per-token work that "
            "clients streaming as the OpenAI SDK does never cause, and it shows in the "
            "latencies measured. Off (the default): usage in the last chunk only, tokens per "
            "chunk from the chunks' token ids where the server sends them, else spread by text.",
        ),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(help="Live progress display (default: when stderr is a terminal)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for summary.json and the records (default runs/bench-<time>)."),
    ] = None,
) -> None:
    """Benchmark an OpenAI-compatible server (vLLM, the sim-server, the gateway) with a workload.

    Each point sends the workload at one concurrency (closed loop) or rate (open loop) for
    --duration seconds, measures TTFT, ITL, TPOT, E2E, throughput and goodput from the client,
    reads the server's /metrics, and checks that the client itself kept up. Ctrl-C stops the
    run and still writes the records gathered so far.
    """
    from servefleet.bench.point import PointSettings
    from servefleet.bench.schedule import StopRule
    from servefleet.bench.search import SloSearch
    from servefleet.stats import SLO, class_slos

    if endpoint not in ("chat", "completions"):
        _fail(f"--endpoint {endpoint!r}: use chat or completions")
    if sum(x is not None for x in (concurrency, rate)) + slo_search > 1:
        _fail("give one of --concurrency, --rate, --slo-search")
    trace = opts.trace_overrides(time_scale, max_requests, trace_block_size)
    spec = opts.workload_spec(workload, input_len, output_len, trace)
    if not duration and requests is None and spec.trace is not None:
        requests = len(spec.trace.records())  # --duration 0: the whole trace, then stop
    if warmup is None:
        warmup = min(5.0, 0.1 * duration) if duration else 0.0
    try:
        stop = StopRule(duration if duration else None, requests)
        slo = SLO(slo_ttft, slo_itl)
        named = opts.slo_classes(slo_classes, spec, slo)
        settings = PointSettings(
            stop,
            warmup,
            cooldown,
            drain_timeout,
            seed,
            slo,
            {**class_slos(spec.model_dump(mode="json"), slo), **(named or {})},
            named,
            max_error_rate,
        )
        search = (
            SloSearch(search_start, search_tolerance, search_max_points) if slo_search else None
        )
    except ValueError as e:
        _fail(str(e))
    loads = [] if slo_search else opts.loads(concurrency, rate, spec)
    out = out or opts.default_out("bench")
    from servefleet.bench.runs import BenchConfig

    config = BenchConfig(
        base_url=url,
        workload=spec,
        settings=settings,
        loads=loads,
        search=search,
        model=model,
        endpoint=endpoint,
        reuse_connections=reuse_connections,
        max_connections=max_connections,
        timeout=timeout,
        api_key=api_key,
        admin_token=admin_token,
        scrape=scrape,
        scrape_replicas=scrape_replicas,
        tokenizer=tokenizer,
        ignore_eos=ignore_eos,
        continuous_usage=usage_per_chunk,
        gpu_metrics=None if gpu_metrics in ("none", "") else gpu_metrics,
        out=out,
        whole_burst_periods=whole_burst_periods,
    )
    code = run_and_report(config, progress)
    raise typer.Exit(code)


def run_and_report(config, progress: bool | None) -> int:
    from servefleet.bench.calibrate import TargetError
    from servefleet.bench.runs import write_summary
    from servefleet.report.run import run_from_summary
    from servefleet.report.terminal import print_run

    holder: dict = {}
    try:
        run = _run_loop(_main(config, progress, holder))
    except TargetError as e:
        _fail(str(e))
    except KeyboardInterrupt:  # a Ctrl-C that arrived before our handler was installed
        run = holder.get("run")
        if run is None:
            err.print("interrupted before the first request")
            return 130
        run.interrupted = True
    if config.out is not None:
        write_summary(run, config.out)
    data = run_from_summary(
        run.summary_dict(), config.out, records={p.load.tag: p.records for p in run.points}
    )
    print_run(data, console)
    if config.out is not None:
        console.print(
            f"records and summary in {config.out}/ (report: servefleet report html {config.out})"
        )
    if run.interrupted:
        err.print(
            f"[yellow]interrupted:[/] wrote the {sum(len(p.records) for p in run.points)} "
            "records gathered so far (the run is marked incomplete)"
        )
        return 130
    return exit_code(run)


def exit_code(run) -> int:
    """1 when a point failed (more than --max-error-rate of its requests failed, every one
    of them counted), with a line per failed point on stderr; else 0."""
    limit = run.config.settings.max_error_rate
    failed = [p for p in run.points if p.summary.failed_point(limit)]
    for p in failed:
        s = p.summary
        first = next((r.error for r in p.records if not r.ok and r.error), "?")
        err.print(
            f"[bold red]FAILED point {p.load.label}:[/] {s.num_failed} of {s.num_requests} "
            f"requests failed ({s.error_rate:.1%} > {limit:.1%} allowed), e.g. {first}"
        )
    total = sum(p.summary.num_requests for p in run.points)
    if total and all(p.summary.num_ok == 0 for p in run.points):
        err.print(f"[bold red]error:[/] every request failed ({total} of {total})")
    return 1 if failed else 0


def _run_loop(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def _main(config, progress: bool | None, holder: dict):
    from servefleet.bench.point import LiveStats
    from servefleet.bench.progress import Display
    from servefleet.bench.runs import run_bench

    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        if stop_event.is_set():
            return
        err.print(
            "[yellow]interrupted: stopping, aborting requests in flight, writing records...[/]"
        )
        stop_event.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_sigint)
    live = LiveStats()

    def first_done(rec) -> None:
        state = "ok" if rec.ok else f"failed: {rec.error}"
        print(
            f"first response after {rec.e2e_latency or 0:.3f} s ({state})",
            file=sys.stderr,
            flush=True,
        )

    live.on_first_done = first_done
    said: dict = {}
    display = Display(live, progress, err)
    n = len(config.loads) if config.loads else None

    def on_ready(run) -> None:
        holder["run"] = run
        c = run.calibration
        err.print(
            f"benchmarking {run.target.model} at {config.base_url} ({config.endpoint}); "
            f"prompt sizing: {c.tokens_per_word:.3f} tokens/word from {c.method}"
        )
        if run.gpu_note:
            err.print(run.gpu_note, highlight=False)
        if run.server_note:
            err.print(f"server metrics: {run.server_note}", highlight=False, soft_wrap=True)
        display.start()

    def on_point_start(i, load) -> None:
        display.point(i, n)
        print(
            f"point {i + 1}{'/' + str(n) if n else ''}: {load.label} started",
            file=sys.stderr,
            flush=True,
        )

    def on_point(i, p) -> None:
        s = p.summary
        print(
            f"point {i + 1}: {p.load.label} done: {s.num_ok}/{s.num_requests} ok"
            + (f", {s.num_failed} failed" if s.num_failed else "")
            + (" — FAILED (error rate)" if s.failed_point(config.settings.max_error_rate) else "")
            + f", {s.output_throughput:,.0f} out tok/s",
            file=sys.stderr,
            flush=True,
        )
        v = p.server
        if v is not None and v.replicas is not None and v.scraped != said.get("scraped"):
            said["scraped"] = v.scraped
            print(
                f"server metrics: summed over {len(v.scraped)} replicas behind the gateway: "
                + ", ".join(v.scraped),
                file=sys.stderr,
                flush=True,
            )
        for note in v.notes if v is not None else ():
            print(f"server metrics: {note}", file=sys.stderr, flush=True)

    try:
        return await run_bench(
            config,
            stop_event=stop_event,
            live=live,
            on_ready=on_ready,
            on_point_start=on_point_start,
            on_point=on_point,
        )
    finally:
        display.stop()


def quality(
    reference: Annotated[
        str, typer.Argument(help="Base URL of the reference deployment (e.g. bf16 weights).")
    ],
    candidate: Annotated[
        str, typer.Argument(help="Base URL of the candidate (e.g. fp8 weights or fp8 KV cache).")
    ],
    prompts: Annotated[
        Path | None,
        typer.Option(
            help='Prompts: one per line (.txt) or JSONL {"prompt", "answer"}; with answers '
            "the accuracy of each side is reported (default: 24 built-in prompts)."
        ),
    ] = None,
    num_prompts: Annotated[
        int | None,
        typer.Option(help="Use only the first N prompts.", callback=opts.POSITIVE),
    ] = None,
    endpoint: Annotated[
        str, typer.Option(help="chat (/v1/chat/completions) or completions (/v1/completions).")
    ] = "chat",
    max_tokens: Annotated[
        int, typer.Option(help="Tokens each answer may have.", callback=opts.POSITIVE)
    ] = 64,
    top_logprobs: Annotated[
        int,
        typer.Option(help="Most likely tokens asked for at each place (vLLM allows up to 20)."),
    ] = 5,
    concurrency: Annotated[
        int,
        typer.Option(help="Prompts asked at once (each to both sides).", callback=opts.POSITIVE),
    ] = 8,
    reference_model: Annotated[
        str | None, typer.Option(help="Model the reference serves (default: its first).")
    ] = None,
    candidate_model: Annotated[
        str | None, typer.Option(help="Model the candidate serves (default: its first).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="Bearer token, for both sides.")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds the whole comparison may take.", callback=opts.POSITIVE)
    ] = 300.0,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for quality.json and report.html (default runs/quality-<time>)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Compare two deployments' answers to the same prompts (greedy, temperature 0, logprobs):
    exact-match rate, first divergent token, the logprob differences of the reference's tokens,
    and with a task file each side's accuracy and their difference with a 95 % interval."""
    from servefleet.bench.quality import QualityError, QualitySettings, Side, run_quality
    from servefleet.quality import BUILT_IN, Prompt, PromptFileError, load_prompts
    from servefleet.report.html import render_quality_page
    from servefleet.report.quality import QUALITY_FILE, quality_tables
    from servefleet.report.terminal import rich_table

    if endpoint not in ("chat", "completions"):
        opts.fail(f"--endpoint {endpoint!r}: use chat or completions")
    if not 0 <= top_logprobs <= 20:
        opts.fail(f"--top-logprobs must be 0 to 20, got {top_logprobs}")
    try:
        asked = load_prompts(prompts) if prompts else [Prompt(p) for p in BUILT_IN]
    except PromptFileError as e:
        opts.fail(str(e))
    asked = asked[:num_prompts] if num_prompts else asked
    settings = QualitySettings(endpoint, max_tokens, top_logprobs, concurrency, timeout)
    try:
        data = run_quality(
            Side(reference, reference_model, api_key),
            Side(candidate, candidate_model, api_key),
            asked,
            settings,
        )
    except (QualityError, TimeoutError) as e:
        opts.fail(f"cannot compare: {e or 'timed out (--timeout)'}")
    folder = out or opts.default_out("quality")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / QUALITY_FILE).write_text(json.dumps(data, indent=2))
    (folder / "report.html").write_text(render_quality_page(data), encoding="utf-8")
    if as_json:
        print(json.dumps(data["summary"], indent=2))
    else:
        for t in quality_tables(data):
            console.print(rich_table(t))
        console.print(f"quality.json and report.html in {folder}/")
    failed = data["summary"]["errors"]
    if failed == len(asked):
        opts.fail(f"every prompt failed: {data['prompts'][0]['error']}", code=1)


def register_quality(app: typer.Typer) -> None:
    """Add the ``quality`` command to the servefleet CLI."""
    app.command(name="quality")(quality)


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to the servefleet CLI."""
    app.command(name="bench")(bench)
