"""Training data: a validated, memory-mapped rollout store with precomputed value targets,
a leakage-free train/validation split, token-budget packing and per-rank sharding.

Flow:

1. ``prepare_store`` streams the archive once through ``rollouts.RolloutReader``
   (validation, quarantine), computes each rollout's value targets (``targets.py``) and
   writes the columns training needs to an Arrow IPC file. Later runs and resumes reuse it
   when the source files and target settings are unchanged (fingerprint).
2. ``RolloutStore`` memory-maps that file: archives larger than RAM train with bounded
   memory, and micro-batches are random-access ``take``s.
3. ``split_by_group`` hashes ``group_id`` (fallback ``sample_id``) so every rollout of a
   prompt lands on the same side, and the split does not move when sources are added.
4. ``plan_epoch`` shuffles deterministically from (seed, epoch) and packs rollouts into
   micro-batches of at most ``max_tokens`` tokens; ``step_batches`` hands each rank its
   share of an optimizer step. A data position is (epoch, micro-batches consumed), so a
   resume continues with exactly the next micro-batch.
5. ``collate_packed`` turns a micro-batch into one padding-free row: ``input_ids`` [1, N],
   ``position_ids`` restarting at 0 per rollout (attention stays inside each rollout).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from rollouts import RolloutReader
from rollouts.paths import resolve

from .config import DataConfig, TargetsConfig
from .targets import RewardTransform, build_targets

log = logging.getLogger(__name__)

STORE_FORMAT = 1
STORE_FILE = "rollouts.arrow"
STORE_META = "meta.json"
# Columns of the store. `returns` are the value targets; `weight` = sample_weight.
STORE_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("returns", pa.list_(pa.float32())),
    ("weight", pa.float32()),
    ("split_key", pa.string()),
    ("oracle_values", pa.list_(pa.float32())),
    ("values", pa.list_(pa.float32())),
])


def reward_transform(t: TargetsConfig) -> RewardTransform:
    clip = t.reward_clip or [None, None]
    return RewardTransform(scale=t.reward_scale, shift=t.reward_shift, clip_min=clip[0], clip_max=clip[1])


# ---------------------------------------------------------------------------------------------
# Store

@dataclass
class StoreStats:
    """What preparing the store read, kept and left out (written to meta.json and manifests)."""

    files: int = 0
    rows: int = 0
    tokens: int = 0
    policy_tokens: int = 0
    bad_rows: int = 0
    bad_files: int = 0
    zero_weight_rows: int = 0
    problems: dict = field(default_factory=dict)
    mean_target: float = 0.0
    target_var: float = 0.0


class RolloutStore:
    """Memory-mapped rollouts with targets. Picklable (DataLoader workers re-open the map)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.meta = json.loads((self.path / STORE_META).read_text())
        self.stats = StoreStats(**self.meta["stats"])
        self._open()

    def _open(self) -> None:
        # Zero-copy: the table's buffers point into the mapped file, RSS grows only with use.
        self.table = pa.ipc.open_file(pa.memory_map(str(self.path / STORE_FILE))).read_all()
        self.lengths = pc.list_value_length(self.table.column("input_ids")).to_numpy().astype(np.int64)

    def __getstate__(self):
        return {"path": self.path, "meta": self.meta, "stats": self.stats}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def has_oracle(self) -> bool:
        return self.table.column("oracle_values").null_count < len(self)

    @property
    def has_values(self) -> bool:
        return self.table.column("values").null_count < len(self)

    def split_keys(self) -> list[str]:
        return self.table.column("split_key").to_pylist()


def _fingerprint(files: list[Path], data: DataConfig, targets: TargetsConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": STORE_FORMAT, "on_bad": data.on_bad, "targets": vars(targets)},
                        sort_keys=True).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def prepare_store(specs: list[str], cache_dir: str | os.PathLike, data: DataConfig,
                  targets: TargetsConfig, *, name: str = "train", progress: bool = False) -> RolloutStore:
    """Validate ``specs`` and build (or reuse) the memory-mapped store under ``cache_dir/name``."""
    files = resolve(specs)
    fp = _fingerprint(files, data, targets)
    out = Path(cache_dir) / name
    if (out / STORE_META).is_file() and json.loads((out / STORE_META).read_text()).get("fingerprint") == fp:
        log.info("%s data: reusing prepared store %s", name, out)
        return RolloutStore(out)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    reader = RolloutReader(files, on_bad=data.on_bad, quarantine=tmp / "quarantine.jsonl")
    transform = reward_transform(targets)
    stats = StoreStats()
    t_sum = t_sq = t_n = 0.0
    bar = _progress(len(files), f"preparing {name} data", progress)
    last_file = None
    with pa.ipc.new_file(str(tmp / STORE_FILE), STORE_SCHEMA) as writer:
        for path, rows, batch in reader:
            if path != last_file:
                bar.update(1 if last_file is not None else 0)
                last_file = path
            batch, n_zero = _drop_zero_weight(batch)
            stats.zero_weight_rows += n_zero
            if batch.num_rows == 0:
                continue
            out_batch, (s, sq, n) = _with_targets(batch, rows, path, transform, targets)
            t_sum, t_sq, t_n = t_sum + s, t_sq + sq, t_n + n
            writer.write_batch(out_batch)
    bar.close()
    summary = reader.summary
    if summary.rows - stats.zero_weight_rows <= 0:
        raise_empty(name, files, summary)
    stats.files, stats.rows = summary.files, summary.rows - stats.zero_weight_rows
    stats.tokens, stats.policy_tokens = summary.tokens, summary.policy_tokens
    stats.bad_rows, stats.bad_files, stats.problems = summary.bad_rows, summary.bad_files, dict(summary.problems)
    stats.mean_target = t_sum / max(t_n, 1)
    stats.target_var = max(t_sq / max(t_n, 1) - stats.mean_target ** 2, 0.0)
    meta = {"format": STORE_FORMAT, "fingerprint": fp, "files": [str(f) for f in files],
            "targets": vars(targets), "stats": vars(stats)}
    (tmp / STORE_META).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return RolloutStore(out)


def raise_empty(name, files, summary) -> None:
    from .errors import UserError
    raise UserError(f"{name} data: no usable rollouts in {len(files)} file(s) "
                    f"({summary.bad_rows} bad rows, {summary.bad_files} bad files); "
                    "run `critic-pretrain rollouts check` on it")


def _drop_zero_weight(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, int]:
    if "sample_weight" not in batch.schema.names:
        return batch, 0
    w = pc.fill_null(batch.column("sample_weight"), 1.0)
    keep = pc.greater(w, 0.0)
    n_zero = batch.num_rows - pc.sum(keep).as_py()
    return (batch.filter(keep) if n_zero else batch), n_zero


def _padded(arr: pa.Array, lengths: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """list array -> right-padded [B, T] tensor (T = longest row)."""
    flat = torch.from_numpy(pc.list_flatten(arr).to_numpy(zero_copy_only=False).copy())
    out = torch.zeros(len(lengths), int(lengths.max()), dtype=dtype)
    rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.from_numpy(lengths))
    cols = torch.arange(len(flat)) - torch.repeat_interleave(torch.from_numpy(np.cumsum(lengths) - lengths),
                                                             torch.from_numpy(lengths))
    out[rows, cols] = flat.to(dtype)
    return out


def _with_targets(batch: pa.RecordBatch, rows: np.ndarray, path: Path, transform: RewardTransform,
                  targets: TargetsConfig) -> tuple[pa.RecordBatch, tuple[float, float, float]]:
    """Compute value targets for a validated batch; return the store columns."""
    names = batch.schema.names
    n = batch.num_rows
    ids = batch.column("input_ids")
    lengths = pc.list_value_length(ids).to_numpy().astype(np.int64)
    mask = _padded(batch.column("loss_mask"), lengths, torch.float32)                   # [B, T]
    reward = None
    if "reward" in names:
        reward = torch.tensor(pc.fill_null(batch.column("reward"), 0.0).to_numpy(zero_copy_only=False), dtype=torch.float32)
    token_rewards = _optional_padded(batch, "token_rewards", lengths)
    values = _optional_padded(batch, "values", lengths) if targets.values_from == "data" else None
    if targets.values_from == "data" and values is None:
        from .errors import UserError
        raise UserError(f"{path}: targets.values_from=data but the rollouts have no 'values' column; "
                        "use rollouts with the collecting critic's values, or targets.lam=1.0")
    ret = build_targets(reward, token_rewards, mask, gamma=targets.gamma, lam=targets.lam,
                        transform=transform, values=values)                             # [B, T]
    valid = mask.bool()
    stats = (float(ret[valid].sum()), float(ret[valid].square().sum()), float(valid.sum()))
    ret_flat = ret[torch.arange(ret.shape[1])[None, :] < torch.from_numpy(lengths)[:, None]]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    weight = (pc.fill_null(batch.column("sample_weight"), 1.0).cast(pa.float32()) if "sample_weight" in names
              else pa.array(np.ones(n, np.float32)))
    key_src = ("group_id" if "group_id" in names and batch.column("group_id").null_count == 0 else
               "sample_id" if "sample_id" in names and batch.column("sample_id").null_count == 0 else None)
    keys = (batch.column(key_src).cast(pa.string()) if key_src else
            pa.array([f"{path}:{r}" for r in rows], pa.string()))
    null_list = pa.nulls(n, pa.list_(pa.float32()))
    cols = {
        "input_ids": ids, "loss_mask": batch.column("loss_mask"),
        "returns": pa.ListArray.from_arrays(offsets, pa.array(ret_flat.numpy(), pa.float32())),
        "weight": weight, "split_key": keys,
        "oracle_values": batch.column("oracle_values") if "oracle_values" in names else null_list,
        "values": batch.column("values") if "values" in names else null_list,
    }
    return pa.RecordBatch.from_arrays([cols[f.name] for f in STORE_SCHEMA], schema=STORE_SCHEMA), stats


def _optional_padded(batch: pa.RecordBatch, name: str, lengths: np.ndarray) -> torch.Tensor | None:
    if name not in batch.schema.names or batch.column(name).null_count == batch.num_rows:
        return None
    col = batch.column(name)
    if col.null_count:  # rows without the list get zeros
        col = pc.if_else(col.is_null(), pa.array([[0.0] * int(l) for l in lengths], col.type), col)
    return _padded(col, lengths, torch.float32)


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="file", leave=False)


# ---------------------------------------------------------------------------------------------
# Split

def split_by_group(keys: list[str], val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, val indices). A key's side depends only on the key (stable hash), so
    adding sources never moves existing rollouts across the split."""
    if val_fraction <= 0:
        return np.arange(len(keys)), np.zeros(0, np.int64)
    threshold = int(val_fraction * 2**32)
    is_val = np.fromiter((int.from_bytes(hashlib.blake2b(k.encode(), digest_size=4).digest(), "little") < threshold
                          for k in keys), dtype=bool, count=len(keys))
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


# ---------------------------------------------------------------------------------------------
# Packing and sharding

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


def effective_lengths(store: RolloutStore, indices: np.ndarray, data: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """(indices kept, their lengths after `overlong` handling)."""
    max_len = data.max_length or data.max_tokens
    lens = store.lengths[indices]
    if data.overlong == "skip":
        keep = lens <= max_len
        return indices[keep], lens[keep]
    return indices, np.minimum(lens, max_len)


def plan_epoch(indices: np.ndarray, lengths: np.ndarray, *, seed: int, epoch: int, data: DataConfig,
               layout: Layout) -> list[np.ndarray]:
    """The epoch's micro-batches in global order, trimmed to whole optimizer steps.

    ``lengths[i]`` is the effective length of row ``indices[i]``.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(len(indices)) if data.shuffle else np.arange(len(indices))
    batches = pack(lengths[perm], data.max_tokens)
    full = len(batches) // layout.per_step * layout.per_step
    return [indices[perm[b]] for b in batches[:full]]


def step_batches(plan: list[np.ndarray], step_in_epoch: int, layout: Layout) -> list[np.ndarray]:
    """This rank's micro-batches for one optimizer step: global order a*world + rank."""
    base = step_in_epoch * layout.per_step
    return [plan[base + a * layout.world + layout.rank] for a in range(layout.grad_accum)]


# ---------------------------------------------------------------------------------------------
# Collation

def collate_packed(store: RolloutStore, rows: np.ndarray, max_length: int, *, extra: bool = False) -> dict:
    """One micro-batch as a single packed row.

    Returns ``input_ids``/``position_ids`` [1, N] int64, ``targets`` [1, N] f32,
    ``weights`` [1, N] f32 (loss_mask * sample_weight, 0 elsewhere), ``seq_lens`` [k] int32,
    ``valid_tokens`` (python int: tokens with weight > 0) and, with ``extra``,
    ``oracle`` / ``old_values`` [1, N] (NaN where unknown) for evaluation.
    """
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
    weight = np.repeat(t.column("weight").to_numpy(zero_copy_only=False).astype(np.float32), lens)
    weights = flat("loss_mask", np.float32) * weight
    batch = {
        "input_ids": torch.from_numpy(flat("input_ids", np.int64))[None],
        "position_ids": torch.from_numpy(position_ids)[None],
        "targets": torch.from_numpy(flat("returns", np.float32))[None],
        "weights": torch.from_numpy(weights)[None],
        "seq_lens": torch.from_numpy(lens.astype(np.int32)),
        "valid_tokens": int((weights > 0).sum()),
        "num_rows": len(rows),
    }
    if extra:
        for key, name in (("oracle", "oracle_values"), ("old_values", "values")):
            col = t.column(name)
            if col.null_count == len(col):
                continue
            vals = np.full(n, np.nan, np.float32)
            present = ~col.is_null().to_numpy(zero_copy_only=False)
            where = np.repeat(present, lens)
            vals[where] = pc.list_flatten(col.filter(pa.array(present))).to_numpy(zero_copy_only=False)
            batch[key] = torch.from_numpy(vals)[None]
    return batch


HOST_KEYS = ("seq_lens",)
"""Batch entries that stay on the host (rollout boundaries: read by Python, no device sync)."""


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) and k not in HOST_KEYS else v)
            for k, v in batch.items()}


class MicroBatches(torch.utils.data.Dataset):
    """A list of micro-batches (row index arrays) as a map-style dataset of packed batches."""

    def __init__(self, store: RolloutStore, batches: list[np.ndarray], max_length: int, extra: bool = False):
        self.store, self.batches, self.max_length, self.extra = store, batches, max_length, extra

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return collate_packed(self.store, self.batches[i], self.max_length, extra=self.extra)


def loader(store: RolloutStore, batches: list[np.ndarray], max_length: int, *, num_workers: int = 0,
           pin_memory: bool = False, extra: bool = False) -> Iterator[dict]:
    """Iterate packed micro-batches in order; workers prefetch so the device does not wait."""
    ds = MicroBatches(store, batches, max_length, extra)
    return iter(torch.utils.data.DataLoader(
        ds, batch_size=None, shuffle=False, num_workers=num_workers, pin_memory=pin_memory,
        prefetch_factor=4 if num_workers else None, persistent_workers=False))


# ---------------------------------------------------------------------------------------------
# Everything a training run needs from the data

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
    overlong: int
    """Rollouts longer than max_length (truncated or skipped)."""

    def describe(self) -> str:
        st = self.train.stats
        return (f"{len(self.train_idx)} training rollouts ({len(self.val_idx)} for validation), {st.tokens} tokens, "
                f"{st.policy_tokens} policy tokens; left out: {st.bad_rows} bad rows, {st.bad_files} bad files, "
                f"{st.zero_weight_rows} zero-weight rows; {self.overlong} longer than max_length={self.max_length}")


def build_train_data(data: DataConfig, targets: TargetsConfig, cache_dir: Path, *, main_first, progress: bool,
                     ) -> TrainData:
    """Prepare (or reuse) the stores and split them. ``main_first`` is a context manager that
    lets rank 0 build the stores before the other ranks read them."""
    with main_first():
        train = prepare_store(data.train, cache_dir, data, targets, name="train", progress=progress)
        val = prepare_store(data.val, cache_dir, data, targets, name="val") if data.val else train
    if data.val:
        train_idx, val_idx = np.arange(len(train)), np.arange(len(val))
    else:
        train_idx, val_idx = split_by_group(train.split_keys(), data.val_fraction)
    max_length = data.max_length or data.max_tokens
    overlong = int((train.lengths[train_idx] > max_length).sum())
    train_idx, train_len = effective_lengths(train, train_idx, data)
    return TrainData(train, val, train_idx, train_len, val_idx, max_length, overlong)
