"""The fault matrix: every way we know a run gets interrupted or its folder damaged, what
re-running the same command then does, and what it costs in lost optimizer steps.

    .venv/bin/python bench/fault_matrix.py                 # prints the markdown table
    .venv/bin/python bench/fault_matrix.py --json out.json

Each scenario trains the same tiny run (8 steps, a checkpoint every 2) in a fresh folder, in
subprocesses through the real CLI: the fault (a kill -9 at a chosen point through the
``CRITIC_PRETRAIN_FAULT`` seam, a real signal, a full disk, a damaged or planted file, a
second run), then the same command again. Reported: the exit code of the faulted run, the
step the re-run resumed from, the steps trained but lost (steps done before the fault minus
the resume step), and whether the final weights equal an uninterrupted run's bit for bit.
The test suite runs it (tests/test_fault_matrix.py); the README's table is its output.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS, SAVE_EVERY = 8, 2
TINY = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "tie_word_embeddings": False}


@dataclass
class Outcome:
    scenario: str
    fault_exit: int | None
    """Exit code of the faulted run (137: killed; 75: preempted; 130: Ctrl-C; 2: refused)."""
    resumed_from: int | None
    """Step the re-run of the same command started from (None: it was refused)."""
    steps_done: int
    """Optimizer steps completed before the fault."""
    lost: int | None
    exact: bool | None
    """Final weights equal to the uninterrupted run's, bit for bit."""
    note: str = ""


def overrides(out: Path, data: Path, **extra) -> list[str]:
    base = {"output_dir": str(out), "data.train": f"[{data}]", "model.config": json.dumps(TINY),
            "data.max_tokens": 256, "data.val_fraction": 0.1, "optim.lr": 3e-3, "optim.warmup_steps": 2,
            "train.max_steps": STEPS, "train.progress": "false", "eval.every": 0,
            "checkpoint.save_every": SAVE_EVERY}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def train(out: Path, data: Path, env: dict | None = None, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train", *overrides(out, data, **extra)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)


def weights(step_dir: Path) -> dict:
    from safetensors.torch import load_file

    from critic_pretrain import checkpoint as ckpt
    return load_file(ckpt.StepPaths(step_dir).weights)


def same(a: dict, b: dict) -> bool:
    import torch
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def resume_point(out: Path) -> int | None:
    """The step the same command resumes from now (what the re-run will pick)."""
    from critic_pretrain import checkpoint as ckpt
    d = ckpt.resolve_resume(out, None)
    return ckpt.step_number(d) if d is not None else 0


def flip_byte(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


class _Exec:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


DAMAGE: set[str] = set()
"""Scenarios whose faulted run was a clean preemption at step 6, damaged afterwards."""


def run_matrix(data: Path, work: Path) -> list[Outcome]:
    from critic_pretrain import checkpoint as ckpt

    straight = work / "straight"
    res = train(straight, data)
    assert res.returncode == 0, res.stderr[-3000:]
    reference = weights(straight / f"step_{STEPS}")
    outcomes = []

    def finish(name: str, out: Path, fault_exit: int | None, done: int, note: str = "", **extra) -> None:
        start = resume_point(out)
        res = train(out, data, **extra)
        if res.returncode != 0:
            last = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            why = re.sub(r"/\S+/", "", last[-1][7:]) if last else f"exit {res.returncode}"  # no temp paths
            outcomes.append(Outcome(name, fault_exit, None, done, None, None, f"{note}{why}"))
            return
        exact = same(weights(out / f"step_{STEPS}"), reference)
        outcomes.append(Outcome(name, fault_exit, start, done, done - start, exact, note))

    # kill -9 mid-step and at every point of a save; full disk during a save
    for name, fault, done in [
        ("kill -9 mid-step (after step 5)", "in_step@5", 5),
        ("kill -9 in a save, after the weights (step 6)", "after_weights@6", 6),
        ("kill -9 in a save, after the optimizer (step 6)", "after_optimizer@6", 6),
        ("kill -9 in a save, before the manifest (step 6)", "before_manifest@6", 6),
        ("kill -9 in a save, before the rename (step 6)", "before_rename@6", 6),
        ("full disk during the save of step 6", "enospc@6", 6),
    ]:
        out = work / fault.replace("@", "_")
        res = train(out, data, {"CRITIC_PRETRAIN_FAULT": fault})
        finish(name, out, res.returncode, done)

    out = work / "retention"
    res = train(out, data, {"CRITIC_PRETRAIN_FAULT": "retention@6"}, **{"checkpoint.keep_last": 1})
    finish("kill -9 while retention deletes an old step (keep_last=1)", out, res.returncode, 6,
           **{"checkpoint.keep_last": 1})

    for name, sig in [("SIGTERM / SIGUSR1 (preemption) at step 5", "TERM"), ("Ctrl-C at step 5", "INT")]:
        out = work / f"signal_{sig}"
        res = train(out, data, {"CRITIC_PRETRAIN_SIGNAL_AT_STEP": "5", "CRITIC_PRETRAIN_SIGNAL": sig})
        finish(name, out, res.returncode, 5)

    # damaged newest checkpoint: a preempted run saved step 6, then something hit the file
    def damaged(name: str, damage) -> None:
        DAMAGE.add(name)
        out = work / name.split(":")[0].replace(" ", "_")
        res = train(out, data, {"CRITIC_PRETRAIN_SIGNAL_AT_STEP": "6"})
        assert res.returncode == 75, res.stderr[-2000:]
        damage(out / "step_6")
        finish(name, out, res.returncode, 6)

    p = ckpt.StepPaths
    damaged("truncated weights file", lambda s: os.truncate(p(s).weights, p(s).weights.stat().st_size // 2))
    damaged("same-size byte flip in the weights", lambda s: flip_byte(p(s).weights))
    damaged("same-size byte flip in the optimizer state",
            lambda s: flip_byte(next(f for f in p(s).optim_dir.iterdir() if f.suffix == ".distcp")))
    damaged("manifest deleted", lambda s: p(s).manifest.unlink())

    def plant(step: Path) -> None:
        (p(step).optim_dir / ".metadata").write_bytes(pickle.dumps(_Exec(work / "pickle_ran")))
        manifest = json.loads(p(step).manifest.read_text())
        manifest["files"] = ckpt.files_manifest(step)  # sizes and checksums made to match
        p(step).manifest.write_text(json.dumps(manifest))

    damaged("planted pickle in the optimizer metadata, checksums matching", plant)
    outcomes[-1].note = ("THE PICKLE RAN: " if (work / "pickle_ran").exists() else "nothing ran: ") + outcomes[-1].note

    # a second run on a busy output_dir
    out = work / "concurrent"
    lock = ckpt.lock_output_dir(out)  # stands in for a first run holding the folder
    res = train(out, data)
    lock.close()
    finish("second run started on a busy output_dir", out, res.returncode, 0,
           note="refused at once, naming the first run's pid; the first run is untouched")
    return outcomes


def markdown(outcomes: list[Outcome]) -> str:
    lines = ["| fault | faulted run exits | re-run resumes from | steps lost | final weights = uninterrupted run |",
             "|---|---:|---:|---:|---|"]
    for o in outcomes:
        resumed = "refused" if o.resumed_from is None else ("start" if o.resumed_from == 0 else
                                                            f"step {o.resumed_from}")
        exact = "n/a" if o.exact is None else ("bit-identical" if o.exact else "**differ**")
        lost = "n/a" if o.lost is None else str(o.lost)
        fe = "" if o.fault_exit is None else str(o.fault_exit)
        if o.scenario in DAMAGE:
            fe += " (then damaged)"
        lines.append(f"| {o.scenario} | {fe} | {resumed} | {lost} | {exact}"
                     + (f" ({o.note})" if o.note else "") + " |")
    return "\n".join(lines)


def toy_rollouts(folder: Path, n: int = 240, seed: int = 0) -> Path:
    """Multi-turn rollouts whose outcome shows in the first token (a tiny model learns it)."""
    import numpy as np

    from rollouts import write_rows
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        good = int(rng.integers(0, 2))
        ids = [1 + good] + rng.integers(8, 64, int(rng.integers(3, 8))).tolist()
        mask = [0] * len(ids)
        for _ in range(int(rng.integers(1, 4))):
            act = rng.integers(8, 64, int(rng.integers(2, 12))).tolist()
            ids, mask = ids + act, mask + [1] * len(act)
            if rng.random() < 0.6:
                tool = rng.integers(8, 64, int(rng.integers(1, 5))).tolist()
                ids, mask = ids + tool, mask + [0] * len(tool)
        rows.append({"input_ids": ids, "loss_mask": mask, "reward": float(good), "sample_id": f"r{i}",
                     "group_id": f"p{i // 4}"})
    write_rows(folder, rows, shard_rows=100)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the outcomes here")
    ap.add_argument("--work", help="keep the run folders here (default: a temporary folder)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        outcomes = run_matrix(toy_rollouts(work / "data"), work)
    print(f"# fault matrix: {STEPS} steps, a checkpoint every {SAVE_EVERY}, tiny Qwen2 on CPU "
          f"({time.perf_counter() - t0:.0f} s)\n")
    print(markdown(outcomes))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
