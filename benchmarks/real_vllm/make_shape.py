#!/usr/bin/env python3
"""A model directory vLLM can serve with ``--load-format dummy``: the shared tokenizer and chat
template, and a Qwen2 ``config.json`` with the dimensions of a servefleet preset.

    python3 make_shape.py PRESET.json TOKDIR DEST

The vocabulary is padded up to the tokenizer's 152,064 ids (vLLM must be able to embed every id
the tokenizer can produce); everything else is the preset's. DEST/config.json is what the
simulator replays (``servefleet simulate --model DEST/config.json``).
"""

import json
import shutil
import sys
from pathlib import Path

KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
    "max_position_embeddings",
)


def main(preset: str, tokdir: str, dest: str) -> None:
    src, out = json.loads(Path(preset).read_text()), Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(tokdir).iterdir():
        if f.name != "config.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((Path(tokdir) / "config.json").read_text())
    cfg.pop("layer_types", None)
    for k in KEYS:
        cfg[k] = src[k]
    cfg["num_key_value_heads"] = src.get("num_key_value_heads", src["num_attention_heads"])
    cfg["vocab_size"] = max(int(src["vocab_size"]), int(cfg["vocab_size"]))
    cfg["max_window_layers"] = cfg["num_hidden_layers"]
    cfg["servefleet_preset"] = Path(preset).stem
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    print("shape", Path(preset).stem, {k: cfg[k] for k in (*KEYS, "vocab_size")})


if __name__ == "__main__":
    main(*sys.argv[1:4])
