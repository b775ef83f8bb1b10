"""Run configuration: YAML, dotted overrides, validation messages, the reference doc, and what a
resume may change (``run_changes``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT

from critic_pretrain.checkpoint.resume import refused_changes, run_changes
from critic_pretrain.config import Config
from critic_pretrain.config_io import load_config
from critic_pretrain.errors import UserError


def test_config_overrides_and_errors(tmp_path):
    from critic_pretrain.config_io import describe
    from critic_pretrain.errors import UserError

    cfg = load_config("configs/demo.yaml", ["train.max_steps=7", "data.train=a", "optim.lr=1e-3"])
    assert cfg.train.max_steps == 7 and cfg.data.train == ["a"] and cfg.optim.lr == 1e-3
    assert cfg.model.config["hidden_size"] == 64
    for bad, msg in [("train.max_stepz=3", "did you mean 'train.max_steps'"),
                     ("optim.schedule=exp", "use one of: constant, linear, cosine"),
                     ("targets.values_from=none", "needs bootstrap values"),
                     ("data.max_length=99999", "must fit into one micro-batch"),
                     ("data.length_warmup_steps=-1", "must be >= 0"),
                     ("data.length_warmup_from=0", "must be > 0"),
                     ("data.length_warmup_hold=5", "the hold is part of the warm-up"),
                     ("train.grad_accum=two", "must be an integer"),
                     ("nokey", "is not key=value"),
                     ("optim.learning_rate=1e-4", "did you mean 'optim.lr'?"),  # a synonym, not optim.min_lr
                     ("train.gradient_accumulation_steps=4", "did you mean 'train.grad_accum'?"),
                     ("targets.gae_lambda=0.9", "did you mean 'targets.lam'?"),
                     ("optim.lr=1e-4", "optim.min_lr=0.0003 must be in")]:
        with pytest.raises(UserError, match=msg):
            load_config("configs/demo.yaml", [bad])
    (tmp_path / "bad.yaml").write_text("train: [1, 2\n")
    with pytest.raises(UserError, match=r"bad.yaml: not valid YAML \(line 2, column 1: "):
        load_config(tmp_path / "bad.yaml")
    keys = {k for k, _, doc in describe()}
    assert {"output_dir", "seed", "data.train", "data.val", "train.max_steps", "checkpoint.save_every",
            "checkpoint.load_step", "checkpoint.keep_last"} <= keys
    assert all(doc for _, _, doc in describe())  # every key is documented
    for path in sorted((ROOT / "configs").glob("*.yaml")):  # every shipped recipe loads
        needs_model = "name_or_path: null" in path.read_text()  # smollm2-135m: a local folder, set at run time
        load_config(path, ["data.train=x"] + (["model.name_or_path=/models/x"] if needs_model else []))
    from critic_pretrain.config_io import reference_markdown
    assert (ROOT / "docs" / "config.md").read_text() == reference_markdown(), \
        "docs/config.md is stale: python -m critic_pretrain.config_io > docs/config.md"


def test_recipes_configure_what_their_header_promises():
    """The model recipes' headers promise an early stop on the validation plateau: configured,
    on a metric the runs log, with a validation split to rank."""
    for path in sorted((ROOT / "configs").glob("qwen*.yaml")):
        header = path.read_text().split("\noutput_dir")[0]
        cfg = load_config(path, ["data.train=x"])
        assert "stop when the validation loss" in header, path
        assert cfg.train.stop_when.metric == "val/loss" and cfg.data.val_fraction > 0 and cfg.eval.every, path
        assert cfg.checkpoint.keep_best == 1, path


def test_bundled_configs_by_name(tmp_path, monkeypatch):
    """`--config demo` (and configs/demo.yaml outside a checkout) name the shipped configs; a
    missing file names them."""
    from critic_pretrain.config_io import find_config
    monkeypatch.chdir(tmp_path)
    assert find_config("demo") == find_config("configs/demo.yaml") == ROOT / "configs" / "demo.yaml"
    assert find_config("configs/accelerate/ddp.yaml") == ROOT / "configs" / "accelerate" / "ddp.yaml"
    (tmp_path / "demo.yaml").write_text("seed: 3\n")
    assert find_config("demo.yaml") == Path("demo.yaml")  # a file of that name wins
    with pytest.raises(UserError, match="config file not found; pass --config FILE.yaml or a bundled config "
                                        "\\(demo, qwen2.5-0.5b"):
        find_config("/abs/missing/demo.yaml")


def test_run_defining_changes():
    old = Config().to_dict()
    new = load_config(None, ["data.train=x", "model.config={model_type: qwen2}", "targets.gamma=0.9",
                             "train.log_every=5", "train.max_steps=200"])
    changed = {k for k, _, _ in run_changes(old, new)}
    assert {"targets.gamma", "train.max_steps", "model.config"} <= changed
    assert "train.log_every" not in changed and "data.train" not in changed  # operational / compared by content
    assert refused_changes(run_changes(old, new), ["targets", "model.config", "train.max_steps"]) == []
    const = load_config(None, ["data.train=x", "model.config={model_type: qwen2}", "optim.schedule=constant",
                               "train.max_steps=500"])
    old_const = {**Config().to_dict(), "optim": {**Config().to_dict()["optim"], "schedule": "constant"},
                 "model": {**Config().to_dict()["model"], "config": {"model_type": "qwen2"}}}
    assert "train.max_steps" not in {k for k, _, _ in run_changes(old_const, const)}


def test_keys_added_since_a_checkpoint_default_to_their_old_value():
    """A config.yaml written before a key existed resumes: the missing key meant its default."""
    old = Config().to_dict()
    del old["train"]["freeze_backbone_steps"], old["optim"]["head_lr"]
    new = load_config(None, ["data.train=x", "model.config={model_type: qwen2}"])
    assert not {k for k, _, _ in run_changes(old, new)} & {"train.freeze_backbone_steps", "optim.head_lr"}
