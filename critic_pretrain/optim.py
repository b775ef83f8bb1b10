"""AdamW, the LR schedule, and the schedule metadata written beside the optimizer state.

One parameter group, as NeMo-RL builds its value optimizer: a seed whose optimizer state
has several groups loads silently with the wrong weight decay there (docs/design.md).
The schedule is a ``LambdaLR`` (warmup, then constant / linear / cosine decay to
``min_lr``); its state dict is what NeMo-RL expects when no ``value.scheduler`` is set.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from .config import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    fused = cfg.fused if cfg.fused is not None else device.type == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, fused=fused or None)


def init_moments(optimizer: torch.optim.AdamW) -> None:
    """Give every parameter AdamW state (zero moments, step 0) before the first step, as AdamW
    itself would on a parameter's first update. With a head-only warm-up the backbone gets no
    update for a while; its state must still exist, so a checkpoint saved meanwhile covers every
    parameter (NeMo-RL's loader and our resume need that) and the backbone starts its bias
    correction at its own first step."""
    for group in optimizer.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            if p.requires_grad and not optimizer.state[p]:
                optimizer.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def lr_factor(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """LR multiplier for the optimizer step with 0-based index ``step``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    floor = cfg.min_lr / cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    if cfg.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, cfg, max_steps))


def apply_config(optimizer: torch.optim.Optimizer, scheduler: LambdaLR, cfg: OptimConfig) -> None:
    """After a resume, the config's peak lr, betas, eps and weight decay, not the saved state's:
    the loaded param groups and the scheduler's base lrs are the old run's, so a change allowed
    with ``train.allow_config_changes`` would be recorded and never applied. The current lr is
    recomputed as LambdaLR does (``base_lr * factor(last_epoch)``): unchanged settings give the
    saved values bit for bit."""
    scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group.update(initial_lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
        group["lr"] = cfg.lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def scheduler_metadata(cfg: OptimConfig, max_steps: int, step: int, scheduler: LambdaLR, progress, layout,
                       max_tokens: int) -> dict:
    """Schedule description with Megatron-equivalent field names (docs/design.md, "Megatron backend").

    ``train_global_batch_size`` is the mean number of rollouts per optimizer step so far:
    batches are token budgets (``global_batch_tokens``), not fixed rollout counts.
    """
    return {
        "scheduler_class": type(scheduler).__name__,
        "schedule": cfg.schedule,
        "lr": cfg.lr,
        "min_lr": cfg.min_lr if cfg.schedule != "constant" else cfg.lr,
        "lr_warmup_iters": cfg.warmup_steps,
        "lr_decay_iters": max_steps,
        "lr_decay_style": cfg.schedule,
        "start_weight_decay": cfg.weight_decay,
        "end_weight_decay": cfg.weight_decay,
        "weight_decay_incr_style": "constant",
        "train_global_batch_size": round(progress.consumed_samples / max(step, 1)),
        "global_batch_tokens": layout.world * layout.grad_accum * max_tokens,
        "train_iters": max_steps,
        "current_step": step,
        "current_lr": scheduler.get_last_lr()[0],
        "optimizer": {"class": "AdamW", "betas": list(cfg.betas), "eps": cfg.eps, "param_groups": 1},
    }
