"""The value model: a Hugging Face backbone with a scalar head, and its value alignment.

The model is ``AutoModelForTokenClassification(config, num_labels=1)`` with
``classifier_dropout = 0.0``: exactly the class NeMo-RL (DTensor backend) and verl
instantiate for a critic, so our weights load into theirs with strict key matching
(``model.<backbone>``, ``score.weight`` [1, H], ``score.bias`` [1]).

Alignment (docs/design.md, all PPO frameworks agree): the value of token t is the head applied
to the hidden state at t-1; position 0 of every sequence gets 0. ``token_values`` applies
that shift, also inside packed batches where each sequence starts at ``position_ids == 0``.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import logging
import pickle
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForTokenClassification, PretrainedConfig, PreTrainedModel

from rollouts import fileio

from . import attention
from .config import ModelConfig
from .errors import UserError, did_you_mean, first_line

log = logging.getLogger(__name__)


def build_config(cfg: ModelConfig, *, saved: bool = False) -> PretrainedConfig:
    """The HF config of the value model: backbone config + ``num_labels=1``, no head dropout.

    ``saved``: ``cfg.config`` is a config.json transformers wrote (a checkpoint's), not keys a
    user typed: it is not checked for typos (a converted backbone's config carries fields its
    class does not declare, e.g. a GGUF-built Llama's ``unk_token_id``)."""
    overrides = dict(cfg.config or {})
    if cfg.name_or_path:
        if str(cfg.name_or_path).lower().endswith(".gguf"):  # transformers reads it, but we save plain folders
            raise UserError(f"model.name_or_path={cfg.name_or_path!r} is a GGUF file; pass a model folder: build one "
                            "from it with transformers (from_pretrained(folder, gguf_file=...), then save_pretrained; "
                            "examples/smollm2/model.py does this for SmolLM2)")
        try:
            config = AutoConfig.from_pretrained(cfg.name_or_path, trust_remote_code=cfg.trust_remote_code)
        except (OSError, ValueError) as e:
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: cannot read its config ({first_line(e)}); "
                            "pass a local model folder or a hub id that is in the local cache") from None
        overrides.pop("model_type", None)
        check_config_keys(type(config)(), overrides)
        for k in sorted(SHAPE_KEYS & overrides.keys()):
            if getattr(config, k, None) is not None and overrides[k] != getattr(config, k):
                raise UserError(f"model.config.{k}={overrides[k]!r} differs from {cfg.name_or_path}'s {k}="
                                f"{getattr(config, k)!r}: its weights have that shape; drop the override "
                                "(model.config=null clears a recipe's random-init model, e.g. the demo's)")
        for k, v in overrides.items():
            try:
                setattr(config, k, v)
            except CONFIG_ERRORS as e:
                raise UserError(f"model.config.{k}={v!r}: transformers refuses it ({first_line(e)}); "
                                "drop or fix that override") from e
    else:
        overrides = dict(overrides)
        model_type = overrides.pop("model_type")
        try:
            if not saved:
                check_config_keys(AutoConfig.for_model(model_type), overrides)
            config = AutoConfig.for_model(model_type, **overrides)
        except ValueError as e:
            raise UserError(f"model.config: {first_line(e)}; "
                            "use a transformers model_type such as qwen2 or llama") from None
        except CONFIG_ERRORS as e:
            raise UserError(f"model.config: transformers refuses this {model_type!r} config ({first_line(e)}); "
                            "fix that field, or start from a real model's config.json") from e
    config.num_labels = 1
    config.id2label, config.label2id = {0: "LABEL_0"}, {"LABEL_0": 0}
    config.classifier_dropout = 0.0  # HF otherwise puts dropout 0.1 in front of the head
    config.token_classification_bias = cfg.head_bias
    config.use_cache = False
    check_config(config, "model.config" if not cfg.name_or_path else f"model.name_or_path={cfg.name_or_path!r}",
                 remote_code=cfg.trust_remote_code)
    return config


SHAPE_KEYS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim"})
"""Config keys that size pretrained weights: an override of one on a loaded backbone cannot load."""

# Keys transformers still accepts and folds into other fields (RoPE settings into rope_parameters),
# and the head fields our own config.json carries.
LEGACY_CONFIG_KEYS = frozenset({"rope_theta", "rope_scaling", "rope_type", "partial_rotary_factor", "torch_dtype",
                                "_name_or_path", "transformers_version", "architectures", "auto_map", "num_labels",
                                "id2label", "label2id", "classifier_dropout", "token_classification_bias"})


def check_config_keys(default: PretrainedConfig, keys) -> None:
    """An unknown ``model.config`` key is a typo until proven otherwise: transformers would
    store it and silently build the default (a `hiden_size` trains a 4096-wide model). Known:
    the config class's fields and the optional ones its modeling code reads (Qwen2's `head_dim`).
    Keys with a leading underscore are metadata no modeling code reads (a GGUF-converted config
    carries `_model_name_or_path`, the GGUF's name): a typo there builds nothing different."""
    keys = [k for k in keys if not k.startswith("_")]
    known = (set(dir(default)) | set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
             | LEGACY_CONFIG_KEYS | modeling_keys(type(default)))
    for key in keys:
        if key not in known:
            hint = did_you_mean(key, (k for k in known if not k.startswith("_")), list_known=False)
            raise UserError(f"model.config.{key}: {type(default).__name__} has no such field; "
                            f"{hint or 'check the spelling against the model config.json'}")


@functools.cache
def modeling_keys(config_class: type) -> frozenset[str]:
    """Config attributes the family's modeling code reads, declared or not: ``config.X`` and
    ``getattr(config, "X", default)`` (parsed, so comments and strings do not count) in the module
    of its token-classification class and in the
    RoPE helpers every family calls. Reading the source (not a list per family) keeps this right
    for families and transformers releases we have not seen."""
    import transformers.modeling_rope_utils as rope
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

    model_class = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING.get(config_class, None)
    modules = [rope] + ([inspect.getmodule(model_class)] if model_class is not None else [])
    keys: set[str] = set()
    for module in modules:
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):  # no source shipped (a frozen install): declared fields only
            continue
        keys.update(_config_reads(ast.parse(source)))
    return frozenset(keys)


def _is_config(node: ast.AST) -> bool:
    """``config`` or ``self.config``."""
    return (isinstance(node, ast.Name) and node.id == "config") or (
        isinstance(node, ast.Attribute) and node.attr == "config")


def _config_reads(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_config(node.value):
            yield node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and _is_config(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            yield node.args[1].value


def check_config(config: PretrainedConfig, where: str, remote_code: bool = False) -> None:
    """Refuse, in one line, a model PPO frameworks cannot load as a critic or that
    transformers would reject with a traceback."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

    custom = remote_code and "AutoModelForTokenClassification" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING and not custom:
        import transformers
        raise UserError(
            f"{where}: model_type {config.model_type!r} has no token-classification class in transformers "
            f"{transformers.__version__}, and NeMo-RL and verl load a critic with AutoModelForTokenClassification, "
            f"so no PPO run could load this critic; use a family that has one (e.g. {', '.join(SUPPORTED_FAMILIES)}; "
            "see the README's supported models)")
    vocab = getattr(config, "vocab_size", None)
    pad = getattr(config, "pad_token_id", None)
    if isinstance(vocab, int) and isinstance(pad, int) and not 0 <= pad < vocab:
        raise UserError(f"{where}: pad_token_id={pad} is not a token of the vocabulary (vocab_size={vocab}), which "
                        "transformers rejects; set model.config.pad_token_id to an id below vocab_size, or null")
    if not custom:
        try:
            with torch.device("meta"):  # no memory, no weights: what the class looks like
                probe = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING[type(config)](copy.deepcopy(config))
        except CONFIG_ERRORS as e:  # transformers' own config checks
            raise UserError(f"{where}: transformers cannot build {config.model_type!r} from this config "
                            f"({first_line(e)}); fix that field, or start from a real model's config.json") from e
        head = getattr(probe, "score", None)
        if not isinstance(head, nn.Linear):
            raise UserError(f"{where}: {type(probe).__name__} names its head differently from 'score' (the name "
                            f"NeMo-RL's strict loader and verl expect); use a family whose token-classification "
                            f"class has a 'score' head (e.g. {', '.join(SUPPORTED_FAMILIES)})")
        if any(getattr(m, "is_causal", True) is False for m in probe.modules()):
            raise UserError(f"{where}: model_type {config.model_type!r} attends in both directions, so its value of "
                            "token t would see tokens after t; a critic needs a causal LM backbone (e.g. "
                            f"{', '.join(SUPPORTED_FAMILIES)})")


try:
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # older huggingface_hub: configs are not strict dataclasses
    StrictDataclassError = ValueError

CONFIG_ERRORS = (ValueError, AssertionError, TypeError, KeyError, AttributeError, NotImplementedError,
                 StrictDataclassError)
"""What transformers raises for a config it cannot build a model from (its own validation)."""

SUPPORTED_FAMILIES = ("qwen2", "qwen3", "qwen3_moe", "llama", "mistral", "gemma2", "phi3", "gpt_oss")
"""Families the test suite proves exact end to end (tests/test_attention.py); the README lists them."""


def position_limit(config: PretrainedConfig) -> int | None:
    """The longest rollout the model supports: ``max_position_embeddings``, or what its RoPE
    scaling extends that to (``factor x original_max_position_embeddings`` for yarn, linear,
    dynamic, longrope, llama3). None when the config states no limit."""
    mpe = getattr(config, "max_position_embeddings", None)
    if not isinstance(mpe, int) or mpe <= 0:
        return None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, dict) and not ("rope_type" in rope or "type" in rope):  # per layer type (Gemma 3 style)
        rope = next((r for r in rope.values() if isinstance(r, dict) and r.get("factor")), {})
    kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if kind in ("yarn", "linear", "dynamic", "longrope", "llama3") and factor:
        original = rope.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None) or mpe
        return max(mpe, int(float(factor) * int(original)))
    return mpe


def build_value_model(cfg: ModelConfig, *, init_head: bool = True, config: PretrainedConfig | None = None,
                      ) -> PreTrainedModel:
    """Instantiate the value model (random init, pretrained backbone, or reward model).

    ``init_head=False`` keeps whatever head the weights had (used when a checkpoint's
    weights will be loaded over it anyway). ``config``: ``build_config(cfg)`` when the
    caller already has it. The model's ``attention_plan`` says what its layers ask of
    attention and which kernels reproduce it (``attention.inspect_model``).
    """
    config = config if config is not None else build_config(cfg)
    dtype = getattr(torch, cfg.dtype)
    attn = attention.resolve(cfg.attn_implementation)
    kwargs = dict(config=config, dtype=dtype, attn_implementation=attn, trust_remote_code=cfg.trust_remote_code)
    if cfg.name_or_path:
        try:
            with _quiet_load_report():
                model, info = AutoModelForTokenClassification.from_pretrained(
                    cfg.name_or_path, output_loading_info=True, **kwargs)
        except (OSError, ValueError, AssertionError) as e:
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: cannot load weights ({first_line(e)})") from e
        except pickle.UnpicklingError:  # torch.load(weights_only=True) met something other than tensors
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: its pickle weights (*.bin) hold objects other "
                            "than tensors, and pickle weights are read as plain tensors only (nothing in them ran); "
                            "use a copy of the model with safetensors weights") from None
        except RuntimeError as e:  # shapes that differ from the weights (an override SHAPE_KEYS does not name)
            if "size mismatch" not in str(e) and "ignore_mismatched_sizes" not in str(e):
                raise
            raise UserError(f"model.name_or_path={cfg.name_or_path!r}: its weights do not fit the config "
                            f"({first_line(e)[:160]}); drop the model.config overrides that change shapes") from e
        missing = set(info.get("missing_keys", ()))
        _log_load(cfg.name_or_path, missing, set(info.get("unexpected_keys", ())))
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
        try:
            model = AutoModelForTokenClassification.from_config(config, dtype=dtype, attn_implementation=attn,
                                                               trust_remote_code=cfg.trust_remote_code)
        except CONFIG_ERRORS as e:  # transformers' own config checks
            raise UserError(f"model.config: transformers cannot build {config.model_type!r} from it "
                            f"({first_line(e)}); fix that field, or start from a real model's config.json") from e
    _set_head_bias(model, cfg.head_bias)
    if init_head:
        init_value_head(model, cfg.head_init, cfg.head_std)
    model.attention_plan = attention.inspect_model(model)
    model.packing = "packed"
    if config.model_type not in SUPPORTED_FAMILIES:
        check_packing(model)
    return model


@contextlib.contextmanager
def _quiet_load_report():
    """transformers prints a LOAD REPORT table for every key a causal LM and our class do not
    share (``score.*`` missing, ``lm_head.weight`` unexpected: expected for a critic); ``_log_load``
    says it in one line and names anything else."""
    def no_report(record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)

    # A filter, not a level: transformers runs extra checks when this logger's level is WARNING+.
    report = logging.getLogger("transformers.modeling_utils")
    report.addFilter(no_report)
    try:
        yield
    finally:
        report.removeFilter(no_report)


def _log_load(source: str, missing: set[str], unexpected: set[str]) -> None:
    """One line for the expected differences between a causal LM (or reward model) and the
    value model; a warning for unexpected keys other than the LM head."""
    head = sorted(k for k in missing if k.startswith("score."))
    lm_head = sorted(k for k in unexpected if k.startswith("lm_head."))
    log.info("backbone weights from %s%s%s", source,
             f"; new value head ({', '.join(head)})" if head else "",
             f"; the LM head ({', '.join(lm_head)}) is left out: a critic has none" if lm_head else "")
    other = sorted(unexpected - set(lm_head))
    if other:
        log.warning("%s holds %d weight(s) the value model has no place for, left out: %s%s", source, len(other),
                    ", ".join(other[:5]), " ..." if len(other) > 5 else "")


def check_packing(model: PreTrainedModel) -> None:
    """For a family outside the tested matrix: compare packed values with the consumer's view
    (eager attention, one rollout at a time) on two short random rollouts. A family that
    mixes rollouts in a packed row (positions or state computed over the row) trains on
    right-padded rows instead (exact, slower); if that differs too, refuse.

    Costs two forwards of about 40 tokens on the model's current device, once."""
    lens = [23, 17]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(int(model.config.vocab_size), 1000), (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    device = next(model.parameters()).device
    ids, pos = ids.to(device), pos.to(device)
    was_training, impl = model.training, model.config._attn_implementation
    model.eval()
    try:
        with torch.no_grad():
            model.set_attn_implementation("eager")  # the consumer's view, on the same weights
            truth = torch.cat([token_values(model, ids[:, s:e], pos[:, s:e])[0]
                               for s, e in zip([0, lens[0]], [lens[0], sum(lens)])])
            model.set_attn_implementation(impl)
            tol = 1e-4 * max(1.0, float(truth.abs().max()))
            found = []
            for mode in ("packed", "padded"):
                model.packing = mode
                try:
                    diff = float((token_values(model, ids, pos, seq_lens=seq_lens)[0] - truth).abs().max())
                except Exception as e:  # e.g. a linear-attention layer that refuses packed rows
                    found.append(f"{mode}: {first_line(e)}")
                    continue
                if diff <= tol:
                    break
                found.append(f"{mode}: max |diff| {diff:.3g}")
            else:
                raise UserError(f"model_type {model.config.model_type!r}: our values differ from transformers' eager "
                                f"attention on the same weights ({'; '.join(found)}), so a PPO run would load a "
                                f"different critic; use a tested family ({', '.join(SUPPORTED_FAMILIES)})")
    finally:
        model.set_attn_implementation(impl)
        model.train(was_training)
    model.packing_note = (f"model_type {model.config.model_type!r} is outside the tested families: checked at start-up "
                          f"against eager attention one rollout at a time ({mode} rows, max |diff| {diff:.2g})"
                          + (f"; packed rows differ ({found[0]}), so micro-batches run as right-padded rows" if found
                             else ""))
    log.warning("%s", model.packing_note)


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


def is_head(parameter_name: str) -> bool:
    """The value head's parameters (``score.weight``, ``score.bias``; under DDP ``module.score.*``)."""
    return parameter_name.startswith(("score.", "module.score."))


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant): transformers'
    ``activation_checkpointing_enable`` where it exists (5.2x), else the older name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


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
    if seq_lens is not None and getattr(_raw(model), "packing", "packed") == "padded":
        return _padded_values(model, input_ids, seq_lens)
    if seq_lens is not None and _attn_impl(model) in (attention.NAME, "flash_attention_2", "flash_attention_3"):
        kwargs = attention.packed_kwargs(seq_lens, input_ids.device)
        if _attn_impl(model) != attention.NAME:
            kwargs.pop("cu_seq_lens_cpu")
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                use_cache=False, **kwargs)
    return shift_values(out.logits.squeeze(-1).float(), position_ids)


def _padded_values(model: nn.Module, input_ids: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Values [1, N] of a packed row computed as k right-padded rows [k, max_len] (for families
    that mix rollouts inside a packed row). ``seq_lens`` [k] on the host: no sync."""
    lens = seq_lens.tolist()
    k, width = len(lens), max(lens)
    device = input_ids.device
    valid = torch.arange(width)[None, :] < seq_lens.long()[:, None]            # [k, width] host
    where = valid.to(device, non_blocking=True)
    padded = torch.zeros(k, width, dtype=input_ids.dtype, device=device)
    padded[where] = input_ids[0]
    pos = torch.arange(width, device=device).expand(k, width)
    values = token_values(model, padded, pos, attention_mask=where.long())      # [k, width]
    return values[where][None]                                                  # [1, N]


def _raw(model: nn.Module) -> nn.Module:
    """The model inside a DDP/accelerate wrapper."""
    return getattr(model, "module", model)


def _attn_impl(model: nn.Module) -> str:
    config = getattr(model, "config", None) or getattr(_raw(model), "config", None)
    return getattr(config, "_attn_implementation", "") or ""


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total, trainable and 'matmul' parameters (no embeddings), for logs and MFU."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emb = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    return {"total": total, "trainable": trainable, "matmul": total - emb}




def write_value_config(config: PretrainedConfig, path: str | Path, architecture: str | None = None) -> None:
    """Write a value model's ``config.json``: ``num_labels: 1`` spelled out (transformers 5
    writes only ``id2label``; readers that default to 2 labels would build the wrong head),
    ``classifier_dropout: 0.0`` and the architecture."""
    d = config.to_dict()
    d.pop("trust_remote_code", None)  # a planted key is not ours to pass on (the loader's flag decides)
    d.pop("_name_or_path", None)  # where it was loaded from here, meaningless in the consumer's folder
    d["num_labels"] = 1
    d["classifier_dropout"] = 0.0
    d["architectures"] = [architecture or d.get("architectures", [None])[0]
                          or f"{type(config).__name__.removesuffix('Config')}ForTokenClassification"]
    fileio.write_json(path, d, sort_keys=True)
