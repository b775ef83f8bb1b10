"""Everything a training run needs from the data: the stores, the split, what truncation leaves."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import DataConfig, TargetsConfig
from ..errors import UserError
from .sampling import effective_lengths, max_length_of, split_by_group, weighted_rows
from .store import RolloutStore, check_bad_fraction, prepare_store

log = logging.getLogger(__name__)



@dataclass
class TrainData:
    train: RolloutStore
    val: RolloutStore
    train_idx: np.ndarray
    """Rows of ``train`` used for training (after split and `overlong: skip`)."""
    train_len: np.ndarray
    """Their effective lengths (after `overlong: truncate`)."""
    val_idx: np.ndarray
    max_length: int
    overlong_rows: int
    """Rollouts longer than max_length (truncated or skipped, by ``overlong_policy``)."""
    overlong_policy: str
    """`data.overlong`: truncate or skip."""
    capped_by_model: bool
    """max_length is the model's position limit, below `data.max_length` / `data.max_tokens`."""
    source_weights: np.ndarray
    """Sampling weight of each training source (indexed by the store's `source` column)."""
    policy_tokens: int = 0
    """Policy tokens of the training rollouts after truncation: what the loss sees."""
    without_policy: int = 0
    """Training rollouts left out: no policy token within max_length (a prompt that long)."""
    val_groups: tuple[int, int] = (0, 0)
    """(held-out groups, all groups) of the `val_fraction` split; (0, 0) with `data.val`."""

    def epoch(self, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's rollouts and lengths after source weights (see ``weighted_rows``)."""
        return weighted_rows(self.train_idx, self.train_len, self.train.source[self.train_idx],
                             self.source_weights, seed=seed, epoch=epoch)

    def describe(self) -> str:
        """The start-up ``data:`` line: what is trained, after truncation and every filter."""
        st = self.train.stats
        held = (f": {self.val_groups[0]} of {self.val_groups[1]} prompts held out" if self.val_groups[1]
                else " from data.val" if self.val is not self.train else "")
        cut = "truncated" if self.overlong_policy == "truncate" else "skipped"
        return (f"{len(self.train_idx)} training rollouts ({len(self.val_idx)} for validation{held}), "
                f"{int(self.train_len.sum()):,} tokens after truncation, {self.policy_tokens:,} policy tokens; "
                f"{self.overlong_rows} longer than max_length={self.max_length}"
                f"{' (the model position limit)' if self.capped_by_model else ''} {cut}"
                + f"; left out: {self.without_policy} with no policy token within max_length, "
                f"{st.duplicates} duplicate sample_ids, {st.bad_rows} bad rows, {st.bad_files} bad "
                f"files, {st.zero_weight_rows} zero-weight rows"
                + "".join(f", {n} by filter {k}" for k, n in st.filtered.items() if n))


MIN_POLICY_SHARE = 0.5
"""Training stops before step 1 when fewer than this share of the rollouts (training or
validation) keep a policy token after truncation: the window is then mostly prompt."""


def with_policy_left(store: RolloutStore, idx: np.ndarray, max_length: int, what: str, data: DataConfig
                     ) -> tuple[np.ndarray, int]:
    """(the rows of ``idx`` that keep a policy token after truncation to ``max_length``, their
    policy tokens). The others carry no loss and are left out (a step of them alone would train
    on nothing); a one-line UserError when fewer than MIN_POLICY_SHARE of the rows keep one."""
    kept = store.policy_tokens(max_length)[idx]
    with_policy = int((kept > 0).sum())
    if len(idx) and with_policy < MIN_POLICY_SHARE * len(idx):
        limits = f"data.max_tokens={data.max_tokens}" + (f", data.max_length={data.max_length}"
                                                         if data.max_length else "")
        raise UserError(f"only {with_policy} of {len(idx)} {what} rollouts keep a policy token after truncation to "
                        f"max_length={max_length} tokens ({limits}): the rest hold prompt tokens only and carry no "
                        "loss; raise data.max_tokens (and data.max_length), or data.overlong=skip to leave long "
                        "rollouts out")
    return idx[kept > 0], int(kept.sum())


def build_train_data(data: DataConfig, targets: TargetsConfig, cache_dir: Path, *, main_first, progress: bool,
                     model_limit: int | None = None, vocab_size: int | None = None) -> TrainData:
    """Prepare (or reuse) the stores and split them. ``main_first`` is a context manager that
    lets rank 0 build the stores before the other ranks read them. ``model_limit``: the
    model's position limit (caps `max_length`); ``vocab_size``: its vocabulary."""
    with main_first():
        train = prepare_store(data.all_sources(), cache_dir, data, targets, name="train", progress=progress,
                              vocab_size=vocab_size)
        val = (prepare_store(data.val, cache_dir, data, targets, name="val", vocab_size=vocab_size) if data.val
               else train)
    for store in {id(train): train, id(val): val}.values():
        check_bad_fraction(store.stats, data.max_bad_fraction, store.path.name, store.path / "quarantine.jsonl")
    val_groups = (0, 0)
    if data.val:
        train_idx, val_idx = np.arange(len(train)), np.arange(len(val))
    else:
        keys = train.split_keys()
        train_idx, val_idx = split_by_group(keys, data.val_fraction)
        if data.val_fraction > 0:
            val_groups = (len({keys[i] for i in val_idx}), len(set(keys)))
        if data.val_fraction > 0 and not len(val_idx):
            raise UserError(f"data.val_fraction={data.val_fraction:g} holds out prompts by group_id, but all "
                            f"{len(train)} rollouts share one group ({keys[0]!r}), so none can be held out: add "
                            "rollouts of other prompts, pass data.val=[...], or set data.val_fraction=0 "
                            "(no validation)")
    if data.recency_half_life:  # ages count from the newest version in the training data
        newest = None
        for store in {id(train): train, id(val): val}.values():
            r = store.set_recency(data.recency_half_life, newest)
            newest = r["newest"]
            log.info("%s data: recency weights, policy versions %d..%d, the oldest weigh %.3g (half-life %g "
                     "versions)%s%s", store.path.name, r["oldest"], r["newest"], r["oldest_weight"],
                     data.recency_half_life, f"; {r['without_version']} rollouts without a version weigh as the "
                     "oldest" if r["without_version"] else "",
                     "; one policy version only: the weights change nothing" if r["oldest"] == r["newest"] else "")
    max_length = max_length_of(data, model_limit)
    overlong_rows = int((train.lengths[train_idx] > max_length).sum())
    train_idx, _ = effective_lengths(train, train_idx, max_length, data.overlong)
    rows = len(train_idx)
    train_idx, policy = with_policy_left(train, train_idx, max_length, "training", data)
    without = rows - len(train_idx)
    train_len = np.minimum(train.lengths[train_idx], max_length)
    val_idx, _ = with_policy_left(val, val_idx, max_length, "validation", data)
    weights = np.array([s.weight for s in data.all_sources()], dtype=np.float64)
    return TrainData(train, val, train_idx, train_len, val_idx, max_length, overlong_rows, data.overlong,
                     max_length < max_length_of(data), weights, policy_tokens=policy, without_policy=without,
                     val_groups=val_groups)
