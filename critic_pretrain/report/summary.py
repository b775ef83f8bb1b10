"""What report.md states about a run: its best steps, where it plateaued, over-training and the checkpoint to pick."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..selection import best
from .runs import RunData

PLATEAU_TOL = 0.1
"""Plateau rule: the first evaluation whose metric is within this share of the run's total
improvement (first evaluation -> best) from the best. Over-training: the last evaluation is
worse than the best by more than the same share."""


def best_point(steps: np.ndarray, values: np.ndarray, metric: str = "val/loss") -> tuple[int, float] | None:
    """(step, value) of the best evaluation of ``metric`` (``selection.best``: earliest on ties)."""
    return best(zip(steps.tolist(), values.tolist()), metric)


def _oriented(values: np.ndarray, higher_is_better: bool) -> tuple[np.ndarray, float]:
    """(values as lower-is-better, total improvement from the first evaluation to the best)."""
    v = -values if higher_is_better else values
    return v, float(v[0] - v.min())


def plateau_step(steps: np.ndarray, values: np.ndarray, *, higher_is_better: bool = False,
                 tol: float = PLATEAU_TOL) -> int | None:
    """The first step whose value is within ``tol`` of the total improvement from the best.

    With L the metric (sign-flipped when higher is better), the plateau is the first
    evaluation s with ``L_s <= best + tol * (L_first - best)``. None when the metric never
    improved on its first evaluation (or there are fewer than 3 evaluations); the last step
    when it only got there at the end (still improving).
    """
    if len(values) < 3:
        return None
    v, gain = _oriented(values, higher_is_better)
    return int(steps[np.flatnonzero(v <= v.min() + tol * gain)[0]]) if gain > 0 else None


MIN_GAIN = 0.05
"""Over-training needs a run that learned: its best loss at least this share below its first. A
20-step run whose validation loss went 0.2955, 0.2901, 0.2992 moved by noise, and was told "prefer
step_10" (a new user's trial); the demo's best is 60% below its first."""


def regressed(values: np.ndarray, *, higher_is_better: bool = False, tol: float = PLATEAU_TOL,
              min_gain: float = MIN_GAIN) -> bool:
    """Whether the last evaluation is worse than the best by more than ``tol`` of the total
    improvement: the over-training signal (VC-PPO: pretraining too long hurts). Only for a run
    whose improvement was at least ``min_gain`` of its first value's size."""
    if len(values) < 3:
        return False
    v, gain = _oriented(values, higher_is_better)
    return gain > min_gain * abs(v[0]) and v[-1] > v.min() + tol * gain


@dataclass
class RunSummary:
    """The numbers ``report.md`` states about one run."""

    name: str
    last_step: int
    evaluations: int
    first: dict
    final: dict
    best_loss_record: dict
    best_ev_record: dict
    best_loss: tuple[int, float] | None
    best_ev: tuple[int, float] | None
    plateau_loss: int | None
    plateau_ev: int | None
    overtrained: bool
    checkpoints: list[int]
    pick: int | None
    calibration: dict | None
    audits: dict[str, dict] = field(default_factory=dict)
    """``step_<n>`` -> what ``critic-pretrain audit`` wrote for it (``<run>/eval/step_<n>-audit.json``)."""
    held_out: dict | None = None
    """What the run validated on (its config's data sources and split keys): runs compare only alike."""

    @property
    def prefer_earlier(self) -> bool:
        """Over-trained, and a saved step before the final evaluation has the lowest val loss."""
        return self.overtrained and self.pick is not None and self.pick < self.final["step"]


def pick_checkpoint(run: RunData) -> tuple[list[int], int | None]:
    """(saved steps, the one to pick): the lowest validation loss among saved steps that were
    evaluated at that very step; None when no saved step was."""
    from ..checkpoint import find_checkpoints  # torch import: only when checkpoints matter

    steps, loss = run.series("val/loss")
    saved = sorted(find_checkpoints(run.path))
    at = dict(zip(steps.tolist(), loss.tolist()))
    chosen = best(((s, at[s]) for s in saved if s in at), "val/loss")
    return saved, (chosen[0] if chosen else None)


def summarize_run(run: RunData, calibration: dict | None = None) -> RunSummary:
    """Best steps, plateaus and the checkpoint to pick (``pick_checkpoint``)."""
    steps, loss = run.series("val/loss")
    ev_steps, ev = run.series("val/explained_variance")
    saved, pick = pick_checkpoint(run)
    best_loss, best_ev = best_point(steps, loss), best_point(ev_steps, ev, "val/explained_variance")

    def val_record(step) -> dict:
        return run.record_at(int(step), "val/loss") if step is not None else {}

    return RunSummary(
        name=run.name, last_step=max(r["step"] for r in run.records), evaluations=len(steps),
        first=val_record(steps[0] if len(steps) else None), final=val_record(steps[-1] if len(steps) else None),
        best_loss_record=val_record(best_loss[0] if best_loss else None),
        best_ev_record=val_record(best_ev[0] if best_ev else None),
        best_loss=best_loss, best_ev=best_ev,
        plateau_loss=plateau_step(steps, loss), plateau_ev=plateau_step(ev_steps, ev, higher_is_better=True),
        overtrained=regressed(loss), checkpoints=saved, pick=pick,
        calibration=calibration, audits=read_audits(run.path), held_out=held_out_of(run.path))


HELD_OUT_KEYS = ("train", "sources", "val", "val_fraction", "val_split", "max_length", "overlong")


def held_out_of(run_dir) -> dict | None:
    """The data keys that decide a run's validation rollouts (from its config.yaml), or None."""
    import yaml
    try:
        data = (yaml.safe_load(Path(run_dir, "config.yaml").read_text()) or {}).get("data") or {}
    except (OSError, yaml.YAMLError):
        return None
    return {k: data.get(k) for k in HELD_OUT_KEYS}


def recipe_choice(summaries: list[RunSummary]) -> list[str]:
    """The oracle-free rule (docs/warm.md, *Choosing a recipe without an oracle*): among runs that
    validate on the same held-out rollouts, the highest final validation EV. On each synthetic
    environment it picks the exact values' recipe or one within a point (bench/recipes.md,
    *Choosing without an oracle*)."""
    scored = [s for s in summaries if s.final.get("val/explained_variance") is not None]
    if len(scored) < 2:
        return []
    if any(s.held_out is None or s.held_out != scored[0].held_out for s in scored):
        return ["Recipe choice: not made: these runs validate on different rollouts (data sources or split "
                "differ), so their validation EVs do not compare."]
    best = max(scored, key=lambda s: s.final["val/explained_variance"])
    ev = best.final["val/explained_variance"]
    others = ", ".join(f"{s.name} {_fmt(s.final['val/explained_variance'])}" for s in scored if s is not best)
    # The floor a critic must clear to have learned anything: a constant (EV 0) and the prompt-only
    # value (each rollout's leave-one-out group mean). Below it the "best" recipe is only the least bad.
    group = best.final.get("val/ev_group_mean")
    floor = max(0.0, group if group is not None and math.isfinite(group) else 0.0)
    if ev <= floor:
        beaten = "the prompt-only value" if floor else "a constant"
        return [f"Recipe choice: none: no run's final validation EV beats {beaten} "
                f"(best {best.name} {_fmt(ev)}; {others}; group-mean EV {_fmt(group)}). None of these critics learned "
                "more than a baseline PPO already has: train longer (more passes over the rollouts) or change the "
                "recipe before warm-starting (docs/warm.md, *Choosing a recipe without an oracle*)."]
    return [f"Recipe choice without an oracle: **{best.name}**, the highest final validation EV "
            f"({_fmt(ev)}; {others}) on the same held-out rollouts "
            "(the rule and how well it agrees with exact values: docs/warm.md, *Choosing a recipe without an oracle*)."]


def read_audits(run_dir) -> dict[str, dict]:
    """The audits of a run's checkpoints, by step folder name, in step order; unreadable files are
    skipped (a report is no place to fail over a stray file)."""
    out = {}
    for f in sorted(Path(run_dir, "eval").glob("step_*-audit.json"),
                    key=lambda f: int(f.name.split("-")[0].removeprefix("step_") or 0)):
        try:
            audit = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(audit, dict) and "lines" in audit:
            out[f.name.split("-")[0]] = audit
    return out


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


VAL_COLUMNS = (("val/loss", "val loss"), ("val/explained_variance", "val EV"), ("val/oracle_loss", "oracle loss"),
               ("val/oracle_explained_variance", "oracle EV"), ("val/calibration_error", "calib. error"),
               ("val/adv_corr_first_lam0.95", "adv. corr lam 0.95"), ("val/adv_corr_first_lam0", "adv. corr lam 0"))


def runs_markdown(summaries: list[RunSummary]) -> str:
    """``report.md``: a comparison table, then a few lines per run."""
    lines = ["# critic-pretrain report", "",
             "| run | steps | best val loss (step) | best val EV (step) | final val loss | final val EV | "
             "loss plateau at |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        bl = f"{_fmt(s.best_loss[1])} ({s.best_loss[0]})" if s.best_loss else "-"
        be = f"{_fmt(s.best_ev[1])} ({s.best_ev[0]})" if s.best_ev else "-"
        lines.append(f"| {s.name} | {s.last_step} | {bl} | {be} | {_fmt(s.final.get('val/loss'))} | "
                     f"{_fmt(s.final.get('val/explained_variance'))} | {_fmt(s.plateau_loss)} |")
    choice = recipe_choice(summaries)
    if choice:
        lines += ["", *choice]
    for s in summaries:
        lines += ["", f"## {s.name}", ""]
        if not s.evaluations:
            lines.append("No validation records (data.val_fraction=0 and no data.val?): only train curves.")
            continue
        cols = [(k, label) for k, label in VAL_COLUMNS if k in s.final]
        lines += ["| | step | " + " | ".join(label for _, label in cols) + " |", "|---|---|" + "---|" * len(cols)]
        rows = [("first evaluation", s.first), ("best val loss", s.best_loss_record),
                ("best val EV", s.best_ev_record), ("final", s.final)]
        for label, rec in rows:
            cells = " | ".join(_fmt(rec.get(k)) for k, _ in cols)
            lines.append(f"| {label} | {rec.get('step', '-')} | {cells} |")
        lines.append("")
        lines.append(f"- Plateau (first evaluation within {PLATEAU_TOL:.0%} of the total improvement from the best): "
                     f"val loss at step {_plateau_text(s.plateau_loss, s.final['step'])}, "
                     f"val EV at step {_plateau_text(s.plateau_ev, s.final['step'])}.")
        if s.overtrained:
            lines.append(f"- {overtraining_text(s)}")
        saved = ", ".join(f"step_{n}" for n in s.checkpoints) or "none"
        pick = (f"step_{s.pick} (lowest val loss among saved steps with an evaluation)" if s.pick is not None
                else "none of the saved steps has an evaluation at the same step")
        lines.append(f"- Checkpoints: {saved}; pick {pick}.")
        if s.calibration:
            m = s.calibration["metrics"]
            oracle = (f", against oracle values {_fmt(m.get('eval/oracle_calibration_error'))}"
                      if m.get("eval/oracle_calibration_error") is not None else "")
            lines.append(f"- Calibration of {Path(s.calibration['checkpoint']['path']).name} on "
                         f"{s.calibration['data']['split']}: mean |target - prediction| over prediction deciles "
                         f"{_fmt(m.get('eval/calibration_error'))}{oracle}.")
            from ..eval.advantage import advantage_markdown  # torch: only with an eval
            adv = advantage_markdown(s.calibration, "eval")
            if adv:
                lines += ["", f"### Advantages of {Path(s.calibration['checkpoint']['path']).name}", "", *adv]
        lines += ["", "### Should I use this seed?", "", *verdict_lines(s.calibration)]
        for name, audit in s.audits.items():
            lines += ["", f"### Audit of {name}: the critic against the policy's Monte-Carlo values", "",
                      *audit_lines(audit)]
    return "\n".join(lines) + "\n"


def overtraining_text(s: RunSummary) -> str | None:
    """The over-training sentence (``regressed``) with the checkpoint to prefer, or None: one text
    for report.md and the end of a training run, so the two never name different steps."""
    if not s.overtrained:
        return None
    return (f"Over-training: the final val loss ({_fmt(s.final.get('val/loss'))}) is above its best "
            f"({_fmt(s.best_loss[1])} at step {s.best_loss[0]}) by more than {PLATEAU_TOL:.0%} of the improvement; "
            + (f"prefer step_{s.pick}." if s.prefer_earlier else
               "no earlier checkpoint with an evaluation was kept: train again to "
               f"train.max_steps={s.best_loss[0]} in a new output_dir, or keep more (checkpoint.keep_last, "
               "checkpoint.save_every)."))


def audit_lines(audit: dict) -> list[str]:
    """What ``critic-pretrain audit`` found, with how it sampled."""
    st = audit.get("settings", {})
    how = (f"`{st.get('policy')}` sampled {st.get('samples')} continuation(s) from up to {st.get('cuts')} states "
           f"in each of {len(audit.get('rows', []))} held-out rollouts (temperature {st.get('temperature')}, "
           f"top-p {st.get('top_p')}, at most {st.get('max_new_tokens')} tokens, reward `{st.get('reward')}`) "
           f"with {audit.get('sampler')} in {audit.get('seconds', 0) / 60:.1f} min.")
    return [how, "", *(f"- {line.strip()}" for line in audit["lines"])]


def verdict_lines(evaluation: dict | None) -> list[str]:
    """The verdict on each held-out regime of the picked checkpoint (``eval.verdict``): the lines
    report.md ends with."""
    regimes = (evaluation or {}).get("regimes") or []
    if not regimes:
        return ["No verdict: the picked checkpoint was not evaluated (`report` without `--no-eval` evaluates it)."]
    name = Path(evaluation["checkpoint"]["path"]).name
    return [f"- {name} on {r['verdict']['line']}" for r in regimes] + [
        "", "How the verdict is reached and what each number means: docs/warm.md, *Should I use this seed?*"]


def _plateau_text(step: int | None, last_eval: int) -> str:
    if step is None:
        return "- (no improvement over the first evaluation, or fewer than 3 evaluations)"
    return f"{step} (still improving at the end)" if step == last_eval else str(step)
