"""Which rollouts a step trains on: the train/validation split by prompt, token-budget packing,
the epoch plan and per-rank sharding."""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..config import DataConfig
from .store import RolloutStore

if TYPE_CHECKING:
    from .train_data import TrainData

log = logging.getLogger(__name__)



def split_by_group(keys: list[str], val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, val indices). A key's side depends only on the key (stable hash), so
    adding sources never moves existing rollouts across the split. With two or more groups
    each side gets at least one: when the hash holds out none (3 prompts at 0.1), the group
    with the smallest hash is held out; when it holds out all, the largest stays in training."""
    if val_fraction <= 0:
        return np.arange(len(keys)), np.zeros(0, np.int64)
    h = np.fromiter((int.from_bytes(hashlib.blake2b(k.encode(), digest_size=4).digest(), "little") for k in keys),
                    dtype=np.int64, count=len(keys))
    is_val = h < int(val_fraction * 2**32)
    if len(h) and h.min() != h.max():  # two or more groups
        if not is_val.any():
            is_val = h == h.min()
        elif is_val.all():
            is_val = h != h.max()
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def split_by_response(keys: list[str], row_hashes: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, val positions) of a split by response, stratified by prompt: a row is
    held out when its content hash (``row_hashes``, uint64, ``RolloutStore.row_hashes``) falls in
    the lowest ``val_fraction`` of the hash range, except that every prompt (``keys``) keeps at
    least one response in training (when the hash picks all of a prompt's responses, those with
    its largest hash stay) and a prompt with one response is never held out. A row's side
    depends only on its own tokens and key, so identical responses of one prompt share a side
    (a held-out response never sits verbatim in training) and adding rows moves no other row."""
    if val_fraction <= 0 or not len(keys):
        return np.arange(len(keys)), np.zeros(0, np.int64)
    group = np.unique(np.asarray(keys, dtype=object), return_inverse=True)[1].astype(np.int64)
    h = (np.asarray(row_hashes, np.uint64) >> np.uint64(32)).astype(np.int64)   # 32 bits, like split_by_group
    is_val = (h < int(val_fraction * 2**32)) & (np.bincount(group)[group] >= 2)
    n_groups = int(group.max()) + 1
    all_val = np.bincount(group, weights=is_val, minlength=n_groups) == np.bincount(group, minlength=n_groups)
    top = np.full(n_groups, -1, np.int64)
    np.maximum.at(top, group, h)
    is_val &= ~(all_val[group] & (h == top[group]))
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def pack(lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Greedy packing of rows in the given order into micro-batches of <= ``max_tokens`` tokens.

    ``lengths`` are effective (already truncated) lengths, each <= ``max_tokens``; returns
    arrays of positions into ``lengths``.
    """
    batches, start, used = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if used + n > max_tokens and i > start:
            batches.append(np.arange(start, i))
            start, used = i, 0
        used += n
    if start < len(lengths):
        batches.append(np.arange(start, len(lengths)))
    return batches


@dataclass(frozen=True)
class Layout:
    """How micro-batches map to ranks: an optimizer step takes ``world * grad_accum`` of them."""

    world: int
    rank: int
    grad_accum: int

    @property
    def per_step(self) -> int:
        return self.world * self.grad_accum


def max_length_of(data: DataConfig, model_limit: int | None = None) -> int:
    """The longest rollout kept whole: `data.max_length` (default `data.max_tokens`), and never
    more than the model's position limit (``model.position_limit``): a longer rollout would
    train on positions the model never supports."""
    max_len = data.max_length or data.max_tokens
    return min(max_len, model_limit) if model_limit else max_len


def cut_length(step: int, data: DataConfig, max_length: int) -> int:
    """The length rollouts are cut at in optimizer step ``step`` (0-based), a sequence-length
    warm-up: `data.length_warmup_from` for the first `data.length_warmup_hold` steps, then growing
    linearly to ``max_length`` at step `data.length_warmup_steps`, ``max_length`` from there. A
    function of the step alone, so a resumed run cuts exactly as the uninterrupted one."""
    n, hold = data.length_warmup_steps, data.length_warmup_hold
    if step >= n:
        return max_length
    start = min(data.length_warmup_from, max_length)
    return start + (max_length - start) * max(step - hold, 0) // (n - hold)


def effective_lengths(store: RolloutStore, indices: np.ndarray, max_len: int, overlong: str,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(indices kept, their lengths after `overlong` handling of rollouts longer than ``max_len``)."""
    lens = store.lengths[indices]
    if overlong == "skip":
        keep = lens <= max_len
        return indices[keep], lens[keep]
    return indices, np.minimum(lens, max_len)


def weighted_rows(indices: np.ndarray, lengths: np.ndarray, source: np.ndarray, weights: np.ndarray, *,
                  seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Apply source weights for one epoch: weight w repeats a source's rollouts floor(w)
    times and adds a fresh random share w - floor(w) of them (from (seed, epoch, source)).
    All weights 1: the rows unchanged."""
    if np.all(weights == 1.0):
        return indices, lengths
    picks = []
    for s, w in enumerate(weights):
        of_source = np.flatnonzero(source == s)
        whole, frac = int(np.floor(w)), w - np.floor(w)
        picks += [of_source] * whole
        if frac > 0:
            rng = np.random.default_rng([seed, epoch, 1000 + s])
            picks.append(np.sort(rng.choice(of_source, int(round(frac * len(of_source))), replace=False)))
    pos = np.concatenate(picks) if picks else np.zeros(0, np.int64)
    return indices[pos], lengths[pos]


def plan_epoch(indices: np.ndarray, lengths: np.ndarray, *, seed: int, epoch: int, data: DataConfig,
               layout: Layout) -> list[np.ndarray]:
    """The epoch's micro-batches in global order, trimmed to whole optimizer steps.

    ``lengths[i]`` is the effective length of row ``indices[i]``.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(len(indices)) if data.shuffle else np.arange(len(indices))
    batches = pack(lengths[perm], data.max_tokens)
    full = len(batches) // layout.per_step * layout.per_step
    return [indices[perm[b]] for b in batches[:full]]


def accum_for_rollouts(indices: np.ndarray, lengths: np.ndarray, *, seed: int, data: DataConfig, world: int,
                       rollouts: int) -> int:
    """The fewest micro-batches per rank (grad_accum) whose optimizer step holds at least ``rollouts``
    rollouts on average over the first pass: ceil(rollouts / (world x mean rollouts per micro-batch))."""
    plan = plan_epoch(indices, lengths, seed=seed, epoch=0, data=data, layout=Layout(world, 0, 1))
    if not plan:
        return 1  # too little data for one step: the caller's own check says so
    per_micro = sum(len(mb) for mb in plan) / len(plan)
    return max(1, math.ceil(rollouts / (world * per_micro) - 1e-9))


FEW_ROLLOUTS_PER_STEP = 4
"""Below this many rollouts per optimizer step the start-up warns (bench/step_rollouts.py)."""


def log_schedule(plan: list[np.ndarray], layout: Layout, max_steps: int, data: DataConfig, train: TrainData) -> None:
    """The start-up ``schedule:`` line for the first pass's ``plan``. The schedule is counted in
    steps of a token budget, so long rollouts mean few per step and few passes: on the synthetic
    ``long`` environment 1,200 steps held ~2 rollouts each and learned nothing (docs/warm.md,
    *When the critic learns nothing*). Say it in rollouts and passes before compute is spent, and
    the sequence-length warm-up (``cut_length``) when it cuts anything."""
    steps_per_pass, rows = len(plan) // layout.per_step, sum(len(mb) for mb in plan)
    log.info("schedule: a pass over the training rollouts is %d step%s of about %.1f rollouts; train.max_steps=%d "
             "is %.1f passes", steps_per_pass, "" if steps_per_pass == 1 else "s", rows / steps_per_pass, max_steps,
             max_steps / steps_per_pass)
    if rows / steps_per_pass < FEW_ROLLOUTS_PER_STEP:
        log.warning("steps of about %.1f rollouts: on the synthetic environments steps of ~2 learned nothing where "
                    "steps of 12+ learned (docs/warm.md, *When the critic learns nothing*); set "
                    "train.rollouts_per_step (e.g. 12) to accumulate micro-batches", rows / steps_per_pass)
    first_cut = cut_length(0, data, train.max_length)
    if first_cut < train.max_length:
        empty = int((train.train.policy_tokens(first_cut)[train.train_idx] == 0).sum())
        log.info("length warm-up: rollouts are cut at %d tokens until step %d, growing to max_length=%d by step %d "
                 "(data.length_warmup_*)%s", first_cut, data.length_warmup_hold, train.max_length,
                 data.length_warmup_steps, f"; {empty} of {len(train.train_idx)} training rollouts have no policy "
                 f"token in the first {first_cut} and train on nothing until the cut passes their prompt"
                 if empty else "")


def step_batches(plan: list[np.ndarray], step_in_epoch: int, layout: Layout) -> list[np.ndarray]:
    """This rank's micro-batches for one optimizer step: global order a*world + rank."""
    base = step_in_epoch * layout.per_step
    return [plan[base + a * layout.world + layout.rank] for a in range(layout.grad_accum)]


def rank_micro_batches(plan: list[np.ndarray], first: int, step: int, layout: Layout, data: DataConfig,
                       max_length: int) -> tuple[list[np.ndarray], list[int]]:
    """This rank's micro-batches from epoch step ``first`` to the end of ``plan``, and the length
    each is cut at (``cut_length``); ``step`` is the global step of epoch step ``first``."""
    steps = range(first, len(plan) // layout.per_step)
    batches = [mb for s in steps for mb in step_batches(plan, s, layout)]
    return batches, [cut_length(step + s - first, data, max_length) for s in steps for _ in range(layout.grad_accum)]
