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
        resume/target.safetensors          the TD target network (targets.refresh_every > 0; ours)
        data/trained.safetensors           xxh3-64 of the training prompts' and rollouts' tokens
                                           (ours: which fresh rollouts answer trained prompts, and
                                           which given rollouts the critic trained on)

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
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rollouts import fileio
from rollouts.fileio import file_checksum

from ..errors import UserError, closest

log = logging.getLogger(__name__)


FORMAT_VERSION = 2  # 2: per-file checksums in the manifest; RNG state as safetensors


WEIGHTS_FILE = "shard-00001-model-00001-of-00001.safetensors"


MANIFEST = "critic_pretrain.json"


STEP_RE = re.compile(r"^step_(\d+)$")


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

    @property
    def target_weights(self) -> Path:
        """The target network's weights (``targets.refresh_every``); absent without one."""
        return self.resume_dir / "target.safetensors"

    @property
    def trained(self) -> Path:
        """Hashes of the prompts and rollouts the critic trained on (``TrainData.trained_hashes``);
        absent in steps written before it existed."""
        return self.root / "data" / "trained.safetensors"

    def read_trained(self) -> dict | None:
        """{"prompts", "rollouts"}: sorted uint64 hashes of the training rows' prompts and tokens,
        or None (no file, or unreadable). safetensors: nothing in it can run code."""
        import numpy as np
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        try:
            raw = load_file(str(self.trained))
            return {k: raw[k].view(np.uint64) for k in ("prompts", "rollouts")}
        except (OSError, KeyError, SafetensorError):
            return None

    # readers (None when the file is missing or unreadable)
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


LOCK = ".lock"


def remove_unstarted(out: Path) -> bool:
    """Remove ``out`` when a fresh start that created it was refused before it wrote more than its
    ``config.yaml`` and lock (a refused start left a folder that looked like a run). Anything else
    in it (a prepared data_cache a fixed re-run reuses, a user's file), or a lock this process does
    not hold (another run that made the folder first), keeps the folder as it is."""
    try:
        if not set(os.listdir(out)) <= {"config.yaml", LOCK} or \
                not (out / LOCK).read_text().startswith(f"pid {os.getpid()} "):
            return False
        for name in ("config.yaml", LOCK):
            (out / name).unlink(missing_ok=True)
        out.rmdir()
    except OSError:
        return False
    return True


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
        if holder.startswith(f"pid {os.getpid()} on {socket.gethostname()} "):  # a notebook's earlier run object
            raise UserError(f"output_dir={out} is held by this Python process: a run set up here earlier (its Run "
                            "from critic_pretrain.train.setup) still holds the lock; close it (run.lock.close()), or "
                            "pass a contextlib.ExitStack to setup(cfg, cleanup) to release it on exit") from None
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


_WARNED: set[tuple[str, str]] = set()
"""(folder, problem) pairs ``find_checkpoints`` has warned about in this process."""


def find_checkpoints(output_dir: str | os.PathLike, *, quiet: bool = False) -> dict[int, Path]:
    """Complete ``step_<n>`` folders by step. ``tmp_step_*`` and broken folders are left out, each
    logged unless ``quiet`` (a caller whose own message names what it found)."""
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
        elif not quiet and (str(d.resolve()), problem) not in _WARNED:
            _WARNED.add((str(d.resolve()), problem))  # once per process: retention looks at every save
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


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``step_<n>`` of ``run_dir`` by sizes (for messages that name it; a
    resume checks content too: ``resolve_resume``); None when there is none."""
    found = find_checkpoints(run_dir, quiet=True) if run_dir.is_dir() else {}  # the message names what it found
    return found[max(found)] if found else None


def run_folder_problem(p: Path) -> str | None:
    """For a folder given where a checkpoint is expected: when it is a run folder (it holds
    ``step_<n>`` folders), what to pass instead (its newest complete step); else None."""
    steps = sorted((d for d in p.iterdir() if d.is_dir() and step_number(d) is not None), key=step_number)
    if not steps:
        return None
    newest = newest_checkpoint(p)
    if newest:
        return f"is a run folder, not a checkpoint; pass one of its step_<n> folders, e.g. the newest " \
               f"complete one: {newest}"
    return f"is a run folder whose step_<n> folders are all incomplete ({', '.join(d.name for d in steps[-3:])}); " \
           "let the run save a checkpoint first"


def missing_path_hint(p: Path) -> str:
    """For a checkpoint path that does not exist: a missing ``step_<n>`` in a run folder gets the
    steps it has; another misspelt component gets 'did you mean X?'; else which ancestor exists
    ('' if none does)."""
    parts = p.parts
    for i in range(len(parts) - 1, 0, -1):
        parent = Path(*parts[:i])
        if parent.is_dir():
            missing = parts[i]
            if step_number(Path(missing)) is not None:
                steps = find_checkpoints(parent, quiet=True)
                if steps:
                    return f"{parent} has no {missing!r}; its checkpoints: {', '.join(f'step_{n}' for n in steps)}"
            close = closest(missing, (d.name for d in parent.iterdir() if d.is_dir()))
            if close:
                return f"did you mean {Path(parent, close, *parts[i + 1:])}?"
            return f"{parent} exists but has no {missing!r}"
    return ""
