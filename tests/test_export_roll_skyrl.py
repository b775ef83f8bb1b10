"""``critic-pretrain export --format roll|skyrl``: each loaded the way its consumer loads it.

- ROLL (``critic.model_args.model_type: trl``; alibaba/ROLL ``roll/models/model_providers.py``
  ``default_value_model_provider`` -> ``load_model(..., add_valuehead=True)``): the folder as
  ``AutoModelForCausalLM``, wrapped in TRL's ``AutoModelForCausalLMWithValueHead`` (TRL 1.12's own
  class, the one ROLL imports from ``trl``), the head from LLaMA-Factory's ``load_valuehead_params``
  (the function from the ``llamafactory`` wheel itself, see ``llamafactory_loader``) loaded with
  ``strict=False``, then ROLL's ``token_classifier_forward`` (``roll/models/trl_patches.py``) and
  ``forward_func_values`` (``values = output[:, :-1]``, ``roll/pipeline/base_worker.py``).
- SkyRL (not installable here: NovaSky-AI/SkyRL ``skyrl/backends/skyrl_train/workers/model_wrapper.py``
  ``get_llm_for_sequence_regression`` / ``_get_critic_model``): the critic class rebuilt from that
  source, ``from_pretrained`` with no missing or unexpected keys, ``values[:, :-1][:, -num_actions:]``.

Values are compared position by position with ours on left-padded prompts + right-padded responses.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import pytest
import torch
from test_interop_export import _train, assert_response_values, our_values, ppo_batch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from critic_pretrain.cli import main as cli_main
from critic_pretrain.interop.check import check_seed
from critic_pretrain.interop.export import export


@pytest.fixture(scope="module")
def step(toy_data, tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("exp_bias"), toy_data)


@pytest.fixture(scope="module")
def step_nobias(toy_data, tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("exp_nobias"), toy_data, **{"model.head_bias": False})


@pytest.fixture(scope="module")
def rows():
    from conftest import toy_rows
    return toy_rows(10, seed=7)


# ---------------------------------------------------------------------------------------------
# ROLL: LLaMA-Factory's sidecar loader + TRL's value-head model

@pytest.fixture
def load_valuehead_params(monkeypatch):
    """``llamafactory.model.model_utils.valuehead.load_valuehead_params``, run from the installed
    wheel's own file. llamafactory pins transformers<=5.6 and trl<=0.24 and its package imports
    peft, gradio and more, so it is installed with ``--no-deps`` (Makefile) and only this module is
    loaded: its two relative imports (``extras.logging``, ``extras.constants``) are given stand-ins,
    the constants read from the wheel's ``extras/constants.py`` itself."""
    spec = importlib.util.find_spec("llamafactory")
    if spec is None or spec.origin is None:
        pytest.skip("llamafactory is not installed: pip install --no-deps llamafactory==0.9.5 (make install does)")
    root = Path(spec.origin).parent
    constants = types.ModuleType("llamafactory.extras.constants")
    for node in ast.parse((root / "extras" / "constants.py").read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in ("V_HEAD_WEIGHTS_NAME", "V_HEAD_SAFE_WEIGHTS_NAME"):
            setattr(constants, node.targets[0].id, ast.literal_eval(node.value))
    log = types.ModuleType("llamafactory.extras.logging")
    log.get_logger = lambda name: types.SimpleNamespace(info_rank0=logging.getLogger(name).info)
    for name in ("llamafactory", "llamafactory.extras", "llamafactory.model", "llamafactory.model.model_utils"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    sys.modules["llamafactory.extras"].logging = log
    sys.modules["llamafactory.extras"].constants = constants
    monkeypatch.setitem(sys.modules, "llamafactory.extras.logging", log)
    monkeypatch.setitem(sys.modules, "llamafactory.extras.constants", constants)
    name = "llamafactory.model.model_utils.valuehead"
    module_spec = importlib.util.spec_from_file_location(name, root / "model" / "model_utils" / "valuehead.py")
    module = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, name, module)
    module_spec.loader.exec_module(module)
    assert constants.V_HEAD_SAFE_WEIGHTS_NAME == "value_head.safetensors"
    return module.load_valuehead_params


def roll_critic(path: Path, load_valuehead_params):
    """ROLL's ``trl`` value model: ``load_model(model_args, is_trainable, add_valuehead=True)``."""
    from trl.experimental.ppo.modeling_value_head import AutoModelForCausalLMWithValueHead

    backbone, info = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                          output_loading_info=True)
    assert not any(info.values()), info  # no missing (random) weights: the LM head is tied
    model = AutoModelForCausalLMWithValueHead.from_pretrained(backbone)
    vhead = load_valuehead_params(str(path), types.SimpleNamespace(cache_dir=None, hf_hub_token=None))
    assert set(vhead) == {"v_head.summary.weight", "v_head.summary.bias"}
    missing, unexpected = model.load_state_dict(vhead, strict=False)
    assert unexpected == [] and not [k for k in missing if k.startswith("v_head.")]
    return model


def roll_values(model, rows):
    """``token_classifier_forward`` (``v_head(hidden_states[-1])``) and ``forward_func_values``
    (``output[:, :-1]``); response token j of a left-padded prompt of width P is column P - 1 + j."""
    ids, mask, P, R, parts = ppo_batch(rows)
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    out = model.pretrained_model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
    values = model.v_head(out.hidden_states[-1])[:, :-1].squeeze(-1)
    return values[:, P - 1:P - 1 + R], parts


@pytest.mark.parametrize("which", ["bias", "nobias"])
def test_roll_export_loads_in_rolls_trl_critic(which, step, step_nobias, toy_data, rows, tmp_path, capsys,
                                               load_valuehead_params):
    src, extra = (step, {}) if which == "bias" else (step_nobias, {"model.head_bias": False})
    assert cli_main(["export", str(src), "--format", "roll", "--out", str(tmp_path / "roll")]) == 0
    out = capsys.readouterr().out
    assert "model_type: trl" in out and "critic_warmup: 0" in out and "value_head.safetensors" in out
    folder = tmp_path / "roll"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["summary_dropout_prob"] == 0.0
    assert config["tie_word_embeddings"] is True
    report = check_seed(folder, "roll")
    assert report.ok, [p.message for p in report.problems]
    model = roll_critic(folder, load_valuehead_params)
    assert isinstance(model.v_head.dropout, nn.Identity)  # summary_dropout_prob: 0.0 reached TRL's ValueHead
    ours = our_values(src, toy_data, rows, **extra)
    for mode in ("eval", "train"):  # ROLL computes values in eval mode and trains the critic in train mode
        getattr(model, mode)()
        with torch.no_grad():
            values, parts = roll_values(model, rows)
        assert_response_values(values, ours, parts)
    if which == "nobias":
        assert "added v_head.summary.bias = 0" in out
        assert float(model.v_head.summary.bias.detach()) == 0.0


def test_roll_seed_check_catches_what_roll_would_load_silently(step, tmp_path):
    folder = export(step, "roll", tmp_path / "roll").out
    (folder / "value_head.safetensors").rename(tmp_path / "moved.safetensors")
    report = check_seed(folder, "roll")
    assert not report.ok and any("no value_head.safetensors" in p.message for p in report.problems)
    (tmp_path / "moved.safetensors").rename(folder / "value_head.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["summary_dropout_prob"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert any("dropout 0.1" in w for w in check_seed(folder, "roll").warnings)


# ---------------------------------------------------------------------------------------------
# SkyRL (emulated from its source; not installable here)

def skyrl_critic(path: Path, value_head_prefix: str = "value_head"):
    """SkyRL's ``get_llm_for_sequence_regression(path, "critic", value_head_prefix=...)``: the
    ``AutoModel`` backbone class's parent as the base, the backbone under ``base_model_prefix``, a
    bias-free ``nn.Linear(hidden_size, 1)`` named ``value_head_prefix``, ``from_pretrained``."""
    config = AutoConfig.from_pretrained(path)
    config._attn_implementation = "eager"
    base_class = AutoModel._model_mapping[type(config)]

    class CriticModel(base_class.__base__):
        def __init__(self, config):
            super().__init__(config)
            setattr(self, self.base_model_prefix, base_class(config))
            self.value_head_prefix = value_head_prefix
            setattr(self, value_head_prefix, nn.Linear(config.hidden_size, 1, bias=False))
            self.post_init()

        def forward(self, input_ids, num_actions, attention_mask):
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            outputs = getattr(self, self.base_model_prefix)(input_ids, attention_mask=attention_mask,
                                                            position_ids=position_ids)
            values = getattr(self, self.value_head_prefix)(outputs["last_hidden_state"]).squeeze(-1)[:, :-1]
            return values[:, -num_actions:]

    model, info = CriticModel.from_pretrained(path, config=config, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("which", ["bias", "nobias"])
def test_skyrl_export_loads_in_skyrls_critic(which, step, step_nobias, toy_data, rows, tmp_path):
    src, extra = (step, {}) if which == "bias" else (step_nobias, {"model.head_bias": False})
    result = export(src, "skyrl", tmp_path / "skyrl")
    assert "trainer.critic.model.path=" in result.config_text and "value_head_prefix=value_head" in result.config_text
    assert check_seed(result.out, "skyrl").ok
    model, info = skyrl_critic(result.out)
    assert not any(info.values()), info
    ids, mask, P, R, parts = ppo_batch(rows)
    with torch.no_grad():
        values = model(ids, R, mask)
    bias = result.head_bias or 0.0
    assert_response_values(values, our_values(src, toy_data, rows, **extra), parts, shift=-bias)
    if which == "bias":
        assert "SkyRL's value head is a bias-free Linear" in result.bias_handling and bias != 0
        config = json.loads((result.out / "config.json").read_text())
        assert config["critic_pretrain_head_bias"] == bias
    else:
        assert "exported losslessly" in result.bias_handling


def test_skyrl_folder_with_a_bias_or_another_head_name_fails_the_check(step, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = export(step, "skyrl", tmp_path / "skyrl").out
    weights = load_file(str(folder / "model.safetensors"))
    save_file({**weights, "value_head.bias": torch.zeros(1)}, str(folder / "model.safetensors"))
    assert any("bias-free Linear" in p.message for p in check_seed(folder, "skyrl").problems)
    weights["score.weight"] = weights.pop("value_head.weight")
    save_file(weights, str(folder / "model.safetensors"))
    assert any("no value head (value_head.weight)" in p.message for p in check_seed(folder, "skyrl").problems)


def test_step_check_for_roll_names_the_roll_export(step_nobias):
    report = check_seed(step_nobias, "roll")
    (line,) = [p.message for p in report.problems]
    assert "--format roll (adds a zero bias" in line and "strict=False" in line


def test_an_export_for_another_framework_is_named_as_such(step, tmp_path):
    """A ROLL export checked for SkyRL (or any other pair) fails in one line that names the export's
    format and the export to run, read from its manifest. Before, it blamed "a backbone or
    language-model checkpoint, not a value model". Without the manifest, the head's name says it."""
    folder = export(step, "roll", tmp_path / "roll").out
    for target, fmt in (("skyrl", "skyrl"), ("verl", "hf"), ("trl", "trl")):
        (line,) = [p.message for p in check_seed(folder, target).problems]
        assert (f"was exported with --format roll, not for {target}, whose layout differs; run critic-pretrain "
                f"export {step.resolve()} --format {fmt} --out <dir>") in line, line
    assert check_seed(export(step, "hf", tmp_path / "hf").out, "verl").ok  # --format hf is verl's
    (folder / "critic_pretrain.json").unlink()
    lines = [p.message for p in check_seed(folder, "skyrl").problems]
    assert any("but v_head.summary.weight, the head of a roll critic: this critic is laid out for another framework, "
               "not skyrl; export its step with critic-pretrain export STEP --format skyrl" in m for m in lines), lines


def test_a_step_checked_for_roll_is_ok_as_the_source_of_an_export(step, capsys):
    """A step_<n> folder passes `--for roll` as the export's source, and the OK line says so: ROLL
    cannot load the step itself (before, "a valid critic seed for roll", the export only in `# next:`)."""
    assert cli_main(["seed", "check", str(step), "--for", "roll"]) == 0
    out = capsys.readouterr().out
    assert f"OK  {step} is a valid source for a roll export (roll loads the exported folder" in out
    assert f"# next: critic-pretrain export {step} --format roll --out <dir>" in out
