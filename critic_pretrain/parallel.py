"""How the model is spread over ranks: accelerate's own DDP / FSDP, or FSDP2 applied here
where accelerate does not shard.

``accelerate launch --config_file configs/accelerate/fsdp2.yaml`` sets ``ACCELERATE_USE_FSDP``
and ``FSDP_VERSION=2`` for the workers. On GPUs accelerate then wraps the model with
``fully_shard`` itself. With CPU workers (``ACCELERATE_USE_CPU=1``, gloo: what the test suite
and a laptop run) accelerate picks plain multi-CPU DDP and ignores the FSDP settings, so a
run that asked for sharding would silently replicate. Here we apply the same FSDP2 layout
ourselves: ``fully_shard`` on each decoder layer (the model's ``_no_split_modules``) and on the
root, before the optimizer is built; the model is then not handed to accelerate (no DDP
wrapper: FSDP2 reduce-scatters the gradients itself, averaged over ranks like DDP).
"""

from __future__ import annotations

import os

import torch

from .errors import UserError

FSDP_ENV, VERSION_ENV, RESHARD_ENV = "ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_RESHARD_AFTER_FORWARD"


def new_accelerator(mixed_precision: str, **kwargs):
    """accelerate's ``Accelerator``. Its state is one per process: a second run in the same process
    (a notebook cell run again with another ``train.mixed_precision``) cannot change it, which
    accelerate says in a traceback; here it is one line with what to do."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    before = AcceleratorState().mixed_precision if AcceleratorState._shared_state else None
    if before is not None and str(before) != mixed_precision:
        raise UserError(f"this Python process already trained with mixed precision {before}, and accelerate keeps "
                        f"one per process: to train with {mixed_precision}, restart the kernel or run "
                        "`critic-pretrain train ...` in a subprocess (a notebook's `!critic-pretrain train ...`)")
    return Accelerator(mixed_precision=mixed_precision, **kwargs)


def fsdp2_requested() -> bool:
    """The launcher's config asked for FSDP2 (accelerate passes it through the environment)."""
    return os.environ.get(FSDP_ENV, "false").lower() == "true" and os.environ.get(VERSION_ENV, "1") == "2"


def accelerate_shards(accelerator) -> bool:
    """accelerate itself wrapped the model with FSDP (GPU workers)."""
    return str(accelerator.distributed_type).split(".")[-1] == "FSDP"


def needs_own_fsdp2(accelerator) -> bool:
    """FSDP2 was asked for, several ranks run, and accelerate did not shard (CPU workers)."""
    return fsdp2_requested() and accelerator.num_processes > 1 and not accelerate_shards(accelerator)


def shard_fsdp2(model: torch.nn.Module) -> int:
    """``fully_shard`` every decoder layer, then the root; returns the number of units."""
    import warnings

    from torch.distributed.fsdp import fully_shard

    # FSDP2 warns that the root returns a view (the logits); an in-place op on it would skip the
    # all-gather, and we do none (token_values copies into a new tensor). Tested: FSDP2 losses
    # and gradient norms equal one process with accumulation (tests/test_parallel.py).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")

    reshard = os.environ.get(RESHARD_ENV, "true").lower() != "false"
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return len(layers) + 1


def is_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules())


def describe(accelerator, model) -> str:
    """One phrase for the start-up log: how the model is spread over the ranks."""
    world = accelerator.num_processes
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
    if is_fsdp(model):
        from torch.distributed.fsdp import FSDPModule
        units = sum(isinstance(m, FSDPModule) for m in model.modules())
        by = ("accelerate" if accelerate_shards(accelerator)
              else "critic-pretrain (accelerate does not shard CPU workers)")
        return (f"FSDP2 over {world} ranks, {units} fully_shard units applied by {by}: parameters, gradients and "
                f"AdamW state sharded; {backend}")
    if world > 1:
        return f"DDP over {world} ranks (replicated parameters); {backend}"
    return f"one process on {accelerator.device}"
