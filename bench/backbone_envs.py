"""A pretrained backbone on the held-out environments no tiny critic passes (issue 23): the shipped
targets on a Hugging Face folder, scored like bench/recipe_envs.py.

    python bench/backbone_envs.py MODEL_DIR [--envs undo long-tools] [--steps 1200] [--json OUT]

Each environment's 2,400 training rows (seed 0) and 1,600 fresh rows (seed 101) are recipe_envs'
archives. The critic is configs/smollm2-135m.yaml's (lr 2e-5 to 2e-6, head lr 1e-3, head from
zero) with the shipped targets (TD(0.98) from its own values, steps of >= 12 rollouts), evaluated
and saved every 50 steps, the best by validation loss kept (`checkpoint.keep_best=1`, the user's
own pick: no oracle). Scored at that step and at the last: the share of the gap from the
prompt-only value to the exact values that its GAE(0.95) advantages close (recipe_envs.score).

A 135M backbone runs ~6 s a step on 2 CPU cores at 53-token rows and ~26 s at undo's 272: this is
a device measurement (bench/gpu_backbone.sh). On CPU, session seventeen ran the same recipe on a
short undo (docs/LOG.md): SmolLM2-135M 37%, the tiny model 35 / 34% at its best step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import recipe_envs as R  # noqa: E402

CONFIG = ROOT / "configs" / "smollm2-135m.yaml"
SHIPPED_TARGETS = ["targets.lam=0.98", "targets.values_from=critic", "train.rollouts_per_step=12"]


def overrides(model: Path, env: str, steps: int) -> list[str]:
    """The backbone's run: the shipped targets on CONFIG, evaluated, saved and ranked every 50 steps."""
    every = max(1, min(50, steps))
    # synthetic ids on a real tokenizer's backbone, on purpose: the probe is the backbone as a sequence model
    return [f"model.name_or_path={model}", "data.synthetic_on_pretrained=true", *SHIPPED_TARGETS,
            f"train.max_steps={steps}", "data.val_fraction=0.1",
            "data.max_tokens=4096", *R.env_overrides(env), f"eval.every={every}", f"checkpoint.save_every={every}",
            "checkpoint.keep_best=1", "checkpoint.keep_last=1", "train.log_every=10"]


def run_env(work: Path, model: Path, env: str, steps: int, rows: int, fresh_rows: int) -> dict:
    from critic_pretrain.checkpoint import best_steps
    from critic_pretrain.config_io import load_config

    data, fresh = R.train_and_fresh(work, env, rows, fresh_rows)
    t0 = time.perf_counter()
    last, _ = R.train_run(work / "runs" / f"backbone-{model.name}-{env}-{rows}-{steps}", data, steps,
                          overrides(model, env, steps), config=CONFIG)
    out = {"env": env, "model": str(model), "steps": steps, "rows": rows, "fresh_rows": fresh_rows,
           "train_s": round(time.perf_counter() - t0, 1)}
    best = best_steps(last.parent, load_config(last / "config.yaml").checkpoint.best_metric, 1)[0]
    for name, step in (("best", last.parent / f"step_{best}"), ("last", last)):
        s = R.score(step, fresh)
        out[name] = {"step": int(step.name.split("_")[1]), "gap_closed": s["all"]["gap_closed"], "ev": s["ev"],
                     "ev_ceiling": s["ev_ceiling"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="a Hugging Face causal-LM folder (examples/smollm2/model.py prints one)")
    p.add_argument("--envs", nargs="+", default=["undo", "long-tools"], choices=[*R.TUNE, *R.HELDOUT])
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps (the shipped 1,200)")
    p.add_argument("--rows", type=int, default=R.TRAIN_ROWS, help="training rows (default recipe_envs')")
    p.add_argument("--fresh-rows", type=int, default=R.HELDOUT_ROWS, help="fresh rows scored (default recipe_envs')")
    p.add_argument("--work", type=Path, default=Path("/tmp/critic-recipe-envs"), help="archives and runs")
    p.add_argument("--json", type=Path, help="append one JSON line per environment here")
    args = p.parse_args(argv)
    for env in args.envs:
        R.emit(run_env(args.work, args.model.resolve(), env, args.steps, args.rows, args.fresh_rows), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
