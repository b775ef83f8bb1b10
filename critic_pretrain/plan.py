"""A memory plan before a long run: ``critic-pretrain plan --config X [--world N] [--gpu-gb G]``.

Builds the value model on the meta device (no memory, no weights) and prints, per rank:

- parameters, gradients and AdamW moments under DDP (replicated; plus DDP's gradient buckets)
  and FSDP2 (sharded over the ranks; plus the unsharded buffers of the layers being gathered);
- activation memory per token, with and without gradient checkpointing, measured: a meta
  forward of the real architecture counts the bytes autograd saves for backward (parameters
  excluded), for one and two decoder layers, so the per-layer and the fixed part separate;
- the largest ``data.max_tokens`` per micro-batch that fits a GPU of ``--gpu-gb``.

Assumptions, printed with the plan: fp32 master weights, gradients and AdamW moments (4 bytes
each: 16 bytes per parameter), activations in the compute dtype (bf16 under mixed precision),
2 GiB for the CUDA context and 10% of the GPU kept free for fragmentation; packed rollouts of
64 tokens in the measurement, whose [L, L] attention scores (the meta device's math attention)
are not counted: FlashAttention and the CPU flash kernel keep none.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

import torch
from torch import nn

GIB = 1 << 30
CONTEXT_GIB = 2.0
FREE_SHARE = 0.10
MEASURE_ROLLOUTS, MEASURE_LEN = 16, 64


@dataclass
class Plan:
    name: str
    parameters: int
    matmul_parameters: int
    layers: int
    largest_layer: int
    """Parameters of the largest fully_shard unit (a decoder layer)."""
    master_bytes: int
    compute_bytes: int
    act_per_token: float
    """Bytes saved for backward per token of a micro-batch, no gradient checkpointing."""
    act_per_token_ckpt: float
    """The same with gradient checkpointing: what the forward keeps (layer inputs) plus one
    layer's activations while backward recomputes it."""
    per_layer: float
    """Bytes per token one decoder layer saves for backward (no checkpointing)."""

    def static(self, kind: str, world: int) -> dict[str, float]:
        """Bytes per rank before activations: parameters, gradients, AdamW moments, buffers."""
        p = self.parameters * self.master_bytes
        if kind == "ddp":
            return {"parameters": p, "gradients": p, "adamw": 2 * p, "buffers": p}  # buffers: DDP grad buckets
        gathered = 2 * self.largest_layer * self.compute_bytes          # the layer in use + the prefetched one
        reduce = self.largest_layer * self.master_bytes                  # one layer's unsharded gradient
        return {"parameters": p / world, "gradients": p / world, "adamw": 2 * p / world,
                "buffers": gathered + reduce}

    def max_tokens(self, kind: str, world: int, gpu_gb: float, checkpointing: bool) -> int:
        """Largest micro-batch (tokens) whose activations fit next to the static memory."""
        budget = gpu_gb * GIB * (1 - FREE_SHARE) - CONTEXT_GIB * GIB - sum(self.static(kind, world).values())
        per_token = self.act_per_token_ckpt if checkpointing else self.act_per_token
        return max(0, int(budget // per_token))


def _meta_model(hf_config, layers: int, dtype: torch.dtype, checkpointing: bool) -> nn.Module:
    from transformers import AutoModelForTokenClassification

    from . import attention
    from .model import enable_checkpointing
    config = copy.deepcopy(hf_config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:layers]
    with torch.device("meta"):
        model = AutoModelForTokenClassification.from_config(config, dtype=dtype,
                                                            attn_implementation=attention.resolve("auto"))
    if checkpointing:
        enable_checkpointing(model)
    return model.train()


def saved_bytes_per_token(model: nn.Module, device: str = "meta") -> float:
    """Bytes autograd keeps for backward per token of a packed micro-batch (parameters not
    counted; a tensor saved twice counted once)."""
    from .model import token_values

    lens = [MEASURE_LEN] * MEASURE_ROLLOUTS
    tokens = sum(lens)
    ids = torch.zeros(1, tokens, dtype=torch.long, device=device)
    pos = torch.cat([torch.arange(n) for n in lens])[None].to(device)
    params = {id(p) for p in model.parameters()}
    seen: dict[int, int] = {}
    keep = []  # hold every saved tensor so ids stay unique while we count

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        keep.append(base)
        scores = t.dim() >= 2 and t.shape[-1] == t.shape[-2] == MEASURE_LEN  # [.., L, L]: the meta device's
        if id(base) not in params and id(t) not in params and not scores:  # math SDPA; flash keeps none
            seen.setdefault(id(base), base.numel() * base.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_values(model, ids, pos, seq_lens=torch.tensor(lens, dtype=torch.int32))
    return sum(seen.values()) / tokens


def make_plan(cfg, name: str | None = None) -> Plan:
    from .model import build_config

    hf_config = build_config(cfg.model)
    master = getattr(torch, cfg.model.dtype)
    mp = cfg.train.mixed_precision
    compute = torch.bfloat16 if mp in ("auto", "bf16") else (torch.float16 if mp == "fp16" else master)
    layers = hf_config.num_hidden_layers
    one, two = (saved_bytes_per_token(_meta_model(hf_config, n, compute, False)) for n in (1, 2))
    per_layer, fixed = two - one, 2 * one - two
    ckpt_one, ckpt_two = (saved_bytes_per_token(_meta_model(hf_config, n, compute, True)) for n in (1, 2))
    ckpt_per_layer, ckpt_fixed = ckpt_two - ckpt_one, 2 * ckpt_one - ckpt_two
    full = _meta_model(hf_config, layers, master, False)
    n_total = sum(p.numel() for p in full.parameters())
    emb = sum(m.weight.numel() for m in full.modules() if isinstance(m, nn.Embedding))
    layer_classes = set(getattr(full, "_no_split_modules", None) or ())
    largest = max((sum(p.numel() for p in m.parameters()) for m in full.modules()
                   if type(m).__name__ in layer_classes), default=n_total)
    return Plan(name or cfg.model.name_or_path or hf_config.model_type, n_total, n_total - emb, layers, largest,
                torch.empty(0, dtype=master).element_size(), torch.empty(0, dtype=compute).element_size(),
                act_per_token=fixed + layers * per_layer,
                act_per_token_ckpt=ckpt_fixed + layers * ckpt_per_layer + per_layer, per_layer=per_layer)


def count_text(n: float) -> str:
    """1.54B, 0.16M, 900: a parameter count in the unit that keeps two significant decimals
    (a tiny model read "0.00B")."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale / 10:
            return f"{n / scale:,.2f}{unit}"
    return f"{n:,.0f}"


def bytes_text(b: float) -> str:
    """28.8 GiB, 1.2 MiB, 0 B: memory in the largest binary unit it fills to at least 0.1."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if b >= 1024 ** power / 10:
            return f"{b / 1024 ** power:,.1f} {unit}"
    return f"{b:,.0f} B"


def render(plan: Plan, world: int, gpu_gb: float) -> str:
    ddp, fsdp = plan.static("ddp", world), plan.static("fsdp2", world)
    lines = [f"plan: {plan.name}: {count_text(plan.parameters)} parameters ({count_text(plan.matmul_parameters)} "
             f"without embeddings), {plan.layers} layers; master weights {plan.master_bytes} bytes, activations "
             f"{plan.compute_bytes} bytes per element",
             f"per rank, {world} rank(s) of {gpu_gb:g} GB (--world, --gpu-gb)",
             f"  {'':<27} {'DDP':>14} {'FSDP2':>14}"]
    for key, label in (("parameters", "parameters"), ("gradients", "gradients"), ("adamw", "AdamW moments"),
                       ("buffers", "buckets / gathered layers")):
        lines.append(f"  {label:<27} {bytes_text(ddp[key]):>14} {bytes_text(fsdp[key]):>14}")
    lines.append(f"  {'total before activations':<27} {bytes_text(sum(ddp.values())):>14} "
                 f"{bytes_text(sum(fsdp.values())):>14}")
    lines.append(f"activations per token: {bytes_text(plan.act_per_token)}, with gradient checkpointing "
                 f"{bytes_text(plan.act_per_token_ckpt)}")
    for ckpt in (False, True):
        fits = {k: plan.max_tokens(k, world, gpu_gb, ckpt) for k in ("ddp", "fsdp2")}
        text = ", ".join(f"{k.upper()} {v:,}" if v else f"{k.upper()} does not fit" for k, v in fits.items())
        lines.append(f"largest data.max_tokens on {gpu_gb:g} GB{' with gradient checkpointing' if ckpt else ''}: "
                     f"{text}")
    lines.append(f"(assumes {CONTEXT_GIB:g} GiB CUDA context and {FREE_SHARE:.0%} of the GPU free; "
                 "measure a real run's peak before relying on the last 10%)")
    return "\n".join(lines)


if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["plan", *sys.argv[1:]]))
