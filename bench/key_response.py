"""Does a critic move where the exact values move? The change of its value across each policy
token, at the decisive tokens (the exact value moves by more than ``--threshold``) and elsewhere.

    python bench/key_response.py runs/x/step_1200 data/long-101 [--rows 40]

On synthetic rollouts (``rollouts synth``: they carry ``oracle_values``). A critic that explains
variance only through the prompt shows a small change at the decisive tokens (against the exact
std) and a low correlation there; one that has found them matches the exact std with a high
correlation. The change across token t is V(t+1) - V(t): the value after the token minus the
value before it. Rows are cut at the model's position limit, as training and scoring cut them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from critic_pretrain.config_io import load_config  # noqa: E402
from critic_pretrain.eval.from_checkpoint import load_checkpoint_model  # noqa: E402
from critic_pretrain.model import position_limit, token_values  # noqa: E402


def changes(step: Path, rollouts: Path, rows: int) -> dict[str, np.ndarray]:
    """Per policy token with a next token: the critic's and the exact value's change across it."""
    # the checkpoint's own model config: no backbone load, whatever model.name_or_path says
    model = load_checkpoint_model(step, load_config(step / "config.yaml"), torch.device("cpu"))
    limit = position_limit(model.config) or 1 << 30
    table = ds.dataset(rollouts).head(rows, columns=["input_ids", "loss_mask", "oracle_values"])
    critic, exact = [], []
    for r in table.to_pylist():
        if r["oracle_values"] is None:
            raise SystemExit(f"{rollouts}: rows carry no oracle_values (synthetic rollouts do)")
        n = min(len(r["input_ids"]), limit)
        ids = torch.tensor(r["input_ids"][:n])[None]
        with torch.no_grad():
            v = token_values(model, ids, torch.arange(n)[None])[0].double().numpy()
        o = np.asarray(r["oracle_values"][:n], np.float64)
        policy = np.asarray(r["loss_mask"][:n - 1]) > 0
        critic.append(np.diff(v)[policy])
        exact.append(np.diff(o)[policy])
    return {"critic": np.concatenate(critic), "exact": np.concatenate(exact)}


def summary(d: dict[str, np.ndarray], threshold: float) -> dict:
    key = np.abs(d["exact"]) > threshold
    c, e = d["critic"], d["exact"]
    return {"decisive": int(key.sum()), "other": int((~key).sum()),
            "critic_std_decisive": float(c[key].std()), "exact_std_decisive": float(e[key].std()),
            "corr_decisive": float(np.corrcoef(c[key], e[key])[0, 1]),
            "critic_std_other": float(c[~key].std()), "exact_std_other": float(e[~key].std())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", type=Path)
    p.add_argument("rollouts", type=Path)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--threshold", type=float, default=0.01, help="|exact change| that makes a token decisive")
    a = p.parse_args()
    s = summary(changes(a.step, a.rollouts, a.rows), a.threshold)
    print(f"| {a.step} | {s['decisive']} | {s['critic_std_decisive']:.3f} (exact {s['exact_std_decisive']:.3f}) | "
          f"{s['corr_decisive']:.2f} | {s['critic_std_other']:.4f} (exact {s['exact_std_other']:.4f}) |")


if __name__ == "__main__":
    main()
