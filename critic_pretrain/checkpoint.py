"""The ``step_<n>`` checkpoint tree: the exact layout a NeMo-RL PPO run warm-starts from.

    <output_dir>/step_<n>/                 n = optimizer steps completed
        value/weights/model/shard-00001-model-00001-of-00001.safetensors
        value/weights/model/.hf_metadata/config.json
        value/optimizer/optim/             torch.distributed.checkpoint: {"optim", "sched"}
        value/optimizer/scheduler.json     schedule metadata (Megatron-equivalent names)
        value/tokenizer/                   when a tokenizer is known
        training_info.json                 NeMo-RL's keys + latest val:<metric>
        config.yaml                        the resolved run config
        critic_pretrain.json               our manifest: format, targets, data, accepted config
                                           changes, versions, every file's size and checksum
        resume/state.json                  step, epoch, data position, early-stop reason (ours)
        resume/rng_rank<r>.safetensors     each rank's RNG state (ours; no pickle)

``StepPaths`` names every one of these files; this module writes them all (``save_checkpoint``,
also for the NeMo-RL export's copy) and reads them back.

Saves are atomic: everything is written under ``tmp_step_<n>`` and renamed at the end, so
a folder named ``step_<n>`` is complete. ``find_checkpoints`` additionally checks the
manifest's file sizes and ignores anything else, so a crash, a partial copy or a planted
folder never becomes the resume point.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from rollouts import fileio

from . import faults
from .errors import UserError, require
from .interop.dcp import UntrustedContent, dcp_load, distributed, single_process_ok
from .model import write_value_config
from .selection import ranked

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: per-file checksums in the manifest; RNG state as safetensors
WEIGHTS_FILE = "shard-00001-model-00001-of-00001.safetensors"
MANIFEST = "critic_pretrain.json"
STEP_RE = re.compile(r"^step_(\d+)$")
OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


@dataclass(frozen=True)
class StepPaths:
    """Every path of one ``step_<n>`` folder (the tree in this module's docstring), and readers
    for its small files. No other module builds these paths by hand."""

    root: Path

    # value/: what NeMo-RL loads
    @property
    def value_dir(self) -> Path:
        return self.root / "value"

    @property
    def weights_root(self) -> Path:
        """value/weights: NeMo-RL refuses a warm start without it."""
        return self.value_dir / "weights"

    @property
    def weights_dir(self) -> Path:
        return self.weights_root / "model"

    @property
    def weights(self) -> Path:
        return self.weights_dir / WEIGHTS_FILE

    @property
    def hf_config(self) -> Path:
        return self.weights_dir / ".hf_metadata" / "config.json"

    @property
    def optimizer_dir(self) -> Path:
        return self.value_dir / "optimizer"

    @property
    def optim_dir(self) -> Path:
        return self.optimizer_dir / "optim"

    @property
    def scheduler_json(self) -> Path:
        return self.optimizer_dir / "scheduler.json"

    @property
    def tokenizer_dir(self) -> Path:
        return self.value_dir / "tokenizer"

    # the step's own records
    @property
    def training_info(self) -> Path:
        return self.root / "training_info.json"

    @property
    def config_yaml(self) -> Path:
        return self.root / "config.yaml"

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def resume_dir(self) -> Path:
        return self.root / "resume"

    @property
    def resume_state(self) -> Path:
        return self.resume_dir / "state.json"

    def rng(self, rank: int) -> Path:
        return self.resume_dir / f"rng_rank{rank}.safetensors"

    # readers (None when the file is missing or unreadable)
    def read_manifest(self) -> dict | None:
        return fileio.read_json(self.manifest)

    def read_training_info(self) -> dict | None:
        return fileio.read_json(self.training_info)

    def read_resume_state(self) -> dict | None:
        return fileio.read_json(self.resume_state)

    def read_config(self) -> dict | None:
        """config.yaml as a plain mapping (``config.load_config`` builds the typed one)."""
        import yaml
        try:
            doc = yaml.safe_load(self.config_yaml.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None
        return doc if isinstance(doc, dict) else None




# ---------------------------------------------------------------------------------------------
# The run folder

LOCK = ".lock"


def lock_output_dir(out: Path):
    """Create ``out`` and take an exclusive advisory lock on ``out/.lock`` for this process's
    life (the OS releases it on any exit, kill -9 included). Returns the open lock file; a
    second run on the same folder gets a one-line UserError naming the holder."""
    import fcntl
    import socket

    try:
        out.mkdir(parents=True, exist_ok=True)
        fh = open(out / LOCK, "a+")
    except OSError as e:
        raise UserError(f"output_dir={out}: cannot create or write it ({e.strerror or e}"
                        f"{': ' + str(e.filename) if e.filename else ''}); pick a writable folder") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise UserError(f"output_dir={out} is in use by {holder}; wait for it to finish (or stop it), "
                        "or use another output_dir") from None
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
    except OSError as e:
        fh.close()
        raise UserError(f"output_dir={out}: cannot write to it ({e.strerror or e}); free space or pick a "
                        "writable folder") from None
    return fh


# ---------------------------------------------------------------------------------------------
# Finding checkpoints

def step_number(path: Path) -> int | None:
    m = STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def verify(step_dir: Path, *, content: bool = False) -> str | None:
    """None when ``step_dir`` is a complete checkpoint, else what is wrong with it.

    Sizes always; with ``content``, every file's checksum too (reads the whole checkpoint:
    done for the one step a resume, ``seed check``, ``export`` or ``eval`` uses)."""
    p = StepPaths(step_dir)
    if not p.manifest.is_file():
        return f"no {MANIFEST} (incomplete save or not written by critic-pretrain)"
    try:
        manifest = json.loads(p.manifest.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable {MANIFEST} ({e})"
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        return f"{MANIFEST} has no file list"
    for rel, entry in files.items():
        size, digest = (entry, None) if isinstance(entry, int) else (entry.get("size"), entry.get(CHECKSUM))
        f = step_dir / rel
        if not f.is_file():
            return f"missing {rel}"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, expected {size} (truncated or overwritten)"
        if content and digest is not None and file_checksum(f) != digest:
            return f"{rel} does not match its checksum (corrupted on disk or edited)"
    return None


CHECKSUM = "xxh3_128"


def file_checksum(path: Path, chunk: int = 8 << 20) -> str:
    """xxh3-128 of the file's bytes (no fallback hash: a digest that differs by machine would
    call a sound checkpoint corrupted)."""
    h = require("xxhash", "checkpoint checksums").xxh3_128()  # a dependency of critic-pretrain
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def find_checkpoints(output_dir: str | os.PathLike) -> dict[int, Path]:
    """Complete ``step_<n>`` folders by step. ``tmp_step_*`` and broken folders are left out."""
    out = {}
    root = Path(output_dir)
    if not root.is_dir():
        return out
    for d in root.iterdir():
        n = step_number(d)
        if n is None or not d.is_dir():
            continue
        problem = verify(d)
        if problem is None:
            out[n] = d
        else:
            log.warning("ignoring %s: %s", d, problem)
    return dict(sorted(out.items()))


def resolve_resume(output_dir: str | os.PathLike, load_step: int | None) -> Path | None:
    """The checkpoint to resume from: ``load_step`` exactly, else the newest complete one whose
    files match their checksums (a corrupted newest one is skipped with a warning)."""
    root = Path(output_dir)
    if load_step is not None:
        d = root / f"step_{load_step}"
        if not d.is_dir():
            have = sorted(find_checkpoints(root))
            raise UserError(f"checkpoint.load_step={load_step}: {d} does not exist "
                            f"(available steps: {have or 'none'}); pick one of them or unset load_step")
        problem = verify(d, content=True)
        if problem:
            raise UserError(f"checkpoint.load_step={load_step}: {d} is not a complete checkpoint ({problem}); "
                            "pick another step or unset load_step to use the newest complete one")
        return d
    for n, d in sorted(find_checkpoints(root).items(), reverse=True):
        problem = verify(d, content=True)
        if problem is None:
            return d
        log.warning("not resuming from %s: %s; trying the previous checkpoint", d, problem)
    return None


# ---------------------------------------------------------------------------------------------
# Saving

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
    meta = {"python": json.dumps([version, gauss]), "numpy": json.dumps([name, int(pos), int(has_gauss), float(cached)])}
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
    is_main: bool = True,
    rank: int = 0,
    barrier=lambda: None,
) -> Path:
    """Write ``step_<step>`` atomically. Collective: every rank calls it.

    ``model`` is the (possibly FSDP-sharded) module; the full state dict is gathered to
    CPU on every rank's behalf and written by the main process.
    """
    root = Path(output_dir)
    tmp = root / f"tmp_step_{step}"
    final = root / f"step_{step}"
    p = StepPaths(tmp)
    try:
        _save(p, step, model, optimizer, scheduler, hf_config, training_info, scheduler_meta, manifest, config_yaml,
              resume_state, tokenizer, is_main, rank, barrier)
    except OSError as e:  # full disk, quota, permissions: keep what was there, remove the partial save
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
          config_yaml, resume_state, tokenizer, is_main, rank, barrier) -> None:
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
        faults.hit("before_manifest", step)
        manifest = {**manifest, "format_version": FORMAT_VERSION, "step": step,
                    "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files_manifest(tmp)}
        fileio.write_json(p.manifest, manifest)
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


# ---------------------------------------------------------------------------------------------
# Loading

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


def library_versions() -> dict[str, str]:
    import accelerate
    import pyarrow
    import safetensors
    import transformers

    from . import __version__
    return {"critic_pretrain": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "safetensors": safetensors.__version__,
            "pyarrow": pyarrow.__version__, "python": sys.version.split()[0]}
