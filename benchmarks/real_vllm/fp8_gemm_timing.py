#!/usr/bin/env python3
"""fp8 GEMM and dynamic-quantization timings on the GPU (device side, no server running), for the
linear layers of a Llama-3.1-8B-shaped model: bf16 ``torch.mm`` against fp8 with per-tensor
scales (``torch._scaled_mm`` and, when vLLM is importable, its CUTLASS ``cutlass_scaled_mm``),
and the dynamic per-tensor activation quantization (``scaled_fp8_quant``: an abs-max reduction
then the cast) that vLLM's ``--quantization fp8`` runs before each linear layer.

    python3 fp8_gemm_timing.py --out F.json

Medians of CUDA-event timings over rotating input sets (more bytes than the L2 holds); a bf16
reference checks each fp8 product (relative error printed).
"""

# ruff: noqa: B023  (each closure is timed inside the iteration that made it)
import argparse
import json
from pathlib import Path

import torch

LAYERS = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
MS = (1000, 1024, 256, 64, 16)


def timed(fn, reps=30):
    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    ev = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(i)
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in ev)
    return ts[len(ts) // 2] * 1000.0  # us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    try:
        from vllm import _custom_ops as ops
    except Exception as e:
        ops = None
        print("vllm ops not importable:", e)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    f8 = torch.float8_e4m3fn
    for name, (k, n) in LAYERS.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        ws = (w.abs().max() / 448.0).float()
        wq = (w / ws).to(f8)
        for m in MS:
            sets = max(2, int(2 * 60e6 // (m * k * 2 + 1)))
            sets = min(sets, 8)
            xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            row = {"layer": name, "M": m, "K": k, "N": n}
            row["bf16_mm_us"] = timed(lambda i: torch.mm(xs[i % sets], w.t()))
            xscale = [(x.abs().max() / 448.0).float() for x in xs]
            xq = [(x / s).to(f8) for x, s in zip(xs, xscale, strict=True)]
            ref = torch.mm(xs[0].float(), w.t().float())
            try:
                row["fp8_scaled_mm_us"] = timed(
                    lambda i: torch._scaled_mm(
                        xq[i % sets],
                        wq.t(),
                        scale_a=xscale[i % sets],
                        scale_b=ws,
                        out_dtype=torch.bfloat16,
                    )
                )
                o = torch._scaled_mm(
                    xq[0], wq.t(), scale_a=xscale[0], scale_b=ws, out_dtype=torch.bfloat16
                )
                row["fp8_scaled_mm_relerr"] = float((o.float() - ref).norm() / ref.norm())
            except Exception as e:
                row["fp8_scaled_mm_error"] = str(e)[:200]
            if ops is not None:
                try:
                    row["cutlass_scaled_mm_us"] = timed(
                        lambda i: ops.cutlass_scaled_mm(
                            xq[i % sets], wq.t(), xscale[i % sets], ws, torch.bfloat16
                        )
                    )
                    row["dyn_quant_per_tensor_us"] = timed(
                        lambda i: ops.scaled_fp8_quant(xs[i % sets])
                    )
                    row["dyn_quant_per_token_us"] = timed(
                        lambda i: ops.scaled_fp8_quant(xs[i % sets], use_per_token_if_dynamic=True)
                    )

                    def fused(i):
                        q, s = ops.scaled_fp8_quant(xs[i % sets])
                        return ops.cutlass_scaled_mm(q, wq.t(), s, ws, torch.bfloat16)

                    row["quant_plus_cutlass_us"] = timed(fused)
                    o = fused(0)
                    row["quant_plus_cutlass_relerr"] = float((o.float() - ref).norm() / ref.norm())
                except Exception as e:
                    row["vllm_ops_error"] = str(e)[:200]
            res["rows"].append(row)
            Path(a.out).write_text(json.dumps(res, indent=1))  # kept if a later row is cut off
            print(
                json.dumps(
                    {k2: (round(v, 2) if isinstance(v, float) else v) for k2, v in row.items()}
                )
            )
    # the two ceilings: a large device copy and a large bf16 product
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(big)
    us = timed(lambda i: dst.copy_(big), reps=10)
    res["copy_GBps"] = 2 * (1 << 30) / us / 1e3
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    us = timed(lambda i: torch.mm(x, y), reps=10)
    res["bf16_TFLOPs"] = 2 * 8192**3 / us / 1e6
    print("copy GB/s", round(res["copy_GBps"]), "bf16 TFLOP/s", round(res["bf16_TFLOPs"]))
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
