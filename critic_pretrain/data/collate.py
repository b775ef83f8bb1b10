"""One micro-batch as one padding-free packed row, and the loader that prefetches them."""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..packed import PackedBatch
from .store import RolloutStore

log = logging.getLogger(__name__)



def collate_packed(store: RolloutStore, rows: np.ndarray, max_length: int, *,
                   with_rewards: bool = False, by_turn: bool = False) -> PackedBatch:
    """One micro-batch as a single packed row (``packed.PackedBatch``); ``with_rewards`` fills the
    fields evaluation and TD targets read (rewards, outcome, oracle, old values); ``by_turn``
    weighs each policy turn of a rollout alike (``data.weighting: turn``)."""
    t = store.table.take(pa.array(rows))
    if int(store.lengths[rows].max()) > max_length:
        t = pa.table({name: (pc.list_slice(t.column(name), 0, max_length)
                             if pa.types.is_list(t.schema.field(name).type) else t.column(name))
                      for name in t.column_names})
    lens = pc.list_value_length(t.column("input_ids")).to_numpy().astype(np.int64)

    def flat(name: str, dtype) -> np.ndarray:
        # copy: Arrow buffers are read-only and torch wants writable memory
        return pc.list_flatten(t.column(name)).to_numpy(zero_copy_only=False).astype(dtype, copy=True)

    n = int(lens.sum())
    starts = np.cumsum(lens) - lens
    position_ids = np.arange(n) - np.repeat(starts, lens)
    row_weight = t.column("weight").to_numpy(zero_copy_only=False).astype(np.float32)
    if store.row_scale is not None:  # data.recency_half_life
        row_weight = row_weight * store.row_scale[rows]
    weight = np.repeat(row_weight, lens)
    weights = flat("loss_mask", np.float32) * weight
    if by_turn:
        weights *= turn_weights(weights > 0, lens)
    batch = PackedBatch(input_ids=torch.from_numpy(flat("input_ids", np.int64))[None],
                        position_ids=torch.from_numpy(position_ids)[None],
                        targets=torch.from_numpy(flat("returns", np.float32))[None],
                        weights=torch.from_numpy(weights)[None], seq_lens=torch.from_numpy(lens.astype(np.int32)),
                        valid_tokens=int((weights > 0).sum()), num_rows=len(rows))
    if with_rewards:
        rewards = flat("rewards", np.float32)
        cut = np.flatnonzero(store.lengths[rows] > lens)  # rollouts truncated at max_length
        if len(cut):
            _return_at_cut(rewards, batch.targets[0].numpy(), flat("loss_mask", np.int64), starts[cut], lens[cut])
        batch.rewards = torch.from_numpy(rewards)[None]
        batch.outcome = torch.from_numpy(t.column("outcome").to_numpy(zero_copy_only=False).astype(np.float32))
        for key, name in (("oracle", "oracle_values"), ("old_values", "values")):
            col = t.column(name)
            if col.null_count == len(col):
                continue
            vals = np.full(n, np.nan, np.float32)
            present = ~col.is_null().to_numpy(zero_copy_only=False)
            where = np.repeat(present, lens)
            vals[where] = pc.list_flatten(col.filter(pa.array(present))).to_numpy(zero_copy_only=False)
            setattr(batch, key, torch.from_numpy(vals)[None])
    return batch


def turn_weights(policy: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """[N] factors on packed policy tokens (``policy``: [N] bool, rows of ``lens``): a token of a
    turn of ``n`` tokens, in a row of ``P`` policy tokens and ``k`` turns, gets ``P / (k * n)``, so
    each turn sums to ``P / k`` and the row to ``P``. A turn is a run of policy tokens."""
    row = np.repeat(np.arange(len(lens)), lens)
    first = policy.copy()
    first[1:] &= ~policy[:-1] | (row[1:] != row[:-1])                   # a turn starts here
    turn = np.cumsum(first) - 1                                          # [N] turn index (valid on policy)
    turn_len = np.bincount(turn[policy], minlength=int(first.sum()))
    p_row = np.bincount(row[policy], minlength=len(lens))
    k_row = np.bincount(row[first], minlength=len(lens))
    out = np.zeros(len(policy), np.float32)
    t = np.flatnonzero(policy)
    out[t] = p_row[row[t]] / (k_row[row[t]] * turn_len[turn[t]])
    return out


def _return_at_cut(rewards: np.ndarray, targets: np.ndarray, mask: np.ndarray, starts: np.ndarray,
                   lens: np.ndarray) -> None:
    """In place: the rewards past a cut are gone, so the last kept policy token of each cut
    rollout (packed ``starts`` / ``lens``) carries the rollout's return from there (its target):
    GAE over the kept part then bootstraps from the whole rollout's outcome, not from 0."""
    for start, n in zip(starts.tolist(), lens.tolist()):
        policy = np.flatnonzero(mask[start:start + n])
        if len(policy):
            rewards[start + policy[-1]] = targets[start + policy[-1]]


class MicroBatches(torch.utils.data.Dataset):
    """A list of micro-batches (row index arrays) as a map-style dataset of packed batches;
    ``max_length``: one length for all, or one per micro-batch (``data.length_warmup_steps``)."""

    def __init__(self, store: RolloutStore, batches: list[np.ndarray], max_length: int | list[int],
                 with_rewards: bool = False, by_turn: bool = False):
        self.store, self.batches, self.with_rewards, self.by_turn = store, batches, with_rewards, by_turn
        self.max_length = [max_length] * len(batches) if isinstance(max_length, int) else max_length
        if len(self.max_length) != len(batches):
            raise ValueError(f"{len(self.max_length)} cut lengths for {len(batches)} micro-batches")

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return collate_packed(self.store, self.batches[i], self.max_length[i], with_rewards=self.with_rewards,
                              by_turn=self.by_turn)


def loader(store: RolloutStore, batches: list[np.ndarray], max_length: int | list[int], *, num_workers: int = 0,
           pin_memory: bool = False, with_rewards: bool = False, by_turn: bool = False) -> Iterator[PackedBatch]:
    """Iterate packed micro-batches in order; workers prefetch so the device does not wait."""
    ds = MicroBatches(store, batches, max_length, with_rewards, by_turn)
    return iter(torch.utils.data.DataLoader(
        ds, batch_size=None, shuffle=False, num_workers=num_workers, pin_memory=pin_memory,
        prefetch_factor=4 if num_workers else None, persistent_workers=False,
        worker_init_fn=_ignore_preemption_signals if num_workers else None))


def _ignore_preemption_signals(worker_id: int) -> None:
    """SLURM and torchrun signal every process of the job; a worker killed by SIGTERM would
    crash the trainer, which must instead save and exit. The trainer tears workers down."""
    import signal
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # Ctrl-C reaches the whole process group
        signal.signal(sig, signal.SIG_IGN)
