"""Before a run: is the server there, which model does it serve, how many tokens is a word.

Tokens per word, in order of preference: the server's ``POST /tokenize`` (vLLM has it); a local
tokenizer (``tokenizer.json`` for the ``tokenizers`` package); else two probe requests of 64 and
512 words with ``max_tokens=1``, whose ``usage.prompt_tokens`` give the slope (the chat
template's fixed overhead cancels out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from servefleet.bench.prompts import synthetic_text

SAMPLE_WORDS = 1000


class TargetError(Exception):
    """The server cannot be benchmarked (unreachable, no model, ...): a message for the user."""


@dataclass(slots=True)
class Calibration:
    tokens_per_word: float
    method: str


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                raise TargetError(
                    f"GET {url} answered HTTP {r.status}; pass --model NAME to say which model "
                    "to ask for"
                )
            data = await r.json(content_type=None)
    except aiohttp.ClientConnectorError as e:
        raise TargetError(
            f"cannot reach {base_url}: {e.os_error or e}. Is the server running and is the "
            "URL right? (a local stand-in: python -m servefleet.sim.server --port 8000)"
        ) from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise TargetError(f"GET {url} failed: {type(e).__name__}: {e}") from None
    models = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict)]
    if not models or not models[0]:
        raise TargetError(f"{url} lists no model; pass --model NAME")
    return str(models[0])


async def check_reachable(session: aiohttp.ClientSession, base_url: str) -> None:
    """Raise ``TargetError`` when nothing listens at ``base_url``."""
    try:
        async with session.get(
            base_url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)
        ):
            pass
    except aiohttp.ClientConnectorError as e:
        raise TargetError(
            f"cannot reach {base_url}: {e.os_error or e}. Is the server running and is the "
            "URL right?"
        ) from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise TargetError(f"cannot reach {base_url}: {type(e).__name__}: {e}") from None


async def calibrate(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    *,
    endpoint: str = "chat",
    tokenizer: Path | None = None,
    headers: dict[str, str] | None = None,
) -> Calibration:
    sample = synthetic_text("calibration", SAMPLE_WORDS)
    if tokenizer is not None:
        return Calibration(_local_count(tokenizer, sample) / SAMPLE_WORDS, f"tokenizer {tokenizer}")
    n = await _tokenize(session, base_url, model, sample, headers)
    if n:
        return Calibration(n / SAMPLE_WORDS, "server /tokenize")
    a = await _probe(session, base_url, model, endpoint, 64, headers)
    b = await _probe(session, base_url, model, endpoint, 512, headers)
    if a is not None and b is not None and b > a:
        return Calibration((b - a) / (512 - 64), "usage.prompt_tokens of two probes")
    return Calibration(1.0, "assumed 1 token per word (no /tokenize, no usage)")


def _local_count(path: Path, text: str) -> int:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TargetError(
            "--tokenizer needs the `tokenizers` package (pip install tokenizers)"
        ) from None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TargetError(f"--tokenizer {path}: no tokenizer.json there")
    return len(Tokenizer.from_file(str(file)).encode(text, add_special_tokens=False).ids)


async def _tokenize(session, base_url, model, text, headers) -> int | None:
    url = base_url.rstrip("/") + "/tokenize"
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    try:
        async with session.post(
            url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=30)
        ) as r:
            if r.status != 200:
                return None
            data = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    n = data.get("count") if isinstance(data, dict) else None
    if n is None and isinstance(data, dict) and isinstance(data.get("tokens"), list):
        n = len(data["tokens"])
    return int(n) if n else None


async def _probe(session, base_url, model, endpoint, words, headers) -> int | None:
    text = synthetic_text(f"probe-{words}", words)
    if endpoint == "chat":
        url = base_url.rstrip("/") + "/v1/chat/completions"
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    else:
        url = base_url.rstrip("/") + "/v1/completions"
        body = {"model": model, "prompt": text, "max_tokens": 1}
    try:
        async with session.post(
            url, data=json.dumps(body), headers=headers, timeout=aiohttp.ClientTimeout(total=60)
        ) as r:
            if r.status != 200:
                return None
            data = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    u = (data or {}).get("usage") or {}
    return int(u["prompt_tokens"]) if u.get("prompt_tokens") else None
