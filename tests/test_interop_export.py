"""``critic-pretrain export``: each format loaded by its consumer's own code path gives our values.

Consumers (docs/export.md cites the source each emulation follows):
- NeMo-RL (DTensor): torch DCP ``HuggingFaceStorageReader`` over every top-level safetensors
  file in value/weights/model, strict ``set_model_state_dict`` into
  ``AutoModelForTokenClassification(config, num_labels=1)``; ``optim/`` = ``{optim, sched}``
  into a fresh AdamW and the scheduler the PPO config builds.
- verl: ``AutoModelForTokenClassification.from_pretrained`` + ``values[:, -R-1:-1]``.
- OpenRLHF: ``_get_critic_model`` (AutoModel backbone, bias-free ``value_head_prefix``
  Linear, ``(values - mean) / std`` under ``normalize_reward``), not installable here.
- TRL 1.12: ``trl.experimental.utils.get_reward`` and ``PolicyAndValueWrapper`` themselves.

Values are compared position by position on padded batches of unseen rollouts.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import tiny_overrides, toy_rows
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim.lr_scheduler import ConstantLR, LambdaLR, SequentialLR
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from critic_pretrain import checkpoint as ckpt
from critic_pretrain.cli import main as cli_main
from critic_pretrain.config_io import load_config
from critic_pretrain.interop.check import check_seed
from critic_pretrain.interop.export import export
from critic_pretrain.model import build_value_model, token_values

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # we test the experimental PPO on purpose
PAD = 0  # toy token ids start at 1: 0 never occurs, as TRL's pad-by-token-id masking needs
PEAK_LR = 3e-3  # tiny_overrides' optim.lr


def _train(out: Path, data: Path, **extra) -> Path:
    from conftest import train_main
    assert train_main(tiny_overrides(out, data, **{"train.max_steps": 4, "checkpoint.save_every": 4, **extra})) == 0
    return out / "step_4"


@pytest.fixture(scope="module")
def step(toy_data, tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("exp_bias"), toy_data)


@pytest.fixture(scope="module")
def step_nobias(toy_data, tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("exp_nobias"), toy_data, **{"model.head_bias": False})


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return toy_rows(10, seed=7)  # rollouts the critic never saw


# ---------------------------------------------------------------------------------------------
# Our values, and the batch layouts the consumers use

def our_values(step_dir: Path, data: Path, rows: list[dict], **extra) -> list[torch.Tensor]:
    """Our model (built and loaded as training does) on a right-padded batch, per rollout."""
    cfg = load_config(None, tiny_overrides(step_dir.parent, data, **extra))
    model = build_value_model(cfg.model, init_head=False)
    ckpt.load_weights(model, step_dir)
    lengths = [len(r["input_ids"]) for r in rows]
    ids = torch.full((len(rows), max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, :lengths[b]] = torch.tensor(r["input_ids"])
        mask[b, :lengths[b]] = 1
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        values = token_values(model.eval(), ids, pos, attention_mask=mask)
    return [values[b, :n] for b, n in enumerate(lengths)]


def split(row: dict) -> tuple[list[int], list[int]]:
    """(prompt, response): the response starts at the first policy token."""
    first = row["loss_mask"].index(1)
    return row["input_ids"][:first], row["input_ids"][first:]


def ppo_batch(rows: list[dict]):
    """Left-padded prompts + right-padded responses (verl, OpenRLHF, TRL rollouts)."""
    parts = [split(r) for r in rows]
    P, R = max(len(p) for p, _ in parts), max(len(r) for _, r in parts)
    ids = torch.full((len(rows), P + R), PAD)
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(parts):
        ids[b, P - len(p):P], ids[b, P:P + len(r)] = torch.tensor(p), torch.tensor(r)
        mask[b, P - len(p):P + len(r)] = 1
    return ids, mask, P, R, parts


def assert_response_values(consumer: torch.Tensor, ours: list[torch.Tensor], parts, shift: float = 0.0) -> None:
    """consumer[b, j] is the value of response token j; ours[b] indexes the whole rollout."""
    for b, (p, r) in enumerate(parts):
        torch.testing.assert_close(consumer[b, :len(r)], ours[b][len(p):len(p) + len(r)] + shift,
                                   rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# NeMo-RL (DTensor / Automodel backend)

def nemo_rl_load(step_dir: Path, scheduler: str = "lambda"):
    """NeMo-RL's warm start: weights through DCP's HF reader (every top-level safetensors
    file), strict load; optimizer {optim, sched} into a fresh AdamW + the PPO run's scheduler."""
    p = ckpt.StepPaths(step_dir)
    assert (step_dir / "value" / "weights").is_dir()  # NeMo-RL's own check
    config = AutoConfig.from_pretrained(p.hf_config.parent)  # stands in for value.model_name's config
    config.token_classification_bias = True  # a causal-LM config has none: transformers' default (True)
    model = AutoModelForTokenClassification.from_config(config, attn_implementation="eager",
                                                        dtype=torch.float32)  # value.precision, not the seed's
    state = get_model_state_dict(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is disabled": one process
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(p.weights_dir)), no_dist=True)
        set_model_state_dict(model, state, options=StateDictOptions(strict=True))
        opt = sched = None
        if p.optim_dir.is_dir():
            opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)  # value.optimizer.kwargs
            sched = (LambdaLR(opt, lambda s: 1) if scheduler == "lambda" else
                     SequentialLR(opt, [ConstantLR(opt, factor=1.0, total_iters=10_000_000_000)], milestones=[]))
            ostate = {"optim": get_optimizer_state_dict(model, opt, options=ckpt.OPTIM_OPTIONS),
                      "sched": sched.state_dict()}
            dcp.load(ostate, checkpoint_id=str(p.optim_dir), no_dist=True)
            set_optimizer_state_dict(model, opt, ostate["optim"], options=ckpt.OPTIM_OPTIONS)
            sched.load_state_dict(ostate["sched"])
    return model.eval(), opt, sched


def padded_values(model, rows: list[dict]) -> list[torch.Tensor]:
    lengths = [len(r["input_ids"]) for r in rows]
    ids = torch.full((len(rows), max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, :lengths[b]], mask[b, :lengths[b]] = torch.tensor(r["input_ids"]), 1
    with torch.no_grad():
        v = token_values(model, ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=mask)
    return [v[b, :n] for b, n in enumerate(lengths)]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-5) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=atol)


def test_nemo_rl_default_export_loads_like_nemo_rl(step, toy_data, rows, tmp_path, capsys):
    assert cli_main(["export", str(step), "--format", "nemo-rl", "--out", str(tmp_path / "seed")]) == 0
    out = capsys.readouterr().out
    seed = tmp_path / "seed" / "step_4"
    assert f"warm_start_value_checkpoint: {seed.resolve()}" in out and "head bias: score.bias = +" in out
    assert check_seed(seed).ok and ckpt.find_checkpoints(tmp_path / "seed") == {4: seed}
    assert not (seed / "resume").exists()
    src, dst = ckpt.StepPaths(step).weights, ckpt.StepPaths(seed).weights
    assert src.stat().st_ino == dst.stat().st_ino  # hard-linked, not copied
    model, opt, sched = nemo_rl_load(seed, "lambda")
    assert_same(padded_values(model, rows), our_values(step, toy_data, rows))
    assert len(opt.param_groups) == 1 and "initial_lr" in opt.param_groups[0]
    assert all(int(opt.state[p]["step"]) == 4 for p in model.parameters())
    assert sched.last_epoch == 4
    opt.step()
    sched.step()
    assert sched.get_last_lr() == [PEAK_LR]  # LambdaLR(lambda: 1) resumes at the run's base lr
    # the class must match: a LambdaLR state does not load into SequentialLR (DCP misses its keys)
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: sched._milestones"):
        nemo_rl_load(seed, "sequential")


def test_nemo_rl_sequential_scheduler_bf16_and_lr(step, toy_data, rows, tmp_path):
    result = export(step, "nemo-rl", tmp_path / "seed", scheduler="sequential", lr=1e-5, dtype="bfloat16")
    seed = result.out
    assert "SequentialLR([ConstantLR(factor=1.0, total_iters=10000000000)], milestones=[])" in result.summary()
    assert "  - milestones: []" in result.config_text
    report = check_seed(seed)
    assert report.ok and report.facts["dtypes"] == ["bfloat16"]
    assert report.facts["optimizer"]["scheduler"] == "SequentialLR[ConstantLR]"
    model, opt, sched = nemo_rl_load(seed, "sequential")
    assert next(model.parameters()).dtype == torch.float32  # NeMo-RL casts on load; DCP copies into fp32
    ours = our_values(step, toy_data, rows)
    for x, y in zip(padded_values(model, rows), ours):
        torch.testing.assert_close(x, y, rtol=0.05, atol=0.05)  # bf16 weights
    assert sched.last_epoch == 4 and opt.param_groups[0]["lr"] == 1e-5
    for _ in range(3):
        opt.step()
        sched.step()
    assert sched.get_last_lr() == [1e-5]
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: sched."):
        nemo_rl_load(seed, "lambda")  # and a SequentialLR state does not load into LambdaLR


def test_nemo_rl_drop_optimizer_and_tokenizer(step, tmp_path):
    tok = _tiny_tokenizer(tmp_path / "tok")
    result = export(step, "nemo-rl", tmp_path / "seed", drop_optimizer=True, tokenizer=str(tok), link=False)
    seed = result.out
    assert not (seed / "value" / "optimizer").exists()
    assert (ckpt.StepPaths(seed).tokenizer_dir / "tokenizer_config.json").is_file()
    report = check_seed(seed)
    assert report.ok and report.facts["optimizer"] is None and report.facts["tokenizer"]
    model, opt, _ = nemo_rl_load(seed)
    assert opt is None
    assert "value:\n  # model_name" in result.config_text and "scheduler" not in result.config_text


def test_nemo_rl_export_adds_a_zero_bias_to_a_bias_free_head(step_nobias, toy_data, rows, tmp_path):
    assert not check_seed(step_nobias).ok  # NeMo-RL's strict load would fail on the missing score.bias
    result = export(step_nobias, "nemo-rl", tmp_path / "seed")
    assert "added score.bias = 0" in result.bias_handling
    model, opt, _ = nemo_rl_load(result.out)
    assert model.score.bias.item() == 0.0 and len(opt.state) == len(list(model.parameters()))
    assert_same(padded_values(model, rows), our_values(step_nobias, toy_data, rows, **{"model.head_bias": False}))


def test_nemo_rl_loader_accepts_extra_keys_and_nan_but_the_seed_check_does_not(step, tmp_path):
    """Why the seed check exists: NeMo-RL's loader takes both without a word."""
    seed = export(step, "nemo-rl", tmp_path / "seed", link=False).out
    weights = ckpt.StepPaths(seed).weights_dir
    from safetensors.torch import load_file, save_file
    save_file({"lm_head.weight": torch.zeros(64, 32)}, weights / "extra.safetensors")
    nemo_rl_load(seed)
    assert any("unexpected tensor" in str(p) for p in check_seed(seed).problems)
    (weights / "extra.safetensors").unlink()
    state = load_file(ckpt.StepPaths(seed).weights)
    state["model.norm.weight"][0] = float("nan")
    save_file(state, ckpt.StepPaths(seed).weights, metadata={"format": "pt"})
    assert "does not match its checksum" in str(check_seed(seed).problems)  # edited after the save
    manifest = json.loads((seed / ckpt.MANIFEST).read_text())
    manifest["files"] = ckpt.files_manifest(seed)  # as if training itself had saved the NaN
    (seed / ckpt.MANIFEST).write_text(json.dumps(manifest))
    model, _, _ = nemo_rl_load(seed)
    assert torch.isnan(model.model.norm.weight).any()
    assert [p.area for p in check_seed(seed).problems] == ["finite"]


# ---------------------------------------------------------------------------------------------
# verl (hf)

def test_hf_export_loads_in_verls_class(step, toy_data, rows, tmp_path):
    result = export(step, "verl", tmp_path / "hf")
    config = json.loads((result.out / "config.json").read_text())
    assert config["num_labels"] == 1 and config["classifier_dropout"] == 0.0
    assert config["architectures"] == ["Qwen2ForTokenClassification"]
    assert check_seed(result.out, "verl").ok
    model, info = AutoModelForTokenClassification.from_pretrained(result.out, attn_implementation="eager",
                                                                  output_loading_info=True)
    assert not any(info.values())
    ids, mask, P, R, parts = ppo_batch(rows)
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)  # verl's position_ids for left-padded prompts
    with torch.no_grad():
        values = model.eval()(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    values = values.squeeze(-1)[:, -R - 1:-1]  # verl dp_critic._forward_micro_batch
    assert_response_values(values, our_values(step, toy_data, rows), parts)
    assert "critic.model.path: " in result.config_text and "trainer.critic_warmup: 0" in result.config_text


def test_hf_export_starts_a_second_stage_with_the_same_critic(step, toy_data, rows, tmp_path):
    """model.name_or_path=<hf export> model.init_from=reward_model: a new run (other data, other
    cut, other schedule) starts from exactly the critic the first one trained, head and bias."""
    hf = export(step, "verl", tmp_path / "hf").out
    from critic_pretrain.config import ModelConfig
    model = build_value_model(ModelConfig(name_or_path=str(hf), init_from="reward_model", attn_implementation="eager"))
    first = our_values(step, toy_data, rows)
    assert model.score.bias is not None and model.score.bias.abs().item() > 0  # the trained bias, not a fresh 0
    for r, ours in zip(rows, first):
        ids = torch.tensor(r["input_ids"])[None]
        with torch.no_grad():
            values = token_values(model.eval(), ids, torch.arange(ids.shape[1])[None])[0]
        torch.testing.assert_close(values, ours, atol=1e-5, rtol=0)
    fresh = build_value_model(ModelConfig(name_or_path=str(hf)))  # init_from=backbone: a new head
    assert not torch.equal(fresh.score.weight, model.score.weight)


# ---------------------------------------------------------------------------------------------
# OpenRLHF (emulated from openrlhf/models/model.py; not installable here)

def openrlhf_critic(path: Path, normalize_reward: bool):
    """OpenRLHF's get_llm_for_sequence_regression(path, "critic") and _get_critic_model."""
    config = AutoConfig.from_pretrained(path)
    config.normalize_reward = normalize_reward
    config._attn_implementation = "eager"
    value_head_prefix = getattr(config, "value_head_prefix", "score")  # config.json wins over the flag
    base_class = AutoModel._model_mapping[type(config)]
    base_pretrained_class = base_class.__base__

    class CriticModel(base_pretrained_class):
        def __init__(self, config):
            super().__init__(config)
            setattr(self, self.base_model_prefix, base_class(config))
            self.value_head_prefix = value_head_prefix
            setattr(self, value_head_prefix, nn.Linear(config.hidden_size, 1, bias=False))
            self.normalize_reward = config.normalize_reward
            self.register_buffer("mean", torch.zeros(1), persistent=False)
            self.register_buffer("std", torch.ones(1), persistent=False)
            self.post_init()  # transformers 5 needs it; OpenRLHF pins transformers 4.x, which does not

        def load_mean_std(self, config):
            if hasattr(config, "mean"):  # "load mean/std from config.json", in OpenRLHF's __init__
                self.mean[0] = config.mean
                self.std[0] = config.std

        def forward(self, input_ids, action_mask, attention_mask):
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            outputs = getattr(self, self.base_model_prefix)(input_ids, attention_mask=attention_mask,
                                                            position_ids=position_ids)
            values = getattr(self, self.value_head_prefix)(outputs["last_hidden_state"]).squeeze(-1)[:, :-1]
            if self.normalize_reward:
                values = (values - self.mean) / self.std
            return values[:, -action_mask.shape[1]:] * action_mask.float()

    model, info = CriticModel.from_pretrained(path, config=config, output_loading_info=True)
    # transformers 5 materialises non-persistent buffers from the meta device uninitialised;
    # under OpenRLHF's transformers 4 the values __init__ set survive, so set them as it does.
    model.mean.fill_(0.0)
    model.std.fill_(1.0)
    model.load_mean_std(config)
    return model.eval(), info


@pytest.mark.parametrize("normalize", [True, False])
def test_openrlhf_export_folds_the_bias_into_mean(step, toy_data, rows, tmp_path, normalize):
    result = export(step, "openrlhf", tmp_path / "orlhf")
    bias = result.head_bias
    config = json.loads((result.out / "config.json").read_text())
    assert config["value_head_prefix"] == "score" and config["mean"] == -bias and config["std"] == 1.0
    assert f"mean = {-bias:.6g}, std = 1" in result.bias_handling and "--normalize_reward" in result.config_text
    assert check_seed(result.out, "openrlhf").ok
    model, info = openrlhf_critic(result.out, normalize_reward=normalize)
    assert not any(info.values())
    ids, mask, P, R, parts = ppo_batch(rows)
    action_mask = torch.zeros(len(rows), R)
    for b, (_, r) in enumerate(parts):
        action_mask[b, :len(r)] = 1
    with torch.no_grad():
        values = model(ids, action_mask, mask)
    # exact with normalization on; without it every value is short of the bias
    assert_response_values(values, our_values(step, toy_data, rows), parts, shift=0.0 if normalize else -bias)


def test_openrlhf_export_of_a_bias_free_head_is_lossless(step_nobias, toy_data, rows, tmp_path):
    result = export(step_nobias, "openrlhf", tmp_path / "orlhf")
    assert "exported losslessly" in result.bias_handling
    assert "mean" not in json.loads((result.out / "config.json").read_text())
    model, _ = openrlhf_critic(result.out, normalize_reward=False)
    ids, mask, P, R, parts = ppo_batch(rows)
    with torch.no_grad():
        values = model(ids, torch.ones(len(rows), R), mask)
    assert_response_values(values, our_values(step_nobias, toy_data, rows, **{"model.head_bias": False}), parts)


# ---------------------------------------------------------------------------------------------
# TRL 1.12 (its own code path)

def trl_values(value_model, rows: list[dict]):
    """TRL's rollout values (get_reward on query_responses, [:, context_length - 1 : -1]) and
    its training-loop values (PolicyAndValueWrapper + forward)."""
    from trl.experimental.ppo.ppo_trainer import PolicyAndValueWrapper, forward
    from trl.experimental.utils import get_reward

    ids, mask, P, R, parts = ppo_batch(rows)
    with torch.no_grad():
        full_value, _, _ = get_reward(value_model, ids, PAD, P)
        rollout = full_value[:, P - 1:-1].squeeze(-1)
        # any causal LM as the policy: only the value side of the wrapper matters here
        policy = AutoModelForCausalLM.from_config(value_model.config, attn_implementation="eager")
        with warnings.catch_warnings():  # TRL 1.12 reads is_gradient_checkpointing, deprecated in transformers 5
            warnings.simplefilter("ignore", FutureWarning)
            wrapper = PolicyAndValueWrapper(policy, value_model)
        _, vpred = forward(wrapper, ids, PAD)
        train = vpred[:, P - 1:-1].squeeze(-1)
    return rollout, train, parts


def test_trl_export_loads_in_trls_ppo(step, toy_data, rows, tmp_path):
    pytest.importorskip("trl")
    result = export(step, "trl", tmp_path / "trl")
    bias = result.head_bias
    assert "dropped" in result.bias_handling and f"{abs(bias):.4g} lower" in result.bias_handling
    assert "model.head_bias=false" in result.bias_handling
    assert check_seed(result.out, "trl").ok
    value_model, info = AutoModelForSequenceClassification.from_pretrained(
        result.out, num_labels=1, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values())
    ours = our_values(step, toy_data, rows)
    rollout, train, parts = trl_values(value_model.eval(), rows)
    assert_response_values(rollout, ours, parts, shift=-bias)
    assert_response_values(train, ours, parts, shift=-bias)
    # the printed snippet restores the bias exactly
    namespace = {"value_model": value_model}
    snippet = result.config_text.split("# exact:", 1)[1].split("\n", 1)[1]
    exec(snippet, namespace)
    rollout, train, parts = trl_values(namespace["value_model"].eval(), rows)
    assert_response_values(rollout, ours, parts)
    assert_response_values(train, ours, parts)


def test_trl_export_of_a_bias_free_head_is_exact(step_nobias, toy_data, rows, tmp_path):
    pytest.importorskip("trl")
    result = export(step_nobias, "trl", tmp_path / "trl")
    value_model = AutoModelForSequenceClassification.from_pretrained(result.out, num_labels=1,
                                                                     attn_implementation="eager")
    rollout, _, parts = trl_values(value_model.eval(), rows)
    assert_response_values(rollout, our_values(step_nobias, toy_data, rows, **{"model.head_bias": False}), parts)


# ---------------------------------------------------------------------------------------------
# Errors

def test_export_errors_are_one_line(step, tmp_path, capsys):
    def run(*args):
        rc = cli_main(["export", *map(str, args)])
        return rc, capsys.readouterr().err.strip()

    rc, err = run(step.parent, "--format", "hf", "--out", tmp_path / "x")
    assert rc == 2 and err.startswith(f"error: cannot export {step.parent}: {step.parent} is a run folder")
    rc, err = run(step, "--format", "hf", "--out", tmp_path / "x", "--scheduler", "sequential")
    assert rc == 2 and "apply to --format nemo-rl only" in err
    rc, err = run(step, "--format", "nemo-rl", "--out", tmp_path / "x", "--drop-optimizer", "--lr", "1e-5")
    assert rc == 2 and err.startswith("error: --drop-optimizer removes the optimizer state")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    rc, err = run(step, "--format", "trl", "--out", tmp_path / "full")
    assert rc == 2 and "already exists and is not empty" in err
    rc, err = run(step, "--format", "trl", "--out", step / "inside")
    assert rc == 2 and "is inside the source checkpoint" in err
    broken = shutil.copytree(step, tmp_path / "run" / "step_4")
    (broken / "training_info.json").unlink()
    rc, err = run(broken, "--format", "hf", "--out", tmp_path / "y")
    assert rc == 2 and "training_info.json" in err and not (tmp_path / "y").exists()


def _tiny_tokenizer(path: Path) -> Path:
    """A word-level tokenizer built locally (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0").save_pretrained(str(path))
    return path
