"""``critic-pretrain report RUN_DIR [RUN_DIR...]``: curves, calibration and a summary.

Writes into ``--out`` (default ``<first run>/report``):

- ``loss.png`` (train and validation value loss, oracle loss when known),
  ``explained_variance.png``, ``lr.png``, ``grad_norm.png``, ``tokens_per_s.png``,
  ``buckets.png`` (validation loss by position quartile and policy turn, first vs last
  evaluation), ``calibration.png`` and, with oracle values, ``advantage.png`` (advantage
  quality over training); several runs are overlaid, one colour per run. The EV plot draws
  the true values' EV (the ceiling) and the group mean's EV as levels when known;
- ``report.md``: per run the best step by validation loss and by explained variance, the
  final metrics, where it plateaued (``plateau_step``), an over-training warning and the
  checkpoint to pick; the same text is printed.

Calibration comes from evaluating the checkpoint the summary picks (lowest validation loss
among saved steps; the newest when no saved step was evaluated) on the run's validation
split (``evaluate.evaluate_checkpoint``, the same rows training validated on). The result
is cached as ``<run>/eval/step_<n>-val.json`` -- the file ``critic-pretrain eval STEP_DIR``
writes -- so a second report or the notebook does not run the model again; ``--no-eval``
skips it and ``--eval FILE.json`` adds calibration tables from other ``eval`` outputs
(e.g. rollouts of a newer policy).

Figures are ``matplotlib.figure.Figure`` objects built without pyplot (rendered by the Agg
canvas when saved), so the notebook can display the very same figures inline.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import yaml

from rollouts import fileio

from .errors import UserError, require
from .metrics import read_metrics
from .selection import best

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLATEAU_TOL = 0.1
"""Plateau rule: the first evaluation whose metric is within this share of the run's total
improvement (first evaluation -> best) from the best. Over-training: the last evaluation is
worse than the best by more than the same share."""


# ---------------------------------------------------------------------------------------------
# Loading

@dataclass
class RunData:
    """The records of one run's ``metrics.jsonl``."""

    path: Path
    name: str
    records: list[dict]
    kinds: tuple[str, str] = ("targets", "targets")
    """What the train and the validation curves are measured against (``TargetsConfig.kinds``)."""

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the records holding a finite ``key``, in step order."""
        pts = sorted((r["step"], r[key]) for r in self.records
                     if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]))
        return (np.array([p[0] for p in pts], dtype=np.int64), np.array([p[1] for p in pts], dtype=np.float64))

    def has(self, key: str) -> bool:
        return len(self.series(key)[0]) > 0

    def record_at(self, step: int, key: str) -> dict:
        """The record of ``step`` holding ``key`` (validation and train records are separate lines)."""
        return next((r for r in self.records if r.get("step") == step and key in r), {})


def load_run(run_dir: str | os.PathLike, name: str | None = None) -> RunData:
    """Read ``RUN_DIR/metrics.jsonl``; a missing or empty file is a one-line UserError."""
    path = Path(run_dir)
    f = path / "metrics.jsonl"
    if not path.is_dir():
        raise UserError(f"{run_dir}: no such run folder; pass the output_dir of a critic-pretrain run")
    if not f.is_file():
        raise UserError(f"{run_dir}: no metrics.jsonl (not a critic-pretrain run folder, or it has not logged yet)")
    records = [r for r in read_metrics(f) if isinstance(r, dict) and "step" in r]
    if not records:
        raise UserError(f"{f}: no records yet; wait for the first log step (train.log_every)")
    return RunData(path, name or path.resolve().name, records, _target_kinds(path))


def _target_kinds(run_dir: Path) -> tuple[str, str]:
    """From the run's config.yaml; generic words when it is missing or from another version."""
    from .config import TargetsConfig
    try:
        targets = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("targets") or {}
        return TargetsConfig(**targets).kinds()
    except (OSError, yaml.YAMLError, TypeError, AttributeError, UserError):
        return RunData.kinds


def load_metrics(run_dir):
    """A run's ``metrics.jsonl`` as a pandas DataFrame: one row per step (the train and the
    validation record of a step merged), sorted by step; a column per metric (NaN where a step
    did not log it). For notebooks: ``load_metrics("runs/x")[["step", "val/loss"]].dropna()``."""
    pd = require("pandas", "critic_pretrain.report.load_metrics")

    frame = pd.DataFrame(load_run(run_dir).records)
    return frame.groupby("step", as_index=False).first().sort_values("step").reset_index(drop=True)


def load_runs(run_dirs: list[str | os.PathLike]) -> list[RunData]:
    """Runs named by folder name, or by the path given when two folders share a name."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [load_run(d, name=(str(d) if names.count(n) > 1 else n)) for d, n in zip(run_dirs, names)]


# ---------------------------------------------------------------------------------------------
# Best step, plateau, over-training

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


def regressed(values: np.ndarray, *, higher_is_better: bool = False, tol: float = PLATEAU_TOL) -> bool:
    """Whether the last evaluation is worse than the best by more than ``tol`` of the total
    improvement: the over-training signal (VC-PPO: pretraining too long hurts)."""
    if len(values) < 3:
        return False
    v, gain = _oriented(values, higher_is_better)
    return gain > 0 and v[-1] > v.min() + tol * gain


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


def pick_checkpoint(run: RunData) -> tuple[list[int], int | None]:
    """(saved steps, the one to pick): the lowest validation loss among saved steps that were
    evaluated at that very step; None when no saved step was."""
    from .checkpoint import find_checkpoints  # torch import: only when checkpoints matter

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
        calibration=calibration)


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
            lines.append(f"- Over-training: the final val loss ({_fmt(s.final.get('val/loss'))}) is above its best "
                         f"({_fmt(s.best_loss[1])} at step {s.best_loss[0]}) by more than {PLATEAU_TOL:.0%} of the "
                         "improvement; prefer an earlier checkpoint.")
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
            from .eval.advantage import advantage_markdown  # torch: only with an eval
            adv = advantage_markdown(s.calibration, "eval")
            if adv:
                lines += ["", f"### Advantages of {Path(s.calibration['checkpoint']['path']).name}", "", *adv]
    return "\n".join(lines) + "\n"


def _plateau_text(step: int | None, last_eval: int) -> str:
    if step is None:
        return "- (no improvement over the first evaluation, or fewer than 3 evaluations)"
    return f"{step} (still improving at the end)" if step == last_eval else str(step)


# ---------------------------------------------------------------------------------------------
# Figures (matplotlib.figure.Figure: no pyplot state, saved with the Agg canvas)

def _figure(ncols: int = 1, width: float = 6.4):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width * ncols if ncols > 1 else width, 3.6), dpi=100, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def _color(i: int) -> str:
    return f"C{i % 10}"


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (the first points average what exists)."""
    if window <= 1 or len(values) < 3:
        return values
    c = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def _plot_series(ax, run: RunData, key: str, color: str, label: str, *, style: str = "-", marker: str | None = None,
                 smooth: bool = False) -> bool:
    steps, values = run.series(key)
    if not len(steps):
        return False
    if smooth and len(values) > 10:
        ax.plot(steps, values, style, color=color, alpha=0.25, linewidth=0.8)
        values = _smooth(values, max(len(values) // 20, 2))
    ax.plot(steps, values, style, color=color, marker=marker, markersize=4, label=label)
    return True


def _label(runs: list[RunData], run: RunData, what: str) -> str:
    return f"{run.name}: {what}" if len(runs) > 1 else what


def fig_metric(runs: list[RunData], lines: list[tuple[str, str, dict]], title: str, ylabel: str, *,
               logy: bool = False):
    """One axis; per run, one line per (metric key, legend text, plot options)."""
    fig, (ax,) = _figure()
    drawn = False
    for i, run in enumerate(runs):
        for key, what, opts in lines:
            drawn |= _plot_series(ax, run, key, _color(i), _label(runs, run, what), **opts)
    ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
    if logy and drawn:
        ax.set_yscale("log")
    if drawn:
        ax.legend(fontsize=8)
    return fig


def _curves(runs: list[RunData], metric: str) -> list[tuple[str, str, dict]]:
    """Train and validation curves of ``metric``, each named with what it is measured against
    (TD targets and Monte-Carlo returns give incomparable numbers), and the oracle's."""
    train, val = runs[0].kinds if len({r.kinds for r in runs}) == 1 else ("targets", "targets")
    return [(f"train/{metric}", f"train (vs {train})", {"smooth": True}),
            (f"val/{metric}", f"validation (vs {val})", {"marker": "o"}),
            (f"val/oracle_{metric}", "validation vs oracle values", {"marker": "s", "style": "--"})]


def fig_loss(runs: list[RunData]):
    return fig_metric(runs, _curves(runs, "loss"), "Value loss (mean squared error over policy tokens)", "loss",
                      logy=True)


def fig_explained_variance(runs: list[RunData]):
    fig = fig_metric(runs, _curves(runs, "explained_variance"), "Explained variance (1 = perfect, 0 = predicts the mean)", "explained variance")
    ax = fig.axes[0]
    for i, run in enumerate(runs):  # reference levels from the newest evaluation that has them
        for key, what, style in (("val/ev_oracle_values", "true values on the val targets (ceiling of validation)",
                                  ":"), ("val/ev_group_mean", "group mean return on the val targets", "-.")):
            steps, values = run.series(key)
            if len(steps):
                ax.axhline(values[-1], color=_color(i), linestyle=style, linewidth=1.0,
                           label=_label(runs, run, f"{what}: {values[-1]:.3f}"))
                ax.legend(fontsize=8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, -1.0), min(max(hi, 0.1), 1.0))  # early negative EVs would flatten the curve
    ax.axhline(0.0, color="k", linewidth=0.6)
    return fig


def fig_advantage(runs: list[RunData]):
    """Correlation of the critic's GAE advantages with the true ones at turn-first tokens, per
    lambda, against the group-mean-as-value control (rollouts with oracle values only)."""
    fig = fig_metric(runs, [("val/adv_corr_first_lam0.95", "critic, lam 0.95", {"marker": "o"}),
                            ("val/adv_corr_first_lam0", "critic, lam 0 (TD residual)", {"marker": "s", "style": "--"}),
                            ("val/adv_corr_first_lam0.95_group_mean", "group mean as value, lam 0.95",
                             {"style": ":"}),
                            ("val/adv_corr_first_grpo", "GRPO group baseline", {"style": "-."})],
                     "Advantage quality at turn-first tokens (corr. with the true advantages)", "correlation")
    fig.axes[0].axhline(0.0, color="k", linewidth=0.6)
    return fig


def fig_lr(runs: list[RunData]):
    return fig_metric(runs, [("train/lr", "learning rate", {})], "Learning rate", "lr")


def fig_grad_norm(runs: list[RunData]):
    return fig_metric(runs, [("train/grad_norm", "grad norm (before clipping)", {"smooth": True})],
                      "Gradient norm", "norm", logy=True)


def fig_tokens_per_s(runs: list[RunData]):
    return fig_metric(runs, [("train/tokens_per_s", "tokens/s (all ranks)", {"smooth": True})], "Throughput",
                      "tokens / s")


def fig_buckets(runs: list[RunData]):
    """Validation loss by position quartile and by policy turn: first (faint) vs last evaluation."""
    from .eval import POSITION_BUCKETS, TURN_BUCKETS

    fig, axes = _figure(2, width=4.2)
    for ax, (short, names, title) in zip(axes, (("pos_", POSITION_BUCKETS, "by position in the response"),
                                                ("turn_", TURN_BUCKETS, "by policy turn"))):
        for i, run in enumerate(runs):
            steps, _ = run.series("val/loss")
            if not len(steps):
                continue
            for step, alpha, when in ((steps[0], 0.35, "first"), (steps[-1], 1.0, "last")):
                rec = run.record_at(int(step), "val/loss")
                for prefix, style in (("val/loss_", "-o"), ("val/oracle_loss_", "--s")):
                    y = [rec.get(f"{prefix}{short}{n}") for n in names]
                    if any(v is not None for v in y):  # an empty bucket (e.g. no 4th turn) is a gap
                        y = [math.nan if v is None else v for v in y]
                        what = f"{'vs oracle, ' if 'oracle' in prefix else ''}{when} eval (step {step})"
                        ax.plot(range(len(names)), y, style, color=_color(i), alpha=alpha, markersize=4,
                                label=_label(runs, run, what))
        ax.set_xticks(range(len(names)), [n.replace("plus", "+") for n in names])
        ax.set(title=f"Validation loss {title}", ylabel="loss")
    axes[0].set_xlabel("quartile of the rollout's policy tokens")
    axes[1].set_xlabel("policy turn")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # one legend for both panels, below them: inside it would hide points
        fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=7)
        fig.set_figheight(3.6 + 0.18 * math.ceil(len(labels) / 2))
    return fig


def fig_calibration(tables: dict[str, dict]):
    """Mean target (and oracle value) per predicted-value decile; the diagonal is perfect.

    ``tables``: legend label -> ``critic-pretrain eval`` JSON (its ``calibration`` rows).
    """
    fig, (ax,) = _figure(width=4.8)
    lo, hi = math.inf, -math.inf
    for i, (label, ev) in enumerate(tables.items()):
        rows = ev["calibration"]
        x = [r["value_mean"] for r in rows]
        ax.plot(x, [r["target_mean"] for r in rows], "-o", color=_color(i), markersize=4, label=f"{label}: target")
        if rows and rows[0].get("oracle_mean") is not None:
            ax.plot(x, [r["oracle_mean"] for r in rows], "--s", color=_color(i), markersize=4, mfc="none",
                    label=f"{label}: oracle value")
        vals = x + [r["target_mean"] for r in rows]
        lo, hi = min(lo, *vals, math.inf), max(hi, *vals, -math.inf)
    if math.isfinite(lo):
        ax.plot([lo, hi], [lo, hi], color="k", linewidth=0.8, alpha=0.6, label="perfect")
        ax.legend(fontsize=7)
    ax.set(title="Calibration (predicted-value deciles)", xlabel="mean prediction", ylabel="mean target")
    return fig


CURVES: dict[str, Callable] = {"loss": fig_loss, "explained_variance": fig_explained_variance, "lr": fig_lr,
                               "grad_norm": fig_grad_norm, "tokens_per_s": fig_tokens_per_s,
                               "buckets": fig_buckets}


# ---------------------------------------------------------------------------------------------
# Calibration source

def run_calibration(run_dir: str | os.PathLike, step: int | None = None, *, compute: bool = True) -> dict | None:
    """The eval JSON of checkpoint ``step`` (default: the newest) on the run's validation split.

    Read from ``<run>/eval/step_<n>-val.json`` when that is newer than the checkpoint;
    otherwise (``compute``) evaluated now and cached there. None without a checkpoint or
    without a validation split (``data.val_fraction=0``, no ``data.val``).
    """
    from .checkpoint import StepPaths, find_checkpoints
    from .eval import default_out, evaluate_checkpoint, write_json

    found = find_checkpoints(run_dir)
    if not found:
        return None
    step_dir = found.get(step, found[max(found)])
    data = ((StepPaths(step_dir).read_config() or {}).get("data") or {})
    if not data.get("val") and not data.get("val_fraction"):  # nothing held out: no calibration to draw
        return None
    cache = default_out(step_dir, None)
    if cache.is_file() and cache.stat().st_mtime >= (step_dir / "critic_pretrain.json").stat().st_mtime:
        cached = json.loads(cache.read_text())
        if "advantages" in cached:  # older evals lack the advantage tables: evaluate again
            return cached
    if not compute:
        return None
    result = evaluate_checkpoint(step_dir)
    write_json(result, cache)
    return result


def run_calibrations(runs: list[RunData], *, evaluate: bool = True) -> dict[str, dict | None]:
    """Run name -> eval JSON of the checkpoint ``pick_checkpoint`` picks (else the newest) on
    the run's validation split; None for a run without checkpoints."""
    return {run.name: run_calibration(run.path, pick_checkpoint(run)[1], compute=evaluate) for run in runs}


def read_eval_json(path: str | os.PathLike) -> dict:
    """A ``critic-pretrain eval`` output, checked to hold a calibration table."""
    try:
        ev = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read it as JSON ({e}); "
                        "pass a file written by `critic-pretrain eval`") from None
    if not isinstance(ev, dict) or "calibration" not in ev:
        raise UserError(f"{path}: no calibration table; pass a file written by `critic-pretrain eval`")
    return ev


# ---------------------------------------------------------------------------------------------
# The report

def figures(runs: list[RunData], calibrations: dict[str, dict | None], extra: dict[str, dict] | None = None
            ) -> dict[str, "Figure"]:
    """Every figure of the report by file stem: the curves, then calibration when any table exists.

    ``extra``: more calibration tables (legend label -> eval JSON), e.g. other rollouts."""
    out = {name: make(runs) for name, make in CURVES.items()}
    if any(run.has("val/adv_corr_first_lam0.95") for run in runs):
        out["advantage"] = fig_advantage(runs)
    tables = {f"{name} {Path(ev['checkpoint']['path']).name}": ev for name, ev in calibrations.items() if ev}
    tables.update(extra or {})
    if tables:
        out["calibration"] = fig_calibration(tables)
    return out


def write_report(run_dirs: list[str | os.PathLike], out_dir: str | os.PathLike, *, evaluate: bool = True,
                 eval_jsons: list[str] = ()) -> tuple[list[Path], str]:
    """Write the PNGs and ``report.md`` to ``out_dir``; returns (files written, summary text)."""
    require("matplotlib", "critic-pretrain report (its PNG figures)")
    runs = load_runs(list(run_dirs))
    extra = {Path(p).stem: read_eval_json(p) for p in eval_jsons}
    calibrations = run_calibrations(runs, evaluate=evaluate)
    figs = figures(runs, calibrations, extra)
    text = runs_markdown([summarize_run(run, calibrations[run.name]) for run in runs])
    out = Path(out_dir)  # created only now: a refusal above leaves nothing behind
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figs.items():
        path = out / f"{name}.png"
        fig.savefig(path)
        written.append(path)
    images = "\n".join(f"![{p.stem}]({p.name})" for p in written)
    fileio.write_text(out / "report.md", f"{text}\n## Figures\n\n{images}\n")
    written.append(out / "report.md")
    return written, text
