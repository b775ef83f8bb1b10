"""Refusals before step 1: settings that would let a run succeed over nothing.

Each check raises a one-line ``UserError`` naming the setting and the fix. They run where the
facts they need are known: the tokenizer and validation checks once the data is prepared, the
metric names once the first validation record (or a resumed run's ``metrics.jsonl``) says which
metrics this run logs. ``eval`` and ``seed check --rollouts`` use the tokenizer check too.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from rollouts.paths import archive_folder
from rollouts.provenance import RewardsLogged, collection, is_synthetic, rewards_logged, synthetic_id_clash
from rollouts.tokenizer import describe as describe_tokenizer
from rollouts.tokenizer import mismatch as tokenizer_mismatch
from rollouts.tokenizer import recorded as tokenizer_recorded

from .config import VAL_PREFIXES, Config
from .errors import UserError, closest
from .metrics import read_metrics

if TYPE_CHECKING:
    from .checkpoint import Manifest

log = logging.getLogger(__name__)


def check_rollouts_tokenizer(specs: list, model_fp: dict | None, fix: str, *, synthetic_ok: bool = False) -> None:
    """Rollouts converted with ``--tokenizer`` record its fingerprint (``_rollouts.json``), and
    synthetic ones say so (``_synth.json``): stop when they cannot mean to the model's tokenizer
    (``model_fp``) what they meant when written (``rollouts.tokenizer.mismatch``), wherever
    rollouts meet a model (training, ``eval``, ``seed check --rollouts``, ``audit``). ``fix``:
    what to do instead. ``synthetic_ok``: ``data.synthetic_on_pretrained`` (a backbone probed on
    synthetic credit structures)."""
    for spec in specs:
        folder = archive_folder(spec)
        if synthetic_ok and is_synthetic(folder):
            continue
        problem = tokenizer_mismatch(folder, model_fp)
        if problem:
            probe = ("; to probe a pretrained backbone on synthetic rollouts on purpose, set "
                     "data.synthetic_on_pretrained=true") if is_synthetic(folder) else ""
            raise UserError(f"{spec}: {problem}; {fix}{probe}")


def log_collections(specs: list) -> None:
    """One line per training archive that records its collecting run (``rollouts convert`` writes
    it to ``_rollouts.json``): framework and version, model, tokenizer, chat template, max length."""
    for spec in specs:
        folder = archive_folder(spec)
        collected = collection(folder) if folder is not None else None
        if collected is not None:
            log.info("rollouts %s: collected by %s; tokenizer %s", spec, collected.describe(),
                     describe_tokenizer(tokenizer_recorded(folder)))


def archive_rewards(specs: list) -> RewardsLogged | None:
    """What the training archives say of their rewards (``rollouts convert --ppo-config`` /
    ``--rewards-raw`` / ``--rewards-scaled``); None when none says. Archives that state
    different scales cannot be trained together: the critic would learn a mixture. Logs what
    each says of its collecting run first (``log_collections``): training prints it at start-up.
    Synthetic archives whose ids would clash (``synthetic_id_clash``) are refused here too."""
    log_collections(specs)
    clash = synthetic_id_clash([f for f in map(archive_folder, specs) if f is not None])
    if clash:
        raise UserError(clash)
    stated = {}
    for spec in specs:
        folder = archive_folder(spec)
        logged = rewards_logged(folder) if folder is not None else None
        if logged is not None:
            stated[str(spec)] = logged
    kinds = {(r.scale, r.shift, r.clip, r.shaped) for r in stated.values()}
    if len(kinds) > 1:
        what = "; ".join(f"{spec}: {r.formula()} ({r.stated_by})" for spec, r in stated.items())
        raise UserError(f"the training rollouts hold rewards on different scales ({what}): a critic trained on them "
                        "would learn a mixture; convert them to one scale, or train on one kind")
    if stated and len(stated) < len(specs):
        unknown = [str(s) for s in specs if str(s) not in stated]
        log.warning("%s do not say how their rewards were logged (rollouts convert --ppo-config / --rewards-raw); "
                    "taken to be like the others: %s", ", ".join(unknown), next(iter(stated.values())).formula())
    return next(iter(stated.values()), None)


def check_validation_needs(cfg: Config, val_rows: int) -> None:
    """``checkpoint.keep_best`` and ``train.stop_when`` rank validation metrics: without a
    validation split they would quietly do nothing."""
    if val_rows:
        return
    why = "there is no validation split (data.val_fraction=0 and no data.val)"
    fix = "set data.val_fraction (e.g. 0.05) or data.val=[...]"
    if cfg.checkpoint.keep_best:
        raise UserError(f"checkpoint.keep_best={cfg.checkpoint.keep_best} keeps the best checkpoints by "
                        f"{cfg.checkpoint.best_metric}, but {why}: {fix}, or drop checkpoint.keep_best")
    if cfg.train.stop_when.metric:
        raise UserError(f"train.stop_when.metric={cfg.train.stop_when.metric} stops on a validation metric, but "
                        f"{why}: {fix}, or drop train.stop_when")
    if cfg.eval.every:
        log.info("no validation split (data.val_fraction=0, no data.val): eval.every=%d evaluates nothing and "
                 "checkpoints carry no val: metrics", cfg.eval.every)


def check_one_step(first_epoch: list, cfg: Config, train_rows: int, world: int) -> None:
    """The first pass must fill one optimizer step (``plan_epoch``'s steps; ``cfg.train.grad_accum``
    already resolved). With ``train.rollouts_per_step`` set, grad_accum follows from it, so it is
    the lever to name (not max_tokens or grad_accum, which it overrides)."""
    if first_epoch:
        return
    rps = cfg.train.rollouts_per_step
    lever = (f"lower train.rollouts_per_step (now {rps}, which set train.grad_accum={cfg.train.grad_accum})"
             if rps else "lower data.max_tokens or train.grad_accum")
    raise UserError(f"not enough training data for one optimizer step: {train_rows} training rollouts do not fill "
                    f"{world * cfg.train.grad_accum} micro-batches of {cfg.data.max_tokens} tokens"
                    f"{f' over {world} processes' if world > 1 else ''}; {lever}, or add rollouts")


def check_metric_names(cfg: Config, logged: set[str]) -> None:
    """``train.stop_when.metric`` and (with ``keep_best``) ``checkpoint.best_metric`` must name a
    metric this run logs (``logged``: its ``val/...`` and ``val_response/...`` keys): ``val/los``
    would never stop. ``best_metric`` is written with ``:`` (``val:loss``), as checkpoints carry it."""
    names = {k for k in logged if k.split("/", 1)[0] in VAL_PREFIXES}
    wanted = []
    if cfg.train.stop_when.metric:
        wanted.append(("train.stop_when.metric", cfg.train.stop_when.metric, "/"))
    if cfg.checkpoint.keep_best:
        wanted.append(("checkpoint.best_metric", cfg.checkpoint.best_metric, ":"))
    for key, value, sep in wanted:
        name = value.replace(sep, "/", 1)
        if name not in names:
            near = closest(name, names)
            raise UserError(f"{key}={value}: this run logs no such validation metric"
                            + (f"; did you mean {near.replace('/', sep, 1)}?" if near else "")
                            + " (docs/metrics.md lists them)")


def logged_val_keys(path: Path) -> set[str]:
    """The validation metric names a run folder's ``metrics.jsonl`` holds (empty without one)."""
    if not path.is_file():
        return set()
    return {k for rec in read_metrics(path) for k in rec if k.split("/", 1)[0] in VAL_PREFIXES}


def constant_targets(cfg: Config, logged: dict[str, float], val_sets) -> list[str]:
    """Warnings, one per held-out set (``ValSet``) whose first evaluation found targets that do not
    vary: every held-out rollout has the same return (one prompt held out, all its responses
    solved). Their explained variance is 0/0 (nan from step 0 on), and the verdict, the group-mean
    baseline and the over-training watch have nothing to measure; only the loss does. A warning,
    not a refusal: the critic still trains on its training rollouts."""
    out = []
    for v in val_sets:
        ev, mean = logged.get(f"{v.prefix}/explained_variance"), logged.get(f"{v.prefix}/target_mean")
        if ev is None or not math.isnan(ev) or mean is None:  # logged and not nan: the targets vary
            continue
        prompts = logged.get(f"{v.prefix}/prompts")
        of = f" of {int(prompts)} prompt{'s' if prompts != 1 else ''}" if prompts is not None else ""
        out.append(f"{v.prefix}/explained_variance is nan: the {len(v.idx)} held-out rollouts{of} all have the same "
                   f"return (every target {mean:.4g}), so the EV, the group-mean baseline and the verdict cannot judge "
                   f"the critic, only {v.prefix}/loss can; hold out more prompts (data.val_fraction, now "
                   f"{cfg.data.val_fraction:g}) or pass rollouts with varied returns as data.val")
    return out


RESUME_FIX = "use a new output_dir, or continue on the new split with data.allow_changes=true"


def check_split_unchanged(step_dir: Path, manifest: Manifest | None, cfg: Config, train_rows: int, val_rows: int,
                          fix: str = RESUME_FIX) -> None:
    """The rows a checkpoint trained and validated on must stay put: a resume would otherwise
    continue on another data set, and ``eval`` would call trained-on rollouts held out (runs
    from before the split held out at least one prompt had none)."""
    before = manifest.split if manifest is not None else (None, None)
    if None in before or before == (train_rows, val_rows) or (cfg.data.allow_changes and fix is RESUME_FIX):
        return
    raise UserError(f"{step_dir.name} trained on {before[0]} rollouts with {before[1]} for validation, the split now "
                    f"gives {train_rows} and {val_rows}: the split, the filters or the rollouts changed; {fix}")
