"""What the advantage-quality metrics add to an evaluation (issue 14: at most 20%).

Times ``evaluate_detailed`` on the bundled sample's rollouts (they carry oracle values) with
the demo model shape, three ways in one process: the value metrics alone (advantage sums
switched off), with the advantage metrics, and with the cold critic on every
``COLD_EVERY``-th micro-batch as ``critic-pretrain eval`` runs it. Best of ``--repeats``.

    python bench/eval_cost.py            # prints a markdown table (bench/RESULTS.md)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from unittest import mock

import numpy as np
import torch
import yaml

from critic_pretrain.config import DataConfig, ModelConfig, TargetsConfig
from critic_pretrain.data import Layout, prepare_store
from critic_pretrain.eval import COLD_EVERY, advantage, evaluate_detailed
from critic_pretrain.model import build_value_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=512, help="rollouts evaluated (of the sample's)")
    p.add_argument("--shapes", nargs="+", default=["demo", "4-layer 256"], help="model shapes to time")
    args = p.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    demo = yaml.safe_load(open("configs/demo.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        store = prepare_store(["builtin:sample"], tmp, DataConfig(), TargetsConfig(), vocab_size=512)
        rows = np.arange(min(args.rows, len(store)))
        shapes = {"demo": demo["model"]["config"],
                  "4-layer 256": {**demo["model"]["config"], "hidden_size": 256, "intermediate_size": 768,
                                  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}}
        no_adv = mock.patch.object(advantage, "estimator_sums", lambda values, *a, **k: (
            torch.zeros(advantage.N_ROWS, 6, dtype=torch.float64), torch.zeros(advantage.N_EV, 6, dtype=torch.float64)))

        print(f"{len(rows)} rollouts, {int(store.lengths[rows].sum())} tokens, {torch.get_num_threads()} threads, "
              f"best of {args.repeats} interleaved runs\n")
        print("| model | value metrics only | + advantage metrics (training evals) | "
              f"+ cold critic every {COLD_EVERY}th micro-batch (`critic-pretrain eval`) |\n|---|---:|---:|---:|")
        for name, config in ((n, shapes[n]) for n in args.shapes):
            torch.manual_seed(0)
            model = build_value_model(ModelConfig(config=config)).eval()
            cold = build_value_model(ModelConfig(config=config)).eval()

            def once(**kw) -> float:
                t0 = time.perf_counter()
                evaluate_detailed(model, store, rows, max_tokens=4096, max_length=4096, layout=Layout(1, 0, 1),
                                  device=torch.device("cpu"), **kw)
                return time.perf_counter() - t0

            # Interleaved, best of each: machine noise hits all three alike.
            base = adv = with_cold = float("inf")
            for _ in range(args.repeats):
                with no_adv:
                    base = min(base, once())
                adv = min(adv, once())
                with_cold = min(with_cold, once(cold_model=cold, cold_every=COLD_EVERY))
            params = sum(p.numel() for p in model.parameters()) / 1e6
            print(f"| {name} ({params:.2f}M parameters) | {base:.2f} s | {adv:.2f} s ({adv / base:.2f}x) | "
                  f"{with_cold:.2f} s ({with_cold / base:.2f}x) |")

if __name__ == "__main__":
    main()
