"""The report's figures: ``matplotlib.figure.Figure`` objects built without pyplot state (saved
with the Agg canvas), so the notebook displays the very same ones."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from .runs import RunData

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
    fig = fig_metric(runs, _curves(runs, "explained_variance"),
                     "Explained variance (1 = perfect, 0 = predicts the mean)", "explained variance")
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
    from ..eval import POSITION_BUCKETS, TURN_BUCKETS

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
