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
  checkpoint to pick; the same text is printed;
- ``values.html`` (linked from report.md): a few held-out rollouts of the picked checkpoint token by
  token, each policy token coloured by its value or by its one-step advantage, with the return, the
  prompt-only value and, where ``critic-pretrain audit`` ran on that step, the policy's Monte-Carlo
  values at its cuts (``--page-rollouts N``, default 6; it runs the model, so not with ``--no-eval``).

Calibration comes from evaluating the checkpoint the summary picks (lowest validation loss
among saved steps; the newest when no saved step was evaluated) on the run's validation
split (``evaluate.evaluate_checkpoint``, the same rows training validated on). The result
is cached as ``<run>/eval/step_<n>-val.json`` -- the file ``critic-pretrain eval STEP_DIR``
writes -- so a second report or the notebook does not run the model again; ``--no-eval``
skips it and ``--eval FILE.json`` adds calibration tables from other ``eval`` outputs
(e.g. rollouts of a newer policy).

Figures are ``matplotlib.figure.Figure`` objects built without pyplot (rendered by the Agg
canvas when saved), so the notebook can display the very same figures inline.

One concern per module: ``runs`` (a run's records), ``summary`` (best steps, plateau,
over-training, the pick, report.md), ``figures``, ``calibration`` (the eval JSON a report
draws), ``values_page`` (the rollouts values.html shows) and ``values_html`` (the page itself);
``write_report`` here puts them together. The names below are the API.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollouts import fileio

from ..errors import require
from .calibration import read_eval_json, run_calibration, run_calibrations
from .figures import (
    CURVES,
    fig_advantage,
    fig_buckets,
    fig_calibration,
    fig_explained_variance,
    fig_grad_norm,
    fig_loss,
    fig_lr,
    fig_metric,
    fig_tokens_per_s,
    figures,
)
from .runs import RunData, load_metrics, load_run, load_runs
from .summary import (
    PLATEAU_TOL,
    RunSummary,
    best_point,
    pick_checkpoint,
    plateau_step,
    regressed,
    runs_markdown,
    summarize_run,
)
from .values_page import PAGE_ROLLOUTS, write_values_page

__all__ = ["CURVES", "PAGE_ROLLOUTS", "PLATEAU_TOL", "RunData", "RunSummary", "best_point", "fig_advantage",
           "fig_buckets", "fig_calibration", "fig_explained_variance", "fig_grad_norm", "fig_loss", "fig_lr",
           "fig_metric", "fig_tokens_per_s", "figures",
           "load_metrics", "load_run", "load_runs", "pick_checkpoint", "plateau_step", "read_eval_json", "regressed",
           "run_calibration", "run_calibrations", "runs_markdown", "summarize_run", "write_report", "write_values_page"]


def write_report(run_dirs: list[str | os.PathLike], out_dir: str | os.PathLike, *, evaluate: bool = True,
                 eval_jsons: list[str] = (), page_rollouts: int = PAGE_ROLLOUTS) -> tuple[list[Path], str]:
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
    pages = write_values_page(runs, out, rollouts=page_rollouts) if evaluate else []  # values.html: runs the model
    fileio.write_text(out / "report.md", f"{text}\n## Figures\n\n{images}\n" + "".join(
        f"\n[Values per token of held-out rollouts]({p.name})\n" for p in pages))
    written += [*pages, out / "report.md"]
    return written, text
