"""Experiment trackers through accelerate (``train.report_to``): TensorBoard, W&B, MLflow, ...

``metrics.jsonl`` stays the source of truth; every record it gets is also sent to the trackers
(``accelerator.log``) under the same names and steps. What we add to accelerate's trackers:

- a re-run of the same command continues the same W&B / MLflow run: their run ids are kept in
  ``<output_dir>/trackers.json`` and passed back on the next start (W&B ``resume="allow"``);
- TensorBoard hides events an interrupted run logged after the checkpoint it resumes from
  (``purge_step``), as W&B and MLflow do not need to: their steps are overwritten in order;
- the resolved config is logged flat (dotted keys, scalars), as TensorBoard's hparams need.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from rollouts import fileio

from .errors import UserError, did_you_mean

IDS_FILE = "trackers.json"


INSTALL = {"tensorboard": "tensorboard", "wandb": "'critic-pretrain[trackers]'",
           "mlflow": "'critic-pretrain[trackers]'", "comet_ml": "comet-ml"}
"""What ``pip install`` brings a tracker's package (others: the tracker's own name). TensorBoard
is a dependency of critic-pretrain itself: it is the default."""


def build(report_to: list[str], out: Path, project: str) -> list:
    """Tracker instances (or accelerate tracker names) for ``Accelerator(log_with=...)``.

    A tracker whose package is missing is a one-line error here, before step 1: accelerate
    would drop it with a debug message and the run would log nowhere. Instances are created on
    every rank but start (and write) on the main process only."""
    from accelerate import tracking

    available = {t.value for t in tracking.get_available_trackers()}
    ids = read_ids(out)
    trackers: list = []
    for name in dict.fromkeys(report_to):
        if name not in tracking.LOGGER_TYPE_TO_CLASS:
            raise UserError(f"train.report_to: unknown tracker {name!r} "
                            f"({did_you_mean(name, tracking.LOGGER_TYPE_TO_CLASS)}); or [] for none")
        if name not in available:
            others = [t for t in report_to if t != name]
            raise UserError(f"train.report_to has {name} but its package is not installed: pip install "
                            f"{INSTALL.get(name, name)} (or leave it out: train.report_to=[{','.join(others)}])")
        if name == "tensorboard":
            trackers.append(tracking.TensorBoardTracker("tensorboard", str(out)))
        elif name == "wandb":
            trackers.append(tracking.WandBTracker(project, id=ids.get("wandb") or uuid.uuid4().hex[:12],
                                                  resume="allow", dir=os.environ.get("WANDB_DIR") or str(out),
                                                  name=out.resolve().name))  # a WANDB_DIR the user set wins
        elif name == "mlflow":
            trackers.append(tracking.MLflowTracker(project, logging_dir=str(out / "mlruns"), run_id=ids.get("mlflow"),
                                                   run_name=out.resolve().name))
        else:  # accelerate's own defaults (logging dir: output_dir)
            trackers.append(name)
    return trackers


def start(accelerator, trackers: list, project: str, config: dict, resume_step: int | None, out: Path) -> None:
    """``accelerator.init_trackers`` with the flat config; remember the run ids (main process)."""
    if not trackers:
        return
    from accelerate import tracking

    for t in trackers:
        if isinstance(t, tracking.TensorBoardTracker):
            t.init_kwargs["purge_step"] = resume_step + 1 if resume_step is not None else None
    accelerator.init_trackers(project, config=flat(config))
    if accelerator.is_main_process:
        ids = read_ids(out)
        for t in accelerator.trackers:
            if t.name == "wandb":
                ids["wandb"] = t.run.id
            elif t.name == "mlflow":
                ids["mlflow"] = t.active_run.info.run_id
        if ids:
            fileio.write_text(out / IDS_FILE, json.dumps(ids, indent=1) + "\n")


def read_ids(out: Path) -> dict[str, str]:
    try:
        ids = json.loads((out / IDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in ids.items() if isinstance(v, str)} if isinstance(ids, dict) else {}


def flat(config: dict, prefix: str = "") -> dict[str, Any]:
    """Nested config -> {dotted key: bool/int/float/str}; lists and None become strings."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        else:
            out[key] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
    return out
