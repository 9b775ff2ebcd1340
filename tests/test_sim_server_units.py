"""The sim-server's parts without a process: tokenizer, pseudo-output and stop strings, flags,
start-up prediction, metrics exposition, faults, the precise waiter, the engine loop."""

from __future__ import annotations

import asyncio
import gzip
import random
import statistics
import tarfile
from pathlib import Path

import pytest
import typer
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from typer.testing import CliRunner

from servefleet.engine import Request, TokenIdContent
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.server import add_cli
from servefleet.sim.server.args import ArgsError, parse_args
from servefleet.sim.server.faults import Faults, FaultUpdate
from servefleet.sim.server.loop import EngineLoop, Seq
from servefleet.sim.server.metrics import (
    INTER_TOKEN_LATENCY_BUCKETS,
    FastHistogram,
    ServerMetrics,
    build_1_2_5_buckets,
)
from servefleet.sim.server.startup import predict_startup
from servefleet.sim.server.textgen import OutputText, sequence_seed
from servefleet.sim.server.timing import Waiter, clock
from servefleet.sim.server.tokenizer import WORDS, WordTokenizer, render_chatml

SHARED = Path(__file__).resolve().parents[2] / "shared" / "gpu-vllm"


# -- tokenizer ---------------------------------------------------------------------------------
def test_word_tokenizer_counts_words_and_special_tokens() -> None:
    tok = WordTokenizer(152064)
    assert len(tok.encode("one two  three\n four")) == 4
    ids = tok.encode("<|im_start|>user\nhello there<|im_end|>\n")
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 5  # glued specials are tokens
    assert tok.encode("hello there") == WordTokenizer(152064).encode("hello there")  # stable
    assert all(0 <= i < 152064 for i in tok.encode("anything goes here, even ümlauts!"))
    known = " ".join(WORDS[:5])
    assert tok.decode(tok.encode(known)) == known
    assert tok.decode(tok.encode("zebra")) == "zebra"  # seen by this process
    assert tok.token_str(151000).startswith("<unk:")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([10**9])


def test_chatml_costs_three_tokens_per_message_and_two_for_the_prompt() -> None:
    tok = WordTokenizer()
    msgs = [("system", "be brief"), ("user", "what is two plus two")]
    text = render_chatml(msgs, add_generation_prompt=True, continue_final_message=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert len(tok.encode(text)) == (2 + 3) + (5 + 3) + 2
    open_ended = render_chatml(
        [("user", "finish"), ("assistant", "the answer is")], False, continue_final_message=True
    )
    assert open_ended.endswith("the answer is") and len(tok.encode(open_ended)) == 4 + 5


@pytest.mark.skipif(not (SHARED / "tok.tar.xz").exists(), reason="shared tokenizer not here")
def test_hf_tokenizer_from_a_local_directory(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from servefleet.sim.server.tokenizer import HFTokenizer

    with tarfile.open(SHARED / "tok.tar.xz") as tf:
        tf.extractall(tmp_path, filter="data")
    tok = HFTokenizer(str(tmp_path / "tok"))
    assert tok.vocab_size == 152064
    assert all(tok.piece(i, False).startswith(" ") for i in tok.output_ids[:50])
    ids = tok.encode(tok.render_chat([("user", "hi")], True, False), add_special_tokens=False)
    assert tok.decode(ids).startswith("<|im_start|>user\nhi<|im_end|>")
    gen = OutputText(tok, 1)
    text = "".join(gen.advance(k, gen.token_id(k)) for k in range(20))
    assert len(text.split()) == 20


def test_missing_hf_packages_give_a_clear_message(monkeypatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def no_hf(name, *args, **kwargs):
        if name in ("transformers", "tokenizers"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hf)
    from servefleet.sim.server.tokenizer import HFTokenizer

    with pytest.raises(ImportError, match=r"pip install 'servefleet\[hf\]'"):
        HFTokenizer(str(tmp_path))


# -- pseudo-output and stop strings -----------------------------------------------------------------
def _run(gen: OutputText, n: int) -> tuple[list[str], int]:
    deltas = []
    for k in range(n):
        deltas.append(gen.advance(k, gen.token_id(k)))
        if gen.stop_reason is not None:
            return deltas, k + 1
    deltas.append(gen.flush())
    return deltas, n


def test_output_is_deterministic_and_one_word_per_token() -> None:
    tok = WordTokenizer()
    seed = sequence_seed(0, None, 0, [5, 6, 7])
    a = [OutputText(tok, seed).token_id(k) for k in range(50)]
    assert a == [OutputText(tok, seed).token_id(k) for k in range(50)]
    assert a != [
        OutputText(tok, sequence_seed(0, None, 1, [5, 6, 7])).token_id(k) for k in range(50)
    ]
    deltas, n = _run(OutputText(tok, seed, first_space=False), 30)
    text = "".join(deltas)
    assert n == 30 and len(text.split()) == 30 and not text.startswith(" ")
    assert tok.encode(text) == [OutputText(tok, seed).token_id(k) for k in range(30)]


def test_two_prompts_never_share_a_run_of_output_words() -> None:
    """Continuing a prompt (a resumed stream) must not reproduce another sequence's words at
    some offset: any run of 3 equal tokens between two seeds' outputs, at offsets 0..59 over
    120 prompt pairs, would be a 1-in-10^10 chance for independent draws."""
    tok = WordTokenizer()
    runs = 0
    for p in range(120):
        a = OutputText(tok, sequence_seed(0, None, 0, [7, p]))
        b = OutputText(tok, sequence_seed(0, None, 0, [7, p, 11, 12]))
        ta = [a.token_id(k) for k in range(100)]
        tb = [b.token_id(k) for k in range(40)]
        for d in range(60):
            same = [ta[d + k] == tb[k] for k in range(40)]
            runs += any(all(same[k : k + 3]) for k in range(38))
    assert runs == 0


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_cut_the_text_and_streamed_deltas_never_show_them(include: bool) -> None:
    tok = WordTokenizer()
    seed = sequence_seed(3, 11, 0, [1])
    full = "".join(_run(OutputText(tok, seed), 40)[0])
    for stop in (full.split()[7], full[30:36], " " + full.split()[12][:2]):
        at = full.index(stop)
        deltas, n = _run(OutputText(tok, seed, [stop], include_stop_str_in_output=include), 40)
        text = "".join(deltas)
        assert text == full[: at + (len(stop) if include else 0)]
        end = at + len(stop)  # the token that completed the stop (a space opens the next one)
        assert n == len(full[:end].split()) + full[end - 1].isspace()
        if not include:
            assert all(stop not in "".join(deltas[: i + 1]) for i in range(len(deltas)))


def test_min_tokens_delays_the_stop_check() -> None:
    tok = WordTokenizer()
    full = "".join(_run(OutputText(tok, 9), 40)[0])
    stop = full.split()[2]
    _, n = _run(OutputText(tok, 9, [stop], min_tokens=10), 40)
    assert n > 10


# -- flags ------------------------------------------------------------------------------------------
def test_vllm_flags_parse_and_ignored_ones_are_reported() -> None:
    a = parse_args(
        ["Qwen/Qwen2.5-7B-Instruct", "-tp", "2", "--max-model-len", "32k", "--dtype", "half",
         "--no-enable-prefix-caching", "--trust-remote-code", "--swap-space", "4", "--port", "0"]
    )  # fmt: skip
    assert a.model == "Qwen/Qwen2.5-7B-Instruct" and a.tensor_parallel_size == 2
    assert a.max_model_len == 32000 and a.dtype == "fp16" and not a.enable_prefix_caching
    assert set(a.ignored_flags) == {"--swap-space", "--trust-remote-code"}
    assert parse_args(["--model", "m", "--max-model-len", "4K"]).max_model_len == 4096
    assert parse_args(["--model", "m", "--served-model-name", "a", "b"]).served_names == ["a", "b"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "m", "--frobnicate"], "unknown flag"),
        ([], "no model"),
        (["--model", "m", "-pp", "2"], "pipeline-parallel"),
        (["--model", "m", "--gpu-memory-utilization", "2"], "--gpu-memory-utilization"),
        (["--model", "m", "--dtype", "int3"], "--dtype"),
    ],
)
def test_bad_flags_say_what_to_fix(argv: list[str], match: str) -> None:
    with pytest.raises(ArgsError, match=match):
        parse_args(argv)


def test_add_cli_registers_sim_server_on_a_typer_app() -> None:
    app = typer.Typer()

    @app.command()
    def other() -> None:  # a second command, as the real CLI has
        pass

    add_cli(app)
    runner = CliRunner()
    r = runner.invoke(app, ["sim-server", "--help"])
    assert r.exit_code == 0 and "--max-model-len" in r.output and "--time-scale" in r.output
    r = runner.invoke(app, ["sim-server", "--model", "m", "--no-such-flag"])
    assert r.exit_code == 2


# -- start-up prediction ---------------------------------------------------------------------------
def test_predicted_startup_matches_the_measured_h200_case() -> None:
    dep = resolve_deployment(load_model("Qwen2.5-7B"), get_gpu("H200-SXM"))
    graphs = predict_startup(dep)
    # measured first starts on fresh H200 machines: 107, 110, 153, 157 s (median 131.5)
    assert abs(graphs.total - 131.5) < 10
    eager = predict_startup(dep.with_(enforce_eager=True))
    assert eager.compile == eager.graphs == 0 and eager.total < graphs.total
    tp2 = predict_startup(dep.with_(tp=2))
    assert tp2.weights == pytest.approx(graphs.weights / 2, rel=0.01) and tp2.nccl > 0


# -- metrics ------------------------------------------------------------------------------------------
def test_fast_histogram_renders_like_prometheus_client() -> None:
    values = [random.Random(1).expovariate(50) for _ in range(500)]
    ra, rb = CollectorRegistry(), CollectorRegistry()
    ref = Histogram(
        "vllm:x", "doc", ["model_name", "engine"], buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=ra
    )
    child = ref.labels("m", "0")
    fast = FastHistogram(
        "vllm:x", "doc", {"model_name": "m", "engine": "0"}, INTER_TOKEN_LATENCY_BUCKETS, rb
    )
    for v in values:
        child.observe(v)
        fast.observe(v)

    def lines(reg: CollectorRegistry) -> list[str]:
        return [
            line.split(" ")[0] + (" " + line.split(" ")[1] if "_created" not in line else "")
            for line in generate_latest(reg).decode().splitlines()
        ]

    assert lines(ra) == lines(rb)


def test_token_buckets_follow_vllms_1_2_5_rule() -> None:
    assert build_1_2_5_buckets(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]


REAL_SCRAPE = Path(__file__).parent / "data" / "vllm-0.26-metrics.txt.gz"
"""A whole /metrics of real vLLM 0.26 on the H200 after a bench (the h200-telemetry run in
benchmarks/real_gpu/data: Qwen2.5-0.5B shape, two points, preemptions)."""


def test_every_vllm_metric_of_the_sim_server_is_a_real_vllm_026_metric_of_the_same_type() -> None:
    real_text = gzip.decompress(REAL_SCRAPE.read_bytes()).decode()
    real = dict(
        line.split()[2:4] for line in real_text.splitlines() if line.startswith("# TYPE vllm:")
    )
    engine = _engine()
    m = ServerMetrics("m", 4096, engine, {"block_size": "16"}, {"gpu": "x"}, lambda: 0.0)
    ours = dict(
        line.split()[2:4]
        for line in m.render().decode().splitlines()
        if line.startswith("# TYPE vllm:")
    )
    assert len(ours) >= 12
    assert {k: real.get(k) for k in ours} == ours  # no invented name, no other type


# -- faults -------------------------------------------------------------------------------------------
def test_fault_updates_and_seeded_failures() -> None:
    f = Faults(rng=random.Random(5))
    f.apply(
        FaultUpdate(fail_fraction=0.5, slowdown=2, stall_seconds=3, exit_after_tokens=9), now=10
    )
    assert (f.fail_fraction, f.slowdown, f.stall_until, f.exit_after_tokens) == (0.5, 2, 13, 9)
    f.apply(FaultUpdate(exit_after_tokens=None), now=10)
    assert f.exit_after_tokens is None and f.slowdown == 2
    draws = [f.should_fail() for _ in range(200)]
    g = Faults(fail_fraction=0.5, rng=random.Random(5))
    assert draws == [g.should_fail() for _ in range(200)] and 60 < sum(draws) < 140
    # a request no replica can serve: the same answer every time, whatever the fraction
    f.apply(FaultUpdate(fail_fraction=0.0, fail_matching="POISON"), now=10)
    assert f.should_fail("a POISON b") and not f.should_fail("fine")
    f.apply(FaultUpdate(reset=True), now=10)
    assert f.describe(10) == {
        "slowdown": 1.0,
        "fail_fraction": 0.0,
        "stall_remaining_seconds": 0.0,
        "exit_after_tokens": None,
        "fail_matching": None,
    }


# -- timing and the engine loop ---------------------------------------------------------------------
def test_waiter_wakes_within_a_fraction_of_a_millisecond() -> None:
    async def main() -> list[float]:
        w = Waiter()
        late = []
        for _ in range(40):
            t = clock() + 0.004
            await w.until(t)
            late.append(clock() - t)
        w.close()
        return late

    late = asyncio.run(main())
    assert min(late) >= 0 and statistics.median(late) < 0.5e-3


def _engine(max_model_len: int = 4096):
    dep = resolve_deployment(
        load_model("Qwen2.5-7B"), get_gpu("H200-SXM"), max_model_len=max_model_len
    )
    return dep.build_engine()


def test_engine_loop_delivers_on_the_models_schedule_and_abort_frees_kv() -> None:
    engine, twin = _engine(), _engine()
    tok = WordTokenizer()
    metrics = ServerMetrics("m", 4096, engine, {"block_size": "16"}, {"gpu": "x"}, lambda: 0.0)

    twin.add_request(Request("t", 50, 6, TokenIdContent(list(range(50)))))
    predicted, t = [], 0.0
    while (res := twin.step(from_idle=not predicted)) is not None:
        t += res.duration
        predicted.append(t)

    async def main() -> tuple[list[float], float]:
        loop = EngineLoop(engine, metrics, Faults(), time_scale=1.0)
        await loop.start()
        sink: asyncio.Queue[Seq] = asyncio.Queue()
        t0 = clock()
        req = Request("a", 50, 6, TokenIdContent(list(range(50))))
        seq = Seq(req, OutputText(tok, 1), sink, 0, True, "a", t0)
        loop.add(seq)
        times = []
        while not seq.done:
            await sink.get()
            times.append(clock() - t0)
        long_seq = Seq(
            Request("b", 500, 3000, TokenIdContent(list(range(500)))),
            OutputText(tok, 2),
            asyncio.Queue(),
            0,
            True,
            "b",
            clock(),
        )
        loop.add(long_seq)
        await long_seq.sink.get()
        used = engine.kv_usage
        loop.abort(long_seq)
        freed = engine.kv_usage
        await loop.stop()
        assert used > 0
        return times, freed

    times, freed = asyncio.run(main())
    assert len(times) == 6 and freed == 0
    errors = [a - b for a, b in zip(times, predicted, strict=True)]
    assert statistics.median(errors) < 1e-3 and min(errors) > -1e-4
