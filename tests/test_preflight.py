"""preflight.py and the checks around it: runs that would succeed over nothing stop, in one line.

- no policy token left after truncation (a window shorter than the prompts), NaN losses;
- an empty validation split, features that need one, metric names with typos;
- the seed check fails a seed whose validation loss is NaN;
- a resume or eval whose split moved.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_overrides, toy_rows, train_main

from critic_pretrain import checkpoint as ckpt
from critic_pretrain.data import split_by_group


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Nothing to train on

def test_no_policy_token_after_truncation_stops_before_step_1(toy_data, tmp_path, capsys):
    """The issue's repro: data.max_tokens=4 cuts every rollout to prompt tokens (before: loss=nan,
    grad_norm 0.0, "OK ... valid critic seed", exit 0)."""
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"data.max_tokens": 4, "train.max_steps": 2})) == 2
    line = one_error(capsys)
    assert "0 of" in line and "keep a policy token after truncation to max_length=4" in line
    assert "raise data.max_tokens" in line
    assert not list(out.glob("step_*"))


def test_a_refused_fresh_start_leaves_no_folder_that_looks_like_a_run(toy_data, tmp_path, capsys):
    """A start refused before step 0 left `config.yaml` and `.lock` in a folder it had created.
    It removes the folder it made; a folder that existed, or one holding a prepared data_cache
    the fixed re-run reuses, stays as it was."""
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, tmp_path / "nope")) == 2
    assert "no such file or folder" in one_error(capsys) and not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert train_main(tiny_overrides(out, tmp_path / "nope")) == 2
    assert sorted(p.name for p in out.iterdir()) == [".lock", "config.yaml", "notes.txt"]
    capsys.readouterr()
    out = tmp_path / "run2"  # refused after the data was prepared: the cache is kept
    assert train_main(tiny_overrides(out, toy_data, **{"train.grad_accum": 500})) == 2
    assert "not enough training data for one optimizer step" in one_error(capsys)
    assert (out / "data_cache").is_dir()


def test_remove_unstarted_never_takes_another_processs_lock(tmp_path):
    from critic_pretrain.checkpoint import LOCK, remove_unstarted
    (tmp_path / "config.yaml").write_text("x: 1\n")
    (tmp_path / LOCK).write_text("pid 1 on elsewhere since 2026-12-07 21:00:00\n")
    assert not remove_unstarted(tmp_path) and (tmp_path / LOCK).exists()


@pytest.mark.parametrize("extra, lever", [
    ({"train.grad_accum": 8}, "lower data.max_tokens or train.grad_accum"),
    ({"train.rollouts_per_step": 40}, "lower train.rollouts_per_step (now 40, which set train.grad_accum="),
])
def test_too_few_rollouts_for_one_step_name_the_lever_that_works(tmp_path, capsys, extra, lever):
    """With rollouts_per_step set, grad_accum and max_tokens are not what sizes the step: the
    line names rollouts_per_step (it once said "lower data.max_tokens or train.grad_accum", and
    neither helped)."""
    from rollouts import write_rows
    write_rows(tmp_path / "data", toy_rows(12, seed=5))
    out = tmp_path / "run"
    over = tiny_overrides(out, tmp_path / "data", **{"data.val_fraction": 0, "train.max_steps": 2, **extra})
    assert train_main(over) == 2
    line = one_error(capsys)
    assert "not enough training data for one optimizer step: 12 training rollouts do not fill" in line
    assert lever in line and line.endswith("or add rollouts")
    assert not list(out.glob("step_*"))


def data_line(capfd) -> str:
    """The start-up ``data:`` line (logging goes to stderr)."""
    return next(line.split(" INFO ", 1)[1] for line in capfd.readouterr().err.splitlines() if " INFO data: " in line)


def test_rollouts_without_policy_tokens_are_left_out_and_counted(tmp_path, capfd):
    """A minority with a prompt longer than the window trains without them; the data line says so."""
    from rollouts import write_rows
    rows = toy_rows(60, seed=3)
    for r in rows[:15]:  # a 40-token prompt: nothing of the response fits into max_length=32
        r["input_ids"] = [5] * 40 + r["input_ids"]
        r["loss_mask"] = [0] * 40 + r["loss_mask"]
    write_rows(tmp_path / "data", rows)
    over = tiny_overrides(tmp_path / "run", tmp_path / "data", **{"data.max_tokens": 64, "data.max_length": 32,
                                                                  "train.max_steps": 2, "data.val_fraction": 0})
    assert train_main(over) == 0
    line = data_line(capfd)
    assert "45 training rollouts" in line and "left out: 15 with no policy token within max_length" in line
    assert ckpt.Manifest.read(tmp_path / "run" / "step_2").split[0] == 45


def test_a_diverged_loss_stops_the_run_and_saves_nothing_after_it(toy_data, tmp_path, capsys):
    out = tmp_path / "run"
    over = tiny_overrides(out, toy_data, **{"optim.lr": 1e20, "optim.warmup_steps": 0, "train.grad_clip": "null",
                                            "train.max_steps": 6, "checkpoint.save_every": 1, "train.log_every": 3})
    assert train_main(over) == 2
    line = one_error(capsys)
    assert "became NaN or inf" in line and "lower optim.lr" in line, line
    for step in ckpt.find_checkpoints(out).values():  # whatever was saved holds finite weights
        from safetensors.torch import load_file
        weights = load_file(ckpt.StepPaths(step).weights)
        assert all(np.isfinite(t.float().numpy()).all() for t in weights.values()), step


def test_seed_check_fails_a_seed_whose_validation_loss_is_nan(toy_data, tmp_path):
    from critic_pretrain.interop.check import check_seed
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "checkpoint.save_every": 2,
                                                        "eval.every": 2})) == 0
    step = out / "step_2"
    assert check_seed(step).ok
    paths = ckpt.StepPaths(step)
    info = json.loads(paths.training_info.read_text())
    info["val:loss"] = None  # what a NaN loss becomes in JSON
    paths.training_info.write_text(json.dumps(info))
    manifest = json.loads(paths.manifest.read_text())  # keep the checksums right: only the metric is wrong
    manifest["files"]["training_info.json"] = {"size": paths.training_info.stat().st_size,
                                               ckpt.CHECKSUM: ckpt.file_checksum(paths.training_info)}
    paths.manifest.write_text(json.dumps(manifest))
    report = check_seed(step)
    assert not report.ok and any("val:loss is None (NaN)" in p.message for p in report.problems), report.problems


# ---------------------------------------------------------------------------------------------
# Validation

@pytest.mark.parametrize("keys, fraction, val_groups", [
    (["a", "b", "c"], 0.1, 1),      # the hash held out none: the smallest hash is held out
    (["a", "b", "c"], 0.5, None),   # as hashed (at least one each side)
    (["a", "b"], 0.99, 1),          # the hash held out all: the largest stays in training
    ([f"p{i}" for i in range(32)], 0.02, None),
])
def test_split_holds_out_at_least_one_group_and_keeps_one(keys, fraction, val_groups):
    rows = [k for k in keys for _ in range(4)]
    train, val = split_by_group(rows, fraction)
    held, kept = {rows[i] for i in val}, {rows[i] for i in train}
    assert held and kept and not held & kept
    if val_groups is not None:
        assert len(held) == val_groups
    assert split_by_group(rows, fraction)[1].tolist() == val.tolist()  # stable
    assert len(split_by_group(rows, 0.0)[1]) == 0


def test_one_group_cannot_be_split(tmp_path, capsys):
    from rollouts import write_rows
    rows = toy_rows(12, seed=5)
    for r in rows:
        r["group_id"] = "only"
    write_rows(tmp_path / "data", rows)
    assert train_main(tiny_overrides(tmp_path / "run", tmp_path / "data", **{"train.max_steps": 2})) == 2
    line = one_error(capsys)
    assert "share one group ('only')" in line and "data.val_fraction=0" in line


@pytest.mark.parametrize("extra, says", [
    ({"checkpoint.keep_best": 2, "eval.every": 4},
     "checkpoint.keep_best=2 keeps the best checkpoints by val:loss, but there is no validation split"),
    ({"train.stop_when.metric": "val/loss"}, "train.stop_when.metric=val/loss stops on a validation metric, but "
                                             "there is no validation split"),
])
def test_features_that_need_validation_refuse_without_it(toy_data, tmp_path, capsys, extra, says):
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"data.val_fraction": 0, **extra})) == 2
    assert says in one_error(capsys)
    assert not list(out.glob("step_*"))


@pytest.mark.parametrize("extra, says", [
    ({"train.stop_when.metric": "val/los"}, "train.stop_when.metric=val/los: this run logs no such validation "
                                            "metric; did you mean val/loss?"),
    ({"checkpoint.keep_best": 1, "checkpoint.best_metric": "val:explained_varianc", "eval.every": 4},
     "did you mean val:explained_variance?"),
])
def test_metric_names_are_checked_before_step_1(toy_data, tmp_path, capsys, extra, says):
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **extra)) == 2
    assert says in one_error(capsys)
    assert not list(out.glob("step_*"))


def test_metric_names_are_checked_on_resume_from_the_logged_metrics(toy_data, tmp_path, capsys):
    out = tmp_path / "run"
    over = tiny_overrides(out, toy_data, **{"train.max_steps": 2, "checkpoint.save_every": 2})
    assert train_main(over) == 0
    capsys.readouterr()
    assert train_main(over + ["train.max_steps=4", "train.stop_when.metric=val/explaind_variance",
                              "train.allow_config_changes=[train.max_steps]"]) == 2
    assert "did you mean val/explained_variance?" in one_error(capsys)


def test_held_out_returns_that_do_not_vary_are_named_at_step_0(toy_data, tmp_path, capfd):
    """Held-out prompts whose responses all succeed: their EV is 0/0. The run said
    `val/explained_variance=nan` at every evaluation and nothing said why (a new user's trial)."""
    from rollouts import write_rows
    rows = toy_rows(32, seed=7)  # 4 prompts of 8, every one solved (a reward filter makes this easy)
    write_rows(tmp_path / "val", [{**r, "reward": 1.0, "group_id": f"p{i // 8}"} for i, r in enumerate(rows)])
    for val, warned in ((tmp_path / "val", True), (None, False)):  # and not on the usual split
        out = tmp_path / f"run-{warned}"
        extra = {"data.val": f"[{val}]"} if val else {}
        capfd.readouterr()
        assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "eval.every": 1, **extra})) == 0
        said = [line.split(" WARNING ", 1)[1] for line in capfd.readouterr().err.splitlines()
                if "explained_variance is nan" in line]
        assert said == ([("val/explained_variance is nan: the 32 held-out rollouts of 4 prompts all have the same "
                          "return (every target 1), so the EV, the group-mean baseline and the verdict cannot "
                          "judge the critic, only val/loss can; hold out more prompts (data.val_fraction, now 0.1) "
                          "or pass rollouts with varied returns as data.val")] if warned else [])
        first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        assert (first.get("val/explained_variance") is None) == warned  # NaN is written as null
        # no verdict either: the run ended with a TypeError on the null EV in its verdict line (a trial)
        info = json.loads((out / "step_2" / "training_info.json").read_text())
        assert (info.get("val:verdict") is None) == warned


def test_eval_and_report_without_validation(toy_data, tmp_path, capsys):
    """eval names the real reason; report draws the train curves and no calibration."""
    from critic_pretrain.cli import main
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"data.val_fraction": 0, "train.max_steps": 2,
                                                        "checkpoint.save_every": 2})) == 0
    capsys.readouterr()
    assert main(["eval", str(out / "step_2")]) == 2
    assert "no validation split (data.val_fraction=0, no data.val)" in one_error(capsys)
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "loss.png").is_file() and not (tmp_path / "rep" / "calibration.png").exists()


def test_report_writes_nothing_when_it_refuses(toy_data, tmp_path, capsys):
    from critic_pretrain.cli import main
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "checkpoint.save_every": 2})) == 0
    (tmp_path / "bad.json").write_text("{}")
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--eval", str(tmp_path / "bad.json")]) == 2
    one_error(capsys)
    assert not (tmp_path / "rep").exists()


def test_eval_refuses_a_split_that_moved_since_training(toy_data, tmp_path, capsys):
    """A run trained when the split held out nothing: its 'validation' rows now would be rows it
    trained on. Simulated by editing the manifest's counts."""
    from critic_pretrain.cli import main
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "checkpoint.save_every": 2})) == 0
    paths = ckpt.StepPaths(out / "step_2")
    manifest = json.loads(paths.manifest.read_text())
    manifest["data"]["train_rows"] += manifest["data"]["val_rows"]
    manifest["data"]["val_rows"] = 0
    paths.manifest.write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["eval", str(out / "step_2")]) == 2
    assert "the split now gives" in one_error(capsys)


def test_start_up_data_line_shows_what_is_trained(tmp_path, capfd):
    """Tokens after truncation, and duplicates left out (they showed only in the manifest)."""
    from rollouts import write_rows
    rows = toy_rows(40, seed=9)
    write_rows(tmp_path / "a", rows)
    write_rows(tmp_path / "b", rows[:10])  # the same sample_ids again
    over = tiny_overrides(tmp_path / "run", tmp_path / "a", **{"data.train": f"[{tmp_path / 'a'},{tmp_path / 'b'}]",
                                                               "data.max_length": 20, "train.max_steps": 1})
    assert train_main(over) == 0
    line = data_line(capfd)
    assert "10 duplicate sample_ids" in line and "tokens after truncation" in line
    n = int(line.split("rollouts (")[0].split()[-2])
    tokens = int(line.split(" tokens after truncation")[0].split(", ")[-1].replace(",", ""))
    assert tokens <= 20 * n


def test_a_source_that_trains_nothing_is_named(tmp_path, capfd):
    """The start-up line gives totals only, so a second source whose sample_ids all repeat the
    first's (two `rollouts synth` archives with one --seed) vanished without a word (a trial).
    Several sources now get a line each, and one that trains nothing a warning."""
    from rollouts import write_rows
    write_rows(tmp_path / "a", toy_rows(60, seed=3))
    write_rows(tmp_path / "b", toy_rows(60, seed=3))  # the same sample_ids
    sources = f"[{{paths: [{tmp_path / 'a'}], name: first}}, {{paths: [{tmp_path / 'b'}], name: again, weight: 2}}]"
    over = tiny_overrides(tmp_path / "run", tmp_path / "a", **{"train.max_steps": 1, "data.sources": sources})
    assert train_main([o for o in over if not o.startswith("data.train=")] + ["data.train=[]"]) == 0
    err = capfd.readouterr().err
    assert "INFO data sources: first 60 rollouts (weight 1), again 0 rollouts (weight 2)" in err
    assert "WARNING data source again trains nothing: no rollout kept" in err
