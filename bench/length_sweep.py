"""Is it the length? The `tools` environment at longer median lengths, trained with the shipped
default (configs/demo.yaml) and scored as bench/recipe_envs.py scores (share of the gap from the
prompt-only value to the exact values that GAE(0.95) advantages close).

`long-tools` is `tools` at a median 4,000 tokens (sigma 0.6); every recipe tried there closed
nothing of the gap, where `tools` at 200 tokens closes 68-77%. This sweep fills the lengths in
between on tuning data (fresh archives, not long-tools' own), so it diagnoses without spending the
held-out environment.

    python bench/length_sweep.py --medians 1000 2000 --work /work/length-sweep --json bench/length_sweep.jsonl

Cut or length? `long-tools`' generator cuts at 8,192 and the demo model's 4,096 positions cut
45% of its rows again (their return kept). The same rows with a model of 8,192 positions, fresh
seeds, at a median other than long-tools' own (so the held-out distribution stays unseen):

    python bench/length_sweep.py --medians 3000 --generator-cut 8192 --positions 4096 --seed 1 ...
    python bench/length_sweep.py --medians 3000 --generator-cut 8192 --positions 8192 --seed 1 ...

Recorded (bench/length_sweep.jsonl, TD(0.98), 1,200 steps, 800 fresh rows each): median 1,000
closes 59% of the gap, 2,000 46% (generator cut 4,096); `tools` (median 200) 68%, `long-tools`
(4,000) -7%. Long-tools-shaped rows (generator cut 8,192, seed 1): median 3,000 58% with the
4,096-position model, 41% with 8,192 positions (the rows' tails scored too); median 4,000 (long-tools'
own distribution, a second draw: a measurement, not a choice) 52%.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import recipe_envs  # noqa: E402


def archive(work: Path, median: int, rows: int, seed: int, cut: int = 4096) -> Path:
    """`tools` rows at ``median`` tokens, cut at ``cut`` tokens by the generator (a row cut there
    earns 0; long-tools cuts at 8,192)."""
    name = f"tools-{median}-{seed}" + (f"-g{cut}" if cut != 4096 else "")
    return recipe_envs.archive(work, "tools", rows, seed, name,
                               ("--median-length", str(median), "--max-length", str(cut), "--length-sigma", "0.6"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--medians", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--work", type=Path, default=Path("/tmp/length-sweep"))
    ap.add_argument("--heldout-rows", type=int, default=800)
    ap.add_argument("--json", type=Path, default=None, help="append one line per median here")
    ap.add_argument("--positions", type=int, default=4096,
                    help="the model's max_position_embeddings: 4,096 is configs/demo.yaml's (it cuts 45%% of "
                         "long-tools' rows, keeping their return); 8,192 keeps every row whole")
    ap.add_argument("--generator-cut", type=int, default=4096,
                    help="where the generator cuts rows (a row cut there earns 0): 4,096 for the recorded rows, "
                         "8,192 as in long-tools (a 4,096-position model then cuts them again, keeping the return)")
    ap.add_argument("--seed", type=int, default=0,
                    help="archive seed (held-out rows: 101 + seed); 0 for the recorded rows, others for fresh rows")
    args = ap.parse_args(argv)
    steps = recipe_envs.steps_of("td0.98", "long")  # configs/demo.yaml's schedule
    over = [f"data.max_tokens={max(8192, args.positions)}"] + (
        [f"model.config.max_position_embeddings={args.positions}"] if args.positions != 4096 else [])
    for median in args.medians:
        cut = args.generator_cut
        data = archive(args.work, median, recipe_envs.TRAIN_ROWS, args.seed, cut)
        heldout = archive(args.work, median, args.heldout_rows, recipe_envs.HELDOUT_SEED + args.seed, cut)
        name = f"tools-{median}" + "".join(f"-{k}{v}" for k, v, default in (
            ("g", cut, 4096), ("p", args.positions, 4096), ("s", args.seed, 0)) if v != default)
        step, seconds = recipe_envs.train_run(args.work / "runs" / name, data, steps, over)
        row = {"median": median, "generator_cut": cut, "positions": args.positions, "seed": args.seed, "steps": steps,
               "train_seconds": seconds, **recipe_envs.score(step, heldout)}
        print(json.dumps(row))
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
