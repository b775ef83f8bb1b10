"""What an archive's rollouts allow a critic that knows the state: tabular Monte-Carlo means.

    python bench/state_ceiling.py /tmp/critic-recipe-envs/data/undo-0 /tmp/critic-recipe-envs/data/undo-101

For the key-step environments (key-steps, long, undo, prefix, synergy), whose state is a few
counts: the prompt's difficulty ``d`` and number of key steps ``k``, the key steps taken ``j``, and
the count the environment's rule keeps (keysteps.RULES: all good steps; the streak since the last
bad one; the good ones before the first bad one, with its flag). Each row of the table is an
estimator told part of that state and nothing else: the value of a state is the mean final reward of
the training rows that pass through it (each row once per state), falling back to coarser states
for one no training row reached. It is scored on the fresh rows like ``bench/credit_parts.py``
(GAE(0.95) against the true one-step advantages, the share of the gap from the prompt-only value to
the exact values).

The first row says how much of the credit the training rows carry for a critic that finds the
state; the gap between it and a trained critic is the model's, not the data's or the targets'
(session seventeen: 94% on undo's 2,400 rows, where the shipped critic closes 35-49%). The state at
position t is read from the tokens before t: ``oracle_values[t]`` is the value before token t is
written (DESIGN.md's alignment), and so is the critic's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from credit_parts import gap_closed  # noqa: E402

from rollouts.synth.vocab import ACT_BAD, ACT_GOOD, DIFFICULTY, N_ACT_IDS, NEED  # noqa: E402

State = tuple[int, ...]


def rule_of(env: str) -> str:
    """The key-step rule of a synth environment, read from its builder (the one owner)."""
    from rollouts.synth.envs import ENVIRONMENTS

    rule = getattr(ENVIRONMENTS[env].build, "keywords", {}).get("rule") if env in ENVIRONMENTS else None
    if rule is None:
        raise SystemExit(f"state_ceiling: {env!r} is not a key-step environment (key-steps, long, undo, prefix, "
                         "synergy): its state is not a few counts")
    return rule


def states(ids: list[int], rule: str) -> list[State]:
    """(d, k, j, count, flag, good) before each position of a key-step row: ``count`` the good steps
    the rule counts, ``flag`` 1 once a bad step has stopped the count (prefix), ``good`` all good
    steps so far (key-steps' count, whatever the rule)."""
    d, k = ids[1] - DIFFICULTY, ids[2] - NEED + 1
    out, j, count, stopped, good_steps = [], 0, 0, 0, 0
    for t in ids:
        out.append((d, k, j, count, stopped, good_steps))
        good, bad = ACT_GOOD <= t < ACT_GOOD + N_ACT_IDS, ACT_BAD <= t < ACT_BAD + N_ACT_IDS
        j += good or bad
        good_steps += good
        if good and not stopped:
            count += 1
        elif bad and rule == "streak":
            count = 0
        elif bad and rule == "prefix":
            stopped = 1
    return out


VIEWS: dict[str, tuple[int, ...]] = {
    # what the estimator is told: positions in the states() tuple; the first three always, (d, k, j)
    "the state (d, k, j, the rule's count)": (0, 1, 2, 3, 4),
    "d, k, j, all good steps so far (key-steps' count)": (0, 1, 2, 5),
    "d, k, j (no count)": (0, 1, 2),
}


def fit(rows: list[dict], rule: str, view: tuple[int, ...]) -> Callable[[State], float]:
    """Tabular means of the final reward per viewed state (each row once per state), falling back to
    (d, k, j), (d, k), () for a state no training row reached."""
    sums: dict[State, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in rows:  # each row once per key it reaches, at every level (a long row does not weigh more)
        seen = {tuple(s[i] for i in view) for s in states(r["input_ids"], rule)}
        for key in {k for st in seen for k in (st, st[:3], st[:2], ())}:
            sums[key][0] += r["reward"]
            sums[key][1] += 1

    def value(st: State) -> float:
        key = next(key for key in (tuple(st[i] for i in view), st[:3], st[:2], ()) if key in sums)
        return sums[key][0] / sums[key][1]

    return value


def ceiling(train: list[dict], fresh: list[dict], rule: str) -> dict[str, float]:
    """Per view in ``VIEWS``: the share of the gap its tabular values close on ``fresh``."""
    out = {}
    for name, view in VIEWS.items():
        value = fit(train, rule, view)
        values = [np.array([value(s) for s in states(r["input_ids"], rule)]) for r in fresh]
        out[name] = gap_closed(fresh, values)["critic"]
    return out


def main(argv: list[str] | None = None) -> int:
    import pyarrow.dataset as ds

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("train", type=Path, help="key-step rollouts the estimator is fit on (rollouts synth)")
    p.add_argument("fresh", type=Path, help="rollouts of the same environment with oracle_values, scored on")
    p.add_argument("--rows", type=int, default=1600, help="fresh rows scored (default 1600, as recipe_envs)")
    args = p.parse_args(argv)
    env, fresh_env = (json.loads((p / "_synth.json").read_text())["params"]["env"] for p in (args.train, args.fresh))
    if env != fresh_env:
        raise SystemExit(f"state_ceiling: {args.train} is {env!r} and {args.fresh} is {fresh_env!r}: fit and score "
                         "one environment")
    rule = rule_of(env)
    cols = ["input_ids", "loss_mask", "oracle_values", "reward", "group_id"]
    train = ds.dataset(args.train).to_table(columns=cols).to_pylist()
    fresh = ds.dataset(args.fresh).head(args.rows, columns=cols).to_pylist()
    print(f"{env} (rule {rule}): fit on {len(train):,} rows of {args.train}, scored on {len(fresh):,} rows of "
          f"{args.fresh}\n\n| tabular values over | gap closed |\n|---|---|")
    for name, g in ceiling(train, fresh, rule).items():
        print(f"| {name} | {g:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
