"""Which part of a critic's error costs its advantages? Values built from the exact ones with one
part taken away, or from the critic's with one part replaced, each scored like recipe_envs.

    python bench/credit_parts.py runs/x/step_1200 /tmp/critic-recipe-envs/data/undo-101 [--rows 1600]

For the key-step environments (key-steps, long, undo, prefix, synergy: one answer, the outcome at
its end, the credit on ACT_GOOD / ACT_BAD tokens), on rollouts with ``oracle_values``. Each row of
the table is a set of values V along every row's policy tokens, scored as the share of the gap
from the prompt-only value to the exact values that GAE(0.95) with V closes, as a correlation with
the true one-step advantages ``r_t + V*_{t+1} - V*_t`` over all policy tokens (the eval's
``adv_corr_all_lam0.95``; the prompt-only value is the leave-one-out group mean return, as there):

- ``critic``: the critic's values (what ``critic-pretrain eval`` scores);
- ``critic, constant between key steps``: each stretch between key tokens takes the mean of the
  critic's values over it, so its jitter on filler tokens is gone and its moves at key steps stay;
- ``exact + the critic's jitter``: the exact values plus the critic's deviation from that mean;
- ``exact without the good steps' change`` (and ``bad``): the exact values, where the change
  across a good (bad) key token is left out and every later value shifts with it.

The second-to-last row says how much is left for a critic that never follows the good steps,
however smooth it is (one construction, not a bound: the bad steps' exact changes are kept). The
GAE and the correlation here are numpy, written apart from the eval's torch code; the ``critic``
row equals the eval's figure (session sixteen: 46.3% for the shipped undo critic on 1,600 fresh
rows, both ways).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollouts.synth.vocab import ACT_BAD, ACT_GOOD, N_ACT_IDS  # noqa: E402

PARTS = ("critic", "critic, constant between key steps", "exact + the critic's jitter",
         "exact without the good steps' change", "exact without the bad steps' change")


def gae(values: np.ndarray, rewards: np.ndarray, lam: float = 0.95) -> np.ndarray:
    """GAE with gamma 1 along one row's policy tokens, V = 0 after the last one (a reference loop)."""
    adv, running = np.zeros(len(values)), 0.0
    for t in reversed(range(len(values))):
        nxt = values[t + 1] if t + 1 < len(values) else 0.0
        running = rewards[t] + nxt - values[t] + lam * running
        adv[t] = running
    return adv


def variants(critic: np.ndarray, exact: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The value sets of ``PARTS`` along one row's policy tokens ([T] each)."""
    good = (ids >= ACT_GOOD) & (ids < ACT_GOOD + N_ACT_IDS)
    bad = (ids >= ACT_BAD) & (ids < ACT_BAD + N_ACT_IDS)
    stretch = np.concatenate([[0], np.cumsum(good | bad)[:-1]])  # the value after key token t is in t + 1's
    mean = (np.bincount(stretch, weights=critic) / np.bincount(stretch))[stretch]
    change = np.diff(exact)

    def without(keys: np.ndarray) -> np.ndarray:
        return exact[0] + np.concatenate([[0.0], np.cumsum(np.where(keys[:-1], 0.0, change))])

    return dict(zip(PARTS, (critic, mean, exact + critic - mean, without(good), without(bad))))


def gap_closed(rows: list[dict], critic_values: list[np.ndarray]) -> dict[str, float]:
    """Per part: (corr - corr of the prompt-only value) / (corr of the exact values - that), over the
    policy tokens of ``rows`` (input_ids, loss_mask, oracle_values, reward, group_id);
    ``critic_values[i]`` is the critic's value at every position of row i."""
    groups = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r["group_id"]].append(i)
    advantages, truth = defaultdict(list), []
    for members in groups.values():
        total = sum(rows[i]["reward"] for i in members)
        for i in members:
            r = rows[i]
            loo = (total - r["reward"]) / max(len(members) - 1, 1)
            policy = np.asarray(r["loss_mask"]) > 0
            exact = np.asarray(r["oracle_values"], np.float64)[policy]
            rewards = np.zeros(policy.sum())
            rewards[-1] = r["reward"]
            truth.append(rewards + np.append(exact[1:], 0.0) - exact)
            sets = {"prompt only": np.full(len(exact), loo), "exact": exact,
                    **variants(np.asarray(critic_values[i], np.float64)[policy], exact,
                               np.asarray(r["input_ids"])[policy])}
            for name, v in sets.items():
                advantages[name].append(gae(v, rewards))
    true = np.concatenate(truth)
    corr = {k: np.corrcoef(np.concatenate(v), true)[0, 1] for k, v in advantages.items()}
    low, high = corr["prompt only"], corr["exact"]
    return {k: (corr[k] - low) / (high - low) for k in PARTS}


def main(argv: list[str] | None = None) -> int:
    import pyarrow.dataset as ds
    import torch

    from critic_pretrain.config_io import load_config
    from critic_pretrain.eval.from_checkpoint import load_checkpoint_model
    from critic_pretrain.model import token_values

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", type=Path, help="a saved step_<n> folder")
    p.add_argument("rollouts", type=Path, help="key-step rollouts with oracle_values (rollouts synth)")
    p.add_argument("--rows", type=int, default=1600)
    args = p.parse_args(argv)
    model = load_checkpoint_model(args.step, load_config(args.step / "config.yaml"), torch.device("cpu"))
    rows = ds.dataset(args.rollouts).head(args.rows, columns=["input_ids", "loss_mask", "oracle_values", "reward",
                                                              "group_id"]).to_pylist()
    values = []
    for r in rows:
        ids = torch.tensor(r["input_ids"])[None]
        with torch.no_grad():
            values.append(token_values(model, ids, torch.arange(ids.shape[1])[None])[0].double().numpy())
    print(f"{args.step} on {len(rows)} rows of {args.rollouts}\n\n| values | gap closed |\n|---|---|")
    for name, g in gap_closed(rows, values).items():
        print(f"| {name} | {g:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
