"""Choosing checkpoints: keep_best retention and the train.stop_when rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_overrides, train_main

from critic_pretrain import checkpoint as ckpt
from critic_pretrain.config import StopConfig
from critic_pretrain.metrics import StopRule, read_metrics


def fake_run(root: Path, losses: dict[int, float]) -> None:
    for step, loss in losses.items():
        d = root / f"step_{step}"
        d.mkdir(parents=True)
        (d / "training_info.json").write_text(json.dumps({"total_steps": step, "val:loss": loss,
                                                          "val:explained_variance": -loss}))
        (d / ckpt.MANIFEST).write_text(json.dumps(
            {"files": {"training_info.json": (d / "training_info.json").stat().st_size}}))


def test_keep_best_never_deletes_newest(tmp_path):
    fake_run(tmp_path, {10: 0.5, 20: 0.2, 30: 0.3, 40: 0.25, 50: 0.9})
    assert ckpt.best_steps(tmp_path, "val:loss", 2) == [20, 40]
    assert ckpt.best_steps(tmp_path, "val:explained_variance", 1) == [20]
    deleted = ckpt.apply_retention(tmp_path, None, protect=set(), keep_best=2)
    assert sorted(deleted) == [10, 30]
    assert sorted(ckpt.find_checkpoints(tmp_path)) == [20, 40, 50]  # 50 is worst but newest


def test_keep_last_and_best_combine(tmp_path):
    fake_run(tmp_path, {10: 0.1, 20: 0.5, 30: 0.4, 40: 0.6})
    ckpt.apply_retention(tmp_path, 1, protect={20}, keep_best=1)
    assert sorted(ckpt.find_checkpoints(tmp_path)) == [10, 20, 40]


@pytest.mark.parametrize("cfg, values, stop_at", [
    (StopConfig(metric="val/explained_variance", above=0.8, patience=2), [0.5, 0.85, 0.7, 0.82, 0.9, 0.95], 4),
    (StopConfig(metric="val/loss", below=0.1, patience=1), [0.5, 0.3, 0.09], 2),
    (StopConfig(metric="val/loss", patience=2), [1.0, 0.8, 0.81, 0.79, 0.8, 0.85], 5),
    (StopConfig(metric="val/loss", patience=2, min_delta=0.05), [1.0, 0.8, 0.78, 0.77], 3),
    (StopConfig(metric="val/explained_variance", patience=1), [0.1, 0.2, 0.2], 2),
    (StopConfig(metric=None), [0.1] * 10, None),
])
def test_stop_rule_on_scripted_metrics(cfg, values, stop_at):
    rule = StopRule(cfg)
    fired = [i for i, v in enumerate(values) if rule.update({cfg.metric or "val/loss": v})]
    assert (fired[0] if fired else None) == stop_at


def test_run_stops_early_and_rerun_has_nothing_to_do(toy_data, tmp_path):
    out = tmp_path / "run"
    extra = {"eval.every": 2, "train.max_steps": 20, "checkpoint.save_every": 0,
             "train.stop_when.metric": "val/loss", "train.stop_when.patience": 1, "train.stop_when.min_delta": 10}
    assert train_main(tiny_overrides(out, toy_data, **extra)) == 0
    assert sorted(ckpt.find_checkpoints(out)) == [2]  # step 0 sets the best; step 2 cannot beat it by 10
    state = json.loads((out / "step_2" / "resume" / "state.json").read_text())
    assert "has not improved" in state["progress"]["stopped_early"]
    assert state["progress"]["stopped_early"].endswith("for 1 evaluation (plateau)")  # not "1 evaluations"
    assert train_main(tiny_overrides(out, toy_data, **extra)) == 0  # same command: nothing to do
    assert sorted(ckpt.find_checkpoints(out)) == [2]
    assert max(r["step"] for r in read_metrics(out / "metrics.jsonl")) == 2
    assert (out / "tensorboard").is_dir() and list((out / "tensorboard").glob("events.*"))


def test_end_of_run_names_the_kept_best_step_when_it_is_not_the_newest(tmp_path):
    """With checkpoint.keep_best the end-of-run lines load the newest step and name the step the rule
    ranks first, with both values, when the two differ; nothing when the newest is the best."""
    from critic_pretrain.commands.train import best_kept_lines

    fake_run(tmp_path, {400: 0.12, 2300: 0.14, 2400: 0.145})
    (line,) = best_kept_lines(tmp_path, "val:loss", 2400)
    assert line.startswith("checkpoint.keep_best: step_400 has the best val:loss of the saved steps (0.12; "
                           "step_2400, the newest, which the lines above load: 0.145)")
    assert f"critic-pretrain seed check {tmp_path / 'step_400'}" in line
    assert best_kept_lines(tmp_path / "none", "val:loss", 2400) == []
    fake_run(tmp_path / "b", {100: 0.3, 200: 0.1})
    assert best_kept_lines(tmp_path / "b", "val:loss", 200) == []


def test_a_keep_best_run_ends_naming_the_step_the_rule_keeps(toy_data, tmp_path, capsys, monkeypatch):
    """End to end: a run with keep_best prints, after the newest step's lines, the step keep_best ranks
    first when that is not the newest. A 12-step run still improves at its end, so the rule's answer
    (tested above) is replaced by step 4 for the end-of-run lines; retention keeps every step here."""
    out = tmp_path / "run"
    monkeypatch.setattr(ckpt, "best_steps", lambda root, metric, k: [4])
    assert train_main(tiny_overrides(out, toy_data, **{"checkpoint.keep_best": 1, "checkpoint.keep_last": 5,
                                                       "eval.every": 4})) == 0
    printed = capsys.readouterr().out
    assert f"warm_start_value_checkpoint: {(out / 'step_12').resolve()}" in printed
    loss = {n: json.loads((out / f"step_{n}" / "training_info.json").read_text())["val:loss"] for n in (4, 12)}
    assert (f"checkpoint.keep_best: step_4 has the best val:loss of the saved steps ({loss[4]:.4g}; step_12, the "
            f"newest, which the lines above load: {loss[12]:.4g})") in printed


@pytest.mark.parametrize("over, says", [
    (["train.stop_when.metric=val_response/loss"], "train.stop_when.metric=val_response/loss: val_response metrics "
                                                   "are logged only with data.val_split=both (now prompt, whose "
                                                   "held-out set is logged as val/); use val/loss"),
    (["checkpoint.keep_best=1", "checkpoint.best_metric=val_response:loss", "data.val_split=response",
      "data.val_fraction=0.2"], "use val:loss or set data.val_split=both"),
    (["checkpoint.keep_best=1", "checkpoint.save_every=30", "eval.every=20"],
     "checkpoint.keep_best=1 ranks checkpoints by their own step's evaluation, but checkpoint.save_every=30 is not a "
     "multiple of eval.every=20"),
    (["checkpoint.keep_best=1", "checkpoint.save_every=30", "eval.every=0"], "eval.every=0 evaluates only the last"),
    (["train.stop_when.metric=loss"], "must be a validation metric such as val/loss (or val_response/loss"),
])
def test_selection_settings_that_cannot_work_are_refused_with_the_config(over, says):
    """Refused when the config is read, before any data or model: `val_response/` exists only with
    data.val_split=both (before: "must be a validation metric", wrongly), and keep_best cannot rank a
    checkpoint saved between evaluations (before: accepted without a word)."""
    from critic_pretrain.config_io import load_config
    from critic_pretrain.errors import UserError
    with pytest.raises(UserError) as e:
        load_config("configs/demo.yaml", over)
    assert says in str(e.value)


def test_the_response_regime_can_stop_a_run_and_rank_its_checkpoints(toy_data, tmp_path):
    """With data.val_split=both, stop_when and keep_best can follow PPO's regime (`val_response/`);
    retention ranks the saved steps by `val_response:loss` from their training_info.json."""
    from critic_pretrain.config_io import load_config
    load_config("configs/demo.yaml", ["data.val_split=both", "train.stop_when.metric=val_response/loss",
                                      "checkpoint.keep_best=1", "checkpoint.best_metric=val_response:loss"])
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{
        "data.val_split": "both", "data.val_fraction": 0.3, "eval.every": 2, "checkpoint.save_every": 2,
        "checkpoint.keep_best": 1, "checkpoint.best_metric": "val_response:loss", "checkpoint.keep_last": 1,
        "train.stop_when.metric": "val_response/loss", "train.stop_when.patience": 50})) == 0
    key = "val_response/loss"
    logged = {r["step"]: r[key] for r in read_metrics(out / "metrics.jsonl") if key in r}
    best = min((s for s in logged if s > 0), key=lambda s: (logged[s], s))
    assert sorted(ckpt.find_checkpoints(out)) == sorted({best, 12})


def test_a_checkpoint_carries_only_its_own_steps_evaluation(toy_data, tmp_path):
    """A step saved between evaluations carries no val: metrics. Before, step_2 carried step 0's
    evaluation and step_6 step 4's, as if they were their own: keep_best ranked a model by another
    model's loss, and `seed check` printed it as the seed's."""
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"checkpoint.save_every": 2, "eval.every": 4,
                                                       "train.max_steps": 8})) == 0
    info = {n: json.loads((out / f"step_{n}" / "training_info.json").read_text()) for n in (2, 4, 6, 8)}
    logged = {r["step"]: r["val/loss"] for r in read_metrics(out / "metrics.jsonl") if "val/loss" in r}
    assert sorted(logged) == [0, 4, 8]
    assert [n for n in info if any(k.startswith("val") for k in info[n])] == [4, 8]
    assert info[4]["val:loss"] == logged[4] and info[8]["val:loss"] == logged[8]
