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

Modules: ``store`` (prepare, filters, the memory-mapped store), ``sampling`` (split, packing,
epoch plan, sharding), ``collate`` (the packed micro-batch, the loader), ``train_data`` (what a
training run gets). The names below are the package's API.
"""

from .collate import MicroBatches, collate_packed, loader
from .sampling import (
    Layout,
    accum_for_rollouts,
    cut_length,
    effective_lengths,
    log_schedule,
    max_length_of,
    pack,
    plan_epoch,
    rank_micro_batches,
    split_by_group,
    split_by_response,
    step_batches,
    weighted_rows,
)
from .store import (
    FILTERS,
    STORE_FILE,
    STORE_FORMAT,
    STORE_META,
    STORE_SCHEMA,
    RolloutStore,
    StoreStats,
    check_bad_fraction,
    file_manifest,
    prepare_store,
    reward_transform,
    source_files,
)
from .train_data import MIN_POLICY_SHARE, REGIMES, TrainData, ValSet, build_train_data, with_policy_left

__all__ = ["FILTERS", "MIN_POLICY_SHARE", "REGIMES", "STORE_FILE", "STORE_FORMAT", "STORE_META", "STORE_SCHEMA",
           "accum_for_rollouts", "build_train_data", "check_bad_fraction", "collate_packed", "cut_length",
           "effective_lengths", "file_manifest", "Layout", "loader", "log_schedule", "max_length_of", "MicroBatches",
           "pack", "plan_epoch", "prepare_store", "rank_micro_batches", "reward_transform", "RolloutStore",
           "source_files", "split_by_group", "split_by_response", "step_batches", "StoreStats", "TrainData",
           "ValSet", "weighted_rows", "with_policy_left"]
