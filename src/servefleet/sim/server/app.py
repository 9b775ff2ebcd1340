"""The sim-server: vLLM's OpenAI-compatible HTTP API over one engine model in wall-clock time.

Routes (as `vllm serve` has them): ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize``, ``GET /version``, ``GET /health``,
``GET /metrics``; and the sim-server's own ``GET /sim/stats`` (lag percentiles, CPU),
``GET|POST /admin/faults`` and ``POST /admin/stats/reset`` (``--admin-token``).

``SimServer`` owns the engine, tokenizer, metrics, faults and the ``EngineLoop``;
``serve(args)`` runs it under aiohttp (uvloop when installed) until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import logging
import os
import random
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from servefleet import protocol
from servefleet.aiohttp_util import bind_lifecycle
from servefleet.engine import Request, TokenIdContent
from servefleet.hardware import get_gpu
from servefleet.models import load_model
from servefleet.protocol import FieldError, RequestError, SamplingRequest
from servefleet.sim.deployment import resolve_deployment
from servefleet.sim.server.api import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    from_request_error,
    validation_error,
)
from servefleet.sim.server.args import SimServerArgs
from servefleet.sim.server.faults import Faults, FaultUpdate
from servefleet.sim.server.log import configure_logging
from servefleet.sim.server.loop import EngineLoop, Seq, fault_exit
from servefleet.sim.server.metrics import ServerMetrics
from servefleet.sim.server.responses import (
    LogprobEntry,
    StreamFormat,
    chat_logprobs,
    chat_response,
    completion_logprobs,
    completion_response,
    js,
    model_list,
    new_request_id,
    usage,
)
from servefleet.sim.server.startup import predict_startup
from servefleet.sim.server.textgen import OutputText, sequence_seed
from servefleet.sim.server.timing import clock
from servefleet.sim.server.tokenizer import ChatTemplateError, load_tokenizer

log = logging.getLogger("servefleet.sim.server")

VLLM_VERSION = "0.26.0"
"""The vLLM release whose API and metrics the sim-server imitates (``GET /version``)."""
MAX_BODY_BYTES = 64 << 20
_M = TypeVar("_M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SimServer:
    def __init__(self, args: SimServerArgs) -> None:
        self.args = args
        model = load_model(args.model)
        gpu = get_gpu(args.gpu)
        dep = resolve_deployment(
            model,
            gpu,
            tp=args.tensor_parallel_size,
            dtype=args.dtype,
            kv_cache_dtype=args.kv_cache_dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            gpu_memory_utilization=args.gpu_memory_utilization,
            block_size=args.block_size,
            enable_prefix_caching=args.enable_prefix_caching,
            enforce_eager=args.enforce_eager,
        )
        mem = dep.memory()
        if not mem.fits:
            raise ValueError(dep.why_not_fits(mem))
        self.deployment = dep
        self.engine = dep.build_engine()
        cfg = self.engine.config
        if cfg.kv_capacity_tokens < cfg.max_model_len:
            raise ValueError(
                f"To serve at least one request with the model's max seq len "
                f"({cfg.max_model_len}), {cfg.max_model_len} tokens of KV cache are needed, "
                f"more than the {cfg.kv_capacity_tokens} that fit on {gpu.name} "
                f"(TP={dep.tp}). Try increasing --gpu-memory-utilization or decreasing "
                "--max-model-len (as vLLM says at start-up)."
            )
        self.max_model_len = cfg.max_model_len
        self.tokenizer = load_tokenizer(args.tokenizer, model.vocab_size)
        self.served = args.served_names
        self.model_name = self.served[0]
        self.faults = Faults(
            slowdown=args.fault_slowdown,
            fail_fraction=args.fault_fail_fraction,
            exit_after_tokens=args.fault_exit_after_tokens,
            rng=random.Random(args.seed),
        )
        self.startup = predict_startup(dep)
        self.startup_seconds = (
            args.startup_time
            if args.startup_time is not None
            else self.startup.total / args.time_scale
        )
        self.metrics = ServerMetrics(
            self.model_name,
            cfg.max_model_len,
            self.engine,
            cache_info={
                "block_size": str(cfg.block_size),
                "cache_dtype": "auto",
                "enable_prefix_caching": str(cfg.enable_prefix_caching),
                "gpu_memory_utilization": str(dep.gpu_memory_utilization),
                "num_gpu_blocks": str(cfg.num_gpu_blocks),
            },
            sim_info={
                "gpu": gpu.name,
                "tensor_parallel_size": str(dep.tp),
                "dtype": dep.dtype,
                "max_num_seqs": str(cfg.max_num_seqs),
                "max_num_batched_tokens": str(cfg.max_num_batched_tokens),
                "time_scale": str(args.time_scale),
            },
            lag_now=lambda: self.loop.lag_last,
        )
        self.loop = EngineLoop(
            self.engine,
            self.metrics,
            self.faults,
            args.time_scale,
            on_finish=self._log_finish if args.log_requests else None,
        )
        self.created = int(time.time())
        self.ready_at = float("inf")
        self._seq_counter = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.ready_at = clock() + self.startup_seconds
        await self.loop.start()

    async def stop(self) -> None:
        await self.loop.stop()

    @property
    def loading(self) -> bool:
        return clock() < self.ready_at

    def describe(self) -> dict[str, Any]:
        dep, cfg = self.deployment, self.engine.config
        return {
            "model": dep.model.name,
            "served_model_name": self.served,
            "gpu": dep.gpu.name,
            "tensor_parallel_size": dep.tp,
            "dtype": dep.dtype,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "num_gpu_blocks": cfg.num_gpu_blocks,
            "block_size": cfg.block_size,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "enforce_eager": cfg.enforce_eager,
            "tokenizer": self.tokenizer.name,
            "time_scale": self.args.time_scale,
            "startup_seconds": self.startup_seconds,
            "predicted_vllm_startup_seconds": self.startup.total,
        }

    # -- the app ---------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_BODY_BYTES)
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_get("/version", self.version)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics_route)
        r.add_get("/sim/stats", self.sim_stats)
        r.add_get("/admin/faults", self.get_faults)
        r.add_post("/admin/faults", self.set_faults)
        r.add_post("/admin/stats/reset", self.reset_stats)
        return bind_lifecycle(app, self.start, self.stop)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        try:
            if path.startswith("/v1"):
                key = self.args.api_key
                if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
                    return web.json_response({"error": "Unauthorized"}, status=401)
            if self.loading and (path.startswith("/v1") or path in ("/tokenize", "/detokenize")):
                left = self.ready_at - clock()
                raise APIError(
                    f"The model is still loading (about {left:.1f} s left); retry after /health "
                    "answers 200.",
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    "ServiceUnavailableError",
                    headers={"Retry-After": str(max(1, round(left)))},
                )
            return await handler(request)
        except APIError as exc:
            if exc.status >= 500:
                log.warning(
                    "request_error",
                    extra={"fields": {"path": path, "status": exc.status, "type": exc.err_type}},
                )
            response = web.json_response(exc.body(), status=exc.status, headers=exc.headers)
            if exc.headers.get("Connection") == "close":
                # the rest of the body is never read: the connection ends with this answer
                await response.prepare(request)
                await response.write_eof()
                request.protocol.force_close()
            return response
        except web.HTTPNotFound:
            return web.json_response({"detail": "Not Found"}, status=404)
        except web.HTTPMethodNotAllowed:
            return web.json_response({"detail": "Method Not Allowed"}, status=405)
        except web.HTTPRequestEntityTooLarge:
            raise
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:
            return self._unexpected(path, exc)

    # -- parsing helpers -------------------------------------------------------------------
    @staticmethod
    def _unexpected(path: str, exc: Exception) -> web.Response:
        """What vLLM's ``create_error_response`` does with an exception it did not expect:
        ValueError, TypeError, RuntimeError and OverflowError (a body it could not take, e.g.
        text its tokenizer cannot encode) are the client's 400; anything else is a 500."""
        if isinstance(exc, ValueError | TypeError | RuntimeError | OverflowError):
            return web.json_response(APIError(str(exc)).body(), status=400)
        log.exception("internal_error", extra={"fields": {"path": path}})
        body = APIError(str(exc), 500, "InternalServerError").body()
        return web.json_response(body, status=500)

    async def _json(self, request: web.Request) -> Any:
        """The request's JSON body. A body that does not come whole within ``--body-timeout``
        s is a 408 (and the connection closes); one whose ``Content-Encoding`` does not decode
        is the client's 400, as is one that is not JSON."""
        try:
            async with asyncio.timeout(self.args.body_timeout):
                raw = await request.read()
        except TimeoutError:
            raise APIError(
                f"The request body did not arrive within {self.args.body_timeout:g} s.",
                HTTPStatus.REQUEST_TIMEOUT,
                "RequestTimeoutError",
                headers={"Connection": "close"},
            ) from None
        except (HttpProcessingError, web.RequestPayloadError) as exc:
            # e.g. ``Content-Encoding: gzip`` on a body that is not gzip
            why = " ".join(str(exc).split()).removeprefix("400, message: ")
            raise APIError(
                f"The request body could not be read: {why}", headers={"Connection": "close"}
            ) from None
        try:
            return protocol.load_body(raw)
        except RequestError as exc:
            raise from_request_error(exc) from None

    @staticmethod
    def _parse(model: type[_M], body: Any) -> _M:
        try:
            if issubclass(model, SamplingRequest):
                return protocol.parse(model, body)  # type: ignore[return-value]
            return model.model_validate(body)
        except ValidationError as exc:
            raise validation_error(exc) from None
        except RequestError as exc:
            raise from_request_error(exc) from None

    def _check_model(self, name: str | None) -> None:
        if name is not None and name not in self.served:
            raise APIError(
                f"The model `{name}` does not exist.",
                HTTPStatus.NOT_FOUND,
                "NotFoundError",
                "model",
            )

    def _max_tokens(self, num_prompt: int, requested: int | None, min_tokens: int) -> int:
        """``max_tokens`` for this prompt, or vLLM's 400 (context length, bounds)."""
        limit = self.max_model_len
        if num_prompt == 0:
            raise APIError("The decoder prompt cannot be empty", param="prompt")
        if requested is not None and requested < 1:
            raise APIError(f"max_tokens must be at least 1, got {requested}.", param="max_tokens")
        if requested is not None and requested > limit:
            raise APIError(
                f"max_tokens={requested} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param="max_tokens",
            )
        out = requested if requested is not None else 0
        if num_prompt + out > limit or (requested is None and num_prompt >= limit):
            out = max(out, 1) if requested is None and num_prompt == limit else out
            shown = min(num_prompt, limit - out + 1)
            raise APIError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{out} output tokens and your prompt contains at least {shown} input tokens, "
                f"for a total of at least {shown + out} tokens. Please reduce the length of the "
                "input prompt or the number of requested output tokens. "
                f"(parameter=input_tokens, value={shown})",
                param="input_tokens",
            )
        max_tokens = requested if requested is not None else limit - num_prompt
        why = self.engine.validate(num_prompt, max_tokens)
        if why is not None:
            raise APIError(why, param="input_tokens")
        if min_tokens > max_tokens:
            raise APIError(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                f"got {min_tokens}.",
                param="min_tokens",
            )
        return max_tokens

    def _maybe_fail(self, text: str = "") -> None:
        if self.faults.should_fail(text):
            raise APIError(
                "Injected fault: the sim-server fails this request (fail_fraction="
                f"{self.faults.fail_fraction}).",
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "InternalServerError",
            )

    def _new_seq(
        self,
        http_id: str,
        index: int,
        ids: list[int],
        max_tokens: int,
        body: SamplingRequest,
        sink: asyncio.Queue[Seq],
        first_space: bool,
        t_arrival: float,
    ) -> Seq:
        self._seq_counter += 1
        rid = f"{http_id}-{index}#{self._seq_counter}"
        req = Request(rid, len(ids), max_tokens, TokenIdContent(ids), arrival_time=t_arrival)
        gen = OutputText(
            self.tokenizer,
            sequence_seed(self.args.seed, body.seed, index, ids),
            body.stop_list,
            body.min_tokens,
            body.include_stop_str_in_output,
            first_space=first_space,
            alter=self.args.alter_tokens,
        )
        return Seq(req, gen, sink, index, bool(body.stream), http_id, t_arrival)

    def _include_usage(self, body: SamplingRequest) -> tuple[bool, bool]:
        opts = body.stream_options
        include = self.args.enable_force_include_usage or bool(opts and opts.include_usage)
        continuous = include and bool(opts and opts.continuous_usage_stats)
        return include, continuous

    # -- generation ------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        t_arrival = clock()
        body = self._parse(CompletionRequest, await self._json(request))
        self._check_model(body.model)
        tok = self.tokenizer
        prompts: list[tuple[list[int], str | None]] = []
        for p in body.prompts():
            if isinstance(p, str):
                prompts.append((tok.encode(p, add_special_tokens=body.add_special_tokens), p))
            else:
                self._check_ids(p, "prompt")
                prompts.append((list(p), None))
        limits = [
            self._max_tokens(len(ids), body.max_tokens, body.min_tokens) for ids, _ in prompts
        ]
        self._maybe_fail("".join(body.texts()))
        http_id = "cmpl-" + new_request_id(request.headers.get("X-Request-Id"))
        sink: asyncio.Queue[Seq] = asyncio.Queue()
        seqs = [
            self._new_seq(http_id, pi * body.n + c, ids, mt, body, sink, True, t_arrival)
            for pi, ((ids, _), mt) in enumerate(zip(prompts, limits, strict=True))
            for c in range(body.n)
        ]
        prompt_lens = [len(ids) for ids, _ in prompts]
        echo = [None] * len(seqs)
        if body.echo:
            for s in seqs:
                ids, text = prompts[s.index // body.n]
                echo[s.index] = text if text is not None else tok.decode(ids)
        self.metrics.request_params_n.observe(body.n)
        for s in seqs:
            self.loop.add(s)
        include, continuous = self._include_usage(body)
        if body.stream:
            fmt = StreamFormat(
                False, http_id, self.model_name, tok.json_safe, prompt_lens, body.n,
                continuous_usage=continuous,
            )  # fmt: skip
            return await self._stream(request, seqs, fmt, include, prompt_lens, echo=echo)
        texts = await self._collect(seqs)
        u = self._usage(seqs, prompt_lens)
        choices = [(s, (echo[s.index] or "") + texts[s.index]) for s in seqs]
        lps = None
        if body.logprobs is not None:
            lps = {s.index: completion_logprobs(self._logprobs(s, body.logprobs)) for s in seqs}
        return web.json_response(completion_response(http_id, self.model_name, choices, u, lps))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        t_arrival = clock()
        body = self._parse(ChatCompletionRequest, await self._json(request))
        self._check_model(body.model)
        try:
            messages = [(m.role, m.text()) for m in body.messages]
            text = self.tokenizer.render_chat(
                messages, body.add_generation_prompt, body.continue_final_message
            )
        except FieldError as exc:
            raise APIError(str(exc), param=exc.param) from None
        except ChatTemplateError as exc:
            raise APIError(str(exc), param="messages") from None
        ids = self.tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
        max_tokens = self._max_tokens(len(ids), body.requested_max_tokens, body.min_tokens)
        self._maybe_fail(text)
        role = "assistant" if body.add_generation_prompt else messages[-1][0]
        first_space = not body.add_generation_prompt
        http_id = "chatcmpl-" + new_request_id(request.headers.get("X-Request-Id"))
        sink: asyncio.Queue[Seq] = asyncio.Queue()
        seqs = [
            self._new_seq(http_id, i, ids, max_tokens, body, sink, first_space, t_arrival)
            for i in range(body.n)
        ]
        echo_text = messages[-1][1] if body.echo and messages[-1][0] == role else None
        self.metrics.request_params_n.observe(body.n)
        for s in seqs:
            self.loop.add(s)
        include, continuous = self._include_usage(body)
        if body.stream:
            fmt = StreamFormat(
                True, http_id, self.model_name, self.tokenizer.json_safe, [len(ids)], body.n,
                role=role, continuous_usage=continuous,
            )  # fmt: skip
            echo = [echo_text] * len(seqs)
            return await self._stream(request, seqs, fmt, include, [len(ids)], echo=echo)
        texts = await self._collect(seqs)
        u = self._usage(seqs, [len(ids)])
        choices = [(s, (echo_text or "") + texts[s.index]) for s in seqs]
        lps = None
        if body.logprobs:
            n = body.top_logprobs or 0
            lps = {s.index: chat_logprobs(self._logprobs(s, n)) for s in seqs}
        return web.json_response(chat_response(http_id, self.model_name, role, choices, u, lps))

    def _logprobs(self, seq: Seq, n: int) -> list[LogprobEntry]:
        """Each delivered token's text and logprob, with the ``n`` most likely at its place
        (``textgen``: the same for the same request and ``--seed``)."""
        tok, gen = self.tokenizer, seq.gen
        out = []
        for k in range(seq.n_out):
            first = k == 0 and not gen.first_space
            top = [(tok.piece(i, first), lp) for i, lp in gen.top_logprobs(k, n)]
            out.append((top[0][0], top[0][1], top[:n]))
        return out

    def _usage(self, seqs: Sequence[Seq], prompt_lens: Sequence[int]) -> dict[str, Any]:
        return usage(
            sum(prompt_lens),
            sum(s.n_out for s in seqs),
            seqs[0].num_cached if seqs else None,
            self.args.enable_prompt_tokens_details,
        )

    async def _collect(self, seqs: list[Seq]) -> list[str]:
        """Wait until every sequence has finished; their texts by choice index."""
        sink = seqs[0].sink
        parts: list[list[str]] = [[] for _ in seqs]
        remaining = {id(s) for s in seqs}
        try:
            while remaining:
                seq = await sink.get()
                text = seq.take_text()
                if text:
                    parts[seq.index].append(text)
                seq.n_sent = seq.n_out
                if seq.done:
                    remaining.discard(id(seq))
        finally:
            for s in seqs:
                if not s.done:
                    self.loop.abort(s)
        if any(s.finish_reason == "abort" for s in seqs):
            raise APIError("The server is shutting down", 503, "ServiceUnavailableError")
        return ["".join(p) for p in parts]

    async def _stream(
        self,
        request: web.Request,
        seqs: list[Seq],
        fmt: StreamFormat,
        include_usage: bool,
        prompt_lens: Sequence[int],
        echo: Sequence[str | None],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        sink = seqs[0].sink
        remaining = {id(s) for s in seqs}
        started = False
        last_write = 0.0
        try:
            await resp.prepare(request)
            while remaining:
                seq = await sink.get()
                await self.loop.right_of_way(last_write)
                if sink.empty():
                    batch: Sequence[Seq] = (seq,)
                else:  # several tokens or sequences are waiting: one write for all
                    pending = {id(seq): seq}
                    while not sink.empty():
                        s = sink.get_nowait()
                        pending[id(s)] = s
                    batch = list(pending.values())
                exit_after = self.faults.exit_after_tokens
                parts = []
                if not started:
                    started = True
                    if fmt.chat:
                        for s in seqs:
                            parts.append(fmt.role_chunk(s.index, prompt_lens[0]))
                            if echo[s.index]:
                                parts.append(fmt.echo_chunk(s.index, echo[s.index]))
                for s in batch:
                    if id(s) not in remaining:
                        continue
                    if s.finish_reason == "abort":
                        raise ConnectionAbortedError("the server is shutting down")
                    if s.n_sent == s.n_out and not s.done:
                        continue
                    n_out = s.n_out
                    if exit_after is not None and n_out > exit_after:
                        n_out = max(s.n_sent, exit_after)  # exactly N tokens, then the exit
                    text = s.take_text(n_out - s.n_sent)
                    if not fmt.chat and echo[s.index] and s.n_sent == 0:
                        text = echo[s.index] + text
                    s.n_sent = n_out
                    finish = s.finish_reason if s.done and n_out == s.n_out else None
                    parts.append(fmt.chunk(s, text, finish, s.stop_reason if s.done else None))
                    if finish is not None:
                        remaining.discard(id(s))
                if parts:
                    await resp.write("".join(parts).encode())
                    last_write = clock()
                if exit_after is not None and any(s.n_sent >= exit_after for s in batch):
                    fault_exit(f"exit_after_tokens={exit_after} reached mid-stream")
            if include_usage:
                await resp.write(fmt.usage_chunk(self._usage(seqs, prompt_lens)).encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self._abort_all(seqs, "client_disconnected")
            raise
        finally:
            self._abort_all(seqs, "stream_ended")
        return resp

    def _abort_all(self, seqs: Sequence[Seq], why: str) -> None:
        for s in seqs:
            if not s.done:
                if self.args.log_requests:
                    log.info(
                        "request_aborted", extra={"fields": {"request_id": s.http_id, "why": why}}
                    )
                self.loop.abort(s)

    def _log_finish(self, seq: Seq) -> None:
        ttft = None if seq.t_first is None else round(seq.t_first - seq.t_arrival, 6)
        log.info(
            "request_finished",
            extra={
                "fields": {
                    "request_id": seq.http_id,
                    "choice": seq.index,
                    "prompt_tokens": seq.req.num_prompt_tokens,
                    "cached_tokens": seq.num_cached,
                    "completion_tokens": seq.n_out,
                    "max_tokens": seq.max_tokens,
                    "finish_reason": seq.finish_reason,
                    "preemptions": seq.req.num_preemptions,
                    "ttft_s": ttft,
                    "e2e_s": round(clock() - seq.t_arrival, 6),
                }
            },
        )

    # -- the other routes ------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[int], field: str) -> None:
        vocab = self.tokenizer.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise APIError(
                f"Token id {bad[0]} is out of vocabulary (the vocabulary has {vocab} ids)",
                param=field,
            )

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            model_list(self.served, self.args.model, self.max_model_len, self.created)
        )

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        body = self._parse(TokenizeRequest, await self._json(request))
        self._check_model(body.model)
        tok = self.tokenizer
        if body.messages is not None:
            try:
                msgs = [(m.role, m.text()) for m in body.messages]
                text = tok.render_chat(
                    msgs, body.add_generation_prompt, body.continue_final_message
                )
            except FieldError as exc:
                raise APIError(str(exc), param=exc.param) from None
            except ChatTemplateError as exc:
                raise APIError(str(exc), param="messages") from None
            special = False if body.add_special_tokens is None else body.add_special_tokens
        else:
            text = body.prompt or ""
            special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = tok.encode(text, add_special_tokens=special)
        strs = [tok.token_str(i) for i in ids] if body.return_token_strs else None
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        body = self._parse(DetokenizeRequest, await self._json(request))
        self._check_model(body.model)
        self._check_ids(body.tokens, "tokens")
        return web.json_response({"prompt": self.tokenizer.decode(body.tokens)})

    async def version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"version": VLLM_VERSION, "servefleet_sim": _package_version()})

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=503 if self.loading else 200)

    async def metrics_route(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def sim_stats(self, request: web.Request) -> web.StreamResponse:
        now = clock()
        return web.json_response(
            {
                **self.loop.stats(),
                "loading": self.loading,
                "faults": self.faults.describe(now),
                "server": self.describe(),
            }
        )

    def _check_admin(self, request: web.Request) -> None:
        token = self.args.admin_token
        if token is None:
            raise APIError(
                "admin endpoints are disabled: start the sim-server with --admin-token",
                HTTPStatus.NOT_FOUND,
                "NotFoundError",
            )
        if request.headers.get("Authorization") != f"Bearer {token}":
            raise APIError(
                "Unauthorized: give `Authorization: Bearer <admin token>`", 401, "Unauthorized"
            )

    async def get_faults(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        return web.json_response(self.faults.describe(clock()))

    async def set_faults(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        update = self._parse(FaultUpdate, await self._json(request))
        now = clock()
        self.faults.apply(update, now)
        state = self.faults.describe(now)
        log.warning("faults_set", extra={"fields": state})
        return web.json_response(state)

    async def reset_stats(self, request: web.Request) -> web.StreamResponse:
        self._check_admin(request)
        self.loop.reset_stats()
        return web.json_response({"reset": True})


def _package_version() -> str:
    try:
        return importlib.metadata.version("servefleet")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- running it ------------------------------------------------------------------------------
def ready_line(server: SimServer, host: str, port: int, scheme: str = "http") -> str:
    d = server.describe()
    return (
        f"servefleet sim-server ready: listening on {scheme}://{host}:{port} port={port} "
        f"model={server.model_name} gpu={d['gpu']} tp={d['tensor_parallel_size']} "
        f"time_scale={d['time_scale']} loading_seconds={server.startup_seconds:.3f}"
    )


def tls_context(args: SimServerArgs) -> ssl.SSLContext | None:
    """vLLM's ``--ssl-certfile``/``--ssl-keyfile``: serve HTTPS (None: plain HTTP)."""
    if not args.ssl_certfile:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    return ctx


def keep_alive_seconds() -> float:
    """How long an idle keep-alive connection stays open: vLLM's
    ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (its uvicorn's ``timeout_keep_alive``), default 5 s."""
    try:
        return float(os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5"))
    except ValueError:
        return 5.0


async def _serve(server: SimServer, host: str, port: int) -> None:
    runner = web.AppRunner(
        server.build_app(),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=keep_alive_seconds(),  # closes idle connections as vLLM's server does
    )
    tls = tls_context(server.args)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, backlog=1024, ssl_context=tls)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        print(ready_line(server, host, bound, "https" if tls else "http"), flush=True)
        log.info("listening", extra={"fields": {"host": host, "port": bound, **server.describe()}})
        if server.startup_seconds > 0:
            loop.call_later(
                server.startup_seconds,
                lambda: log.info(
                    "model_loaded", extra={"fields": {"after_s": server.startup_seconds}}
                ),
            )
        await stop.wait()
        log.info("shutting_down", extra={"fields": {}})
    finally:
        await runner.cleanup()


def serve(args: SimServerArgs) -> int:
    """Build the server and run it until SIGINT/SIGTERM; the process's exit status."""
    configure_logging(args.log_level)
    if args.ignored_flags:
        log.warning(
            "ignored_vllm_flags",
            extra={
                "fields": {"flags": args.ignored_flags, "why": "not modelled by the sim-server"}
            },
        )
    try:
        server = SimServer(args)
        tls_context(args)
    except (ValueError, ImportError, OSError, ssl.SSLError) as exc:
        print(f"servefleet sim-server: error: {exc}", file=sys.stderr)
        return 2
    gc.freeze()  # start-up objects never need collecting: shorter GC pauses while serving
    try:
        import uvloop

        runner: Callable[..., Any] = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_serve(server, args.host, args.port))
    except OSError as exc:  # e.g. the port is taken
        print(
            f"servefleet sim-server: error: cannot listen on {args.host}:{args.port}: {exc}",
            file=sys.stderr,
        )
        return 2
    return 0


__all__ = ["VLLM_VERSION", "SimServer", "js", "ready_line", "serve"]
