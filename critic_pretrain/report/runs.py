"""A run's records as the report reads them: ``RunData`` over ``metrics.jsonl``, and the notebook's DataFrame."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..errors import UserError, require
from ..metrics import read_metrics


@dataclass
class RunData:
    """The records of one run's ``metrics.jsonl``."""

    path: Path
    name: str
    records: list[dict]
    kinds: tuple[str, str] = ("targets", "targets")
    """What the train and the validation curves are measured against (``TargetsConfig.kinds``)."""

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the records holding a finite ``key``, in step order."""
        pts = sorted((r["step"], r[key]) for r in self.records
                     if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]))
        return (np.array([p[0] for p in pts], dtype=np.int64), np.array([p[1] for p in pts], dtype=np.float64))

    def has(self, key: str) -> bool:
        return len(self.series(key)[0]) > 0

    def record_at(self, step: int, key: str) -> dict:
        """The record of ``step`` holding ``key`` (validation and train records are separate lines)."""
        return next((r for r in self.records if r.get("step") == step and key in r), {})


def load_run(run_dir: str | os.PathLike, name: str | None = None) -> RunData:
    """Read ``RUN_DIR/metrics.jsonl``; a missing or empty file is a one-line UserError."""
    path = Path(run_dir)
    f = path / "metrics.jsonl"
    if not path.is_dir():
        raise UserError(f"{run_dir}: no such run folder; pass the output_dir of a critic-pretrain run")
    if not f.is_file():
        raise UserError(f"{run_dir}: no metrics.jsonl (not a critic-pretrain run folder, or it has not logged yet)")
    records = [r for r in read_metrics(f) if isinstance(r, dict) and "step" in r]
    if not records:
        raise UserError(f"{f}: no records yet; wait for the first log step (train.log_every)")
    return RunData(path, name or path.resolve().name, records, _target_kinds(path))


def _target_kinds(run_dir: Path) -> tuple[str, str]:
    """From the run's config.yaml; generic words when it is missing or from another version."""
    from ..config import TargetsConfig
    try:
        targets = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("targets") or {}
        return TargetsConfig(**targets).kinds()
    except (OSError, yaml.YAMLError, TypeError, AttributeError, UserError):
        return RunData.kinds


def load_metrics(run_dir):
    """A run's ``metrics.jsonl`` as a pandas DataFrame: one row per step (the train and the
    validation record of a step merged), sorted by step; a column per metric (NaN where a step
    did not log it). For notebooks: ``load_metrics("runs/x")[["step", "val/loss"]].dropna()``."""
    pd = require("pandas", "critic_pretrain.report.load_metrics")

    frame = pd.DataFrame(load_run(run_dir).records)
    return frame.groupby("step", as_index=False).first().sort_values("step").reset_index(drop=True)


def load_runs(run_dirs: list[str | os.PathLike]) -> list[RunData]:
    """Runs named by folder name, or by the path given when two folders share a name."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [load_run(d, name=(str(d) if names.count(n) > 1 else n)) for d, n in zip(run_dirs, names)]
