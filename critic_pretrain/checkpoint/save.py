"""Writing a step: every file of the tree, atomically (``tmp_step_<n>`` then rename), the
manifest with each file's size and checksum, RNG state without pickle, and retention."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from rollouts import fileio

from .. import faults
from ..errors import UserError, cause
from ..model import write_value_config
from ..selection import ranked
from .layout import CHECKSUM, MANIFEST, StepPaths, file_checksum, find_checkpoints
from .manifest import stamp
from .safe_dcp import distributed, single_process_ok

log = logging.getLogger(__name__)


OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def files_manifest(root: Path) -> dict[str, dict]:
    """Size and checksum of every file under ``root`` (the manifest aside)."""
    return {str(f.relative_to(root)): {"size": f.stat().st_size, CHECKSUM: file_checksum(f)}
            for f in sorted(root.rglob("*")) if f.is_file() and f.name != MANIFEST}


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rng_state(path: Path, state: dict[str, Any]) -> None:
    """RNG state as safetensors (no pickle): tensors plus the few scalars in the metadata."""
    version, mt, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    tensors = {"torch": state["torch"], "python": torch.tensor(mt, dtype=torch.int64),
               "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64))}
    for i, t in enumerate(state.get("cuda", [])):
        tensors[f"cuda.{i}"] = t
    meta = {"python": json.dumps([version, gauss]),
            "numpy": json.dumps([name, int(pos), int(has_gauss), float(cached)])}
    save_file(tensors, path, metadata=meta)


def load_rng_state(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    t = load_file(path)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    version, gauss = json.loads(meta["python"])
    name, pos, has_gauss, cached = json.loads(meta["numpy"])
    state = {"python": (version, tuple(int(x) for x in t["python"].tolist()), gauss),
             "numpy": (name, t["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached), "torch": t["torch"]}
    cuda = sorted((k for k in t if k.startswith("cuda.")), key=lambda k: int(k.split(".")[1]))
    if cuda:
        state["cuda"] = [t[k] for k in cuda]
    return state


def save_checkpoint(
    output_dir: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    hf_config,
    training_info: dict,
    scheduler_meta: dict | None,
    manifest: dict,
    config_yaml: str,
    resume_state: dict,
    tokenizer=None,
    target_model: torch.nn.Module | None = None,
    trained_hashes: dict[str, np.ndarray] | None = None,
    is_main: bool = True,
    rank: int = 0,
    barrier=lambda: None,
) -> Path:
    """Write ``step_<step>`` atomically. Collective: every rank calls it.

    ``model`` is the (possibly FSDP-sharded) module; the full state dict is gathered to
    CPU on every rank's behalf and written by the main process. ``target_model``: the TD target
    network (a plain module, the same on every rank), written to ``resume/target.safetensors``;
    ``trained_hashes``: sorted uint64 hashes of the training prompts and rollouts (``data/``).
    """
    root = Path(output_dir)
    tmp = root / f"tmp_step_{step}"
    final = root / f"step_{step}"
    p = StepPaths(tmp)
    try:
        _save(p, step, model, optimizer, scheduler, hf_config, training_info, scheduler_meta, manifest, config_yaml,
              resume_state, tokenizer, target_model, trained_hashes, is_main, rank, barrier)
    except BaseException as raised:  # full disk, quota, permissions: keep what was there, remove the partial save
        e = cause(raised, OSError)  # safetensors and torch DCP wrap the OSError in their own errors
        if e is None:
            raise
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        prev = sorted(find_checkpoints(root))
        raise UserError(f"saving {final} failed: {e.strerror or e} ({e.filename or root}); "
                        + (f"step_{prev[-1]} is intact" if prev else "no earlier checkpoint exists")
                        + "; free space (or fix the folder) and re-run the same command to resume") from None
    if is_main:
        _publish(root, tmp, final, step)
    barrier()
    return final


def _save(p: StepPaths, step, model, optimizer, scheduler, hf_config, training_info, scheduler_meta, manifest,
          config_yaml, resume_state, tokenizer, target_model, trained_hashes, is_main, rank, barrier) -> None:
    """Write everything of one checkpoint under the temporary folder ``p.root``."""
    tmp = p.root
    if is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        p.weights_dir.mkdir(parents=True)
        p.resume_dir.mkdir(parents=True)
    barrier()

    # Collective under FSDP (all-gather); a copy to CPU otherwise.
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if is_main:
        state = {k: v.contiguous() for k, v in state.items()}
        save_file(state, p.weights, metadata={"format": "pt"})
        write_value_config(hf_config, p.hf_config, architecture=type(_unwrap(model)).__name__)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(p.tokenizer_dir))
    del state
    faults.hit("after_weights", step)

    if optimizer is not None:
        optim_state = {"optim": get_optimizer_state_dict(model, optimizer, options=OPTIM_OPTIONS),
                       "sched": scheduler.state_dict()}
        # Collective; each rank writes its shards.
        with single_process_ok():
            dcp.save(optim_state, checkpoint_id=str(p.optim_dir), no_dist=not distributed())
    faults.hit("after_optimizer", step)
    save_rng_state(p.rng(rank), rng_state())
    barrier()

    if is_main:
        if scheduler_meta is not None:
            fileio.write_json(p.scheduler_json, scheduler_meta)
        fileio.write_json(p.training_info, training_info)
        fileio.write_text(p.config_yaml, config_yaml)
        fileio.write_json(p.resume_state, resume_state)
        if target_model is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in target_model.state_dict().items()},
                      p.target_weights, metadata={"format": "pt"})
        if trained_hashes is not None:  # uint64 stored as int64 bits: safetensors' portable integer type
            p.trained.parent.mkdir(exist_ok=True)
            save_numpy({k: np.ascontiguousarray(v, np.uint64).view(np.int64) for k, v in trained_hashes.items()},
                       str(p.trained))
        faults.hit("before_manifest", step)
        fileio.write_json(p.manifest, stamp(manifest, step, files_manifest(tmp)))
        fileio.fsync_tree(tmp)


def _publish(root: Path, tmp: Path, final: Path, step: int) -> None:
    """Rename the finished temporary folder to ``step_<n>`` (the atomic moment of a save)."""
    faults.hit("before_rename", step)
    fileio.replace_dir(tmp, final, root / f"deleting_step_{step}")  # retention removes a leftover
    fileio.fsync_dir(root)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP wraps; FSDP2 does not


def best_steps(output_dir: str | os.PathLike, metric: str, k: int) -> list[int]:
    """The k complete checkpoints with the best ``metric`` in their training_info.json
    (``selection.ranked``: lower is better for losses and errors)."""
    scored = []
    for n, d in find_checkpoints(output_dir).items():
        try:
            scored.append((n, json.loads(StepPaths(d).training_info.read_text()).get(metric)))
        except (OSError, ValueError):
            continue
    return [n for n, _ in ranked(scored, metric)[:k]]


def apply_retention(output_dir: str | os.PathLike, keep_last: int | None, protect: set[int],
                    keep_best: int | None = None, best_metric: str = "val:loss") -> list[int]:
    """Delete checkpoints that no rule keeps; returns the deleted steps.

    Kept: the newest, ``protect`` (e.g. the one the run resumed from), the newest
    ``keep_last`` and the best ``keep_best`` by ``best_metric``. With neither rule set,
    everything is kept. Also removes leftover ``tmp_step_*`` folders of older steps.
    """
    root = Path(output_dir)
    for d in root.glob("deleting_step_*"):  # an earlier retention was interrupted
        shutil.rmtree(d, ignore_errors=True)
    steps = sorted(find_checkpoints(root))
    deleted = []
    if steps and (keep_last is not None or keep_best is not None):
        keep = {steps[-1]} | protect
        if keep_last is not None:
            keep |= set(steps[-keep_last:])
        if keep_best is not None:
            keep |= set(best_steps(root, best_metric, keep_best))
        for n in steps:
            if n not in keep:
                # Rename first (atomic): a kill during the slow delete never leaves a
                # half-deleted folder named step_<n>.
                doomed = root / f"deleting_step_{n}"
                os.replace(root / f"step_{n}", doomed)
                faults.hit("retention", steps[-1])
                shutil.rmtree(doomed)
                deleted.append(n)
    newest = steps[-1] if steps else -1
    for d in root.glob("tmp_step_*"):
        m = re.match(r"tmp_step_(\d+)$", d.name)
        if m and int(m.group(1)) <= newest:
            shutil.rmtree(d, ignore_errors=True)
    return deleted
