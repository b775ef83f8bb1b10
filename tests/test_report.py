"""`critic-pretrain report`: plateau rule, summary, PNGs, overlays and one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_evaluate import tiny_run

from critic_pretrain import cli, report

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CURVES = ("loss", "explained_variance", "lr", "grad_norm", "tokens_per_s", "buckets")
# Validation loss every 10 steps: best 0.20 at step 70, then rising (over-training).
VAL_LOSS = [1.0, 0.6, 0.4, 0.3, 0.25, 0.22, 0.21, 0.20, 0.22, 0.26, 0.30]


def synthetic_run(root: Path, name: str = "synthetic") -> Path:
    """A metrics.jsonl shaped like train.py's, with known best step and plateau."""
    run = root / name
    run.mkdir(parents=True)
    lines = []
    for step in range(0, 101):
        if step:
            lines.append({"step": step, "train/loss": 1.0 / (1 + 0.05 * step), "train/explained_variance": 0.01 * step,
                          "train/lr": 1e-3, "train/grad_norm": 2.0 / step, "train/tokens_per_s": 1000.0 + step,
                          "train/valid_tokens": 100.0})
        if step % 10 == 0:
            loss = VAL_LOSS[step // 10]
            rec = {"step": step, "val/loss": loss, "val/explained_variance": 1.0 - loss, "val/valid_tokens": 50.0,
                   "val/calibration_error": loss / 10}
            rec.update({f"val/loss_pos_{q}": loss * (1 + i / 10) for i, q in enumerate(("q1", "q2", "q3", "q4"))})
            rec.update({f"val/loss_turn_{t}": loss for t in ("1", "2", "3")}, **{"val/loss_turn_4plus": None})
            lines.append(rec)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 10')  # torn line
    return run


def test_plateau_best_and_overtraining_rules():
    steps, loss = np.arange(0, 110, 10), np.array(VAL_LOSS)
    assert report.best_point(steps, loss) == (70, 0.20)
    # threshold: 0.20 + 0.1 * (1.0 - 0.20) = 0.28 -> first reached at step 40 (0.25)
    assert report.plateau_step(steps, loss) == 40
    assert report.regressed(loss)                                     # 0.30 > 0.28
    assert not report.regressed(loss[:9])                             # ends at 0.22
    assert report.plateau_step(steps, 1 - loss, higher_is_better=True) == 40
    assert report.plateau_step(steps[:3], np.array([1.0, 0.5, 0.1])) == 20   # still improving: the last step
    assert report.plateau_step(steps[:3], np.array([1.0, 1.2, 1.1])) is None  # never improved
    assert report.plateau_step(steps[:2], np.array([1.0, 0.5])) is None       # too few evaluations


def test_report_on_synthetic_metrics(tmp_path, capsys):
    run = synthetic_run(tmp_path)
    out = tmp_path / "rep"
    assert cli.main(["report", str(run), "--out", str(out), "--no-eval"]) == 0
    printed = capsys.readouterr().out
    for name in CURVES:
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    assert not (out / "calibration.png").exists()  # no checkpoint, no eval JSON
    text, figures = (out / "report.md").read_text().split("\n## Figures\n")
    assert text in printed  # report.md is the printed summary plus the figures it links
    assert all(f"![{name}]({name}.png)" in figures for name in CURVES)
    assert "| synthetic | 100 | 0.2 (70) | 0.8 (70) | 0.3 | 0.7 | 40 |" in text
    assert "| best val loss | 70 | 0.2 | 0.8 | 0.02 |" in text
    assert "val loss at step 40" in text and "Over-training" in text
    assert "Checkpoints: none" in text
    assert "no earlier checkpoint with an evaluation was kept: train again to train.max_steps=70" in text


def test_overtraining_names_the_earlier_saved_step(tmp_path, monkeypatch):
    """With step_70 (the best val loss) kept next to step_100, report.md points at it."""
    from critic_pretrain import checkpoint
    run = synthetic_run(tmp_path)
    monkeypatch.setattr(checkpoint, "find_checkpoints", lambda path: {70: run / "step_70", 100: run / "step_100"})
    _, text = report.write_report([run], tmp_path / "rep", evaluate=False)
    assert "Over-training" in text and "prefer step_70." in text


def test_end_of_training_names_the_step_the_report_prefers(tmp_path, monkeypatch):
    """The end-of-run lines load the newest step; when the report's over-training rule prefers
    another, they say so in the report's own words (the demo's paste block named step_1200 while
    its report said "prefer step_1100"), and say nothing when the rule does not fire."""
    from critic_pretrain import checkpoint
    from critic_pretrain.commands.train import overtraining_lines
    run = synthetic_run(tmp_path)
    monkeypatch.setattr(checkpoint, "find_checkpoints", lambda path: {70: run / "step_70", 100: run / "step_100"})
    _, text = report.write_report([run], tmp_path / "rep", evaluate=False)
    (said,) = [line.removeprefix("- ") for line in text.splitlines() if line.startswith("- Over-training")]
    (line,) = overtraining_lines(run)
    assert line.startswith(f"report: {said} `critic-pretrain seed check {run / 'step_70'}` prints its lines")
    monkeypatch.setattr(checkpoint, "find_checkpoints", lambda path: {100: run / "step_100"})
    (line,) = overtraining_lines(run)  # nothing earlier kept: the report's advice to train again, no command
    assert "train again to train.max_steps=70" in line and "seed check" not in line
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(x for x in lines if '"step": 100' not in x) + "\n")
    assert overtraining_lines(run) == []  # ends at 0.26 < 0.28: not over-trained


def test_report_overlays_runs_and_extra_calibration(tmp_path):
    a, b = synthetic_run(tmp_path / "a"), synthetic_run(tmp_path / "b")   # same folder name: named by path
    ev = tmp_path / "newer-policy.json"
    ev.write_text(json.dumps({"checkpoint": {"path": "/x/step_5"}, "calibration": [
        {"lo": None, "hi": 0.5, "tokens": 3, "value_mean": 0.2, "target_mean": 0.3, "oracle_mean": 0.25},
        {"lo": 0.5, "hi": None, "tokens": 3, "value_mean": 0.7, "target_mean": 0.6, "oracle_mean": 0.65}]}))
    written, text = report.write_report([a, b], tmp_path / "rep", evaluate=False, eval_jsons=[str(ev)])
    assert (tmp_path / "rep" / "calibration.png").stat().st_size > 5000
    assert f"| {a} |" in text and f"| {b} |" in text
    runs = report.load_runs([a, b])
    fig = report.fig_loss(runs)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert f"{a}: validation (vs targets)" in labels and f"{b}: validation (vs targets)" in labels  # no config.yaml


def test_curves_name_what_they_are_measured_against(tmp_path):
    """With targets from the critic's own values, train loss/EV are against TD targets and the
    validation against Monte-Carlo returns (train EV 0.98 vs validation 0.54 in the demo): the
    legend says so."""
    run = synthetic_run(tmp_path / "td")
    (run / "config.yaml").write_text("targets: {gamma: 1.0, lam: 0.8, values_from: critic}\n")
    for fig in (report.fig_loss(report.load_runs([run])), report.fig_explained_variance(report.load_runs([run]))):
        labels = fig.axes[0].get_legend_handles_labels()[1]
        assert "train (vs TD(0.8) of its own values)" in labels and "validation (vs Monte-Carlo returns)" in labels


def test_report_without_validation_records(tmp_path):
    run = tmp_path / "noval"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 1.0 / s, "train/lr": 1e-3})
                                               + "\n" for s in range(1, 20)))
    written, text = report.write_report([run], tmp_path / "rep", evaluate=False)
    assert (tmp_path / "rep" / "loss.png").stat().st_size > 5000
    assert "No validation records" in text and "| noval | 19 | - | - | - | - | - |" in text


def test_report_on_a_real_run(tmp_path_factory, toy_data, tmp_path, capsys):
    run = tiny_run(tmp_path_factory, toy_data)
    out = tmp_path / "rep"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    for name in (*CURVES, "calibration"):
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    text = (out / "report.md").read_text()
    best = report.best_point(*report.load_run(run).series("val/loss"))
    assert f"best val loss | {best[0]} |" in text
    saved, pick = report.pick_checkpoint(report.load_run(run))
    assert saved == [4, 8] and f"Checkpoints: step_4, step_8; pick step_{pick} " in text
    assert f"Calibration of step_{pick} on validation split of the run" in text
    assert (run / "eval" / f"step_{pick}-val.json").is_file()
    assert "[Values per token of held-out rollouts](values.html)" in text   # no tokenizer: token ids
    assert (out / "values.html").read_text().count('<div class="rollout">') == report.PAGE_ROLLOUTS


def test_report_on_a_read_only_run(tmp_path_factory, toy_data, tmp_path, caplog, monkeypatch):
    """A run folder that cannot be written (a teammate's, a read-only mount): the report is written
    to --out with the evaluation it computed, and a warning says it was not cached. Before: "cannot
    write .../eval/step_8-val.json; pass --out FILE.json", a flag report does not have for that."""
    from rollouts import fileio
    run = tiny_run(tmp_path_factory, toy_data)
    shutil.rmtree(run / "eval", ignore_errors=True)
    real = fileio.write_json

    def read_only(path, obj, **kw):
        if Path(path).is_relative_to(run):
            raise OSError(30, "Read-only file system", str(path))
        return real(path, obj, **kw)
    monkeypatch.setattr(fileio, "write_json", read_only)
    with caplog.at_level("WARNING", logger="critic_pretrain.report.calibration"):
        assert cli.main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert "Calibration of step_" in (tmp_path / "rep" / "report.md").read_text()
    err = " ".join(r.getMessage() for r in caplog.records)
    assert "Read-only file system" in err and "the report goes on without caching it there" in err
    assert not (run / "eval").exists() or not list((run / "eval").glob("*.json"))


@pytest.mark.parametrize("case", ["missing", "no_metrics", "empty", "bad_eval_json"])
def test_report_errors_are_one_line(tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    (tmp_path / "bare").mkdir()
    run = synthetic_run(tmp_path)
    (tmp_path / "x.json").write_text("{}")
    argv = {"missing": [str(tmp_path / "nope")], "no_metrics": [str(tmp_path / "bare")],
            "empty": [str(tmp_path / "empty")], "bad_eval_json": [str(run), "--eval", str(tmp_path / "x.json")]}[case]
    assert cli.main(["report", *argv, "--no-eval", "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert {"missing": "no such run folder", "no_metrics": "no metrics.jsonl", "empty": "no records yet",
            "bad_eval_json": "no calibration table"}[case] in err


def test_load_metrics_is_one_row_per_step(tmp_path):
    """critic_pretrain.report.load_metrics: train and validation records of a step merged; NaN elsewhere."""
    import math

    from critic_pretrain.report import load_metrics

    lines = [{"step": 0, "val/loss": 0.3}, {"step": 1, "train/loss": 0.5}, {"step": 2, "train/loss": 0.4},
             {"step": 2, "val/loss": 0.2, "val/explained_variance": 0.1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    df = load_metrics(tmp_path)
    assert df["step"].tolist() == [0, 1, 2]
    assert df.loc[2, "train/loss"] == 0.4 and df.loc[2, "val/loss"] == 0.2 and math.isnan(df.loc[1, "val/loss"])
    assert df[["step", "val/loss"]].dropna()["step"].tolist() == [0, 2]


def test_report_picks_a_recipe_by_validation_ev_among_alike_runs(toy_data, tmp_path):
    """Several runs on the same held-out rollouts: report.md names the highest final val EV (the
    oracle-free rule of docs/warm.md); runs validated on other rollouts are not compared."""
    from conftest import tiny_overrides, train_main

    from critic_pretrain.report import write_report
    runs = {"learns": {"train.max_steps": 30, "eval.every": 10},
            "frozen": {"train.max_steps": 2, "optim.lr": 1e-30, "optim.warmup_steps": 0, "eval.every": 1}}
    for name, extra in runs.items():
        assert train_main(tiny_overrides(tmp_path / name, toy_data, **extra)) == 0
    _, text = write_report([tmp_path / "learns", tmp_path / "frozen"], tmp_path / "r", evaluate=False)
    assert "Recipe choice without an oracle: **learns**" in text
    assert train_main(tiny_overrides(tmp_path / "other", toy_data, **{"data.val_fraction": 0.3, "eval.every": 2,
                                                                      "train.max_steps": 2})) == 0
    _, text = write_report([tmp_path / "learns", tmp_path / "other"], tmp_path / "r2", evaluate=False)
    assert "Recipe choice: not made: these runs validate on different rollouts" in text


def test_report_picks_no_recipe_when_none_beats_a_baseline(toy_data, tmp_path):
    """Every candidate at its random init (nothing learned): the rule must not crown the least bad one."""
    from conftest import tiny_overrides, train_main

    from critic_pretrain.report import write_report
    frozen = {"train.max_steps": 2, "optim.lr": 1e-30, "optim.warmup_steps": 0, "eval.every": 1}
    for name, seed in (("a", 0), ("b", 1)):
        assert train_main(tiny_overrides(tmp_path / name, toy_data, seed=seed, **frozen)) == 0
    _, text = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "r", evaluate=False)
    assert "Recipe choice: none: no run's final validation EV beats" in text
    assert "Recipe choice without an oracle" not in text


def test_a_run_that_never_learned_is_not_called_over_trained():
    """A 20-step run (a new user's trial): validation loss 0.2955, 0.2901, 0.2992 is noise around
    the untrained model, not over-training; the demo-like curve still is."""
    assert not report.regressed(np.array([0.2955, 0.2901, 0.2992]))
    assert report.regressed(np.array(VAL_LOSS))
    assert report.regressed(np.array([0.2955, 0.1181, 0.1391]))  # the demo's first, best and last
