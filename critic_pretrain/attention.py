"""Attention for packed (padding-free) batches: the model's own attention, chosen in one place.

A packed micro-batch is one row of concatenated rollouts; attention must stay inside each
rollout. Passing ``cu_seq_lens_*`` / ``max_length_*`` into the model forward (as
transformers' flash-attention path does) lets the attention function see the boundaries
without an [N, N] mask. We register one function, ``critic_packed``, with transformers'
``AttentionInterface``.

transformers calls it with each layer's extras as keyword arguments, and a critic is only a
warm start if we compute exactly what the consumer's eager attention computes with them:

- ``sliding_window`` W (Mistral, Qwen2/Qwen3 windowed layers, Gemma 2 alternating layers,
  ``layer_types``): query i sees keys i-W+1 .. i (transformers' ``sliding_window_overlay``);
- ``softcap`` c (Gemma 2): logits -> c * tanh(logits / c) before the mask;
- ``scaling``: the softmax scale (Gemma 2's ``query_pre_attn_scalar``);
- ``s_aux`` (gpt-oss attention sinks): one extra per-head logit in every softmax, dropped
  from the output;
- ``dropout``: attention dropout while training.

Per call, the fastest exact kernel is chosen:

- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA, 16-bit):
  FlashAttention over the packed row, O(N) memory; windows through its ``window_size``
  where this torch has it. No softcap, sinks or dropout.
- ``sdpa``: one ``scaled_dot_product_attention`` call per rollout (CPU, fp32, sinks, or what
  varlen lacks): causal, or a banded [L, L] mask for a rollout longer than its window. Sinks
  ride on it as one more key that every query sees (``_sdpa_with_sinks``).
- ``math``: the eager formula per rollout (softcap): [H, L, L] logits per rollout, as the
  consumer's eager path holds them.

Anything else a layer asks for (an extra we do not know) is refused: ``inspect_model``
finds it at start-up and the model then runs transformers' own ``sdpa``/``eager`` on the
packed row (exact; an [N, N] mask, slower), and the start-up line says so. Never a
different function silently.

transformers' own ``sdpa`` on a packed row builds a block-diagonal [N, N] mask: on CPU
that was 40x slower than per-sequence calls (docs/LOG.md). With ``critic_packed``
transformers builds no mask at all (a custom implementation has no mask function), so
right-padded input with an attention mask also works: causal attention never looks at
the padding after a row's last token.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

NAME = "critic_packed"

# Keyword arguments that carry no maths (bookkeeping, or the packing we consume ourselves).
PASSIVE = frozenset({"position_ids", "use_cache", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                     "cu_seq_lens_cpu", "output_attentions", "cache_position", "past_key_values", "past_key_value",
                     "layer_idx", "attention_type"})


class UnsupportedAttention(RuntimeError):
    """A layer asked for an attention feature ``critic_packed`` does not reproduce."""


@dataclass(frozen=True)
class Extras:
    """What one attention call asks for beyond plain causal attention."""

    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None   # [Hq] extra logit per head
    dropout: float = 0.0

    @classmethod
    def of(cls, module, sliding_window=None, softcap=None, s_aux=None, dropout=0.0, is_causal=True,
           **kwargs) -> "Extras":
        unknown = sorted(k for k, v in kwargs.items() if k not in PASSIVE and v is not None and v is not False)
        if is_causal is False:
            unknown.append("is_causal=False")
        if unknown:
            raise UnsupportedAttention(f"{type(module).__name__} passes {', '.join(unknown)}")
        p = float(dropout) if module.training else 0.0
        return cls(int(sliding_window) if sliding_window else None, float(softcap) if softcap else None, s_aux, p)


@lru_cache(maxsize=1)
def _varlen():
    """(varlen_attn, kwargs that make it causal, has window_size, has enable_gqa) or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    has_window = "window_size" in params
    causal = {"window_size": (-1, 0)} if has_window else {"is_causal": True}
    return varlen_attn, causal, has_window, "enable_gqa" in params


KERNELS = {"varlen": "torch varlen (FlashAttention)", "sdpa": "per-rollout SDPA", "math": "per-rollout eager formula"}


def _varlen_has_window() -> bool:
    v = _varlen()
    return v is not None and v[2]


def kernel_for(device: torch.device, dtype: torch.dtype, x: Extras) -> str:
    """The kernel ``critic_packed`` uses for one layer's call: varlen, sdpa or math."""
    if x.softcap is not None:
        return "math"
    if x.sinks is not None:  # varlen has no sinks; SDPA carries them as a key (_sdpa_with_sinks)
        return "sdpa"
    if (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _varlen() is not None
            and x.dropout == 0 and (x.window is None or _varlen_has_window())):
        return "varlen"
    return "sdpa"


def compute_dtype(value: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's where it is on, else the tensors'. Under
    autocast an fp32 model's query and key leave the rotary embedding in fp32 (the cos/sin
    tables follow the fp32 residual stream) while value is 16-bit: judging by the query's
    dtype sent every bf16 CUDA run to per-rollout SDPA, 46 cuDNN calls per layer, each
    building a graph for its length (docs/LOG.md, 2026-12-04)."""
    kind = value.device.type  # "meta" (the memory planner's tracing) has no autocast to ask
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return value.dtype


def backend_for(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel for plain causal layers (no extras) on ``device`` with ``dtype``."""
    return kernel_for(device, dtype, Extras())


def packed_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers attention function. query [B, Hq, T, D], key/value [B, Hkv, T, D] ->
    ([B, T, Hq, D], None)."""
    x = Extras.of(module, **kwargs)
    if _RECORDING is not None:
        _RECORDING.append((x, scaling, query.shape[-1]))
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or query.shape[0] != 1:  # not packed: each row is one causal sequence (right padding)
        return _attend(query, key, value, scaling, x).transpose(1, 2).contiguous(), None
    kernel = kernel_for(query.device, compute_dtype(value), x)
    if _COUNTING is not None:
        _COUNTING[kernel] += 1
    if kernel == "varlen":
        return _varlen_forward(query, key, value, cu, kwargs["max_length_q"], scaling, x.window), None
    bounds = kwargs.get("cu_seq_lens_cpu")
    bounds = bounds if bounds is not None else cu.tolist()  # host sync only if the CPU copy is missing
    return _per_sequence(query, key, value, bounds, scaling, x), None


@torch.compiler.disable  # a Python loop over rollouts: under torch.compile, a graph break, not a recompile
def _per_sequence(query, key, value, bounds: list[int], scaling, x: Extras) -> torch.Tensor:
    outs = [_attend(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], scaling, x)
            for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def _attend(q, k, v, scaling, x: Extras) -> torch.Tensor:
    """Causal attention of one sequence (or right-padded rows) with its extras:
    q [B, Hq, L, D], k/v [B, Hkv, L, D] -> [B, Hq, L, D]."""
    L = q.shape[2]
    gqa = k.shape[1] != q.shape[1]
    if x.softcap is None:
        if x.sinks is not None:
            return _sdpa_with_sinks(q, k, v, scaling, x)
        if x.window is None or L <= x.window:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, dropout_p=x.dropout,
                                                  enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_band(L, x.window, q.device), scale=scaling,
                                              dropout_p=x.dropout, enable_gqa=gqa)
    # The eager formula (Gemma 2 softcap, with gpt-oss sinks if a model had both): logits [B, Hq, L, L] in memory.
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    if x.softcap is not None:
        logits = torch.tanh(logits / x.softcap) * x.softcap
    allowed = _band(L, x.window, q.device) if x.window is not None else _band(L, L, q.device)
    acc = torch.promote_types(logits.dtype, torch.float32)  # softmax in fp32 at least, as transformers' eager
    logits = logits.masked_fill(~allowed, float("-inf")).to(acc)
    if x.sinks is not None:  # one more logit per head in each softmax; its probability is dropped
        sink = x.sinks.to(acc).reshape(1, -1, 1, 1).expand(logits.shape[0], -1, L, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    probs = F.dropout(probs, p=x.dropout, training=x.dropout > 0).to(v.dtype)
    return torch.matmul(probs, v)


def _sdpa_with_sinks(q, k, v, scaling, x: Extras) -> torch.Tensor:
    """gpt-oss attention sinks through SDPA, exactly: the eager softmax over [logits, sink_h]
    with the sink's probability dropped is attention over one more key, placed before the first
    token, that every query sees, whose logit is ``sink_h`` and whose value is 0.

    The head dimension grows by two (to a multiple of 8 on CUDA, where the fused kernels want
    one): the queries carry ``sink_h / scale`` there as a pair in the compute dtype, hi + lo, so
    the kernel's fp32 accumulation sees it to ~16 bits where one bf16 number keeps 8 (in fp32 lo
    is 0); the real keys carry (0, 0) and the sink key (1, 1), so the sink key's logit is
    ``sink_h`` and every other logit is unchanged (the sink lives in the query, so it stays per
    query head under GQA). A zero query row before the first token makes the [L + 1, L + 1]
    problem square, so ``is_causal`` lets token i see the sink and tokens 0..i; its output row is
    dropped. Gradients reach ``sinks`` through the queries' extra dimensions. On a causal layer
    the kernel can be flash, O(L) memory (the eager formula holds [Hq, L, L] logits: 64 GB for
    64 heads at 16k tokens in fp32); a windowed layer longer than its window passes an
    [L + 1, L + 1] mask, as the plain windowed path does.
    q [B, Hq, L, D], k/v [B, Hkv, L, D] -> [B, Hq, L, D]."""
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    dt = compute_dtype(v)  # under autocast q and k leave RoPE in fp32: split the sink for the dtype that runs
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    scale = scaling if scaling is not None else D ** -0.5
    extra = 2 + (-(D + 2)) % 8 if q.device.type == "cuda" else 2  # CUDA: D + extra a multiple of 8
    s = x.sinks.to(torch.promote_types(x.sinks.dtype, torch.float32)) / scale         # [Hq]
    hi = s.to(dt)
    lo = (s - hi.to(s.dtype)).to(dt)
    sink = F.pad(torch.stack([hi, lo], dim=-1), (0, extra - 2))                      # [Hq, extra]
    q1 = torch.cat([F.pad(q, (0, 0, 1, 0)), sink.reshape(1, Hq, 1, extra).expand(B, Hq, L + 1, extra)], dim=-1)
    key = F.pad(k.new_ones(2), (0, extra - 2))                                       # (1, 1, 0..)
    sink_key = F.pad(key.expand(B, Hkv, 1, extra), (D, 0))                           # [B, Hkv, 1, D+extra]
    k1 = torch.cat([sink_key, F.pad(k, (0, extra))], dim=2)                          # [B, Hkv, L+1, D+extra]
    # value 0 for the sink key; zero dimensions too, since CPU flash wants v as wide as q (9x faster)
    v1 = F.pad(v, (0, extra, 1, 0))                                                  # [B, Hkv, L+1, D+extra]
    gqa = Hkv != Hq
    if x.window is None or L <= x.window:
        out = F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, scale=scale, dropout_p=x.dropout,
                                             enable_gqa=gqa)
    else:  # the window over the real keys; the sink key stays in every row's view
        allowed = torch.zeros(L + 1, L + 1, dtype=torch.bool, device=q.device)
        allowed[:, 0] = True
        allowed[1:, 1:] = _band(L, x.window, q.device)
        out = F.scaled_dot_product_attention(q1, k1, v1, attn_mask=allowed, scale=scale, dropout_p=x.dropout,
                                             enable_gqa=gqa)
    return out[:, :, 1:, :D]


def _band(L: int, window: int, device) -> torch.Tensor:
    """[L, L] bool: query i may see key j when i - window < j <= i."""
    i = torch.arange(L, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


def _varlen_forward(query, key, value, cu_seqlens, max_len: int, scaling, window: int | None):
    varlen_attn, causal, _, has_gqa = _varlen()
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))        # [T, H, D]
    # Under autocast q and k leave the rotary embedding in fp32; the kernel needs one 16-bit dtype.
    dtype = compute_dtype(value)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    extra = {"window_size": (window - 1, 0)} if window is not None else dict(causal)
    if k.shape[1] != q.shape[1]:
        if has_gqa:
            extra["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    cu = cu_seqlens.to(torch.int32)
    out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, **extra)  # [T, Hq, D]
    return out[None]                                                              # [1, T, Hq, D]


# ---------------------------------------------------------------------------------------------
# What a model asks of its attention, found once at start-up

_RECORDING: list | None = None
_COUNTING: Counter | None = None


@contextmanager
def count_kernels():
    """Count the kernel each packed attention call runs (tests hold it against the plan)::

        with count_kernels() as used:
            model(...)
        assert used == plan.kernels(device, dtype)   # one forward: one call per layer
    """
    global _COUNTING
    _COUNTING = Counter()
    try:
        yield _COUNTING
    finally:
        _COUNTING = None


@dataclass
class AttentionPlan:
    """The attention extras of every layer of a model, as its forward passes them."""

    layers: int = 0
    windows: Counter = field(default_factory=Counter)      # window -> layers
    softcap: set = field(default_factory=set)
    sinks: int = 0
    dropout: float = 0.0
    scalings: set = field(default_factory=set)
    unsupported: str | None = None
    extras: list = field(default_factory=list)

    def kernels(self, device: torch.device, dtype: torch.dtype) -> Counter:
        return Counter(kernel_for(device, dtype, x) for x in self.extras)

    def describe(self, device: torch.device, dtype: torch.dtype) -> str:
        """One phrase for the start-up line: kernels per layer and the features reproduced."""
        if self.unsupported:
            return (f"{NAME} cannot reproduce this model ({self.unsupported}), so transformers' own exact path runs "
                    "on packed rows (an [N, N] mask per micro-batch: slower)")
        if not self.layers:
            return "transformers' own implementation, as configured (model.attn_implementation)"
        feats = [f"sliding window {w} on {n}/{self.layers} layers" for w, n in sorted(self.windows.items())]
        if self.softcap:
            feats.append(f"logit softcap {', '.join(f'{c:g}' for c in sorted(self.softcap))}")
        if self.sinks:
            feats.append(f"attention sinks on {self.sinks}/{self.layers} layers")
        if self.dropout:
            feats.append(f"dropout {self.dropout:g}")
        if self.scalings:
            feats.append(f"softmax scale {', '.join(f'{s:.4g}' for s in sorted(self.scalings))}")
        ks = self.kernels(device, dtype)
        kern = ", ".join(f"{KERNELS[k]} on {n}/{self.layers} layers" for k, n in ks.most_common())
        why = []
        if ks.get("math"):
            why.append("softcap needs the exact per-rollout eager formula")
        if ks.get("sdpa") and device.type == "cuda" and self.sinks:
            why.append("varlen has no sinks: they ride on SDPA as one more key")
        elif ks.get("sdpa") and device.type == "cuda" and self.windows and not _varlen_has_window():
            why.append("this torch's varlen has no window_size")
        return f"{kern}" + (f" ({'; '.join(feats)})" if feats else "") + (f"; {'; '.join(why)}" if why else "")


def inspect_model(model) -> AttentionPlan:
    """Run a 2-token forward (train mode, no grad) and record what each layer passes to
    ``critic_packed``. A feature we do not reproduce switches the model to transformers'
    own exact attention (sdpa, else eager) and is named in ``plan.unsupported``."""
    global _RECORDING
    plan = AttentionPlan()
    if getattr(model.config, "_attn_implementation", None) != NAME:
        return plan
    was_training = model.training
    device = next(model.parameters()).device
    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    _RECORDING = []
    try:
        with torch.no_grad():
            model.train()
            model(input_ids=ids, position_ids=torch.arange(2, device=device)[None], use_cache=False)
    except UnsupportedAttention as e:
        plan.unsupported = str(e)
    finally:
        recorded, _RECORDING = _RECORDING, None
        model.train(was_training)
    for x, scaling, head_dim in recorded:
        plan.layers += 1
        plan.extras.append(x)
        if x.window is not None:
            plan.windows[x.window] += 1
        if x.softcap is not None:
            plan.softcap.add(x.softcap)
        plan.sinks += x.sinks is not None
        plan.dropout = max(plan.dropout, x.dropout)
        if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
            plan.scalings.add(round(float(scaling), 6))  # a custom softmax scale (Gemma 2)
    if plan.unsupported:
        fallback = "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"
        model.set_attn_implementation(fallback)
        log.warning("attention: %s; using transformers' own %s on packed rows instead (exact; builds an [N, N] "
                    "mask per micro-batch, slower)", plan.unsupported, fallback)
    return plan


def register() -> str:
    """Register ``critic_packed`` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, packed_attention)
    return NAME


def resolve(name: str) -> str:
    """Map the config's ``model.attn_implementation`` to what transformers gets."""
    if name in ("auto", NAME):
        return register()
    return name


def packed_kwargs(seq_lens: torch.Tensor, device: torch.device) -> dict:
    """Forward kwargs that carry a packed row's rollout boundaries to the attention function.

    ``seq_lens`` [k] int32 on the host (no sync to build these).
    """
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(seq_lens, 0)
    max_len = int(seq_lens.max())
    cu_dev = cu.to(device, non_blocking=True)
    return {"cu_seq_lens_q": cu_dev, "cu_seq_lens_k": cu_dev, "max_length_q": max_len, "max_length_k": max_len,
            "cu_seq_lens_cpu": cu.tolist()}
