"""The calibration a report draws: the eval JSON of the checkpoint the summary picks, cached
beside the run, or a given ``critic-pretrain eval`` output."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import UserError
from .runs import RunData
from .summary import pick_checkpoint

log = logging.getLogger(__name__)


def run_calibration(run_dir: str | os.PathLike, step: int | None = None, *, compute: bool = True) -> dict | None:
    """The eval JSON of checkpoint ``step`` (default: the newest) on the run's validation split.

    Read from ``<run>/eval/step_<n>-val.json`` when that is newer than the checkpoint;
    otherwise (``compute``) evaluated now and cached there. None without a checkpoint or
    without a validation split (``data.val_fraction=0``, no ``data.val``).
    """
    from ..eval import default_out, evaluate_checkpoint, write_json

    step_dir = checkpoint_to_draw(run_dir, step)
    if step_dir is None:
        return None
    cache = default_out(step_dir, None)
    if cache.is_file() and cache.stat().st_mtime >= (step_dir / "critic_pretrain.json").stat().st_mtime:
        cached = json.loads(cache.read_text())
        whole = cached.get("settings") == {"max_length": None, "max_tokens": None}  # not a cut or partial one
        if whole and "advantages" in cached and "regimes" in cached:  # older evals: evaluate again
            return cached
    if not compute:
        return None
    result = evaluate_checkpoint(step_dir)
    try:
        write_json(result, cache)
    except UserError as e:  # a read-only run folder: the cache is a convenience, the report goes on
        log.warning("%s; the report goes on without caching it there (the next report evaluates again)", e)
    return result


def checkpoint_to_draw(run_dir: str | os.PathLike, step: int | None = None) -> Path | None:
    """The checkpoint folder a report evaluates on the run's validation split: ``step`` (default,
    or not saved: the newest). None without a checkpoint or without a validation split
    (``data.val_fraction=0``, no ``data.val``): nothing held out, nothing to draw."""
    from ..checkpoint import StepPaths, find_checkpoints

    found = find_checkpoints(run_dir)
    if not found:
        return None
    step_dir = found.get(step, found[max(found)])
    data = ((StepPaths(step_dir).read_config() or {}).get("data") or {})
    return step_dir if data.get("val") or data.get("val_fraction") else None


def run_calibrations(runs: list[RunData], *, evaluate: bool = True) -> dict[str, dict | None]:
    """Run name -> eval JSON of the checkpoint ``pick_checkpoint`` picks (else the newest) on
    the run's validation split; None for a run without checkpoints."""
    return {run.name: run_calibration(run.path, pick_checkpoint(run)[1], compute=evaluate) for run in runs}


def read_eval_json(path: str | os.PathLike) -> dict:
    """A ``critic-pretrain eval`` output, checked to hold a calibration table."""
    try:
        ev = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read it as JSON ({e}); "
                        "pass a file written by `critic-pretrain eval`") from None
    if not isinstance(ev, dict) or "calibration" not in ev:
        raise UserError(f"{path}: no calibration table; pass a file written by `critic-pretrain eval`")
    return ev
