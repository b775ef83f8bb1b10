"""Reading a step back into a model, an optimizer and a scheduler (strict keys, safe DCP)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..errors import UserError
from .layout import StepPaths
from .safe_dcp import UntrustedContent, dcp_load
from .save import OPTIM_OPTIONS, load_rng_state

log = logging.getLogger(__name__)


def load_weights(model: torch.nn.Module, step_dir: Path, *, is_main: bool = True, distributed: bool = False) -> None:
    """Load ``value/weights`` into ``model`` with strict key matching."""
    path = StepPaths(step_dir).weights
    state = load_file(path) if (is_main or not distributed) else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True,
                                                                broadcast_from_rank0=distributed))


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, step_dir: Path) -> None:
    """Load ``value/optimizer/optim`` ({"optim", "sched"}) into a fresh optimizer and scheduler."""
    state = {"optim": get_optimizer_state_dict(model, optimizer, options=OPTIM_OPTIONS),  # allocates moments
             "sched": scheduler.state_dict()}
    path = StepPaths(step_dir).optim_dir
    try:
        dcp_load(state, path)
    except UntrustedContent as e:
        raise UserError(f"{path}: {e}; this folder was not written by critic-pretrain, nothing from it was run: "
                        "resume from another step or use a new output_dir") from None
    set_optimizer_state_dict(model, optimizer, state["optim"], options=OPTIM_OPTIONS)
    scheduler.load_state_dict(state["sched"])


def load_resume_state(step_dir: Path, rank: int) -> tuple[dict, dict | None]:
    """(resume state, this rank's RNG state or None when the world size changed)."""
    p = StepPaths(step_dir)
    state = p.read_resume_state()
    if state is None:
        raise UserError(f"{p.resume_state} is missing or unreadable; resume from another step")
    rng_file = p.rng(rank)
    return state, (load_rng_state(rng_file) if rng_file.is_file() else None)  # older pickled .pt: not loaded


