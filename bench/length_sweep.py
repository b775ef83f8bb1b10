"""Is it the length? The `tools` environment at longer median lengths, trained with the shipped
default (configs/demo.yaml) and scored as bench/recipe_envs.py scores (share of the gap from the
prompt-only value to the exact values that GAE(0.95) advantages close).

`long-tools` is `tools` at a median 4,000 tokens (sigma 0.6); every recipe tried there closed
nothing of the gap, where `tools` at 200 tokens closes 68-77%. This sweep fills the lengths in
between on tuning data (fresh archives, not long-tools' own), so it diagnoses without spending the
held-out environment.

    python bench/length_sweep.py --medians 1000 2000 --work /work/length-sweep --json bench/length_sweep.jsonl

Recorded (bench/length_sweep.jsonl, TD(0.98), 1,200 steps, 800 fresh rows each): median 1,000
closes 59% of the gap, 2,000 46%; `tools` (median 200) 68%, `long-tools` (4,000) -7%.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import recipe_envs  # noqa: E402


def archive(work: Path, median: int, rows: int, seed: int) -> Path:
    out = work / "data" / f"tools-{median}-{seed}"
    if not (out / "_synth.json").is_file():
        subprocess.run([sys.executable, "-m", "rollouts", "synth", "--env", "tools", "--out", str(out), "--rows",
                        str(rows), "--seed", str(seed), "--median-length", str(median), "--max-length", "4096",
                        "--length-sigma", "0.6", "--overwrite"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--medians", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--work", type=Path, default=Path("/tmp/length-sweep"))
    ap.add_argument("--heldout-rows", type=int, default=800)
    ap.add_argument("--json", type=Path, default=None, help="append one line per median here")
    args = ap.parse_args(argv)
    steps = recipe_envs.steps_of("td0.98", "long")  # configs/demo.yaml's schedule
    for median in args.medians:
        data = archive(args.work, median, recipe_envs.TRAIN_ROWS, seed=0)
        heldout = archive(args.work, median, args.heldout_rows, seed=recipe_envs.HELDOUT_SEED)
        step, seconds = recipe_envs.train_run(args.work / "runs" / f"tools-{median}", data, steps,
                                              ["data.max_tokens=8192"])
        row = {"median": median, "steps": steps, "train_seconds": seconds, **recipe_envs.score(step, heldout)}
        print(json.dumps(row))
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
