"""What a resume may change: the rules that keep a re-run of the same command from mixing two runs.

A resume continues the newest checkpoint only when the run-defining settings are the ones it was
trained with (``check_config_changes``; ``train.allow_config_changes`` accepts named changes and
records them), the micro-batches of one optimizer step are the same (``check_layout``: world size
x grad_accum), and the rollout files are unchanged (``check_data_changes``; ``data.allow_changes``).
Each check runs before anything in the output folder is rewritten.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from ..config import Config, absolute_spec
from ..data import Layout, file_manifest, source_files
from ..errors import UserError
from .layout import StepPaths, resolve_resume, step_number, verify
from .manifest import Manifest

log = logging.getLogger(__name__)


# Keys that define what is trained: a resume that changed one would continue a different run
# under the old run's name (steps trained with gamma 1 reported as gamma 0.9, a schedule
# stretched mid-way, a different split). Prefixes cover whole sections.
RUN_DEFINING = ("seed", "model.name_or_path", "model.config", "model.head_bias", "model.dtype", "targets.",
                "optim.lr", "optim.min_lr", "optim.weight_decay", "optim.betas", "optim.eps", "optim.schedule",
                "optim.warmup_steps", "optim.head_lr", "train.freeze_backbone_steps", "train.max_steps",
                "train.rollouts_per_step",
                "train.grad_clip", "data.sources",
                "data.val_fraction", "data.val_split", "data.max_tokens", "data.max_length", "data.overlong",
                "data.length_warmup_steps", "data.length_warmup_from", "data.length_warmup_hold",
                "data.shuffle",
                "data.on_bad", "data.recency_half_life", "data.weighting")
# data.train / data.val paths are not here: the data manifest compares the files themselves.
# train.grad_accum is not here either: what must stay is world size x grad_accum, the micro-batches
# of one optimizer step (``check_layout``), so a run may resume on another number of ranks.


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and model.config stay whole values."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "model.config":
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _matches(key: str, patterns) -> bool:
    return any(key == p or key.startswith(p if p.endswith(".") else p + ".") for p in patterns)


def run_changes(old: dict, new: Config) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every run-defining key that differs between a checkpoint's
    ``config.yaml`` (``old``, a plain dict) and ``new``. ``train.max_steps`` only counts when
    the schedule has a horizon (linear or cosine)."""
    # A key the old config lacks (written before the key existed) had its default then.
    before, after = {**flatten(Config().to_dict()), **flatten(old)}, flatten(new.to_dict())
    for d in (before, after):  # sources as written then and now: relative paths from this folder
        d["data.sources"] = [{**s, "paths": [absolute_spec(p) for p in s.get("paths") or []]}
                             if isinstance(s, dict) else s for s in d.get("data.sources") or []]
    changed = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        if a == b or not _matches(key, RUN_DEFINING):
            continue
        if key == "train.max_steps" and new.optim.schedule == "constant" and before.get("optim.schedule") == "constant":
            continue
        changed.append((key, a, b))
    return changed


def refused_changes(changes: list[tuple[str, Any, Any]], allowed: list[str]) -> list[tuple[str, Any, Any]]:
    return [c for c in changes if not _matches(c[0], allowed)]


def check_config_changes(step_dir: Path, cfg: Config) -> list[dict]:
    """Compare the run-defining keys of ``cfg`` with the config ``step_dir`` was trained with.

    A change stops the run (the checkpoint would continue under settings it was not trained
    with) unless ``train.allow_config_changes`` names it; then it joins the history recorded
    in later manifests. Nothing in the output folder is touched before this check.
    """
    paths = StepPaths(step_dir)
    old = paths.read_config()
    if old is None:
        raise UserError(f"{paths.config_yaml} cannot be read; resume from another step (checkpoint.load_step=N) "
                        "or use a new output_dir")
    manifest = Manifest.read(step_dir)
    history = manifest.config_changes if manifest else []
    changes = run_changes(old, cfg)
    refused = refused_changes(changes, cfg.train.allow_config_changes)
    if refused:
        what = "; ".join(_change(k, a, b) for k, a, b in refused)
        keys = ",".join(k for k, _, _ in refused)
        raise UserError(f"{cfg.output_dir} holds a run trained with other settings ({step_dir.name}): {what}. "
                        f"Use a new output_dir, or continue this run with the change: "
                        f"train.allow_config_changes=[{keys}] (recorded in the checkpoint manifests)")
    if not changes:
        return history
    log.warning("resuming with changed settings (train.allow_config_changes): %s",
                "; ".join(_change(k, a, b) for k, a, b in changes))
    return history + [{"at_step": step_number(step_dir),
                       "changes": [{"key": k, "old": a, "new": b} for k, a, b in changes]}]


def warn_precision(step_dir: Path, mixed_precision: str) -> None:
    """A resume in another mixed precision (``train.mixed_precision``, or `auto` on other hardware:
    a CPU run re-queued on a GPU) continues, said once: its steps are not bit-identical to a
    straight run in one precision, and the manifests record the precision of each step."""
    before = getattr(Manifest.read(step_dir), "mixed_precision", None)
    if before is not None and before != mixed_precision:
        log.warning("%s was trained in mixed precision %s and the run continues in %s (train.mixed_precision): "
                    "steps from here are not bit-identical to a run in one precision", step_dir.name, before,
                    mixed_precision)


def saved_layout(step_dir: Path) -> tuple[int, int] | None:
    """(world size, grad_accum) ``step_dir`` was trained with; None when the checkpoint does not say."""
    world = getattr(Manifest.read(step_dir), "world_size", None)
    accum = ((StepPaths(step_dir).read_config() or {}).get("train") or {}).get("grad_accum")
    return (world, accum) if isinstance(world, int) and isinstance(accum, int) else None


def resumed_grad_accum(step_dir: Path, world: int) -> int | None:
    """The grad_accum that keeps ``step_dir``'s micro-batches per optimizer step on ``world`` ranks
    (None: the checkpoint does not say, or ``world`` does not divide them; ``check_layout`` refuses)."""
    saved = saved_layout(step_dir)
    if saved is None or (saved[0] * saved[1]) % world:
        return None
    return saved[0] * saved[1] // world


def check_layout(step_dir: Path, layout: Layout) -> None:
    """A resume may change the number of ranks, not the micro-batches of one optimizer step
    (world x grad_accum): the data position counts steps of the same epoch plan."""
    saved = saved_layout(step_dir)
    if saved is None or saved[0] * saved[1] == layout.per_step:
        return
    world, accum = saved
    per_step = world * accum
    fix = (f"set train.grad_accum={per_step // layout.world}" if per_step % layout.world == 0
           else f"run on a number of ranks that divides {per_step}")
    raise UserError(f"{step_dir.name} was trained with {world} rank(s) x train.grad_accum {accum} = {per_step} "
                    f"micro-batches per step; this run has {layout.world} x {layout.grad_accum} = {layout.per_step}. "
                    f"To resume on {layout.world} rank(s), {fix}, so every step sees the same data")


def _change(key: str, old, new) -> str:
    """``key old -> new``; for a dict (``model.config``) only the fields that differ, which a cut
    rendering of the whole dict hid."""
    if isinstance(old, dict) and isinstance(new, dict):
        return "; ".join(f"{key}.{k} {_short(old.get(k))} -> {_short(new.get(k))}"
                         for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k))
    return f"{key} {_short(old)} -> {_short(new)}"


def _short(v) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def check_data_changes(step_dir: Path, data_cfg) -> list[dict]:
    """Compare the rollout files now with the data manifest saved in ``step_dir``.

    Changed files stop the run (a resume would silently train on other data) unless
    ``data.allow_changes``; then the change joins the history recorded in later manifests.
    """
    manifest = json.loads(StepPaths(step_dir).manifest.read_text()).get("data", {})
    history = list(manifest.get("changes", []))
    before = {f["path"]: f for f in manifest.get("files", [])}
    now = {f["path"]: f for f in file_manifest(source_files(data_cfg.all_sources()))}
    added = sorted(now.keys() - before.keys())
    removed = sorted(before.keys() - now.keys())
    modified = sorted(p for p in now.keys() & before.keys() if _file_changed(before[p], now[p]))
    if not (added or removed or modified):
        return history
    listed = [p for v in (added, removed, modified) for p in v[:3]]
    unique = len({Path(p).name for p in listed}) == len(listed)  # part-00000.parquet added and removed: full paths
    parts = [f"{len(v)} {k} ({', '.join(Path(p).name if unique else p for p in v[:3])}{', ...' if len(v) > 3 else ''})"
             for k, v in (("added", added), ("removed", removed), ("modified", modified)) if v]
    what = f"the rollout files changed since {step_dir.name} was saved: {'; '.join(parts)}"
    if not data_cfg.allow_changes:
        raise UserError(f"{what}. Restore them, use a new output_dir, or set data.allow_changes=true to continue "
                        "on the new data (the change is recorded in the checkpoint manifests)")
    log.warning("%s; continuing on the new data (data.allow_changes=true)", what)
    return history + [{"at_step": step_number(step_dir), "added": added, "removed": removed,
                       "modified": modified}]


def _file_changed(before: dict, now: dict) -> bool:
    """Size, mtime (when both recorded) or content fingerprint differ. Manifests from before
    sampled fingerprints hold a footer-only one: compare like with like."""
    from rollouts.paths import legacy_fingerprint

    if before["size"] != now["size"]:
        return True
    if before.get("mtime_ns") is not None and before["mtime_ns"] != now.get("mtime_ns"):
        return True
    old = before["fingerprint"]
    return old != (now["fingerprint"] if old.startswith("v2:") else legacy_fingerprint(now["path"]))


SUPERSEDED = "superseded"
"""Where steps newer than ``checkpoint.load_step`` go when a run branches from it (nothing is deleted)."""


def branch(out: Path, load_step: int | None) -> tuple[Path | None, list[Path]]:
    """(the step to resume from, the newer steps a branch from ``load_step`` sets aside).

    Going back to step N with steps after it on disk starts a second trajectory in the folder:
    its saves would interleave with the old steps (retention then counts the old ones as newest
    and deletes the new), and a later plain re-run would resume the old trajectory over the new
    one's metrics. So the newer steps move to ``superseded/`` (``set_aside``). Re-running the same
    command must continue, not branch again: when the newest step was itself saved by a run with
    this ``load_step`` (its config.yaml), that step is the resume point."""
    if load_step is None or not out.is_dir():
        return resolve_resume(out, load_step), []  # (a missing folder: resolve_resume's one-line error)
    newer = sorted((d for d in out.iterdir() if d.is_dir() and (step_number(d) or -1) > load_step), key=step_number)
    complete = [d for d in newer if verify(d) is None]
    if complete and _load_step_of(complete[-1]) == load_step:  # the newest was saved by this same command
        log.info("checkpoint.load_step=%d: %s was saved by a run with the same load_step; continuing that branch",
                 load_step, complete[-1].name)
        return resolve_resume(out, step_number(complete[-1])), []
    return resolve_resume(out, load_step), newer  # step N's content is checked only when it is the resume point


def _load_step_of(step_dir: Path) -> int | None:
    return ((StepPaths(step_dir).read_config() or {}).get("checkpoint") or {}).get("load_step")


def set_aside(out: Path, load_step: int, newer: list[Path]) -> Path:
    """Move ``newer`` (and a copy of metrics.jsonl, whose lines after ``load_step`` the resumed run
    drops) into ``out/superseded/from_step_<N>_<time>/``; main process, after every rank has
    chosen its resume point."""
    dest = out / SUPERSEDED / f"from_step_{load_step}_{time.strftime('%Y%m%d-%H%M%S')}"
    dest.mkdir(parents=True, exist_ok=False)
    if (out / "metrics.jsonl").is_file():
        shutil.copy2(out / "metrics.jsonl", dest / "metrics.jsonl")
    for d in newer:
        d.rename(dest / d.name)
    log.warning("checkpoint.load_step=%d: %s %s newer, from another trajectory; moved to %s so the two do not mix "
                "(nothing deleted; re-running this command continues the new branch)", load_step,
                ", ".join(d.name for d in newer), "was" if len(newer) == 1 else "were", dest)
    return dest


def resume_point(cfg: Config, layout: Layout, barrier=lambda: None) -> tuple[Path | None, Layout, list, list]:
    """(the step to resume from or None, the layout to train with, accepted config changes,
    accepted data changes). ``barrier``: waits for every rank (a branch moves steps on the
    main process once all have chosen theirs)."""
    out = Path(cfg.output_dir)
    resume_dir, newer = branch(out, cfg.checkpoint.load_step)
    if resume_dir is None:
        log.info("fresh start in %s: weights from %s", out, cfg.model.name_or_path or "random init (model.config)")
        return None, layout, [], []
    config_changes = check_config_changes(resume_dir, cfg)  # before anything in out is rewritten
    if cfg.train.rollouts_per_step:  # resolved when the run began: keep its micro-batches per step
        cfg.train.grad_accum = resumed_grad_accum(resume_dir, layout.world) or cfg.train.grad_accum
        layout = Layout(layout.world, layout.rank, cfg.train.grad_accum)
    check_layout(resume_dir, layout)
    data_changes = check_data_changes(resume_dir, cfg.data)
    # Said once the checks above passed: a refused resume never announced itself first.
    log.info("resuming from %s (the checkpoint wins over model.name_or_path and head init)", resume_dir)
    if (step_number(resume_dir) or 0) >= cfg.train.max_steps:  # a re-run of a finished run: say so up front
        log.info("step %d is train.max_steps: nothing left to train, the seed is checked again (to train on, raise "
                 "train.max_steps with train.allow_config_changes=[train.max_steps])", step_number(resume_dir))
    if newer:  # every check passed: only now is the folder rearranged
        barrier()
        if layout.rank == 0:
            set_aside(out, cfg.checkpoint.load_step, newer)
        barrier()
    return resume_dir, layout, config_changes, data_changes
