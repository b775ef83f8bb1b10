"""Metrics: value-loss statistics from sufficient sums, and the run's ``metrics.jsonl``.

Explained variance over policy tokens: ``1 - Var(R - V) / Var(R)`` with R the value
target and V the prediction. Both variances come from running sums (count, sum, sum of
squares), so they add across micro-batches and ranks with one all-reduce.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

import torch

from rollouts import fileio

from .selection import lower_is_better

# Layout of the sums tensor: [n, Σw·(V−R)², ΣR, ΣR², Σ(R−V), Σ(R−V)²]
N_SUMS = 6


def token_terms(values: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[..., 6] float64 per-token terms of the sums below (tokens with weight 0 add nothing)."""
    valid = (weights > 0).to(torch.float64)
    r = targets.to(torch.float64)
    d = r - values.detach().to(torch.float64)
    return torch.stack([valid, weights.to(torch.float64) * d.square(), valid * r, valid * r.square(),
                        valid * d, valid * d.square()], dim=-1)


def value_sums(values: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[6] float64 sums over tokens with weight > 0 (device tensor: no host sync)."""
    return token_terms(values, targets, weights).reshape(-1, N_SUMS).sum(0)


def summarize(sums: torch.Tensor, prefix: str) -> dict[str, float]:
    """Loss and explained variance from (all-reduced) sums. Host sync: ``.tolist()``."""
    n, sq, r, r2, d, d2 = sums.tolist()
    if n <= 0:
        return {}
    var_r = r2 / n - (r / n) ** 2
    var_d = d2 / n - (d / n) ** 2
    out = {f"{prefix}/loss": sq / n, f"{prefix}/valid_tokens": n, f"{prefix}/target_mean": r / n,
           f"{prefix}/value_mean": (r - d) / n}
    out[f"{prefix}/explained_variance"] = 1.0 - var_d / var_r if var_r > 1e-12 else math.nan
    return out


class MetricsLog:
    """Append-only ``metrics.jsonl``; one JSON object per logged step, mirrored to the
    experiment trackers (``mirror``: ``accelerator.log``, see ``tracking.py``) with the same
    names and steps.

    A resumed run first drops lines logged after its checkpoint's step (the preempted run
    got further than its last save), so every step appears once.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int | None, enabled: bool = True,
                 mirror: Callable[..., None] | None = None):
        self.path = Path(path)
        self.enabled = enabled
        self.mirror = mirror
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and _step_of(line) <= resume_step]
            fileio.write_text(self.path, "".join(line + "\n" for line in kept))
        self._f = open(self.path, "a")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self._f.write(fileio.dumps(record) + "\n")  # NaN -> null, tensors -> numbers
        self._f.flush()
        if self.mirror is not None:
            scalars = {k: float(v) for k, v in record.items()
                       if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
            self.mirror(scalars, step=record["step"])

    def close(self) -> None:
        if self.enabled:
            self._f.close()


class StopRule:
    """``train.stop_when``: a threshold held for ``patience`` evaluations, or a plateau.

    ``update`` takes each validation record and returns why to stop, or None.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.mode = cfg.mode if cfg.mode != "auto" else ("min" if cfg.metric and lower_is_better(cfg.metric) else "max")
        self.best: float | None = None
        self.count = 0

    def replay(self, path: str | os.PathLike, upto: int) -> None:
        """Feed the rule the validation records a resumed run logged up to step ``upto``."""
        if Path(path).is_file():
            for rec in read_metrics(path):
                if rec.get("step", 1 << 62) <= upto and any(k.startswith("val/") for k in rec):
                    self.update(rec)

    def update(self, record: dict) -> str | None:
        c = self.cfg
        value = record.get(c.metric) if c.metric else None
        if value is None or not math.isfinite(value):
            return None
        if c.above is not None or c.below is not None:
            hit = value > c.above if c.above is not None else value < c.below
            self.count = self.count + 1 if hit else 0
            if self.count >= c.patience:
                bound = f"above {c.above:g}" if c.above is not None else f"below {c.below:g}"
                return f"{c.metric} {bound} for {_evaluations(c.patience)} in a row (now {value:.4g})"
            return None
        better = (self.best is None or (value < self.best - c.min_delta if self.mode == "min"
                                        else value > self.best + c.min_delta))
        if better:
            self.best, self.count = value, 0
            return None
        self.count += 1
        if self.count >= c.patience:
            return f"{c.metric} has not improved on {self.best:.4g} for {_evaluations(c.patience)} (plateau)"
        return None


class CollapseWatch:
    """A critic that learned and then collapsed to a near-constant value.

    Semi-gradient TD(lambda) (``targets.values_from: critic``) can collapse: a constant value is a
    fixed point of its own targets, so the training loss stays low while the values stop
    depending on the input (seen with a 1.1M-parameter critic at lr 3e-3, docs/LOG.md). The
    validation loss alone can miss it (a constant at the mean return is not far off on rollouts
    with little variance); the spread of the values cannot: ``val/value_std / val/target_std``
    falls from its peak to near 0. ``update`` returns what happened once the ratio, having
    reached ``LEARNED`` at an evaluation after step 0 with an EV of at least ``LEARNED_EV`` (the
    spread of a critic that learned something; a random head's spread at step 0 is not, and
    shrinking it towards the mean return is what early training does), drops below
    ``COLLAPSED``; None otherwise.
    """

    LEARNED = 0.2
    """The ratio a critic must have reached before a drop counts as a collapse (a fresh head
    starts near 0: that is not one)."""
    COLLAPSED = 0.05
    """Below this share of the targets' spread the values are close to one constant."""
    LEARNED_EV = 0.2
    """The validation EV at which a spread counts as learned (``OvertrainWatch.LEARNED``). The demo
    recipe evaluated every 20 steps had 21% of the spread at EV 0.048, dipped to 4.6% at step 40 and
    was stopped as collapsed (a trial); the same dip at the default eval.every recovers to 53% by
    step 100. Any EV above 0 had counted."""

    def __init__(self):
        self.peak, self.peak_step, self.peak_ev = 0.0, None, None

    def replay(self, path: str | os.PathLike, upto: int) -> None:
        """Feed the watch the validation records a resumed run logged up to step ``upto``."""
        if Path(path).is_file():
            for rec in read_metrics(path):
                if rec.get("step", 1 << 62) <= upto:
                    self.update(rec, rec.get("step", 0))

    def update(self, record: dict, step: int) -> str | None:
        std, spread = record.get("val/value_std"), record.get("val/target_std")
        if std is None or spread is None or not (math.isfinite(std) and spread > 1e-12):
            return None
        ratio = std / spread
        ev_now = record.get("val/explained_variance")
        learned = step > 0 and ev_now is not None and math.isfinite(ev_now) and ev_now >= self.LEARNED_EV
        if ratio > self.peak and learned:  # a random head's spread (step 0, EV near 0) is not learned
            self.peak, self.peak_step, self.peak_ev = ratio, step, ev_now
            return None
        if self.peak < self.LEARNED or ratio >= self.COLLAPSED:
            return None
        ev = record.get("val/explained_variance", math.nan)
        was = f", val EV {self.peak_ev:.3f}" if self.peak_ev is not None else ""
        return (f"the critic collapsed to a near-constant value at step {step}: val/value_std {std:.4g} is "
                f"{ratio:.1%} of the targets' spread {spread:.4g} (val EV {ev:.3f}); at step {self.peak_step} it "
                f"was {self.peak:.1%}{was}")


class OvertrainWatch(CollapseWatch):
    """A critic that learned and then lost it on the held-out rollouts: over-training, the strong form.

    A small archive trained for many passes is memorised: the training loss keeps falling while
    the validation EV falls from its best, below that of a constant (session seventeen: a 160k
    critic on 2,200 rollouts of 53 tokens, 41 passes, went from val EV 0.39 at step 250 to -0.05
    at step 1,200, and its advantages from 35% of the gap closed to -25%). The values keep their
    spread, so ``CollapseWatch`` does not see it. ``report``'s over-training flag (the last val loss
    above its best by 10% of the run's improvement, report/summary.py) is the mild form: read after
    the run, and raised on the demo itself, so it is no warning during training.

    ``update`` returns one line, once, when the validation EV has reached ``LEARNED`` at an
    evaluation after step 0 and then stays below ``FRACTION`` of that best for ``PATIENCE``
    evaluations in a row; None otherwise. Replayed over 80 runs on the synthetic archives
    (bench/recipe_envs.py's and the diagnostics of docs/LOG.md), it fires on the 4 short-archive runs
    and on 1 of twice the demo's schedule (undo, val EV 0.33 at step 600, 0.15 at step 2,150), and on
    none of 1,200 steps on the full-length archives."""

    LEARNED = 0.2
    """The validation EV a critic must have reached before a fall counts (noise around a plateau,
    EV ~0.1 early on, is not learning)."""
    FRACTION = 0.5
    """A fall below this share of the best EV counts."""
    PATIENCE = 3
    """Evaluations in a row below it (one low evaluation is noise)."""

    def __init__(self):  # replay is CollapseWatch's: a warning given before a resume is not repeated
        self.best, self.best_step, self.below, self.fired = -math.inf, None, 0, False

    def update(self, record: dict, step: int) -> str | None:
        ev = record.get("val/explained_variance")
        if step == 0 or ev is None or not math.isfinite(ev):
            return None
        if ev > self.best:
            self.best, self.best_step, self.below = ev, step, 0
            return None
        self.below = self.below + 1 if self.best >= self.LEARNED and ev < self.FRACTION * self.best else 0
        if self.below < self.PATIENCE or self.fired:
            return None
        self.fired = True
        return (f"over-training: the critic's val/explained_variance fell from {self.best:.3f} "
                f"at step {self.best_step} to {ev:.3f} at step {step}, below half its best for {self.PATIENCE} "
                "evaluations in a row (it memorises its training rollouts)")


def _evaluations(n: int) -> str:
    return f"{n} evaluation" + ("" if n == 1 else "s")


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except ValueError:
        return 1 << 62  # a torn last line from a crash: drop it


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a ``metrics.jsonl`` (skips a torn last line)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Progress: a bar in a terminal, log lines elsewhere

log = logging.getLogger("critic_pretrain.progress")


def progress(enabled: bool, start: int, total: int, *, every_s: float = 30.0, stream: TextIO | None = None):
    """Training progress with tqdm's interface (``update``, ``set_postfix``, ``close``).

    In a terminal: a tqdm bar. Without one (SLURM, ``> file``, CI), a bar would write a
    carriage-return redraw per update into the file, so ``LogProgress`` writes one log line
    every ``every_s`` seconds instead."""
    from tqdm.auto import tqdm

    stream = stream or sys.stderr
    if not enabled or stream.isatty():
        return tqdm(total=total, initial=start, desc="train", unit="step", disable=not enabled, dynamic_ncols=True,
                    file=stream)
    return LogProgress(start, total, every_s)


class LogProgress:
    """Progress as log lines: ``step 120/600 (20%)  loss=..  ev=..  tok_s=..  2.1 steps/s  ETA 3m48s``,
    at most one every ``every_s`` seconds, and a last one at ``close``."""

    def __init__(self, start: int, total: int, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.start = self.n = self.logged = start
        self.total, self.every_s, self.clock = total, every_s, clock
        self.t0 = self.last = clock()
        self.postfix: dict[str, str] = {}
        self.postfix_step = start
        """The step the postfix (the last train record) is from: a line between log steps says so."""

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last >= self.every_s:
            self._log()

    def set_postfix(self, **values: str) -> None:
        self.postfix.update(values)
        self.postfix_step = self.n

    def close(self) -> None:
        if self.n != self.logged:
            self._log()

    def line(self) -> str:
        now = self.clock()
        rate = (self.n - self.start) / max(now - self.t0, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else math.inf
        stale = [f"(logged at step {self.postfix_step})"] if self.postfix and self.postfix_step != self.n else []
        parts = [f"step {self.n}/{self.total} ({100 * self.n / max(self.total, 1):.0f}%)",
                 *(f"{k}={v}" for k, v in self.postfix.items()), *stale, f"{rate:.3g} steps/s",
                 f"ETA {_duration(eta)}" if self.n < self.total else "done"]
        return "  ".join(parts)

    def _log(self) -> None:
        log.info("%s", self.line())
        self.last, self.logged = self.clock(), self.n


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
