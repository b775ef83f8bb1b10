"""Recipe search: which training recipe teaches the demo critic credit within the rollout?

Each recipe is the demo run as it was before this search (configs/demo.yaml with Monte-Carlo
targets and 300 steps: ``BASE``; bundled synthetic rollouts, 0.16M-parameter random-init
critic) with a few overrides. Every run's final checkpoint is scored by
``critic-pretrain eval`` on 1,600 fresh held-out rollouts of the same environment (seed 101,
never trained on), against the issue-14 targets:

- lam 0.95 advantage correlation at turn-first tokens >= group-mean control + 0.05;
- lam 0 (TD residual) correlation at turn-first tokens >= 0.3;
- explained variance >= 0.8 x the true values' explained variance (the ceiling).

    python bench/recipes.py                      # all recipes (about 6-10 min each on 2 cores)
    python bench/recipes.py --only mc td0.95     # some of them
    python bench/recipes.py --out bench/recipes.md

Runs go to ``--work`` (default /tmp/critic-recipes) and are reused when finished, so a table
can be re-rendered without training again. The table is markdown (docs/LOG.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELDOUT_ROWS, HELDOUT_SEED = 1600, 101

BIGGER = json.dumps({"model_type": "qwen2", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 512,
                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 4096, "tie_word_embeddings": False})
BASE = ["targets.lam=1.0", "targets.values_from=none", "train.max_steps=300"]
"""The demo recipe before this search (Monte-Carlo targets, 300 steps); every recipe starts from it."""
RECIPES: dict[str, tuple[str, list[str]]] = {
    "mc": ("the demo as it was: Monte-Carlo targets, 300 steps", []),
    "td0.95": ("bootstrapped TD(0.95) from the critic's own values",
               ["targets.lam=0.95", "targets.values_from=critic"]),
    "td0.8": ("bootstrapped TD(0.8)", ["targets.lam=0.8", "targets.values_from=critic"]),
    "mc-600": ("Monte-Carlo, 600 steps", ["train.max_steps=600"]),
    "mc-lr1e-2": ("Monte-Carlo, peak lr 1e-2", ["optim.lr=1e-2", "optim.min_lr=1e-3"]),
    "bigger": ("4 layers, hidden 128 (1.1M parameters), Monte-Carlo", [f"model.config={BIGGER}"]),
    "head-warmup": ("head-only warm-up for the first 30 steps", ["train.freeze_backbone_steps=30"]),
    "td0.5": ("bootstrapped TD(0.5)", ["targets.lam=0.5", "targets.values_from=critic"]),
    "td0.8-600": ("bootstrapped TD(0.8), 600 steps", ["targets.lam=0.8", "targets.values_from=critic",
                                                     "train.max_steps=600"]),
    "td0.8-bigger": ("bootstrapped TD(0.8), 4 layers, hidden 128", ["targets.lam=0.8", "targets.values_from=critic",
                                                                   f"model.config={BIGGER}"]),
    "td0.8-bigger-lr1e-3": ("bootstrapped TD(0.8), 4 layers, hidden 128, peak lr 1e-3",
                            ["targets.lam=0.8", "targets.values_from=critic", f"model.config={BIGGER}",
                             "optim.lr=1e-3", "optim.min_lr=1e-4"]),
    "td0.9-600": ("bootstrapped TD(0.9), 600 steps", ["targets.lam=0.9", "targets.values_from=critic",
                                                     "train.max_steps=600"]),
    "td0.8-1000": ("bootstrapped TD(0.8), 1000 steps", ["targets.lam=0.8", "targets.values_from=critic",
                                                       "train.max_steps=1000"]),
}


def heldout(work: Path) -> Path:
    out = work / "heldout"
    if not (out / "_synth.json").is_file():
        subprocess.run([sys.executable, "-m", "rollouts", "synth", "--out", str(out), "--rows", str(HELDOUT_ROWS),
                        "--seed", str(HELDOUT_SEED)], check=True, cwd=ROOT)
    return out


def train(name: str, overrides: list[str], work: Path) -> tuple[Path, float | None]:
    run = work / name
    overrides = BASE + overrides
    steps = [int(o.split("=")[1]) for o in overrides if o.startswith("train.max_steps=")][-1]
    timing = run / "train_seconds.txt"
    if not (run / f"step_{steps}").is_dir():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train", "--config", "configs/demo.yaml",
                        f"output_dir={run}", "train.progress=false", *overrides], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        timing.write_text(f"{time.perf_counter() - t0:.1f}\n")
    return run / f"step_{steps}", float(timing.read_text()) if timing.is_file() else None


def score(step: Path, data: Path) -> dict:
    from critic_pretrain.eval import evaluate_checkpoint

    report = evaluate_checkpoint(step, [str(data)], cold_every=0)
    m = report["metrics"]
    return {"corr95": m["eval/adv_corr_first_lam0.95"], "control95": m["eval/adv_corr_first_lam0.95_group_mean"],
            "corr0": m["eval/adv_corr_first_lam0"], "corr0_all": m["eval/adv_corr_all_lam0"],
            "ev": m["eval/explained_variance"], "ceiling": m["eval/ev_oracle_values"],
            "oracle95": m["eval/adv_corr_first_lam0.95_oracle_values"], "turn": m.get("eval/turn_change_corr")}


def table(rows: list[tuple[str, str, dict, float | None]]) -> str:
    out = ["| recipe | what | lam 0.95 corr (control) | +0.05 over control | lam 0 corr | >= 0.3 | EV / ceiling "
           "| >= 0.8 | turn change corr | train time (2 cores, runs overlapping) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, what, s, secs in rows:
        ok = lambda b: "yes" if b else "no"  # noqa: E731
        out.append(f"| {name} | {what} | {s['corr95']:.3f} ({s['control95']:.3f}) | "
                   f"{ok(s['corr95'] >= s['control95'] + 0.05)} | {s['corr0']:.3f} | {ok(s['corr0'] >= 0.3)} | "
                   f"{s['ev']:.3f} / {s['ceiling']:.3f} | {ok(s['ev'] >= 0.8 * s['ceiling'])} | "
                   f"{s['turn']:.3f} | {'-' if secs is None else f'{secs / 60:.1f} min'} |")
    return "\n".join(out)


SCHEDULE_PAIRS = (("mc", "mc-600"), ("td0.8-600", "td0.8-1000"))
"""(finished short schedule, longer schedule) pairs compared at the short one's last step."""


def schedule_table(work: Path) -> str:
    """A finished short schedule vs the same step of a longer one (mid-schedule, LR still high),
    from the runs' own validation records."""
    from critic_pretrain.metrics import read_metrics

    out = ["| step | finished schedule | val EV | oracle EV | calibration error | lam 0.95 corr | mid-schedule "
           "of | val EV | oracle EV | calibration error | lam 0.95 corr |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = ("val/explained_variance", "val/oracle_explained_variance", "val/calibration_error",
            "val/adv_corr_first_lam0.95")
    for short, long in SCHEDULE_PAIRS:
        if not ((work / short / "metrics.jsonl").is_file() and (work / long / "metrics.jsonl").is_file()):
            continue
        end = max(r["step"] for r in read_metrics(work / short / "metrics.jsonl") if "val/loss" in r)
        a, b = ({r["step"]: r for r in read_metrics(work / n / "metrics.jsonl") if "val/loss" in r}[end]
                for n in (short, long))
        out.append(f"| {end} | {short} | " + " | ".join(f"{a[k]:.3f}" for k in keys) + f" | {long} | "
                   + " | ".join(f"{b[k]:.3f}" for k in keys) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=list(RECIPES), help="recipes to run (default: all)")
    p.add_argument("--work", default="/tmp/critic-recipes", help="where runs and the held-out rollouts go")
    p.add_argument("--out", help="also write the markdown table here")
    args = p.parse_args()
    work = Path(args.work)
    data = heldout(work)
    rows = []
    for name in args.only or list(RECIPES):
        what, overrides = RECIPES[name]
        step, secs = train(name, overrides, work)
        rows.append((name, what, score(step, data), secs))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (f"Held-out: {HELDOUT_ROWS} fresh rollouts of the bundled environment (seed {HELDOUT_SEED}); "
            "correlations at turn-first tokens against the true one-step advantages.\n\n" + table(rows)
            + "\n\nA finished schedule against the same step of a longer one (the runs' validation split):\n\n"
            + schedule_table(work))
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
