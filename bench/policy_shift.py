"""Policy shift: when does a critic trained on an older policy's rollouts hurt PPO?

The bundled sample is policy version 0 of the synthetic environment. Version 1 is the same
environment after the policy improved (good actions: 0.95 on easy prompts, 0.6 on hard ones,
instead of 0.85 and 0.1). Every critic is trained with configs/demo.yaml at the demo's recipe
when this table was made (TD(0.8), 600 steps: ``BASE``, pinned so the table stays what it says)
and scored on 1,600 fresh version-1 rollouts, as ``critic-pretrain seed check --rollouts``
scores it:

- ``stale``: version 0 only; ``stale, Monte-Carlo``: the same with the demo's recipe before
  issue 14 (Monte-Carlo targets, 300 steps), a critic that learned little beyond difficulty;
- ``mixed``: version 0 plus 400 version-1 rollouts;
- ``mixed, recency``: the same with ``data.recency_half_life=0.5`` (version 0 weighs 1/4);
- ``fresh only``: the 400 version-1 rollouts alone.

    python bench/policy_shift.py [--out bench/policy_shift.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SHIFTED = dict(p_good_easy=0.95, p_good_hard=0.6, policy_version=1)
BASE = ["targets.lam=0.8", "train.max_steps=600"]
"""The demo's recipe when bench/policy_shift.md was made (it has moved since: configs/demo.yaml)."""


def synth(out: Path, rows: int, seed: int, **params) -> Path:
    from rollouts import synth as gen

    if not out.is_dir():
        out.mkdir(parents=True)
        pq.write_table(gen.generate(rows, seed, **params), out / "part-0.parquet")
    return out


def train(run: Path, data: list[str], extra: list[str]) -> Path:
    import yaml

    steps = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())["train"]["max_steps"]
    steps = next((int(o.split("=")[1]) for o in reversed(extra) if o.startswith("train.max_steps=")), steps)
    if not (run / f"step_{steps}").is_dir():
        subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train", "--config", "configs/demo.yaml",
                        f"output_dir={run}", "train.progress=false", f"data.train=[{','.join(data)}]", *extra],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run / f"step_{steps}"


def main() -> None:
    from critic_pretrain.interop.check import check_seed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/critic-shift")
    p.add_argument("--out", help="also write the markdown table here")
    args = p.parse_args()
    work = Path(args.work)
    fresh_train = synth(work / "v1-train", 400, 302, **SHIFTED)
    fresh_test = synth(work / "v1-test", 1600, 303, **SHIFTED)
    own_test = synth(work / "v0-test", 1600, 101)
    runs = {"stale": (["builtin:sample"], []),
            "stale, Monte-Carlo": (["builtin:sample"], ["targets.lam=1.0", "targets.values_from=none",
                                                        "train.max_steps=300"]),
            "mixed": (["builtin:sample", str(fresh_train)], []),
            "mixed, recency": (["builtin:sample", str(fresh_train)], ["data.recency_half_life=0.5"]),
            "fresh only": ([str(fresh_train)], [])}
    lines = ["| critic | scored on | lam 0.95 corr | group-mean control | GRPO | lam 0 corr | EV / ceiling | "
             "group mean's EV | `seed check --rollouts` |", "|---|---|---|---|---|---|---|---|---|"]
    for name, (data, extra) in runs.items():
        step = train(work / name.replace(", ", "-").replace(" ", "-"), data, [*BASE, *extra])
        for label, test in (("version 1", fresh_test), ("version 0", own_test)) if name.startswith("stale") \
                else (("version 1", fresh_test),):
            report = check_seed(step, rollouts=[str(test)])  # one evaluation: its numbers are the facts
            q = report.facts["quality"]
            verdict = "passes" if report.ok else "fails"
            lines.append(f"| {name} | {label} | {q['critic']:.3f} | {q['baseline']:.3f} | {q['grpo']:.3f} | "
                         f"{q['td0']:.3f} | {q['explained_variance']:.3f} / {q['ceiling']:.3f} | "
                         f"{q['ev_group_mean']:.3f} | {verdict} |")
            print(lines[-1], flush=True)
    text = ("Critics trained with configs/demo.yaml at " + " ".join(BASE) + " (the demo's recipe when this was "
            "made; `stale, Monte-Carlo` overrides it); scored on 1,600 fresh rollouts (correlations at turn-first "
            "tokens against the true one-step advantages).\n\n" + "\n".join(lines))
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
