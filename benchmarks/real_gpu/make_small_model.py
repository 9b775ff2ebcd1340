"""A small random-weight model (Qwen2.5-0.5B's shape) next to the shared tokenizer, for engine
baselines that must load in seconds: `python make_small_model.py TOK_DIR OUT_DIR [--cpu]`.

Writes OUT_DIR/config.json (the tokenizer's Qwen2 config with 0.5B dimensions), the tokenizer
files, and random bf16 weights (`save_pretrained`, seed 0), so that vLLM and `transformers serve`
load the very same model. With --config-only, only the config and tokenizer (no torch needed).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SHAPE = {  # Qwen2.5-0.5B
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_window_layers": 24,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


def main(argv: list[str]) -> int:
    tok, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((tok / "config.json").read_text())
    cfg.update(SHAPE)
    cfg["layer_types"] = ["full_attention"] * SHAPE["num_hidden_layers"]
    for f in tok.iterdir():
        if f.name != "config.json":
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if "--config-only" in argv:
        return 0
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device = "cpu" if "--cpu" in argv or not torch.cuda.is_available() else "cuda"
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(out)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {n / 1e6:.0f} M parameters (bf16, random, seed 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
