"""What the shipped model can learn when the targets are exact: its credit with no target noise.

    python bench/exact_targets.py --envs undo key-steps --seeds 0 1 [--lam 0] [--json OUT]

The shipped recipe's critic (configs/demo.yaml: the tiny random-init model, its optimizer and
1,200 steps) trained on targets built from each training row's exact values instead of from its own:
the archive is copied with a ``values`` column equal to ``oracle_values`` (DESIGN.md's alignment,
the value before token t, for both) and trained with ``targets.values_from=data targets.lam=0``.
A TD(0) target is then the exact value after the token, which equals the exact value before it at
every token but a key step, so the regression's only noise is the key step's own draw. Scored like
bench/recipe_envs.py on the same fresh rows (the share of the gap from the prompt-only value to the
exact values that its GAE(0.95) advantages close).

Not a recipe (a user has no exact values) but a reading of where a shortfall lives, next to
bench/state_ceiling.py's reading of the data: if a critic trained on exact targets closes no more
than the shipped recipe's, no choice of targets (lambda, a target network, weighting) can close the
rest for this model; the model is what falls short (session eighteen, docs/LOG.md: undo).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import recipe_envs as R  # noqa: E402


def with_exact_values(src: Path, dst: Path) -> Path:
    """``src``'s parquet files under ``dst`` with a ``values`` column equal to ``oracle_values``
    (written once; a folder from an earlier call is reused)."""
    import pyarrow.parquet as pq

    done = dst / "_exact_values"
    if not done.is_file():
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.parquet")):
            table = pq.read_table(f)
            if "values" in table.schema.names:
                table = table.drop(["values"])
            pq.write_table(table.append_column("values", table.column("oracle_values")), dst / f.name)
        done.write_text(f"{src}\n")
    return dst


def run_env(work: Path, env: str, seed: int, lam: float, steps: int, rows: int, fresh_rows: int,
            extra: list[str]) -> dict:
    data, fresh = R.train_and_fresh(work, env, rows, fresh_rows)
    # the eval reads the run's targets, so the fresh rows carry the column too (the score does not use it)
    data, fresh = (with_exact_values(d, work / "data" / f"{d.name}-exact") for d in (data, fresh))
    name = "-".join(["exact", f"lam{lam:g}", f"seed{seed}", env, str(rows), str(steps), *extra]).replace("/", "_")
    last, secs = R.train_run(work / "runs" / name, data, steps,
                             [*R.env_overrides(env), "targets.values_from=data", f"targets.lam={lam}", R.ADAM_0999,
                              f"seed={seed}", f"train.max_steps={steps}", *extra])
    s = R.score(last, fresh)
    return {"env": env, "seed": seed, "lam": lam, "steps": steps, "rows": rows, "extra": extra,
            "gap_closed": s["all"]["gap_closed"], "ev": s["ev"], "ev_ceiling": s["ev_ceiling"], "train_s": secs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=["undo"], choices=[*R.TUNE, *R.HELDOUT])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="training seeds")
    p.add_argument("--lam", type=float, default=0.0, help="lambda of the targets built from the exact values")
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps (the shipped 1,200)")
    p.add_argument("--rows", type=int, default=R.TRAIN_ROWS, help="training rows (default recipe_envs')")
    p.add_argument("--fresh-rows", type=int, default=R.HELDOUT_ROWS, help="fresh rows scored (default recipe_envs')")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides (a wider model...)")
    p.add_argument("--work", type=Path, default=Path("/tmp/critic-recipe-envs"), help="archives and runs")
    p.add_argument("--json", type=Path, help="append one JSON line per run here")
    args = p.parse_args(argv)
    for env in args.envs:
        for seed in args.seeds:
            R.emit(run_env(args.work, env, seed, args.lam, args.steps, args.rows, args.fresh_rows, args.set), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
