"""tracking.py: trackers through accelerate (TensorBoard, W&B offline), the same names and steps
as metrics.jsonl, and a re-run that continues the same W&B run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_overrides, train_main

from critic_pretrain.metrics import read_metrics


def test_wandb_offline_run_continues_across_reruns(toy_data, tmp_path, monkeypatch):
    """Every metrics.jsonl record reaches W&B with its names and step (recorded at wandb's own
    Run.log); a re-run continues the same run id; TensorBoard events are written too."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sent: list[tuple[int, dict]] = []
    real_log = wandb.sdk.wandb_run.Run.log

    def log(self, data, step=None, **kw):
        sent.append((step, dict(data)))
        return real_log(self, data, step=step, **kw)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", log)
    out = tmp_path / "run"
    args = tiny_overrides(out, toy_data, **{"train.max_steps": 4, "checkpoint.save_every": 2, "eval.every": 2,
                                            "train.report_to": "[tensorboard, wandb]"})
    assert train_main(args) == 0
    first = json.loads((out / "trackers.json").read_text())["wandb"]
    assert train_main(args + ["checkpoint.load_step=2"]) == 0  # the same command, resumed from step_2
    assert json.loads((out / "trackers.json").read_text())["wandb"] == first
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(first) and list(r.glob("run-*.wandb")) for r in runs)
    # The resumed run re-logged steps 3-4: what W&B got last for each step is metrics.jsonl's record.
    got: dict[int, dict] = {}
    for step, data in sent:
        got.setdefault(step, {}).update(data)
    for rec in read_metrics(out / "metrics.jsonl"):
        for key, value in rec.items():
            if key != "step" and isinstance(value, float):
                assert got[rec["step"]][key] == pytest.approx(value, rel=1e-9), (rec["step"], key)
    assert {3, 4} <= {step for step, _ in sent[len(sent) // 2:]}
    assert list((out / "tensorboard").glob("events.*"))


def test_no_trackers_and_unknown_ones(toy_data, tmp_path, capsys):
    out = tmp_path / "none"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "train.report_to": "[]"})) == 0
    assert not (out / "tensorboard").exists() and not (out / "trackers.json").exists()
    capsys.readouterr()
    assert train_main(tiny_overrides(tmp_path / "bad", toy_data, **{"train.report_to": "[wandbb]"})) == 2
    err = capsys.readouterr().err
    assert "unknown tracker 'wandbb' (did you mean 'wandb'?)" in err and "Traceback" not in err


def test_requested_tracker_without_its_package_is_one_line_before_anything_is_written(toy_data, tmp_path, capsys):
    """accelerate drops a tracker whose package is missing with a debug message; we refuse it
    (mlflow and aim are not in the test extra: the packages are really absent)."""
    import importlib.util
    for name in ("mlflow", "aim"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed: this test needs it absent"
        out = tmp_path / name
        assert train_main(tiny_overrides(out, toy_data, **{"train.report_to": f"[tensorboard, {name}]"})) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "Traceback" not in err, err
        assert f"train.report_to has {name} but its package is not installed: pip install" in err
        assert "train.report_to=[tensorboard]" in err
        assert not out.exists() or not any(out.iterdir())  # nothing written


def test_flat_config_for_hparams():
    from critic_pretrain.tracking import flat
    assert flat({"a": {"b": 1, "c": [1, 2], "d": None}, "e": "x"}) == {"a.b": 1, "a.c": "[1, 2]", "a.d": "null",
                                                                        "e": "x"}


def test_tensorboard_false_still_drops_it(toy_data, tmp_path):
    """The deprecated train.tensorboard=false keeps working (old configs and commands)."""
    out = tmp_path / "tb"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "train.tensorboard": False})) == 0
    assert not (out / "tensorboard").exists()
    assert Path(out / "metrics.jsonl").is_file()


def test_wandb_dir_set_by_the_user_wins(toy_data, tmp_path, monkeypatch):
    """The run passed dir=output_dir to W&B, so a WANDB_DIR the user set was ignored (a trial)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 1, "train.report_to": "[wandb]"})) == 0
    assert list((tmp_path / "wb").rglob("offline-run-*")) and not (out / "wandb").exists()
