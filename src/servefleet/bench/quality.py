"""Asking two OpenAI-compatible deployments the same prompts, greedily and with logprobs, for
``servefleet quality`` (the comparison itself is ``servefleet.quality``, pure).

Each prompt goes to both sides (``temperature 0``, ``seed 0``, ``logprobs`` with the
``top_logprobs`` most likely tokens at each place; vLLM returns the sampled token's logprob and
the top ones of the distribution it sampled from), a few prompts at a time, one answer each.
An answer that fails (an HTTP error, no logprobs) is kept as that prompt's error.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from servefleet.quality import Answer, Prompt, compare, summarize


@dataclass(frozen=True, slots=True)
class Side:
    url: str
    """Base URL (the OpenAI API under /v1)."""
    model: str | None = None
    """Model to ask for (None: the first of /v1/models)."""
    api_key: str | None = None


@dataclass(frozen=True, slots=True)
class QualitySettings:
    endpoint: str = "chat"
    max_tokens: int = 64
    top_logprobs: int = 5
    concurrency: int = 8
    timeout: float = 300.0
    """Seconds the whole comparison may take (``TimeoutError`` past it)."""


class QualityError(RuntimeError):
    """A side cannot be asked at all (unreachable, no model)."""


def _headers(side: Side) -> dict[str, str]:
    return {"Authorization": f"Bearer {side.api_key}"} if side.api_key else {}


async def _model(session: aiohttp.ClientSession, side: Side) -> str:
    if side.model:
        return side.model
    url = side.url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, headers=_headers(side)) as r:
            data = await r.json(content_type=None) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise QualityError(f"{url}: {e or type(e).__name__}") from None
    models = (data or {}).get("data") or []
    if not models:
        raise QualityError(f"{url}: no model listed; give the model to ask for")
    return str(models[0]["id"])


def request_body(prompt: str, model: str, s: QualitySettings) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": s.max_tokens, "temperature": 0, "seed": 0}
    if s.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["logprobs"] = True
        body["top_logprobs"] = s.top_logprobs
    else:
        body["prompt"] = prompt
        body["logprobs"] = s.top_logprobs
    return body


def parse_answer(data: dict[str, Any], endpoint: str) -> Answer:
    """An OpenAI-shaped response (chat or completions) as an ``Answer``."""
    choice = (data.get("choices") or [{}])[0]
    lp = choice.get("logprobs")
    if endpoint == "chat":
        text = (choice.get("message") or {}).get("content") or ""
        content = (lp or {}).get("content")
        if content is None:
            return Answer(text, error="the server returned no logprobs")
        return Answer(
            text,
            [t["token"] for t in content],
            [float(t["logprob"]) for t in content],
            [
                {a["token"]: float(a["logprob"]) for a in t.get("top_logprobs") or []}
                for t in content
            ],
        )
    text = choice.get("text") or ""
    if not lp or lp.get("tokens") is None:
        return Answer(text, error="the server returned no logprobs")
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return Answer(
        text,
        list(lp["tokens"]),
        [float(x) for x in lp["token_logprobs"]],
        [{k: float(v) for k, v in (t or {}).items()} for t in tops],
    )


async def _ask(
    session: aiohttp.ClientSession, side: Side, model: str, prompt: str, s: QualitySettings
) -> Answer:
    path = "/v1/chat/completions" if s.endpoint == "chat" else "/v1/completions"
    url = side.url.rstrip("/") + path
    try:
        async with session.post(
            url, json=request_body(prompt, model, s), headers=_headers(side)
        ) as r:
            data = await r.json(content_type=None)
            if r.status != 200:
                msg = ((data or {}).get("error") or {}).get("message") or str(data)[:200]
                return Answer(error=f"HTTP {r.status}: {msg}")
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        return Answer(error=f"{type(e).__name__}: {e}")
    return parse_answer(data, s.endpoint)


async def ask_both(
    ref: Side, cand: Side, prompts: list[Prompt], s: QualitySettings
) -> tuple[list[tuple[Answer, Answer]], str, str]:
    """Every prompt's answers (reference, candidate), and the two models asked, within
    ``s.timeout`` s in all (and each request within it too)."""
    timeout = aiohttp.ClientTimeout(total=s.timeout)
    async with asyncio.timeout(s.timeout), aiohttp.ClientSession(timeout=timeout) as session:
        models = await _model(session, ref), await _model(session, cand)
        gate = asyncio.Semaphore(s.concurrency)

        async def one(p: Prompt) -> tuple[Answer, Answer]:
            async with gate:
                a, b = await asyncio.gather(
                    _ask(session, ref, models[0], p.text, s),
                    _ask(session, cand, models[1], p.text, s),
                )
                return a, b

        answers = await asyncio.gather(*(one(p) for p in prompts))
    return list(answers), models[0], models[1]


def run_quality(ref: Side, cand: Side, prompts: list[Prompt], s: QualitySettings) -> dict:
    """Ask both sides and compare: what ``servefleet quality`` writes to quality.json."""
    answers, ref_model, cand_model = asyncio.run(ask_both(ref, cand, prompts, s))
    rows = [
        compare(i, p.text, a, b, p.expected)
        for i, (p, (a, b)) in enumerate(zip(prompts, answers, strict=True))
    ]
    return {
        "kind": "quality",
        "reference": {"url": ref.url, "model": ref_model},
        "candidate": {"url": cand.url, "model": cand_model},
        "settings": asdict(s),
        "summary": summarize(rows).to_dict(),
        "prompts": [asdict(r) for r in rows],
    }
