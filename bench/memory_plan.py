"""The memory plan (critic_pretrain/plan.py) for the model sizes RL teams train critics for, on
8 x 80 GB and 8 x 141 GB GPUs: the table in docs/training.md comes from this script.

    .venv/bin/python bench/memory_plan.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from critic_pretrain.config_io import load_config  # noqa: E402
from critic_pretrain.plan import GIB, make_plan  # noqa: E402

SHAPES = {  # the Qwen2.5 configs' architecture fields
    "Qwen2.5-1.5B": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "Qwen2.5-14B": dict(model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
}


def main() -> int:
    print("| model | params | GPUs | layout | static per GPU | act/token (ckpt) | max_tokens | max_tokens with ckpt |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for name, shape in SHAPES.items():
        cfg = load_config(None, ["data.train=[x]", f"model.config={json.dumps(shape)}", "train.mixed_precision=bf16"])
        plan = make_plan(cfg, name)
        for gpu in (80, 141):
            for kind in ("ddp", "fsdp2"):
                static = sum(plan.static(kind, 8).values()) / GIB
                fits = [plan.max_tokens(kind, 8, gpu, c) for c in (False, True)]
                print(f"| {name} | {plan.parameters / 1e9:.2f}B | 8 x {gpu} GB | {kind.upper()} | {static:.1f} GiB | "
                      f"{plan.act_per_token / 2**20:.2f} MiB ({plan.act_per_token_ckpt / 2**20:.2f}) | "
                      + " | ".join(f"{n:,}" if n else "does not fit" for n in fits) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
