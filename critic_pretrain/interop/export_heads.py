"""Exports for the consumers that name the value head their own way: ROLL (``--format roll``) and
SkyRL (``--format skyrl``). docs/export.md cites the loading code each layout follows.

- ``roll``: ROLL's critic with ``model_type: trl`` loads the folder as ``AutoModelForCausalLM``,
  wraps it in TRL's ``AutoModelForCausalLMWithValueHead`` and loads the value head from the
  ``value_head.safetensors`` sidecar (LLaMA-Factory's ``load_valuehead_params``:
  ``v_head.summary.weight`` [1, H] and ``v_head.summary.bias`` [1]) with ``strict=False``. We
  write the backbone as a ``*ForCausalLM`` folder whose LM head (a critic has none) is tied to the
  embeddings, and ``summary_dropout_prob: 0.0`` (TRL's ValueHead defaults to dropout 0.1).
- ``skyrl``: SkyRL's ``get_llm_for_sequence_regression(path, "critic")`` builds the ``AutoModel``
  backbone under its ``base_model_prefix`` plus a bias-free ``nn.Linear`` named
  ``trainer.algorithm.value_head_prefix`` (default ``value_head``) and loads with
  ``from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

from .. import checkpoint as ckpt
from ..errors import UserError
from .export_files import (
    HF_WEIGHTS,
    ExportResult,
    add_tokenizer,
    dtype_name,
    load_state,
    prepare_state,
    reprefix,
    save_state,
    write_export_manifest,
)
from .frameworks import FRAMEWORKS, HEAD
from .seed_report import SeedReport

VALUE_HEAD_FILE = "value_head.safetensors"
"""LLaMA-Factory's ``V_HEAD_SAFE_WEIGHTS_NAME``, the sidecar ROLL's ``load_valuehead_params`` reads."""


def export_roll(report: SeedReport, tmp: Path, *, cast, tokenizer: str | None) -> ExportResult:
    """``tmp``: a ``*ForCausalLM`` backbone folder + ``value_head.safetensors`` (``v_head.summary.*``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config, state, bias, prefix = _source(report, cast, add_bias=True)
    result = ExportResult("roll", report.path, tmp, bias, roll_bias_note(bias))
    head = FRAMEWORKS["roll"].head
    value_head = {f"{head}.{k}": state.pop(f"{HEAD}.{k}") for k in ("weight", "bias")}
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if arch is None:
        raise UserError(f"transformers has no causal-LM class for model_type {config.model_type!r}: ROLL's trl "
                        "critic (AutoModelForCausalLM + value head) cannot load this critic")
    config.tie_word_embeddings = True  # no LM head to ship: tied, it loads with no missing (random) weights
    config.summary_dropout_prob = 0.0  # TRL's ValueHead reads it; without it, dropout 0.1 before the head
    _write(result, config, {reprefix(k, config, prefix): v for k, v in state.items()}, arch, cast, tokenizer)
    save_state(value_head, tmp / VALUE_HEAD_FILE)
    result.files[VALUE_HEAD_FILE] = "written"
    result.notes.append(f"{VALUE_HEAD_FILE}: {head}.weight and {head}.bias (LLaMA-Factory's value-head sidecar); "
                        "the backbone's LM head is tied to the embeddings (tie_word_embeddings: true): values never "
                        "read it")
    write_export_manifest(report.path, tmp, "roll", dtype=cast, add_bias=bias is None, files_list=False,
                          optimizer="not exported (Hugging Face folders carry weights only)")
    return result


def export_skyrl(report: SeedReport, tmp: Path, *, cast, tokenizer: str | None) -> ExportResult:
    """``tmp``: the ``AutoModel`` backbone under its ``base_model_prefix`` + bias-free ``value_head``."""
    from transformers import AutoModel

    config, state, bias, prefix = _source(report, cast, add_bias=False)
    result = ExportResult("skyrl", report.path, tmp, bias, skyrl_bias_note(bias, report.facts.get("target_std")))
    head = FRAMEWORKS["skyrl"].head
    state.pop(f"{HEAD}.bias", None)
    weights = {(f"{head}.weight" if k == f"{HEAD}.weight" else reprefix(k, config, prefix)): v
               for k, v in state.items()}
    config.value_head_prefix = head  # ours (seed check); SkyRL takes trainer.algorithm.value_head_prefix
    if bias:
        config.critic_pretrain_head_bias = bias
    _write(result, config, weights, AutoModel._model_mapping[type(config)].__name__, cast, tokenizer)
    write_export_manifest(report.path, tmp, "skyrl", dtype=cast, add_bias=False, files_list=False,
                          optimizer="not exported (Hugging Face folders carry weights only)")
    return result


def _source(report: SeedReport, cast, *, add_bias: bool):
    """(config, weights cast and with a zero bias when ``add_bias``, the head's bias, AutoModel prefix)."""
    from transformers import AutoConfig, AutoModel

    src = ckpt.StepPaths(report.path)
    config = AutoConfig.from_pretrained(str(src.hf_config.parent))
    bias = report.facts["head"]["bias"]
    state = prepare_state(load_state(sorted(src.weights_dir.glob("*.safetensors"))), cast, add_bias=add_bias)
    return config, state, bias, AutoModel._model_mapping[type(config)].base_model_prefix


def _write(result: ExportResult, config, weights: dict, arch: str, cast, tokenizer: str | None) -> None:
    from ..model import write_value_config

    if cast is not None:
        config.dtype = cast
        result.notes.append(f"weights cast to {dtype_name(cast)}")
    write_value_config(config, result.out / "config.json", architecture=arch)
    save_state(weights, result.out / HF_WEIGHTS)
    result.files.update({"config.json": "written", HF_WEIGHTS: "written", ckpt.MANIFEST: "written"})
    add_tokenizer(ckpt.StepPaths(result.source).tokenizer_dir, tokenizer, result.out, result, link=False)


def roll_bias_note(bias: float | None) -> str:
    if bias is None:
        return ("the critic was trained without a head bias (model.head_bias=false); added v_head.summary.bias = 0 "
                "because TRL's ValueHead has one and ROLL loads the sidecar with strict=False (a missing bias would "
                "stay at its random initialisation): values unchanged")
    return f"score.bias = {bias:+.4g}, kept as v_head.summary.bias (TRL's ValueHead has a bias): exact"


def skyrl_bias_note(bias: float | None, target_std: float | None) -> str:
    if bias is None:
        return "none (trained with model.head_bias=false): exported losslessly"
    if bias == 0:
        return "score.bias = 0: dropped, nothing lost"
    size = f"{bias:+.4g}" + (f" ({abs(bias) / target_std:.2f} target std)" if target_std else "")
    return (f"score.bias = {size}: SkyRL's value head is a bias-free Linear and SkyRL has no setting that adds one, "
            f"so it is dropped and every SkyRL value is {abs(bias):.4g} {'lower' if bias > 0 else 'higher'} than "
            "ours (kept in config.json as critic_pretrain_head_bias); for a lossless export, train with "
            "model.head_bias=false")
