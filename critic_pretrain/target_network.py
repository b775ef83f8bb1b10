"""The TD target network (``targets.refresh_every``): a frozen copy of the critic that bootstrapped
targets come from, refreshed every N optimizer steps and saved with each checkpoint."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from critic_pretrain import checkpoint as ckpt
from critic_pretrain import parallel
from critic_pretrain.config import Config
from critic_pretrain.errors import UserError


def target_network(cfg: Config, raw: torch.nn.Module, resume_dir: Path | None, step: int) -> torch.nn.Module | None:
    """The frozen critic copy TD targets bootstrap from (``targets.refresh_every``), or None. A
    fresh run copies the initial weights; a resume loads the copy the checkpoint saved (it dates
    from the last refresh, which is not the checkpoint's step in general)."""
    every = cfg.targets.refresh_every
    if not every:
        return None
    if parallel.is_fsdp(raw):
        raise UserError("targets.refresh_every is not supported with FSDP yet: use DDP (one full copy of the "
                        "critic per rank) or targets.refresh_every=0")
    from safetensors.torch import load_file

    target = copy.deepcopy(raw).eval().requires_grad_(False)  # costs one more copy of the weights
    if resume_dir is not None:
        saved = ckpt.StepPaths(resume_dir).target_weights
        if saved.is_file():
            target.load_state_dict(load_file(saved, device=str(next(raw.parameters()).device)))
        elif step % every:
            raise UserError(f"{resume_dir} has no {saved.name} (the target network of targets.refresh_every="
                            f"{every}), and step {step} is not a refresh step: it cannot be resumed exactly; resume "
                            "from a step that is a multiple of it (checkpoint.load_step) or start a new output_dir")
    return target


def refresh(target: torch.nn.Module | None, raw: torch.nn.Module, step: int, every: int) -> None:
    """After optimizer step ``step``: copy the trained weights into the target at each refresh."""
    if target is not None and step % every == 0:
        target.load_state_dict(raw.state_dict())
