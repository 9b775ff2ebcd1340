#!/usr/bin/env python3
# ruff: noqa: SIM115  (short-lived device script)
"""Prefix-cache reuse of multi-turn chat on a real vLLM server, turn by turn (on the GPU machine).

Each session sends ``--turns`` chat requests; turn k+1 resends the history the way an OpenAI
client does: the earlier messages, the previous answer's *text* as an assistant message, and a new
user message, rendered by the server's chat template and tokenized again. Per turn it records the
prompt's token ids (``POST /tokenize`` with the messages), the generated token ids (logprobs with
``return_tokens_as_token_ids``) and vLLM's own count of prefix-cache hits for the request
(``usage.prompt_tokens_details.cached_tokens``; the server needs ``--enable-prompt-tokens-details``).

``--mode ids`` sends the same conversation as token ids on ``/v1/completions`` (the previous prompt,
the generated ids, then the template's tokens and the new message): the reuse a perfect client gets,
to check the block arithmetic. Writes one JSON file (``--out``) with every turn.
"""

import argparse
import asyncio
import json
import sys
import time

import aiohttp

from servefleet.bench.prompts import synthetic_text


async def post(s, url, body):
    async with s.post(url, json=body) as r:
        txt = await r.text()
        if r.status == 400 and "logprobs" in body:  # a server without logprobs: ids unknown
            body = {
                k: v for k, v in body.items() if k not in ("logprobs", "return_tokens_as_token_ids")
            }
            return await post(s, url, body)
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {txt[:300]}")
        return json.loads(txt)


def gen_ids(choice):
    out = []
    for e in (choice.get("logprobs") or {}).get("content") or []:
        tok = e.get("token", "")
        out.append(int(tok.split(":", 1)[1]) if tok.startswith("token_id:") else -1)
    return out


async def session(s, a, sid, turns):
    msgs, rows, ids_prompt = [], [], None
    for k in range(a.turns):
        user = synthetic_text(f"{a.salt}:s{sid}:u{k}", a.user_words)
        if a.mode == "chat":
            msgs.append({"role": "user", "content": user})
            tok = await post(
                s,
                a.base + "/tokenize",
                {"model": a.model, "messages": msgs, "add_generation_prompt": True},
            )
            prompt_ids = tok["tokens"]
            body = {
                "model": a.model,
                "messages": msgs,
                "max_tokens": a.max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "logprobs": True,
                "return_tokens_as_token_ids": True,
            }
            res = await post(s, a.base + "/v1/chat/completions", body)
            ch = res["choices"][0]
            text = ch["message"]["content"] or ""
            msgs.append({"role": "assistant", "content": text})
        else:
            head = "" if k == 0 else "<|im_end|>\n"
            suffix = f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            tok = await post(
                s,
                a.base + "/tokenize",
                {"model": a.model, "prompt": suffix, "add_special_tokens": False},
            )
            prompt_ids = (ids_prompt or []) + tok["tokens"]
            body = {
                "model": a.model,
                "prompt": prompt_ids,
                "max_tokens": a.max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
            res = await post(s, a.base + "/v1/completions", body)
            ch = res["choices"][0]
            text = ch.get("text") or ""
            lp = ch.get("logprobs") or {}
            ch = {"logprobs": {"content": [{"token": t} for t in lp.get("tokens") or []]}}
        g = gen_ids(ch)
        usage = res.get("usage") or {}
        det = usage.get("prompt_tokens_details") or {}
        rows.append(
            {
                "session": sid,
                "turn": k,
                "prompt_ids": prompt_ids,
                "gen_ids": g,
                "prompt_tokens": usage.get("prompt_tokens"),
                "cached_tokens": det.get("cached_tokens"),
                "answer_chars": len(text),
            }
        )
        if a.mode == "ids":
            ids_prompt = prompt_ids + g
        await asyncio.sleep(a.think)
    turns.extend(rows)


async def main_async(a):
    turns = []
    t0 = time.time()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=a.timeout)
    ) as s:
        sem = asyncio.Semaphore(a.concurrency)

        async def one(i):
            async with sem:
                await session(s, a, i, turns)

        await asyncio.gather(*(one(i) for i in range(a.sessions)), return_exceptions=False)
    return {"args": vars(a), "wall_s": time.time() - t0, "turns": turns}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=("chat", "ids"), default="chat")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user-words", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--think", type=float, default=0.2)
    ap.add_argument("--salt", default="probe")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = asyncio.run(main_async(a))
    json.dump(res, open(a.out, "w"))
    n = len(res["turns"])
    hit = sum(t["cached_tokens"] or 0 for t in res["turns"])
    q = sum(t["prompt_tokens"] or 0 for t in res["turns"])
    print(
        f"session_probe {a.mode}: {n} turns in {res['wall_s']:.1f}s, cached {hit}/{q} prompt tokens",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
