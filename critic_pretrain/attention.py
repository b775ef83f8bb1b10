"""Attention for packed (padding-free) batches, chosen in one place.

A packed micro-batch is one row of concatenated rollouts; attention must stay inside each
rollout. Passing ``cu_seq_lens_*`` / ``max_length_*`` into the model forward (as
transformers' flash-attention path does) lets the attention function see the boundaries
without an [N, N] mask. We register one function, ``critic_packed``, with transformers'
``AttentionInterface``; it dispatches to:

- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA, bf16/fp16):
  FlashAttention over the packed row, O(N) memory;
- ``per_sequence``: one causal ``scaled_dot_product_attention`` call per rollout (CPU,
  fp32, or torch without varlen): exact, no [N, N] mask.

transformers' own ``sdpa`` on a packed row builds a block-diagonal [N, N] mask: on CPU
that was 40x slower than per-sequence calls (docs/LOG.md), on GPU no faster than padding.
With ``critic_packed`` transformers builds no mask at all (a custom implementation has no
mask function), so right-padded input with an attention mask also works: causal attention
never looks at the padding after a row's last token.
"""

from __future__ import annotations

import inspect
import logging
from functools import lru_cache

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

NAME = "critic_packed"


@lru_cache(maxsize=1)
def _varlen():
    """(varlen_attn, kwargs that make it causal with GQA) or None when torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    return varlen_attn, causal, "enable_gqa" in params


def backend_for(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel ``critic_packed`` uses for activations of ``dtype`` on ``device``."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _varlen() is not None:
        return "varlen"
    return "per_sequence"


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function. query [B, Hq, T, D], key/value [B, Hkv, T, D] ->
    ([B, T, Hq, D], None)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or query.shape[0] != 1:  # not packed: plain causal attention per row
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None
    if backend_for(query.device, query.dtype) == "varlen":
        return _varlen_forward(query, key, value, cu, kwargs["max_length_q"], scaling), None
    bounds = kwargs.get("cu_seq_lens_cpu")
    bounds = bounds if bounds is not None else cu.tolist()  # host sync only if the CPU copy is missing
    return _per_sequence(query, key, value, bounds, scaling), None


@torch.compiler.disable  # a Python loop over rollouts: under torch.compile, a graph break, not a recompile
def _per_sequence(query, key, value, bounds: list[int], scaling) -> torch.Tensor:
    outs = [F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True,
                                           scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
            for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def _varlen_forward(query, key, value, cu_seqlens, max_len: int, scaling):
    varlen_attn, causal, has_gqa = _varlen()
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))        # [T, H, D]
    # Under autocast q and k leave the rotary embedding in fp32; the kernel needs one 16-bit dtype.
    dtype = value.dtype if value.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    extra = dict(causal)
    if k.shape[1] != q.shape[1]:
        if has_gqa:
            extra["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    cu = cu_seqlens.to(torch.int32)
    out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, **extra)  # [T, Hq, D]
    return out[None]                                                              # [1, T, Hq, D]


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
