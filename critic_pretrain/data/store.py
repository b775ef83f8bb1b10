"""The rollout store: a validated, memory-mapped Arrow file of the rollouts with their value
targets, prepared once per input set (``prepare_store``) and reused while the inputs are unchanged."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from rollouts import RolloutReader, fileio
from rollouts.errors import Quarantine
from rollouts.fileio import file_checksum
from rollouts.paths import file_fingerprint, resolve

from ..config import DataConfig, SourceConfig, TargetsConfig
from ..errors import UserError, environment_error
from ..targets import RewardTransform, compute_returns, critic_lambda, token_level_rewards

log = logging.getLogger(__name__)



STORE_FORMAT = 6  # 6: meta.json holds the store file's xxh3-128 checksum
STORE_FILE = "rollouts.arrow"
STORE_META = "meta.json"
# Columns of the store. `returns` are the value targets; `rewards` the transformed per-token
# rewards they were built from (outcome placed on the last policy token), `outcome` the
# rollout's discounted return from its first policy token (what GRPO's group baseline
# compares); `weight` = sample_weight; `oracle_values` are in target units (transformed).
STORE_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("returns", pa.list_(pa.float32())),
    ("rewards", pa.list_(pa.float32())),
    ("outcome", pa.float32()),
    ("weight", pa.float32()),
    ("split_key", pa.string()),
    ("oracle_values", pa.list_(pa.float32())),
    ("values", pa.list_(pa.float32())),
    ("source", pa.int16()),
    ("policy_version", pa.int64()),
])


def reward_transform(t: TargetsConfig) -> RewardTransform:
    clip = t.reward_clip or [None, None]
    return RewardTransform(scale=t.reward_scale, shift=t.reward_shift, clip_min=clip[0], clip_max=clip[1])


@dataclass
class StoreStats:
    """What preparing the store read, kept and left out (written to meta.json and manifests)."""

    files: int = 0
    rows: int = 0
    """Rollouts in the store."""
    tokens: int = 0
    policy_tokens: int = 0
    bad_rows: int = 0
    bad_files: int = 0
    duplicates: int = 0
    """Rollouts dropped as repeats of an earlier sample_id (across sources)."""
    zero_weight_rows: int = 0
    filtered: dict = field(default_factory=dict)
    """Rollouts left out by source filters, by filter."""
    problems: dict = field(default_factory=dict)
    """Bad rows and files by kind (see the quarantine report for each one)."""
    sources: dict = field(default_factory=dict)
    """Rollouts kept per source name."""
    mean_target: float = 0.0
    target_var: float = 0.0
    reward_min: float | None = None
    """Smallest rollout reward (outcome plus token rewards) as the archive holds it, before
    the targets' reward transform; ``seed check`` compares the range with the PPO run's."""
    reward_max: float | None = None

    def bad_fraction(self) -> float:
        """Share of bad rows among rows read, or of bad files among files, whichever is larger."""
        rows_read = self.rows + self.bad_rows + self.duplicates + self.zero_weight_rows + sum(self.filtered.values())
        return max(self.bad_rows / max(rows_read, 1), self.bad_files / max(self.files, 1))


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
        self.source = self.table.column("source").to_numpy().astype(np.int64)
        if not hasattr(self, "row_scale"):
            self.row_scale: np.ndarray | None = None
            """[rows] float32 factor on each rollout's weight (``set_recency``), or None."""

    def __getstate__(self):
        return {"path": self.path, "meta": self.meta, "stats": self.stats, "row_scale": self.row_scale}

    def set_recency(self, half_life: float, newest: float | None = None) -> dict:
        """Weigh each rollout ``0.5 ** (age / half_life)`` by its policy version's age behind
        ``newest`` (default: the newest in this store); returns what was applied (for the log)."""

        version = pc.fill_null(self.table.column("policy_version").cast(pa.float64()), np.nan).to_numpy()
        if np.isnan(version).all():
            raise UserError(f"data.recency_half_life={half_life:g} needs a policy_version column in the rollouts "
                            f"({self.path.name} data has none); add it, or set data.recency_half_life=null")
        newest = np.nanmax(version) if newest is None else newest
        oldest = np.nanmin(version)
        age = np.maximum(np.where(np.isnan(version), newest - oldest, newest - version), 0.0)
        self.row_scale = (0.5 ** (age / half_life)).astype(np.float32)
        return {"newest": int(newest), "oldest": int(oldest), "oldest_weight": float(self.row_scale.min()),
                "without_version": int(np.isnan(version).sum())}

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

    @property
    def files(self) -> list[dict]:
        """The data manifest: one entry per file (path, size, mtime_ns, fingerprint, source, rows)."""
        return self.meta["files"]

    def split_keys(self) -> list[str]:
        return self.table.column("split_key").to_pylist()

    def split_keys_of(self, rows: np.ndarray) -> list[str]:
        return self.table.column("split_key").take(np.asarray(rows, np.int64)).to_pylist()

    def row_hashes(self, prompt_only: bool = False) -> np.ndarray:
        """[rows] uint64 xxh3 of each rollout's token ids (``prompt_only``: of the tokens before
        its first policy token, the prompt the policy answered). Identical token sequences hash
        alike whatever their sample_id: the response split (``split_by_response``) and a
        checkpoint's record of its training prompts (``data.prompts``) rest on it."""
        import xxhash
        out, row = np.empty(len(self), np.uint64), 0
        ids_chunks, mask_chunks = self.table.column("input_ids").chunks, self.table.column("loss_mask").chunks
        for ids, mask in zip(ids_chunks, mask_chunks):
            offsets = ids.offsets.to_numpy().astype(np.int64)
            offsets = offsets - offsets[0]                            # a sliced chunk's offsets start above 0
            flat = pc.list_flatten(ids).to_numpy().astype(np.int32, copy=False)
            ends = offsets[1:]
            if prompt_only:
                policy = pc.list_flatten(mask).to_numpy().astype(bool)
                for i in range(len(ids)):
                    hits = np.flatnonzero(policy[offsets[i]:ends[i]])
                    ends_i = offsets[i] + (hits[0] if len(hits) else ends[i] - offsets[i])
                    out[row + i] = xxhash.xxh3_64_intdigest(flat[offsets[i]:ends_i].tobytes())
            else:
                for i in range(len(ids)):
                    out[row + i] = xxhash.xxh3_64_intdigest(flat[offsets[i]:ends[i]].tobytes())
            row += len(ids)
        return out

    def policy_tokens(self, max_len: int) -> np.ndarray:
        """[rows] policy tokens among each rollout's first ``max_len`` tokens: what training sees
        after truncation. One pass over the loss masks, a record batch at a time."""
        out, row = np.empty(len(self), np.int64), 0
        for chunk in self.table.column("loss_mask").chunks:
            lens = pc.list_value_length(chunk).to_numpy().astype(np.int64)
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            csum = np.concatenate([[0], np.cumsum(pc.list_flatten(chunk).to_numpy(), dtype=np.int64)])
            out[row:row + len(chunk)] = csum[starts + np.minimum(lens, max_len)] - csum[starts]
            row += len(chunk)
        return out


def _cache_key(manifest: list[dict], sources: list[SourceConfig], data: DataConfig,
               targets: TargetsConfig, vocab_size: int | None) -> str:
    """What the store is built from: settings and each file's path, size, mtime and sampled content
    fingerprint (``file_manifest``: the one the resume check compares; with `data.allow_changes` a
    shard edited in place, size and mtime kept, was announced as new data and read from the old store)."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": STORE_FORMAT, "on_bad": data.on_bad, "targets": vars(targets),
                         "sources": [vars(s) for s in sources], "vocab_size": vocab_size}, sort_keys=True).encode())
    for e in manifest:
        h.update(f"{e['source']}\0{e['path']}\0{e['size']}\0{e['mtime_ns']}\0{e['fingerprint']}\n".encode())
    return h.hexdigest()[:16]


def source_files(sources: list[SourceConfig]) -> list[tuple[int, Path]]:
    """(source index, file) for every file of every source; a file listed by two sources is
    read once, for the first."""
    out, seen = [], set()
    for i, src in enumerate(sources):
        for f in resolve(src.paths):
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append((i, f))
    return out


def file_manifest(files: list[tuple[int, Path]]) -> list[dict]:
    """Path, size, mtime and content fingerprint of each file (cheap: the parquet footer)."""
    out = []
    for i, f in files:
        st = f.stat()
        out.append({"path": str(f.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "fingerprint": file_fingerprint(f), "source": i})
    return out


def prepare_store(sources: list[SourceConfig] | list[str], cache_dir: str | os.PathLike, data: DataConfig,
                  targets: TargetsConfig, *, name: str = "train", progress: bool = False,
                  vocab_size: int | None = None) -> RolloutStore:
    """Validate, filter and de-duplicate ``sources`` (``SourceConfig``s, or plain path specs
    as one unfiltered source), compute targets, and build (or reuse) the memory-mapped store
    under ``cache_dir/name``. ``vocab_size``: token ids at or above it are bad rows (an
    embedding lookup past the table would fail mid-training, on a GPU as a device assert)."""
    if sources and not isinstance(sources[0], SourceConfig):
        sources = [SourceConfig(paths=[str(p) for p in sources], name=name)]
    files = source_files(sources)
    manifest = file_manifest(files)  # one fingerprint pass: the cache key and the store's file list
    key = _cache_key(manifest, sources, data, targets, vocab_size)
    out = Path(cache_dir) / name
    if _reusable(out, key, name):
        return RolloutStore(out)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        return _build_store(sources, files, manifest, key, data, targets, name, progress, vocab_size, tmp, out)
    except OSError as e:
        if environment_error(e) is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"{name} data: writing the prepared store {out} failed ({e.strerror or e}); free space there "
                        "or point data.cache_dir at a disk with room, then re-run the same command") from None


def _reusable(out: Path, key: str, name: str) -> bool:
    """The prepared store at ``out`` was built from these files and settings (``key``) and holds
    what was written (its xxh3-128 checksum; before, a store changed after it was written trained
    silently on what it then held). Costs one read of the store: logged."""
    meta = fileio.read_json(out / STORE_META)
    if not meta or meta.get("fingerprint") != key:
        return False
    t = time.perf_counter()
    if meta.get("checksum") != file_checksum(out / STORE_FILE):
        log.warning("%s data: the prepared store %s changed after it was written (its checksum differs); preparing "
                    "it again from the rollouts", name, out)
        return False
    log.info("%s data: reusing prepared store %s (%.0f MB, checksum verified in %.1f s)", name, out,
             (out / STORE_FILE).stat().st_size / 1e6, time.perf_counter() - t)
    return True


def _build_store(sources, files, manifest, key, data, targets, name, progress, vocab_size, tmp: Path,
                 out: Path) -> RolloutStore:
    transform = reward_transform(targets)
    stats = StoreStats(filtered=dict.fromkeys(FILTERS, 0))
    sums = np.zeros(3)  # Σ target, Σ target², count over policy tokens
    seen_ids: set[str] = set()  # de-duplication across files and sources
    bar = _progress(len(files), f"preparing {name} data", progress)
    with pa.ipc.new_file(str(tmp / STORE_FILE), STORE_SCHEMA) as writer, \
            Quarantine(tmp / "quarantine.jsonl") as quarantine:
        for entry, (i, f) in zip(manifest, files):
            src = sources[i]
            reader = RolloutReader([f], on_bad=data.on_bad, duplicates="drop", seen_ids=seen_ids,
                                   vocab_size=vocab_size, need_values=targets.values_from == "data")
            kept = 0
            for path, rows, batch in reader:
                batch, rows = _apply_filters(batch, rows, src, stats)
                if batch.num_rows:
                    _add_reward_range(stats, batch)
                    stats.tokens += int(pc.sum(pc.list_value_length(batch.column("input_ids"))).as_py())
                    stats.policy_tokens += int(pc.sum(pc.list_flatten(batch.column("loss_mask"))).as_py())
                    out_batch, target_sums = _with_targets(batch, rows, path, transform, targets, source=i)
                    sums += target_sums
                    writer.write_batch(out_batch)
                    kept += batch.num_rows
            for p in reader.problems:
                quarantine.add(p)
            _add_summary(stats, reader.summary)
            entry.update(rows=kept, bad_rows=reader.summary.bad_rows, bad=reader.summary.bad_files > 0)
            label = src.name or src.paths[0]
            stats.sources[label] = stats.sources.get(label, 0) + kept
            stats.rows += kept
            bar.update(1)
    bar.close()
    if stats.rows == 0:
        raise_empty(name, len(files), stats)
    stats.mean_target = sums[0] / max(sums[2], 1)
    stats.target_var = max(sums[1] / max(sums[2], 1) - stats.mean_target ** 2, 0.0)
    meta = {"format": STORE_FORMAT, "fingerprint": key, "files": manifest, "targets": vars(targets),
            "sources": [vars(s) for s in sources], "stats": vars(stats), "checksum": file_checksum(tmp / STORE_FILE)}
    fileio.write_json(tmp / STORE_META, meta)
    fileio.replace_dir(tmp, out)
    return RolloutStore(out)


def _add_reward_range(stats: StoreStats, batch: pa.RecordBatch) -> None:
    """Widen ``stats``' reward range by the batch's rollout rewards (outcome + token rewards)."""
    names = batch.schema.names
    total = (pc.fill_null(batch.column("reward"), 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
             if "reward" in names else np.zeros(batch.num_rows))
    if "token_rewards" in names:
        col = batch.column("token_rewards")
        lens = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        lens = np.nan_to_num(lens.astype(np.float64)).astype(np.int64)  # a null list: no token rewards
        flat = pc.fill_null(pc.list_flatten(col), 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        total += np.add.reduceat(np.concatenate([flat, [0.0]]),
                                 np.concatenate([[0], np.cumsum(lens)[:-1]])) * (lens > 0)
    lo, hi = float(total.min()), float(total.max())
    stats.reward_min = lo if stats.reward_min is None else min(stats.reward_min, lo)
    stats.reward_max = hi if stats.reward_max is None else max(stats.reward_max, hi)


def _add_summary(stats: StoreStats, summary) -> None:
    stats.files += summary.files
    stats.bad_files += summary.bad_files
    stats.bad_rows += summary.bad_rows
    stats.duplicates += summary.duplicates
    for k, v in summary.problems.items():
        stats.problems[k] = stats.problems.get(k, 0) + v


def check_bad_fraction(stats: StoreStats, limit: float, name: str, quarantine: Path) -> None:
    """Stop instead of silently training on a sliver of the archive."""
    if stats.bad_fraction() > limit:
        raise UserError(f"{name} data: {stats.bad_rows} bad rows and {stats.bad_files} bad files of {stats.files} "
                        f"({stats.bad_fraction():.1%} bad) is above data.max_bad_fraction={limit:g}; see {quarantine} "
                        "for each one, fix or remove them, or raise data.max_bad_fraction")


def raise_empty(name: str, n_files: int, stats: StoreStats) -> None:
    """No rollout left: say what removed them and point at that lever. `rollouts check` sees bad
    rows, not the sources' filters or sample weights."""
    filters = {k: n for k, n in stats.filtered.items() if n and k != "zero_weight"}
    counts = ", ".join([f"{stats.bad_rows} bad rows", f"{stats.bad_files} bad files",
                        *(f"{n} by filter {k}" for k, n in filters.items()),
                        f"{stats.zero_weight_rows} with sample_weight 0"]
                       + ([f"{stats.duplicates} repeated sample_ids"] if stats.duplicates else []))
    if filters:
        keys = " and ".join(f"data.sources[].{k}" for k in filters)
        fix = f"loosen or remove {keys} (every rollout was filtered out)"
    elif stats.zero_weight_rows and not (stats.bad_rows or stats.bad_files):
        fix = "every rollout has sample_weight 0 (rows with weight 0 are dropped); give them a weight above 0"
    else:
        fix = "run `critic-pretrain rollouts check` on it"
    raise UserError(f"{name} data: no usable rollouts in {n_files} file(s) ({counts}); {fix}")


FILTERS = ("zero_weight", "policy_version", "reward", "min_policy_tokens", "max_length")


def _apply_filters(batch: pa.RecordBatch, rows: np.ndarray, src: SourceConfig,
                   stats: StoreStats) -> tuple[pa.RecordBatch, np.ndarray]:
    """Drop rows with sample_weight 0 and rows outside the source's filters; count each."""
    n = batch.num_rows
    names = batch.schema.names
    keep = np.ones(n, dtype=bool)

    def drop(mask: np.ndarray, reason: str) -> None:
        nonlocal keep
        hit = mask & keep
        stats.filtered[reason] = stats.filtered.get(reason, 0) + int(hit.sum())
        keep &= ~mask

    def column(name: str, fill) -> np.ndarray:
        if name not in names:
            return np.full(n, fill, dtype=float)
        return pc.fill_null(batch.column(name).cast(pa.float64()), fill).to_numpy(zero_copy_only=False)

    drop(column("sample_weight", 1.0) <= 0, "zero_weight")
    if src.policy_version is not None:
        v = column("policy_version", np.nan)
        drop(~((v >= src.policy_version[0]) & (v <= src.policy_version[1])), "policy_version")
    if src.reward is not None:
        r = column("reward", np.nan)
        drop(~((r >= src.reward[0]) & (r <= src.reward[1])), "reward")
    if src.min_policy_tokens > 1:
        mask = batch.column("loss_mask")
        policy = np.bincount(pc.list_parent_indices(mask).to_numpy(), weights=pc.list_flatten(mask).to_numpy(),
                             minlength=n)
        drop(policy < src.min_policy_tokens, "min_policy_tokens")
    if src.max_length is not None:
        drop(pc.list_value_length(batch.column("input_ids")).to_numpy() > src.max_length, "max_length")
    stats.zero_weight_rows = stats.filtered.get("zero_weight", 0)
    if keep.all():
        return batch, rows
    return batch.filter(pa.array(keep)), rows[keep]


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
                  targets: TargetsConfig, source: int = 0) -> tuple[pa.RecordBatch, np.ndarray]:
    """Compute value targets for a validated batch; return the store columns."""
    names = batch.schema.names
    n = batch.num_rows
    ids = batch.column("input_ids")
    lengths = pc.list_value_length(ids).to_numpy().astype(np.int64)
    mask = _padded(batch.column("loss_mask"), lengths, torch.float32)                   # [B, T]
    reward = None
    if "reward" in names:
        reward = torch.tensor(pc.fill_null(batch.column("reward"), 0.0).to_numpy(zero_copy_only=False),
                              dtype=torch.float32)
    token_rewards = _optional_padded(batch, "token_rewards", lengths)
    values = _optional_padded(batch, "values", lengths) if targets.values_from == "data" else None
    if targets.values_from == "data" and values is None:
        raise UserError(f"{path}: targets.values_from=data but the rollouts have no 'values' column; "
                        "use rollouts with the collecting critic's values, or targets.lam=1.0")
    rewards = token_level_rewards(reward, token_rewards, mask, transform)              # [B, T]
    # values_from=critic bootstraps from the critic during training; the store keeps Monte-Carlo returns.
    lam = 1.0 if targets.values_from == "critic" else critic_lambda(mask, targets.lam, targets.lam_alpha)
    ret = compute_returns(rewards, mask, gamma=targets.gamma, lam=lam, values=values)  # [B, T]
    mc = (ret if isinstance(lam, float) and lam == 1.0 and values is None else
          compute_returns(rewards, mask, gamma=targets.gamma, lam=1.0))
    valid = mask.bool()
    outcome = mc.gather(1, valid.long().argmax(1, keepdim=True))[:, 0]                 # [B] at 1st policy token
    sums = np.array([float(ret[valid].sum()), float(ret[valid].square().sum()), float(valid.sum())])
    in_row = torch.arange(ret.shape[1])[None, :] < torch.from_numpy(lengths)[:, None]  # [B, T]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    def as_list(x: torch.Tensor) -> pa.ListArray:
        return pa.ListArray.from_arrays(offsets, pa.array(x[in_row].numpy(), pa.float32()))
    weight = (pc.fill_null(batch.column("sample_weight"), 1.0).cast(pa.float32()) if "sample_weight" in names
              else pa.array(np.ones(n, np.float32)))
    key_src = ("group_id" if "group_id" in names and batch.column("group_id").null_count == 0 else
               "sample_id" if "sample_id" in names and batch.column("sample_id").null_count == 0 else None)
    keys = (batch.column(key_src).cast(pa.string()) if key_src else
            pa.array([f"{path}:{r}" for r in rows], pa.string()))
    null_list = pa.nulls(n, pa.list_(pa.float32()))
    has_oracle = "oracle_values" in names and batch.column("oracle_values").null_count < n
    cols = {
        "input_ids": ids, "loss_mask": batch.column("loss_mask"),
        "returns": as_list(ret), "rewards": as_list(rewards), "outcome": pa.array(outcome.numpy(), pa.float32()),
        "weight": weight, "split_key": keys,
        "oracle_values": _oracle_in_target_units(batch, lengths, valid, transform, as_list) if has_oracle
                         else null_list,
        "values": batch.column("values") if "values" in names else null_list,
        "source": pa.array(np.full(n, source, np.int16)),
        "policy_version": (batch.column("policy_version").cast(pa.int64()) if "policy_version" in names
                           else pa.nulls(n, pa.int64())),
    }
    return pa.RecordBatch.from_arrays([cols[f.name] for f in STORE_SCHEMA], schema=STORE_SCHEMA), sums


def _oracle_in_target_units(batch: pa.RecordBatch, lengths: np.ndarray, valid: torch.Tensor,
                            transform: RewardTransform, as_list) -> pa.Array:
    """The true values mapped like the rewards: ``scale * V + shift`` up to the outcome's
    position (the value still contains the outcome there), ``scale * V`` after it. A clipped
    outcome has no such map, so the oracle is dropped (metrics against it would be wrong).
    Only a non-identity map pads the column into a tensor."""
    column = batch.column("oracle_values")
    if transform.clip_min is not None or transform.clip_max is not None:
        _warn_once("targets.reward_clip is set: oracle_values cannot be mapped to clipped reward units; "
                   "oracle metrics are left out")
        return pa.nulls(len(column), pa.list_(pa.float32()))
    if transform.scale == 1.0 and transform.shift == 0.0:
        return column.cast(pa.list_(pa.float32()))
    oracle = _optional_padded(batch, "oracle_values", lengths)                          # [B, T]
    positions = torch.arange(1, valid.shape[1] + 1)
    before_outcome = positions[None, :] <= (valid * positions).amax(1, keepdim=True)  # [B, T]
    mapped = as_list(oracle * transform.scale + transform.shift * before_outcome)
    return pc.if_else(column.is_null(), pa.nulls(len(column), mapped.type), mapped)


@functools.cache
def _warn_once(msg: str) -> None:
    log.warning(msg)


def _optional_padded(batch: pa.RecordBatch, name: str, lengths: np.ndarray) -> torch.Tensor | None:
    if name not in batch.schema.names or batch.column(name).null_count == batch.num_rows:
        return None
    col = batch.column(name)
    if col.null_count:  # rows without the list get zeros
        col = pc.if_else(col.is_null(), pa.array([[0.0] * int(l) for l in lengths], col.type), col)
    return _padded(col, lengths, torch.float32)


def _progress(total: int, desc: str, enabled: bool):
    import sys

    from tqdm.auto import tqdm
    # Without a terminal a bar is a carriage-return redraw per file in the log: leave it out.
    return tqdm(total=total, desc=desc, unit="file", leave=False, disable=not (enabled and sys.stderr.isatty()))
