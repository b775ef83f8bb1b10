"""Stream validated rollouts out of parquet archives with bounded memory.

Files are opened one at a time with ``pyarrow.parquet.ParquetFile`` and read in record
batches of ``batch_rows`` rows, so memory is bounded by one batch (not by the archive)
and thousands of shards never hold thousands of file handles.

Bad data is handled by ``on_bad``:

- ``"fail"``: raise ``RolloutError`` (one line: file, row, column, what to do) at the
  first bad row or file;
- ``"skip"``: leave the bad row (or file) out, count it, and append it to the quarantine
  report (JSONL with file, row, sample_id, column, reason) when one is given. Nothing is
  dropped silently: ``Summary`` carries the counts.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import Problem, Quarantine, RolloutError
from .paths import resolve
from .schema import BY_NAME as _SCHEMA_NAMES
from .validate import BatchResult, check_batch, check_schema

OnBad = Literal["fail", "skip"]
DEFAULT_BATCH_ROWS = 512
# Columns validation always needs, even when the caller asks for fewer.
_NEEDED = {"input_ids", "loss_mask", "reward", "token_rewards", "sample_id", "sample_weight"}


@dataclass
class Summary:
    """Running statistics over what was read; ``to_dict`` for JSON, ``format`` for humans."""

    files: int = 0
    bad_files: int = 0
    rows: int = 0
    """Rows kept (valid)."""
    bad_rows: int = 0
    duplicates: int = 0
    """Rows dropped as repeats of an earlier sample_id (de-duplication mode)."""
    tokens: int = 0
    policy_tokens: int = 0
    problems: Counter = field(default_factory=Counter)
    extra_columns: set = field(default_factory=set)
    _lengths: list = field(default_factory=list, repr=False)
    _rewards: list = field(default_factory=list, repr=False)
    _turns: list = field(default_factory=list, repr=False)
    padded_ends: Counter = field(default_factory=Counter)
    """Rollouts ending in PAD_RUN copies of one token id, by that id (padding left in?)."""

    def add(self, res: BatchResult) -> None:
        self.padded_ends.update(trailing_runs(res.batch.column("input_ids"), res.lengths).tolist())
        self.rows += len(res.rows)
        self.bad_rows += len(res.problems)
        self.duplicates += res.duplicates
        self.tokens += int(res.lengths.sum())
        self.policy_tokens += int(res.policy_tokens.sum())
        self._lengths.append(res.lengths.astype(np.int32))
        self._rewards.append(res.total_reward.astype(np.float64))
        self._turns.append(res.turns.astype(np.int32))
        for p in res.problems:
            self.problems[p.kind] += 1

    @property
    def lengths(self) -> np.ndarray:
        return np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)

    @property
    def rewards(self) -> np.ndarray:
        return np.concatenate(self._rewards) if self._rewards else np.zeros(0)

    @property
    def turns(self) -> np.ndarray:
        return np.concatenate(self._turns) if self._turns else np.zeros(0, np.int32)

    def warnings(self) -> list[str]:
        """What looks wrong although every row is valid: most rollouts ending in a run of one id
        (padding converted as tokens: pad ids would train as policy tokens, the reward on a pad)."""
        if not self.rows or not self.padded_ends:
            return []
        pad, n = self.padded_ends.most_common(1)[0]
        if n <= self.rows / 2:
            return []
        return [f"{n:,} of {self.rows:,} rollouts end in {PAD_RUN}+ copies of token id {pad}: padding left in the "
                f"token ids? Re-convert with --pad-id {pad} or --mask-field <the attention/response mask>"]

    def to_dict(self) -> dict:
        lengths, rewards, turns = self.lengths, self.rewards, self.turns
        d = {
            "files": self.files, "bad_files": self.bad_files,
            "rows": self.rows, "bad_rows": self.bad_rows, "duplicates": self.duplicates,
            "tokens": self.tokens, "policy_tokens": self.policy_tokens,
            "problems": dict(sorted(self.problems.items())),
            "extra_columns": sorted(self.extra_columns), "warnings": self.warnings(),
        }
        if self.rows:
            q = [50, 90, 99]
            d["length"] = {"min": int(lengths.min()), **{f"p{p}": float(np.percentile(lengths, p)) for p in q},
                           "max": int(lengths.max()), "mean": float(lengths.mean())}
            d["reward"] = {"mean": float(rewards.mean()), "std": float(rewards.std()),
                           "min": float(rewards.min()), "max": float(rewards.max()),
                           **{f"p{p}": float(np.percentile(rewards, p)) for p in (10, 50, 90)},
                           "distinct": int(min(len(np.unique(rewards)), 1000))}
            d["turns"] = {"mean": float(turns.mean()), "max": int(turns.max()),
                          "histogram": {str(k): int(v)
                                        for k, v in zip(*np.unique(np.minimum(turns, 10), return_counts=True))}}
        return d

    def format(self) -> str:
        d = self.to_dict()
        out = [f"files          {d['files']}" + (f"  ({d['bad_files']} unreadable or invalid)"
                                                 if d["bad_files"] else ""),
               f"rows           {d['rows']:,}" + (f"  ({d['bad_rows']:,} bad rows left out)" if d["bad_rows"] else ""),
               f"tokens         {d['tokens']:,}",
               f"policy tokens  {d['policy_tokens']:,}" + (f"  ({d['policy_tokens'] / max(d['tokens'], 1):.1%})")]
        if self.rows:
            L, R, T = d["length"], d["reward"], d["turns"]
            out.append(f"length         min {L['min']}  p50 {L['p50']:.0f}  p90 {L['p90']:.0f}  "
                       f"p99 {L['p99']:.0f}  max {L['max']}")
            out.append(f"reward         mean {R['mean']:.4g}  std {R['std']:.4g}  min {R['min']:.4g}  "
                       f"p50 {R['p50']:.4g}  max {R['max']:.4g}  ({R['distinct']} distinct values)")
            hist = "  ".join(f"{k if k != '10' else '10+'}:{v}" for k, v in T["histogram"].items())
            out.append(f"policy turns   mean {T['mean']:.2f}  max {T['max']}  [{hist}]")
        if d["extra_columns"]:
            out.append(f"extra columns  {', '.join(d['extra_columns'])} (kept)")
        if d["problems"]:
            out.append("problems       " + ", ".join(f"{k}: {v}" for k, v in d["problems"].items()))
        return "\n".join(out)


PAD_RUN = 4
"""A rollout ending in this many copies of one token id looks padded."""


def trailing_runs(ids: pa.Array, lengths: np.ndarray, run: int = PAD_RUN) -> np.ndarray:
    """The token id that the last ``run`` tokens of each row repeat, for the rows that end so."""
    flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False)
    ends = np.cumsum(lengths.astype(np.int64))
    rows = np.flatnonzero(lengths >= run)
    if not len(rows):
        return np.zeros(0, np.int64)
    last = flat[ends[rows] - 1]
    same = np.all([flat[ends[rows] - k] == last for k in range(2, run + 1)], axis=0)
    return last[same].astype(np.int64)


class RolloutReader:
    """Iterate validated record batches over a rollout archive.

    >>> reader = RolloutReader("rollouts/", on_bad="skip", quarantine="bad.jsonl")
    >>> for file, rows, batch in reader:   # batch: canonical pa.RecordBatch
    ...     ...
    >>> print(reader.summary.format())
    """

    def __init__(self, paths: str | os.PathLike | Iterable, *, on_bad: OnBad = "fail",
                 quarantine: str | os.PathLike | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                 columns: list[str] | None = None, check_duplicates: bool = True,
                 duplicates: Literal["error", "drop"] = "error", seen_ids: set[str] | None = None,
                 vocab_size: int | None = None, need_values: bool = False):
        if on_bad not in ("fail", "skip"):
            raise ValueError(f"on_bad must be 'fail' or 'skip', got {on_bad!r}")
        self.files = resolve(paths)
        self.on_bad = on_bad
        self.quarantine = Path(quarantine) if quarantine else None
        self.batch_rows = batch_rows
        self.columns = columns
        self.check_duplicates = check_duplicates
        self.duplicates = duplicates
        self._shared_ids = seen_ids
        """A set shared with other readers: de-duplicate across sources."""
        self.vocab_size = vocab_size
        """Token ids must be below this (the model's vocabulary); None: not checked."""
        self.need_values = need_values
        """Every row must carry ``values`` (bootstrap targets with lambda < 1)."""
        self.summary = Summary()
        self.problems: list[Problem] = []
        """Every problem found (bounded by what was read; the quarantine file has them too)."""
        self._quarantine = Quarantine(None)

    def __iter__(self) -> Iterator[tuple[Path, np.ndarray, pa.RecordBatch]]:
        seen_ids = (self._shared_ids if self._shared_ids is not None else set()) if self.check_duplicates else None
        self.summary = Summary()
        self.problems = []
        with Quarantine(self.quarantine) as self._quarantine:
            for path in self.files:
                yield from self._read_file(path, seen_ids)

    def read_all(self) -> pa.Table:
        """Everything valid as one table (small archives, tests, notebooks)."""
        batches = [b for _, _, b in self]
        if not batches:
            raise RolloutError(f"no valid rollouts in {', '.join(map(str, self.files))}")
        # Files may differ in extra columns: promote to one schema.
        return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="default")

    def _report(self, problem: Problem) -> None:
        if self.on_bad == "fail":
            raise RolloutError(problem)
        self.problems.append(problem)
        self._quarantine.add(problem)

    def _file_problem(self, problem: Problem) -> None:
        self.summary.bad_files += 1
        self.summary.problems[problem.kind] += 1
        self._report(problem)

    def _read_file(self, path: Path, seen_ids):
        name = str(path)
        self.summary.files += 1
        if path.stat().st_size == 0:
            return self._file_problem(Problem(name, None, None, "empty file (0 bytes)",
                                              "delete it or re-export the shard", kind="empty_file"))
        try:
            source = _open(path, self.batch_rows)
        except (pa.ArrowException, OSError) as e:
            kind = "Arrow stream (a datasets file)" if path.suffix == ".arrow" else "parquet file"
            return self._file_problem(Problem(name, None, None, f"not a readable {kind} ({_short(e)})",
                                              "the shard is truncated or corrupt: re-copy or re-export it",
                                              kind="corrupt_file"))
        with source:
            sch = source.schema
            bad_schema = check_schema(name, sch)
            if bad_schema:
                self.summary.bad_files += 1
                for p in bad_schema:
                    self.summary.problems[p.kind] += 1
                    self._report(p)
                return
            if source.num_rows == 0:
                return self._file_problem(Problem(name, None, None, "empty file (no rows)",
                                                  "delete it or re-export the shard", kind="empty_file"))
            self.summary.extra_columns.update(n for n in sch.names if n not in _SCHEMA_NAMES)
            columns = None
            if self.columns is not None:
                columns = [c for c in sch.names if c in set(self.columns) | _NEEDED]
            offset = 0
            it = source.batches(columns)
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                except (pa.ArrowException, OSError) as e:
                    return self._file_problem(Problem(
                        name, offset, None, f"cannot decode rows from here on ({_short(e)})",
                        "the shard is truncated or corrupt: re-copy or re-export it", kind="corrupt_file"))
                res = check_batch(name, batch, offset, seen_ids, self.duplicates, vocab_size=self.vocab_size,
                                  need_values=self.need_values)
                for p in res.problems:
                    self._report(p)
                self.summary.add(res)
                offset += batch.num_rows
                if len(res.rows):
                    yield path, res.rows, res.batch


class _Parquet:
    """A parquet shard: schema, row count and batches of ``batch_rows`` (bounded memory)."""

    def __init__(self, path: Path, batch_rows: int):
        self.pf = pq.ParquetFile(path, memory_map=False, buffer_size=1 << 20, pre_buffer=False)
        self.schema, self.num_rows, self.batch_rows = self.pf.schema_arrow, self.pf.metadata.num_rows, batch_rows

    def batches(self, columns):
        return self.pf.iter_batches(batch_size=self.batch_rows, columns=columns)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.pf.close()


class _ArrowStream:
    """A Hugging Face datasets shard (Arrow IPC stream, memory-mapped: zero-copy), re-cut into
    batches of at most ``batch_rows``."""

    def __init__(self, path: Path, batch_rows: int):
        self.source = pa.memory_map(str(path))
        self.reader = pa.ipc.open_stream(self.source)
        self.schema, self.num_rows, self.batch_rows = self.reader.schema, None, batch_rows

    def batches(self, columns):
        for batch in self.reader:
            if columns is not None:
                batch = batch.select(columns)
            for start in range(0, batch.num_rows, self.batch_rows):
                yield batch.slice(start, self.batch_rows)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.source.close()


def _open(path: Path, batch_rows: int):
    return (_ArrowStream if path.suffix == ".arrow" else _Parquet)(path, batch_rows)


def _short(e: Exception) -> str:
    msg = " ".join(str(e).split())
    return msg[:160] + ("..." if len(msg) > 160 else "")


def check(paths, *, on_bad: OnBad = "skip", quarantine=None, batch_rows: int = DEFAULT_BATCH_ROWS,
          vocab_size: int | None = None) -> RolloutReader:
    """Read and validate everything under ``paths``; returns the reader with summary and problems."""
    reader = RolloutReader(paths, on_bad=on_bad, quarantine=quarantine, batch_rows=batch_rows,
                           vocab_size=vocab_size)
    for _ in reader:
        pass
    return reader

