"""Validation of rollout tables, vectorised over Arrow record batches.

``check_schema`` looks at a file's schema once; ``check_batch`` checks every row of a
record batch with pyarrow/numpy kernels (no Python loop over rows) and returns the rows
that passed, cast to the canonical schema, plus one ``Problem`` per bad row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import schema as S
from .errors import Problem

INT32_MAX = np.iinfo(np.int32).max


def check_schema(file: str, sch: pa.Schema) -> list[Problem]:
    """File-level problems: missing required columns, no reward column, wrong types."""
    names = set(sch.names)
    problems = []
    for name in S.REQUIRED:
        if name not in names:
            problems.append(Problem(file, None, name, "missing required column",
                                    f"add '{name}' ({S.expected_kind(name)}), or convert the file with "
                                    "`critic-pretrain rollouts convert --from generic --map COLUMN=FIELD`",
                                    kind="missing_column"))
    if not names & set(S.REWARD_COLUMNS):
        problems.append(Problem(file, None, "reward", "no reward column",
                                "add 'reward' (outcome, one number per row) and/or 'token_rewards' "
                                "(one number per token)", kind="missing_column"))
    for f in sch:
        if f.name in S.BY_NAME and not S.accepts(f.name, f.type):
            problems.append(Problem(file, None, f.name, f"wrong type {f.type}",
                                    f"'{f.name}' must be {S.expected_kind(f.name)}; fix the writer "
                                    "or convert with `critic-pretrain rollouts convert`", kind="wrong_type"))
    return problems


@dataclass
class BatchResult:
    batch: pa.RecordBatch
    """Rows that passed, canonical types, extra columns kept."""
    rows: np.ndarray
    """Row index within the file of each kept row."""
    problems: list[Problem]
    lengths: np.ndarray
    """Token count of each kept row."""
    policy_tokens: np.ndarray
    total_reward: np.ndarray
    """Outcome reward plus the sum of per-token rewards, per kept row."""
    turns: np.ndarray
    """Number of contiguous policy segments, per kept row."""
    duplicates: int = 0
    """Rows left out as repeats of an earlier sample_id (``duplicates="drop"``)."""


class _Flags:
    """First problem per row, in the order checks run."""

    def __init__(self, n: int):
        self.reason = np.full(n, -1, dtype=np.int32)
        self.msgs: list[tuple[str | None, str, str, str]] = []

    def add(self, bad: np.ndarray, column: str | None, reason: str, fix: str, kind: str) -> None:
        bad = np.asarray(bad, dtype=bool) & (self.reason < 0)
        if bad.any():
            self.reason[bad] = len(self.msgs)
            self.msgs.append((column, reason, fix, kind))


def _list_parts(arr: pa.Array):
    """(lengths with nulls as -1, flat values as numpy, parent row of each flat value, has inner nulls per row)."""
    n = len(arr)
    lengths = pc.fill_null(pc.list_value_length(arr), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(arr)
    parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    inner_null = np.zeros(n, dtype=bool)
    if flat.null_count:
        inner_null = np.bincount(parents[flat.is_null().to_numpy(zero_copy_only=False)], minlength=n) > 0
        flat = pc.fill_null(flat, 0)
    if pa.types.is_boolean(flat.type):
        flat = flat.cast(pa.int8())
    return lengths, flat.to_numpy(zero_copy_only=False), parents, inner_null


def _row_any(flat_bad: np.ndarray, parents: np.ndarray, n: int) -> np.ndarray:
    if not flat_bad.any():
        return np.zeros(n, dtype=bool)
    return np.bincount(parents[flat_bad], minlength=n) > 0


def check_batch(file: str, batch: pa.RecordBatch, row_offset: int,
                seen_ids: set[str] | None = None, duplicates: str = "error", *,
                vocab_size: int | None = None, need_values: bool = False) -> BatchResult:
    """Validate every row of ``batch`` (rows ``row_offset...`` of ``file``).

    ``seen_ids`` carries sample ids across batches and files to catch duplicates; ids of
    kept rows are added to it. A repeated id is a problem (``duplicates="error"``) or is
    dropped and only counted (``"drop"``: de-duplication across sources). ``vocab_size``:
    token ids must be below it (the model's embedding size). ``need_values``: every row
    must carry the collecting critic's ``values`` (bootstrap targets with lambda < 1).

    One check per column, in this order (a row reports its first problem): tokens, mask,
    rewards, per-token floats, sample weight, sample ids.
    """
    n = batch.num_rows
    names = set(batch.schema.names)
    flags = _Flags(n)
    lengths = _check_tokens(flags, batch.column("input_ids"), n, vocab_size)
    mlen, mask, mask_parents, policy = _check_mask(flags, batch.column("loss_mask"), lengths, n)
    reward = _check_rewards(flags, batch, names, lengths, n)
    for name in ("values", "oracle_values"):
        if _present(batch, names, name):
            _check_floats(flags, batch.column(name), name, lengths, n)
    if need_values and _present(batch, names, "values"):
        flags.add(batch.column("values").is_null().to_numpy(zero_copy_only=False), "values",
                  "no values for this row, and lambda < 1 bootstraps from them",
                  "drop the row, write the collecting critic's values, or train with targets.lam=1.0", "null")
    if _present(batch, names, "sample_weight"):
        w = pc.fill_null(batch.column("sample_weight").cast(pa.float64()), 1.0).to_numpy(zero_copy_only=False)
        flags.add(~np.isfinite(w) | (w < 0), "sample_weight", "sample_weight is negative, NaN or infinite",
                  "use a finite weight >= 0 (0 drops the row from the loss)", "nan")
        _check_magnitude(flags, np.nan_to_num(w) > MAX_MAGNITUDE, "sample_weight", "sample_weight",
                         "weights are relative: scale them down (a unit or logging error?) or drop the row")
    sample_ids = (batch.column("sample_id").cast(pa.string()).to_pylist()
                  if _present(batch, names, "sample_id") else None)
    dropped = _check_ids(flags, sample_ids, seen_ids, duplicates, n)

    bad = flags.reason >= 0
    problems = []
    for i in np.flatnonzero(bad):
        column, reason, fix, kind = flags.msgs[flags.reason[i]]
        sid = sample_ids[i] if sample_ids is not None else None
        problems.append(Problem(file, int(row_offset + i), column, reason, fix, sid, kind))
    keep = ~bad & ~dropped
    if seen_ids is not None and sample_ids is not None:
        seen_ids.update(s for s, k in zip(sample_ids, keep) if k and s is not None)
    turns = _turns(mask, mask_parents, mlen, n)
    kept = batch.filter(pa.array(keep)) if not keep.all() else batch
    return BatchResult(batch=_canonicalize(kept), rows=np.flatnonzero(keep) + row_offset, problems=problems,
                       lengths=lengths[keep], policy_tokens=policy[keep], total_reward=reward[keep],
                       turns=turns[keep], duplicates=int(dropped.sum()))


def _present(batch: pa.RecordBatch, names: set[str], name: str) -> bool:
    return name in names and not pa.types.is_null(batch.column(name).type)


def _check_tokens(flags: _Flags, ids: pa.Array, n: int, vocab_size: int | None) -> np.ndarray:
    """Null, empty, negative, out-of-range and out-of-vocabulary token ids; returns the lengths."""
    lengths, tok, parents, inner_null = _list_parts(ids)
    flags.add(lengths < 0, "input_ids", "null token list", "write the token ids of the rollout", "null")
    flags.add(lengths == 0, "input_ids", "empty token list", "drop the row or write its tokens", "empty_row")
    flags.add(inner_null, "input_ids", "null inside the token list", "write integer token ids only", "null")
    flags.add(_row_any(tok < 0, parents, n), "input_ids", "negative token id",
              "token ids must be >= 0; check the tokenizer or the converter", "negative_token")
    flags.add(_row_any(tok > INT32_MAX, parents, n), "input_ids", "token id above int32 range",
              "token ids must be < 2**31; check the converter", "token_range")
    if vocab_size is not None:
        flags.add(_row_any((tok >= vocab_size) & (tok <= INT32_MAX), parents, n), "input_ids",
                  f"token id >= the model's vocab_size {vocab_size}",
                  "the rollouts were tokenized for a model with a larger vocabulary: train that model, or "
                  "re-tokenize the rollouts for this one",
                  "token_out_of_vocab")
    return lengths


def _check_mask(flags: _Flags, col: pa.Array, lengths: np.ndarray, n: int):
    """One 0/1 entry per token and at least one policy token; (lengths, flat mask, parents, policy tokens)."""
    mlen, mask, parents, inner_null = _list_parts(col)
    policy = np.zeros(n, dtype=np.int64)
    _check_len(flags, "loss_mask", mlen, lengths)
    flags.add(inner_null, "loss_mask", "null inside the mask", "write 0 or 1 for every token", "null")
    flags.add(_row_any((mask != 0) & (mask != 1), parents, n), "loss_mask", "values other than 0 and 1",
              "write 1 for policy tokens and 0 for prompt, tool and environment tokens", "bad_mask")
    if len(mask):
        policy = np.bincount(parents, weights=(mask == 1), minlength=n).astype(np.int64)
    flags.add(policy == 0, "loss_mask", "no policy token (loss_mask is all 0)",
              "there is nothing to learn from this row: drop it, or fix the mask", "no_policy_token")
    return mlen, mask, parents, policy


MAX_MAGNITUDE = 1e9
"""Largest |reward| (and |value|, and sample_weight) accepted: far beyond any reward scale PPO trains on, and far
below what float32 targets and squared errors can hold (1e20 squared overflows: the run crashed).
A larger one is a unit or logging error."""


def _check_magnitude(flags: _Flags, bad: np.ndarray, column: str, what: str,
                     fix: str = "rescale the rewards when converting (a unit or logging error?) or drop the row",
                     ) -> None:
    flags.add(bad, column, f"{what} beyond +-{MAX_MAGNITUDE:.0e}, too large for the critic's float32 targets and "
              "loss", fix, "nan")


def _check_rewards(flags: _Flags, batch: pa.RecordBatch, names: set[str], lengths: np.ndarray, n: int) -> np.ndarray:
    """A finite outcome reward or per-token rewards on every row; returns each row's total reward."""
    reward = np.zeros(n)
    has_reward = np.zeros(n, dtype=bool)
    if _present(batch, names, "reward"):
        col = batch.column("reward")
        r = pc.fill_null(col.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
        null = col.is_null().to_numpy(zero_copy_only=False)
        flags.add(~null & ~np.isfinite(r), "reward", "reward is NaN or infinite",
                  "fix the reward function or drop the row", "nan")
        _check_magnitude(flags, ~null & (np.abs(np.nan_to_num(r)) > MAX_MAGNITUDE), "reward", "reward")
        has_reward |= ~null
        reward = np.where(null, 0.0, r)
    if _present(batch, names, "token_rewards"):
        tlen, tr, parents, inner_null = _list_parts(batch.column("token_rewards"))
        present = tlen >= 0
        _check_len(flags, "token_rewards", np.where(present, tlen, lengths), lengths)
        flags.add(inner_null, "token_rewards", "null inside token_rewards", "write 0.0 where there is no reward",
                  "null")
        tr = tr.astype(np.float64)
        flags.add(_row_any(~np.isfinite(tr), parents, n), "token_rewards", "NaN or infinite token reward",
                  "fix the reward function or drop the row", "nan")
        _check_magnitude(flags, _row_any(np.abs(np.nan_to_num(tr)) > MAX_MAGNITUDE, parents, n), "token_rewards",
                         "a token reward")
        if len(tr):
            reward = reward + np.bincount(parents, weights=np.nan_to_num(tr), minlength=n)
        has_reward |= present
    flags.add(~has_reward, "reward", "no reward for this row (reward and token_rewards are null)",
              "write an outcome reward or per-token rewards", "no_reward")
    return reward


def _check_floats(flags: _Flags, col: pa.Array, name: str, lengths: np.ndarray, n: int) -> None:
    """A per-token float column (values, oracle_values): one finite number per token, or null."""
    vlen, v, parents, inner_null = _list_parts(col)
    _check_len(flags, name, np.where(vlen >= 0, vlen, lengths), lengths)
    flags.add(inner_null, name, f"null inside {name}", "write a number for every token", "null")
    flags.add(_row_any(~np.isfinite(v.astype(np.float64)), parents, n), name,
              f"NaN or infinite {name}", "fix the critic output or drop the column", "nan")
    _check_magnitude(flags, _row_any(np.abs(np.nan_to_num(v.astype(np.float64))) > MAX_MAGNITUDE, parents, n), name,
                     f"a value in {name}")


def _check_ids(flags: _Flags, sample_ids: list | None, seen_ids: set[str] | None, duplicates: str,
               n: int) -> np.ndarray:
    """Repeated sample ids: a problem (``duplicates="error"``), or dropped (returned mask) and counted."""
    dropped = np.zeros(n, dtype=bool)
    if sample_ids is None or seen_ids is None:
        return dropped
    dup = np.zeros(n, dtype=bool)
    batch_seen: set[str] = set()
    for i, sid in enumerate(sample_ids):
        if sid is None:
            continue
        if sid in seen_ids or sid in batch_seen:
            dup[i] = True
        batch_seen.add(sid)
    if duplicates == "error":
        flags.add(dup, "sample_id", "duplicate sample_id (seen earlier in this archive)",
                  "make ids unique, or remove the repeated rollout", "duplicate_id")
        return dropped
    return dup & (flags.reason < 0)


def _turns(mask: np.ndarray, parents: np.ndarray, mlen: np.ndarray, n: int) -> np.ndarray:
    """Policy turns per row: a turn starts at a policy token whose predecessor in its row is not one."""
    if not len(mask):
        return np.zeros(n, dtype=np.int64)
    is_policy = mask == 1
    prev = np.concatenate([[False], is_policy[:-1]])
    ml = np.maximum(mlen, 0)
    prev[(np.cumsum(ml) - ml)[ml > 0]] = False
    return np.bincount(parents[is_policy & ~prev], minlength=n)


def _check_len(flags: _Flags, name: str, got: np.ndarray, want: np.ndarray) -> None:
    flags.add(got < 0, name, "null list", f"write one entry per token in '{name}'", "null")
    flags.add((got >= 0) & (got != want), name, "length differs from input_ids",
              f"'{name}' needs exactly one entry per token of input_ids", "length_mismatch")


def _canonicalize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Cast schema columns to their canonical types; keep extra columns as they are."""
    arrays, fields = [], []
    for f, arr in zip(batch.schema, batch.columns):
        col = S.BY_NAME.get(f.name)
        if col is not None and not arr.type.equals(col.type):
            if pa.types.is_list(col.type) and pa.types.is_boolean(getattr(arr.type, "value_type", None)):
                arr = arr.cast(pa.list_(pa.int8()))
            arr = arr.cast(col.type)
            f = pa.field(f.name, col.type)
        arrays.append(arr)
        fields.append(f)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
