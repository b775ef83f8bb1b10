"""The value model: a Hugging Face backbone with a scalar head, and its value alignment.

The model is ``AutoModelForTokenClassification(config, num_labels=1)`` with
``classifier_dropout = 0.0``: exactly the class NeMo-RL (DTensor backend) and verl
instantiate for a critic, so our weights load into theirs with strict key matching
(``model.<backbone>``, ``score.weight`` [1, H], ``score.bias`` [1]).

Alignment (DESIGN.md, all PPO frameworks agree): the value of token t is the head applied
to the hidden state at t-1; position 0 of every sequence gets 0. ``token_values`` applies
that shift, also inside packed batches where each sequence starts at ``position_ids == 0``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForTokenClassification, PretrainedConfig, PreTrainedModel

from . import attention
from .config import ModelConfig
from .errors import UserError

log = logging.getLogger(__name__)


def build_config(cfg: ModelConfig) -> PretrainedConfig:
    """The HF config of the value model: backbone config + ``num_labels=1``, no head dropout."""
    overrides = dict(cfg.config or {})
    if cfg.name_or_path:
        try:
            config = AutoConfig.from_pretrained(cfg.name_or_path, trust_remote_code=cfg.trust_remote_code)
        except (OSError, ValueError) as e:
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: cannot read its config ({_first_line(e)}); "
                            "pass a local model folder or a hub id that is in the local cache") from None
        overrides.pop("model_type", None)
        for k, v in overrides.items():
            setattr(config, k, v)
    else:
        overrides = dict(overrides)
        model_type = overrides.pop("model_type")
        try:
            config = AutoConfig.for_model(model_type, **overrides)
        except ValueError as e:
            raise UserError(f"model.config: {_first_line(e)}; use a transformers model_type such as qwen2 or llama") from None
    config.num_labels = 1
    config.id2label, config.label2id = {0: "LABEL_0"}, {"LABEL_0": 0}
    config.classifier_dropout = 0.0  # HF otherwise puts dropout 0.1 in front of the head
    config.token_classification_bias = cfg.head_bias
    config.use_cache = False
    return config


def build_value_model(cfg: ModelConfig, *, init_head: bool = True) -> PreTrainedModel:
    """Instantiate the value model (random init, pretrained backbone, or reward model).

    ``init_head=False`` keeps whatever head the weights had (used when a checkpoint's
    weights will be loaded over it anyway).
    """
    config = build_config(cfg)
    dtype = getattr(torch, cfg.dtype)
    attn = attention.resolve(cfg.attn_implementation)
    kwargs = dict(config=config, dtype=dtype, attn_implementation=attn, trust_remote_code=cfg.trust_remote_code)
    if cfg.name_or_path:
        try:
            model, info = AutoModelForTokenClassification.from_pretrained(
                cfg.name_or_path, output_loading_info=True, **kwargs)
        except (OSError, ValueError) as e:
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: cannot load weights ({_first_line(e)})") from None
        missing = set(info.get("missing_keys", ()))
        backbone_missing = sorted(k for k in missing if not k.startswith("score."))
        if backbone_missing:
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: backbone weights missing "
                            f"({', '.join(backbone_missing[:3])}...); is it a causal LM of this model_type?")
        if cfg.init_from == "reward_model":
            if "score.weight" in missing:
                raise UserError(f"model.init_from=reward_model but {cfg.name_or_path!r} has no 'score' head; "
                                "point at a *ForSequenceClassification reward model, or use init_from=backbone")
            log.info("value head taken from the reward model at %s", cfg.name_or_path)
            init_head = "score.bias" in missing and cfg.head_bias  # only a missing bias needs a value
            if init_head:
                nn.init.zeros_(model.score.bias)
                init_head = False
    else:
        model = AutoModelForTokenClassification.from_config(config, dtype=dtype, attn_implementation=attn,
                                                           trust_remote_code=cfg.trust_remote_code)
    _set_head_bias(model, cfg.head_bias)
    if init_head:
        init_value_head(model, cfg.head_init, cfg.head_std)
    return model


def _set_head_bias(model: PreTrainedModel, bias: bool) -> None:
    """Older transformers ignore ``token_classification_bias``: enforce the head's bias here."""
    head: nn.Linear = model.score
    if (head.bias is not None) == bias:
        return
    new = nn.Linear(head.in_features, head.out_features, bias=bias, device=head.weight.device,
                    dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        if bias:
            new.bias.zero_()
    model.score = new


def init_value_head(model: PreTrainedModel, how: str, std: float, bias: float = 0.0) -> None:
    with torch.no_grad():
        if how == "zero":
            model.score.weight.zero_()
        else:
            model.score.weight.normal_(0.0, std)
        if model.score.bias is not None:
            model.score.bias.fill_(bias)


def set_head_bias_value(model: PreTrainedModel, value: float) -> None:
    """Start the head's bias at ``value`` (e.g. the mean target), if it has one."""
    if model.score.bias is not None:
        with torch.no_grad():
            model.score.bias.fill_(value)


def shift_values(logits: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] head outputs -> [B, T] values: value[t] = head(h[t-1]), 0 at every sequence start.

    Packed rows hold several sequences; each starts where ``position_ids == 0``.
    """
    values = torch.zeros_like(logits)
    values[:, 1:] = logits[:, :-1]
    return values.masked_fill(position_ids == 0, 0.0)


def token_values(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None = None, seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Values [B, T] (float32) for ``input_ids`` [B, T], aligned as PPO frameworks expect.

    Packed input: B = 1, ``position_ids`` restarting at 0 per rollout, ``seq_lens`` [k]
    (host tensor) giving the rollout lengths so attention stays inside each rollout
    without an [N, N] mask. Padded input: right padding with ``attention_mask``.
    """
    kwargs = {}
    if seq_lens is not None and _attn_impl(model) in (attention.NAME, "flash_attention_2", "flash_attention_3"):
        kwargs = attention.packed_kwargs(seq_lens, input_ids.device)
        if _attn_impl(model) != attention.NAME:
            kwargs.pop("cu_seq_lens_cpu")
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                use_cache=False, **kwargs)
    return shift_values(out.logits.squeeze(-1).float(), position_ids)


def _attn_impl(model: nn.Module) -> str:
    config = getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)
    return getattr(config, "_attn_implementation", "") or ""


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total, trainable and 'matmul' parameters (no embeddings), for logs and MFU."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emb = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    return {"total": total, "trainable": trainable, "matmul": total - emb}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def write_value_config(config: PretrainedConfig, path: str | Path, architecture: str | None = None) -> None:
    """Write a value model's ``config.json``: ``num_labels: 1`` spelled out (transformers 5
    writes only ``id2label``; readers that default to 2 labels would build the wrong head),
    ``classifier_dropout: 0.0`` and the architecture."""
    d = config.to_dict()
    d["num_labels"] = 1
    d["classifier_dropout"] = 0.0
    d["architectures"] = [architecture or d.get("architectures", [None])[0]
                          or f"{type(config).__name__.removesuffix('Config')}ForTokenClassification"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
