"""``critic_pretrain.json``: what a value checkpoint is. Built here when a step is saved
(``build_manifest``) or exported (``write_export_manifest``), read here by everyone else
(``Manifest``): resume, eval, seed check and export ask it for facts by name, never by key.

    {"kind", "format_version", "step", "saved_at", "max_steps",
     "targets": {gamma, lam, reward transform..., definition},  "value_alignment",
     "model": {class, name_or_path, head_bias, parameters},
     "data": {files, train_rows, val_rows, val_split, val_regimes: {regime: rows}, stats, sources,
              changes, rewards: {logged, min, max}},
     "config_changes": [{at_step, changes}], "tokenizer", "world_size", "versions",
     "files": {relative path: {size, xxh3_128}},  "exported": {format, from, ...} (exports only)}

Readers tolerate older manifests: a missing section reads as None.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rollouts import fileio
from rollouts.provenance import RewardsLogged

from ..config import scheduled_lam
from ..model import count_parameters
from .layout import FORMAT_VERSION, MANIFEST

KIND = "critic_pretrain.value_checkpoint"
TARGETS_DEFINITION = ("GAE returns A_t + V_t over policy tokens with NeMo-RL carry-forward masking; lam=1 without "
                      "values is the Monte-Carlo return")
VALUE_ALIGNMENT = "value[t] = head(hidden[t-1]); value[0] = 0"


def build_manifest(cfg, *, model, data, rewards_logged: RewardsLogged | None, data_changes, config_changes: list,
                   tokenizer: dict | None, world_size: int, mixed_precision: str | None = None) -> dict:
    """The manifest of a step of this run, before ``save_checkpoint`` adds the format, step,
    time and file list. ``cfg``: the run's Config; ``model``: the unwrapped value model;
    ``data``: its TrainData."""
    stats = data.train.stats
    return {
        "kind": KIND, "max_steps": cfg.train.max_steps,
        "targets": {**vars(cfg.targets), "definition": TARGETS_DEFINITION},
        "value_alignment": VALUE_ALIGNMENT,
        "model": {"class": type(model).__name__, "name_or_path": cfg.model.name_or_path,
                  "head_bias": cfg.model.head_bias, "parameters": count_parameters(model),
                  "mixed_precision": mixed_precision},
        "data": {"files": data.train.files, "train_rows": len(data.train_idx), "val_rows": len(data.val_idx),
                 "val_split": cfg.data.val_split, "val_regimes": data.val_rows(),
                 "stats": vars(stats), "sources": data.train.meta["sources"], "changes": data_changes,
                 "rewards": {"logged": rewards_logged.to_dict() if rewards_logged else None,
                             "min": stats.reward_min, "max": stats.reward_max}},
        "config_changes": config_changes,
        "tokenizer": tokenizer,
        "world_size": world_size, "versions": library_versions(),
    }


def library_versions() -> dict[str, str]:
    """The versions a step was written with (the manifest's ``versions``)."""
    import accelerate
    import pyarrow
    import safetensors
    import torch
    import transformers

    from .. import __version__

    return {"critic_pretrain": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "safetensors": safetensors.__version__,
            "pyarrow": pyarrow.__version__, "python": sys.version.split()[0]}


def stamp(manifest: dict, step: int, files: dict) -> dict:
    """``manifest`` as written into ``step_<step>``: with the format, step, time and file list."""
    return {**manifest, "format_version": FORMAT_VERSION, "step": step,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}


def write_export_manifest(src_root: Path, dst_root: Path, exported: dict, files: dict | None) -> None:
    """The source's manifest with where the export came from (``exported``: format, from, at,
    ...); a step tree gets a
    fresh file list (so ``find_checkpoints``/``verify`` accept it), an HF folder none."""
    source = Manifest.read(src_root)  # None: missing or unreadable (the seed check reported it)
    manifest = dict(source.raw) if source else {}
    manifest.pop("files", None)
    manifest["exported"] = exported
    if files is not None:
        manifest["files"] = files
    fileio.write_json(dst_root / MANIFEST, manifest)


@dataclass(frozen=True)
class Manifest:
    """A read manifest; every fact another module needs is a property here."""

    raw: dict

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The manifest in ``folder`` (a step or an exported folder); None when missing or unreadable."""
        raw = fileio.read_json(Path(folder) / MANIFEST)
        return cls(raw) if isinstance(raw, dict) else None

    def _section(self, name: str) -> dict:
        value = self.raw.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def format_version(self) -> int:
        return self.raw.get("format_version", 1)

    @property
    def step(self) -> int | None:
        return self.raw.get("step")

    @property
    def files(self):
        """{relative path: {size, checksum}} (format 1: {path: size}); None when absent."""
        return self.raw.get("files")

    @property
    def targets(self) -> dict | None:
        """The targets' settings as trained (gamma, lam, the targets' own reward transform)."""
        return self.raw.get("targets")

    @property
    def rewards(self) -> dict | None:
        """``data.rewards``: how the archive logged its rewards, and their range."""
        return self._section("data").get("rewards")

    @property
    def effective_targets(self) -> dict | None:
        """The targets with the reward transform taken relative to the raw reward: the archive's
        own scaling (``data.rewards.logged``, e.g. a NeMo-RL dump's) composed with the targets'
        transform, and with ``targets.lam_end`` the lambda of this step as ``lam``. As recorded
        when the archive did not say."""
        targets = self.targets
        if targets and targets.get("lam_end") is not None and self.step is not None:
            # targets.lam_end: the lambda this step was last trained with, which is what PPO inherits
            targets = {**targets, "lam_start": targets.get("lam", 1.0),
                       "lam": scheduled_lam(targets.get("lam", 1.0), targets["lam_end"], self.step,
                                            self.raw.get("max_steps") or self.step)}
        logged = (self.rewards or {}).get("logged")
        return RewardsLogged.from_dict(logged).compose(targets) if targets and logged else targets

    @property
    def model_name_or_path(self) -> str | None:
        return self._section("model").get("name_or_path")

    @property
    def mean_target(self) -> float | None:
        return (self._section("data").get("stats") or {}).get("mean_target")

    @property
    def target_std(self) -> float | None:
        """The training targets' standard deviation (sizes a head bias); None when unknown or 0."""
        var = (self._section("data").get("stats") or {}).get("target_var")
        return math.sqrt(var) if isinstance(var, (int, float)) and var > 0 else None

    @property
    def split(self) -> tuple[int | None, int | None]:
        """(training rows, validation rows) the step was trained and validated on."""
        data = self._section("data")
        return data.get("train_rows"), data.get("val_rows")

    @property
    def val_split(self) -> str:
        """`data.val_split` of the run (`prompt` for steps written before it existed)."""
        return self._section("data").get("val_split") or "prompt"

    @property
    def tokenizer(self) -> dict | None:
        """The tokenizer's fingerprint (``rollouts.tokenizer``)."""
        return self.raw.get("tokenizer")

    @property
    def config_changes(self) -> list:
        """Accepted config changes of earlier resumes: [{at_step, changes: [{key, old, new}]}]."""
        return list(self.raw.get("config_changes") or [])

    @property
    def mixed_precision(self) -> str | None:
        """The mixed precision the run trained in (``no``, ``bf16``, ``fp16``; None before it was recorded)."""
        return self._section("model").get("mixed_precision")

    @property
    def world_size(self) -> int | None:
        return self.raw.get("world_size")

    @property
    def exported(self) -> dict | None:
        """Where an exported folder came from; None for a step a run saved."""
        return self.raw.get("exported")
