#!/usr/bin/env python3
# ruff: noqa: B023, F821, B905, RUF059  (closures are called inside the loop that binds them)
"""H200 micro-benchmarks for the servefleet cost model (runs on the GPU machine).

Sections (each writes into one JSON, saved after every section so a crash keeps what ran):
  env      torch/CUDA/GPU facts, nvidia-smi clocks, CUDA-context memory, copy bandwidth, big GEMM
  gemm     F.linear (x @ W.T) in bf16 and fp16 for the linear layers of four models (+ TP=2 shards)
  prefill  torch SDPA causal prefill (flash and cuDNN backends), chunked prefill over a cache
  decode   torch SDPA decode (q_len 1, enable_gqa=True so the KV is read once)
  layer    a pure-torch 28-layer Qwen2.5-7B-shaped stack: prefill and decode, eager and CUDA graph
  fa3      vLLM's own FlashAttention-3 kernel (paged KV, block 16), if the vLLM payload is unpacked
           at --site: prefill, chunked prefill and decode exactly as vLLM V1 calls it

Timing method (all sections): CUDA events around a CUDA-graph replay of R back-to-back calls of the
op, median over several replays, divided by R.  The graph removes CPU launch gaps (vLLM decode runs
under CUDA graphs too); the GPU-side gap between kernels stays in, as it does in a real step.
Cache residency: the H200 has 60 MB of L2.  Each op cycles through k copies of its weights (GEMM) or
of its K/V (attention), k chosen so that the copies together are >= 256 MB (>= 4x L2), so every call
reads its operand from HBM, as a real step does (the 27 other layers flush L2 between uses).
Inputs are random normal (never zeros).  Activations (GEMM x) are not rotated: in a real step they
were just written by the previous kernel and are partly L2-resident too.
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

T0 = time.time()
ROT_BYTES = 256 << 20  # rotation set size (>= 4x the 60 MB L2)
TARGET_REPLAY_S = 2.5e-3  # each timed graph replay runs about this long
N_REPLAYS = 5


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def elapsed():
    return time.time() - T0


# ----------------------------------------------------------------------------- timing core
def _events_time(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e-3


def bench(fns, use_graph=True, target_s=TARGET_REPLAY_S, n_replays=N_REPLAYS, max_r=256):
    """fns: list of zero-arg callables (one per rotation copy).  Returns dict with the median
    per-call time.  Warm-up: every fn once eagerly, then one eager timing pass to size R."""
    n = len(fns)
    for f in fns:
        f()
    torch.cuda.synchronize()
    est = _events_time(lambda: [f() for f in fns]) / n
    r = int(min(max_r, max(1, math.ceil(target_s / max(est, 1e-7)))))
    if r > n:
        r = int(math.ceil(r / n) * n)
    r = min(r, max(max_r, n))

    def body():
        for i in range(r):
            fns[i % n]()

    mode = "graph"
    g = None
    if use_graph:
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                body()  # warm on the side stream (cuBLAS workspace etc.)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                body()
            g.replay()
            torch.cuda.synchronize()
        except Exception as ex:  # capture unsupported: fall back to eager loop
            mode = f"eager (graph failed: {type(ex).__name__}: {str(ex)[:120]})"
            g = None
            torch.cuda.synchronize()
    else:
        mode = "eager"
    runner = g.replay if g is not None else body
    if g is None:
        runner()
    times = [_events_time(runner) / r for _ in range(n_replays)]
    del g
    med = statistics.median(times)
    return {
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "calls_per_replay": r,
        "replays": n_replays,
        "rotation_copies": n,
        "mode": mode,
        "spread": (max(times) - min(times)) / med if med > 0 else None,
    }


def n_copies(bytes_each, cap=64):
    return int(max(1, min(cap, math.ceil(ROT_BYTES / max(bytes_each, 1)))))


# ----------------------------------------------------------------------------- env
def sh(cmd):
    try:
        return subprocess.run(
            cmd, shell=True, capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except Exception as ex:
        return f"ERR {ex}"


def section_env(R):
    env = {}
    torch.cuda.init()
    free0, total0 = torch.cuda.mem_get_info()
    env["mem_after_init"] = {"free": free0, "total": total0, "context_used": total0 - free0}
    p = torch.cuda.get_device_properties(0)
    env.update(
        {
            "gpu_name": p.name,
            "sm_count": p.multi_processor_count,
            "total_memory": p.total_memory,
            "l2_cache_bytes": getattr(p, "L2_cache_size", None),
            "cc": f"{p.major}.{p.minor}",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "nvidia_smi_L": sh("nvidia-smi -L"),
            "nvidia_smi_query_idle": sh(
                "nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,"
                "clocks.mem,clocks.max.mem,power.limit,power.draw,memory.total,"
                "memory.used,temperature.gpu,pstate --format=csv"
            ),
            "rot_bytes": ROT_BYTES,
            "target_replay_s": TARGET_REPLAY_S,
            "n_replays": N_REPLAYS,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
    )
    # cuBLAS handle/workspace and first-kernel overheads
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    env["mem_after_first_matmul"] = {
        "free": free1,
        "torch_reserved": torch.cuda.memory_reserved(),
        "non_torch_used": total0 - free1 - torch.cuda.memory_reserved(),
    }
    del a
    # device-to-device copy bandwidth (read+write counted), 4 GiB
    x = torch.randn(1 << 30, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    r = bench([lambda: y.copy_(x)], use_graph=False, target_s=0.02)
    env["copy_4GiB"] = dict(
        r, bytes_rw=2 * x.numel() * 4, gbps=2 * x.numel() * 4 / r["median_s"] / 1e9
    )
    del x, y
    # read-only bandwidth: a sum over 4 GiB bf16
    x = torch.randn(1 << 31, device="cuda", dtype=torch.bfloat16)
    r = bench([lambda: x.sum()], use_graph=False, target_s=0.02)
    env["read_sum_4GiB"] = dict(r, bytes=x.numel() * 2, gbps=x.numel() * 2 / r["median_s"] / 1e9)
    del x
    # big square GEMM ceiling
    for dt in (torch.bfloat16, torch.float16):
        a = torch.randn(8192, 8192, device="cuda", dtype=dt)
        b = torch.randn(8192, 8192, device="cuda", dtype=dt)
        r = bench([lambda: a @ b], use_graph=False, target_s=0.02)
        env[f"gemm_8192cube_{str(dt)[6:]}"] = dict(r, tflops=2 * 8192**3 / r["median_s"] / 1e12)
        del a, b
    env["nvidia_smi_query_after_load"] = sh(
        "nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,pstate --format=csv"
    )
    torch.cuda.empty_cache()
    R["env"] = env
    log(
        "env:",
        env["gpu_name"],
        env["sm_count"],
        "SMs; context",
        env["mem_after_init"]["context_used"] >> 20,
        "MiB; copy",
        round(env["copy_4GiB"]["gbps"]),
        "GB/s; read",
        round(env["read_sum_4GiB"]["gbps"]),
        "GB/s; 8192^3 bf16",
        round(env["gemm_8192cube_bfloat16"]["tflops"]),
        "TF",
    )


# ----------------------------------------------------------------------------- GEMM
MODELS = {
    # name: hidden, heads, kv_heads, head_dim, intermediate, vocab
    "qwen2.5-7b": (3584, 28, 4, 128, 18944, 152064),
    "qwen1.5-14b": (5120, 40, 40, 128, 13696, 152064),
    "qwen2.5-32b": (5120, 40, 8, 128, 27648, 152064),
    "llama-3.1-8b": (4096, 32, 8, 128, 14336, 128256),
}
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def gemm_shapes():
    out = []  # (model, tp, proj, N, K)
    for m, (h, nh, nkv, d, inter, vocab) in MODELS.items():
        q = nh * d + 2 * nkv * d
        base = {
            "qkv_proj": (q, h),
            "o_proj": (h, nh * d),
            "gate_up_proj": (2 * inter, h),
            "down_proj": (h, inter),
            "lm_head": (vocab, h),
        }
        for p, (n, k) in base.items():
            out.append((m, 1, p, n, k))
        if m in ("qwen2.5-7b", "qwen2.5-32b"):  # TP=2 shards
            tp = {
                "qkv_proj": (q // 2, h),
                "o_proj": (h, nh * d // 2),
                "gate_up_proj": (inter, h),
                "down_proj": (h, inter // 2),
                "lm_head": (vocab // 2, h),
            }
            for p, (n, k) in tp.items():
                out.append((m, 2, p, n, k))
    return out


def section_gemm(R, deadline):
    rows = R.setdefault("gemm", [])
    shapes = gemm_shapes()
    done_dtypes = []
    for dt in (torch.bfloat16, torch.float16):
        dname = str(dt)[6:]
        for m, tp, p, n, k in shapes:
            if elapsed() > deadline:
                R.setdefault("skipped", []).append(
                    f"gemm {dname} {m} tp{tp} {p} and later: time budget"
                )
                log("GEMM: time budget reached, skipping rest")
                return
            wb = n * k * 2
            ws = [torch.randn(n, k, device="cuda", dtype=dt) for _ in range(n_copies(wb))]
            xmax = torch.randn(max(MS), k, device="cuda", dtype=dt)
            line = []
            for M in MS:
                x = xmax[:M]
                fns = [(lambda w=w: F.linear(x, w)) for w in ws]
                r = bench(fns)
                t = r["median_s"]
                flops = 2 * M * n * k
                byts = (n * k + M * k + M * n) * 2
                rows.append(
                    dict(
                        model=m,
                        tp=tp,
                        proj=p,
                        dtype=dname,
                        M=M,
                        N=n,
                        K=k,
                        flops=flops,
                        bytes=byts,
                        tflops=flops / t / 1e12,
                        gbps=byts / t / 1e9,
                        **r,
                    )
                )
                line.append(f"{M}:{t * 1e6:.0f}")
            del ws, xmax
            torch.cuda.empty_cache()
            log(f"gemm {dname} {m} tp{tp} {p:13s} N={n} K={k} us:", " ".join(line))
        done_dtypes.append(dname)


# ----------------------------------------------------------------------------- attention (torch SDPA)
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
HEADS = [(28, 4), (40, 40), (64, 8)]
D = 128


def prefill_flops(h, c, o):
    return 4 * h * D * (c * o + c * (c + 1) / 2)


def sdpa_call(backend, q, k, v, causal, gqa):
    with sdpa_kernel([BACKENDS[backend]]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def section_sdpa_survey(R):
    sv = R.setdefault("sdpa_backend_survey", [])
    for case in (
        "prefill_28_4_S2048_causal_gqa",
        "decode_28_4_B32_L4096_gqa",
        "prefill_40_40_S2048_causal",
    ):
        hq, hk = (40, 40) if "40_40" in case else (28, 4)
        if case.startswith("prefill"):
            S = 2048
            q = torch.randn(1, hq, S, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, hk, S, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            causal = True
        else:
            q = torch.randn(32, hq, 1, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(32, hk, 4096, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            causal = False
        gqa = hq != hk
        ref = None
        for b in BACKENDS:
            rec = {"case": case, "backend": b}
            try:
                out = sdpa_call(b, q, k, v, causal, gqa)
                torch.cuda.synchronize()
                if ref is None:
                    ref = out.float()
                rec["rel_err_vs_first"] = ((out.float() - ref).norm() / ref.norm()).item()
                r = bench([lambda: sdpa_call(b, q, k, v, causal, gqa)], n_replays=3)
                rec.update(ok=True, **r)
            except Exception as ex:
                rec.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:300]}")
            sv.append(rec)
            log(
                "sdpa survey",
                case,
                b,
                "ok" if rec.get("ok") else "FAIL",
                f"{rec.get('median_s', 0) * 1e6:.0f}us"
                if rec.get("ok")
                else rec.get("error", "")[:100],
            )
        del q, k, v, ref
    torch.cuda.empty_cache()


def section_prefill(R, deadline):
    rows = R.setdefault("prefill_sdpa", [])
    for backend in ("flash", "cudnn"):
        for hq, hk in HEADS:
            for S in (128, 256, 512, 1024, 2048, 4096, 8192):
                if elapsed() > deadline:
                    R.setdefault("skipped", []).append("prefill_sdpa rest: time budget")
                    return
                kvb = 2 * hk * S * D * 2 + 2 * hq * S * D * 2
                nc = n_copies(kvb, cap=16)
                sets = [
                    (
                        torch.randn(1, hq, S, D, device="cuda", dtype=torch.bfloat16),
                        torch.randn(1, hk, S, D, device="cuda", dtype=torch.bfloat16),
                        torch.randn(1, hk, S, D, device="cuda", dtype=torch.bfloat16),
                    )
                    for _ in range(nc)
                ]
                rec = dict(
                    kind="prefill", backend=backend, heads=hq, kv_heads=hk, c=S, o=0, mask="causal"
                )
                try:
                    r = bench(
                        [
                            (lambda s=s: sdpa_call(backend, s[0], s[1], s[2], True, hq != hk))
                            for s in sets
                        ]
                    )
                    fl = prefill_flops(hq, S, 0)
                    rec.update(ok=True, flops=fl, tflops=fl / r["median_s"] / 1e12, **r)
                except Exception as ex:
                    rec.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
                rows.append(rec)
                del sets
            log(
                f"prefill sdpa {backend} {hq}/{hk}:",
                " ".join(
                    f"{x['c']}:{x['tflops']:.0f}TF" if x.get("ok") else f"{x['c']}:FAIL"
                    for x in rows
                    if x["backend"] == backend
                    and x["heads"] == hq
                    and x["kv_heads"] == hk
                    and x["kind"] == "prefill"
                ),
            )
    # chunked prefill: c new query tokens over o cached + c new keys.  Mask: NONE (non-causal over all
    # o+c keys) -- torch's is_causal aligns top-left, which is wrong here, and a lower-right bias
    # forces other backends.  Executed FLOPs = 4 h D c (o+c); 'useful' FLOPs use the cost-model
    # formula 4 h D (c o + c(c+1)/2).  The exact (bottom-right causal) kernel is in the fa3 section.
    for hq, hk in HEADS:
        for c in (256, 512, 2048):
            for o in (1024, 4096, 8192):
                if elapsed() > deadline:
                    R.setdefault("skipped", []).append("chunked sdpa rest: time budget")
                    return
                L = o + c
                kvb = 2 * hk * L * D * 2
                nc = n_copies(kvb, cap=16)
                q = torch.randn(1, hq, c, D, device="cuda", dtype=torch.bfloat16)
                sets = [
                    (
                        torch.randn(1, hk, L, D, device="cuda", dtype=torch.bfloat16),
                        torch.randn(1, hk, L, D, device="cuda", dtype=torch.bfloat16),
                    )
                    for _ in range(nc)
                ]
                rec = dict(
                    kind="chunked",
                    backend="flash",
                    heads=hq,
                    kv_heads=hk,
                    c=c,
                    o=o,
                    mask="none (full)",
                )
                try:
                    r = bench(
                        [
                            (lambda s=s: sdpa_call("flash", q, s[0], s[1], False, hq != hk))
                            for s in sets
                        ]
                    )
                    fl = prefill_flops(hq, c, o)
                    fe = 4 * hq * D * c * L
                    rec.update(
                        ok=True,
                        flops=fl,
                        flops_executed=fe,
                        tflops=fl / r["median_s"] / 1e12,
                        tflops_executed=fe / r["median_s"] / 1e12,
                        **r,
                    )
                except Exception as ex:
                    rec.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
                rows.append(rec)
                del sets, q
        log(
            f"chunked sdpa {hq}/{hk}:",
            " ".join(
                f"{x['c']}/{x['o']}:{x['tflops']:.0f}TF"
                for x in rows
                if x["kind"] == "chunked"
                and x["heads"] == hq
                and x["kv_heads"] == hk
                and x.get("ok")
            ),
        )
    torch.cuda.empty_cache()


DEC_B = [1, 8, 32, 128, 256]
DEC_L = [256, 1024, 4096, 16384]
KV_LIMIT = 24 << 30


def section_decode(R, deadline):
    rows = R.setdefault("decode_sdpa", [])
    for hq, hk in ((28, 4), (40, 40)):
        for B in DEC_B:
            for L in DEC_L:
                kvb = 2 * B * hk * L * D * 2
                if kvb > KV_LIMIT:
                    continue
                if elapsed() > deadline:
                    R.setdefault("skipped", []).append("decode_sdpa rest: time budget")
                    return
                nc = n_copies(kvb, cap=32)
                q = torch.randn(B, hq, 1, D, device="cuda", dtype=torch.bfloat16)
                sets = [
                    (
                        torch.randn(B, hk, L, D, device="cuda", dtype=torch.bfloat16),
                        torch.randn(B, hk, L, D, device="cuda", dtype=torch.bfloat16),
                    )
                    for _ in range(nc)
                ]
                rec = dict(backend="flash", heads=hq, kv_heads=hk, B=B, L=L, kv_bytes=kvb)
                try:
                    r = bench(
                        [
                            (lambda s=s: sdpa_call("flash", q, s[0], s[1], False, hq != hk))
                            for s in sets
                        ]
                    )
                    rec.update(ok=True, gbps=kvb / r["median_s"] / 1e9, **r)
                except Exception as ex:
                    rec.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
                rows.append(rec)
                del sets, q
            torch.cuda.empty_cache()
        log(
            f"decode sdpa {hq}/{hk} GB/s:",
            " ".join(
                f"B{x['B']}L{x['L']}:{x['gbps']:.0f}"
                for x in rows
                if x["heads"] == hq and x.get("ok")
            ),
        )


# ----------------------------------------------------------------------------- whole stack
class Stack:
    """Qwen2.5-7B-shaped decoder stack: RMSNorm, QKV (with bias), SDPA, O, RMSNorm, SiLU MLP, residuals.
    No RoPE, no embedding, no KV write; final norm + lm_head on the last token of each sequence."""

    def __init__(
        self, layers=28, h=3584, nh=28, nkv=4, inter=18944, vocab=152064, dt=torch.bfloat16
    ):
        self.h, self.nh, self.nkv, self.inter = h, nh, nkv, inter
        self.q, self.kv = nh * D, nkv * D
        mk = lambda *s: torch.randn(*s, device="cuda", dtype=dt) * 0.02  # noqa: E731
        self.L = [
            dict(
                ln1=torch.ones(h, device="cuda", dtype=dt),
                wqkv=mk(self.q + 2 * self.kv, h),
                bqkv=mk(self.q + 2 * self.kv),
                wo=mk(h, self.q),
                ln2=torch.ones(h, device="cuda", dtype=dt),
                wgu=mk(2 * inter, h),
                wd=mk(h, inter),
            )
            for _ in range(layers)
        ]
        self.lnf = torch.ones(h, device="cuda", dtype=dt)
        self.lm = mk(vocab, h)

    def _mlp(self, x, p):
        hdn = F.rms_norm(x, (self.h,), p["ln2"], 1e-6)
        g, u = F.linear(hdn, p["wgu"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(g) * u, p["wd"])

    def prefill(self, x):  # x [S, h]
        S = x.shape[0]
        for p in self.L:
            hdn = F.rms_norm(x, (self.h,), p["ln1"], 1e-6)
            qkv = F.linear(hdn, p["wqkv"], p["bqkv"])
            q, k, v = qkv.split([self.q, self.kv, self.kv], dim=-1)
            q = q.view(S, self.nh, D).transpose(0, 1).unsqueeze(0)
            k = k.view(S, self.nkv, D).transpose(0, 1).unsqueeze(0)
            v = v.view(S, self.nkv, D).transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + F.linear(o[0].transpose(0, 1).reshape(S, self.q), p["wo"])
            x = self._mlp(x, p)
        return F.linear(F.rms_norm(x[-1:], (self.h,), self.lnf, 1e-6), self.lm)

    def decode(self, x, kvs):  # x [B, h]; kvs[i] = (k, v) each [B, nkv, L, D]
        B = x.shape[0]
        for p, (kc, vc) in zip(self.L, kvs):
            hdn = F.rms_norm(x, (self.h,), p["ln1"], 1e-6)
            qkv = F.linear(hdn, p["wqkv"], p["bqkv"])
            q = qkv[:, : self.q].reshape(B, self.nh, 1, D)
            o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            x = x + F.linear(o.reshape(B, self.q), p["wo"])
            x = self._mlp(x, p)
        return F.linear(F.rms_norm(x, (self.h,), self.lnf, 1e-6), self.lm)


def section_layer(R, deadline):
    rows = R.setdefault("stack", [])
    m = Stack()
    R["stack_info"] = {
        "model": "qwen2.5-7b dims",
        "layers": 28,
        "dtype": "bfloat16",
        "parts": "rmsnorm, qkv(+bias), sdpa(default dispatch, enable_gqa), o, rmsnorm, gate_up, "
        "silu*mul, down, residuals; final norm + lm_head on last token/sequence; "
        "no rope, no embedding, no kv write",
    }
    with torch.inference_mode():
        for S in (512, 2048, 8192):
            x = torch.randn(S, m.h, device="cuda", dtype=torch.bfloat16)
            r = bench([lambda: m.prefill(x)], use_graph=False, target_s=0.0, n_replays=5)
            rows.append(dict(kind="prefill", S=S, mode_req="eager", **r))
            log(f"stack prefill S={S}: {r['median_s'] * 1e3:.2f} ms")
        Bmax, Lmax = 128, 4096
        per = Bmax * m.nkv * Lmax * D
        pool = [
            (
                torch.randn(per, device="cuda", dtype=torch.bfloat16),
                torch.randn(per, device="cuda", dtype=torch.bfloat16),
            )
            for _ in range(28)
        ]
        for B in (1, 32, 128):
            for L in (1024, 4096):
                if elapsed() > deadline:
                    R.setdefault("skipped", []).append("stack decode rest: time budget")
                    return
                n = B * m.nkv * L * D
                kvs = [(a[:n].view(B, m.nkv, L, D), b[:n].view(B, m.nkv, L, D)) for a, b in pool]
                x = torch.randn(B, m.h, device="cuda", dtype=torch.bfloat16)
                for mode in ("eager", "graph"):
                    try:
                        r = bench(
                            [lambda: m.decode(x, kvs)],
                            use_graph=(mode == "graph"),
                            target_s=0.0,
                            n_replays=7,
                        )
                        rows.append(dict(kind="decode", B=B, L=L, mode_req=mode, **r))
                        log(
                            f"stack decode B={B} L={L} {mode}: {r['median_s'] * 1e3:.3f} ms ({r['mode'][:30]})"
                        )
                    except Exception as ex:
                        rows.append(
                            dict(
                                kind="decode",
                                B=B,
                                L=L,
                                mode_req=mode,
                                ok=False,
                                error=f"{type(ex).__name__}: {str(ex)[:200]}",
                            )
                        )
                        log("stack decode fail", B, L, mode, ex)
        del pool
    del m
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- vLLM FA3
def section_fa3(R, deadline, site):
    info = R.setdefault("fa3_info", {})
    ok = os.path.join(site, ".ok")
    for _ in range(120):
        if os.path.exists(ok):
            break
        time.sleep(1)
    if not os.path.exists(ok):
        info["error"] = f"payload not unpacked at {site}"
        log("fa3: payload not ready, skipped")
        return
    sys.path.insert(0, site)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    try:
        import vllm
        from vllm.vllm_flash_attn import flash_attn_interface as fi
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        info.update(
            vllm=vllm.__version__, FA3_AVAILABLE=fi.FA3_AVAILABLE, reason=fi.FA3_UNAVAILABLE_REASON
        )
    except Exception as ex:
        info["error"] = f"import: {type(ex).__name__}: {str(ex)[:300]}"
        log("fa3 import failed", info["error"])
        return
    log("fa3:", info)
    BS = 16
    info["block_size"] = BS
    info["layout"] = (
        "kv_cache physical (num_blocks, block, kv_heads, 2*D); K=[..., :D], V=[..., D:] as vLLM 0.26"
    )
    rows = R.setdefault("fa3", [])

    def make_cache(nblocks, hk):
        kvc = torch.randn(nblocks, BS, hk, 2 * D, device="cuda", dtype=torch.bfloat16)
        return kvc, kvc[..., :D], kvc[..., D:]

    def call(q, kc, vc, cu_q, max_q, seqused, max_k, bt):
        return flash_attn_varlen_func(
            q=q,
            k=kc,
            v=vc,
            cu_seqlens_q=cu_q,
            max_seqlen_q=max_q,
            seqused_k=seqused,
            max_seqlen_k=max_k,
            causal=True,
            block_table=bt,
            fa_version=3,
        )

    # correctness spot check vs SDPA (prefill 28/4, S=512)
    try:
        S, hq, hk = 512, 28, 4
        nb = S // BS
        kvc, kc, vc = make_cache(nb, hk)
        q = torch.randn(S, hq, D, device="cuda", dtype=torch.bfloat16)
        cu = torch.tensor([0, S], device="cuda", dtype=torch.int32)
        su = torch.tensor([S], device="cuda", dtype=torch.int32)
        bt = torch.arange(nb, device="cuda", dtype=torch.int32).view(1, nb)
        out = call(q, kc, vc, cu, S, su, S, bt)
        kk = kc.reshape(S, hk, D).transpose(0, 1)[None]
        vv = vc.reshape(S, hk, D).transpose(0, 1)[None]
        ref = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None].float(), kk.float(), vv.float(), is_causal=True, enable_gqa=True
        )[0].transpose(0, 1)
        info["prefill_rel_err_vs_sdpa_fp32"] = ((out.float() - ref).norm() / ref.norm()).item()
        log("fa3 rel err vs fp32 sdpa:", info["prefill_rel_err_vs_sdpa_fp32"])
    except Exception as ex:
        info["check_error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        log("fa3 check failed:", info["check_error"])
        traceback.print_exc()
        return

    # prefill (o=0) and chunked prefill (c over o cached), batch 1, exact bottom-right causal
    cases = [(c, 0) for c in (128, 256, 512, 1024, 2048, 4096, 8192)] + [
        (c, o) for c in (256, 512, 2048) for o in (1024, 4096, 8192)
    ]
    for hq, hk in HEADS:
        for c, o in cases:
            if elapsed() > deadline:
                R.setdefault("skipped", []).append("fa3 prefill rest: time budget")
                return
            L = o + c
            nb = math.ceil(L / BS)
            kvb = nb * BS * hk * 2 * D * 2
            nc = n_copies(kvb + c * hq * D * 2, cap=16)
            caches = [make_cache(nb, hk) for _ in range(nc)]
            q = torch.randn(c, hq, D, device="cuda", dtype=torch.bfloat16)
            cu = torch.tensor([0, c], device="cuda", dtype=torch.int32)
            su = torch.tensor([L], device="cuda", dtype=torch.int32)
            bt = torch.arange(nb, device="cuda", dtype=torch.int32).view(1, nb)
            rec = dict(
                kind="prefill" if o == 0 else "chunked",
                heads=hq,
                kv_heads=hk,
                c=c,
                o=o,
                mask="bottom-right causal (exact)",
            )
            try:
                r = bench(
                    [(lambda cc=cc: call(q, cc[1], cc[2], cu, c, su, L, bt)) for cc in caches]
                )
                fl = prefill_flops(hq, c, o)
                rec.update(ok=True, flops=fl, tflops=fl / r["median_s"] / 1e12, **r)
            except Exception as ex:
                rec.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
            rows.append(rec)
            del caches
        log(
            f"fa3 prefill {hq}/{hk}:",
            " ".join(
                f"{x['c']}/{x['o']}:{x['tflops']:.0f}TF"
                for x in rows
                if x.get("heads") == hq
                and x.get("kv_heads") == hk
                and x["kind"] != "decode"
                and x.get("ok")
            ),
        )
        torch.cuda.empty_cache()
    # decode: q_len 1 per sequence, paged KV
    for hq, hk in ((28, 4), (40, 40)):
        for B in DEC_B:
            for L in DEC_L:
                kvb = 2 * B * hk * L * D * 2
                if kvb > KV_LIMIT:
                    continue
                if elapsed() > deadline:
                    R.setdefault("skipped", []).append("fa3 decode rest: time budget")
                    return
                nbs = L // BS
                nb = B * nbs
                nc = n_copies(kvb, cap=32)
                caches = [make_cache(nb, hk) for _ in range(nc)]
                q = torch.randn(B, hq, D, device="cuda", dtype=torch.bfloat16)
                cu = torch.arange(B + 1, device="cuda", dtype=torch.int32)
                su = torch.full((B,), L, device="cuda", dtype=torch.int32)
                bt = torch.arange(nb, device="cuda", dtype=torch.int32).view(B, nbs)
                rec = dict(kind="decode", heads=hq, kv_heads=hk, B=B, L=L, kv_bytes=kvb)
                try:
                    r = bench(
                        [(lambda cc=cc: call(q, cc[1], cc[2], cu, 1, su, L, bt)) for cc in caches]
                    )
                    rec.update(ok=True, gbps=kvb / r["median_s"] / 1e9, **r)
                except Exception as ex:
                    rec.update(ok=False, error=f"{type(ex).__name__}: {str(ex)[:200]}")
                rows.append(rec)
                del caches
            torch.cuda.empty_cache()
        log(
            f"fa3 decode {hq}/{hk} GB/s:",
            " ".join(
                f"B{x['B']}L{x['L']}:{x['gbps']:.0f}"
                for x in rows
                if x["kind"] == "decode" and x["heads"] == hq and x.get("ok")
            ),
        )


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--budget", type=float, default=330.0, help="seconds; sections stop starting work after"
    )
    ap.add_argument(
        "--site", default="/tmp/site", help="unpacked vLLM payload (fa3 section); .ok marks done"
    )
    ap.add_argument("--sections", default="env,gemm,survey,prefill,decode,layer,fa3")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "h200_microbench.json")
    R = {
        "script": "benchmarks/calibration/h200_microbench.py",
        "started_unix": T0,
        "args": vars(a),
        "method": __doc__,
    }
    B = a.budget
    # soft deadlines per section (cumulative, seconds since start)
    plan = {
        "env": B,
        "gemm": 0.45 * B,
        "survey": B,
        "prefill": 0.60 * B,
        "decode": 0.68 * B,
        "layer": 0.80 * B,
        "fa3": B,
    }
    fns = {
        "env": lambda d: section_env(R),
        "gemm": lambda d: section_gemm(R, d),
        "survey": lambda d: section_sdpa_survey(R),
        "prefill": lambda d: section_prefill(R, d),
        "decode": lambda d: section_decode(R, d),
        "layer": lambda d: section_layer(R, d),
        "fa3": lambda d: section_fa3(R, d, a.site),
    }
    R["section_times"] = {}
    for s in a.sections.split(","):
        t = time.time()
        try:
            fns[s](plan[s])
        except Exception as ex:
            R.setdefault("errors", {})[s] = (
                f"{type(ex).__name__}: {ex}\n{traceback.format_exc()[-1500:]}"
            )
            log(f"SECTION {s} FAILED:", ex)
            traceback.print_exc()
        R["section_times"][s] = time.time() - t
        R["elapsed_s"] = elapsed()
        with open(path, "w") as f:
            json.dump(R, f)
        log(f"section {s} done in {R['section_times'][s]:.1f}s; saved")
    log("ALL DONE")


if __name__ == "__main__":
    main()
