"""Convert other rollout dumps into schema-v1 parquet shards: ``critic-pretrain rollouts convert``.

Four sources (see docs/converters.md for the field-by-field mapping and where it was checked):

- ``nemo-rl``: NeMo-RL's training-batch dumps ``train_data_step<N>.jsonl``, one JSON object
  per rollout with right-padded per-token lists;
- ``slime``: slime's ``--save-debug-rollout-data`` files, ``torch.save`` of one rollout step's
  ``Sample.to_dict()`` list each;
- ``verl``: verl's ``skip.rollout`` cache, pickled ``DataProto`` batches (``gen_batch.dp``);
- ``generic``: JSONL or parquet rows mapped onto schema columns with ``--map COLUMN=FIELD``,
  or built from a prompt field and a response field.

The pickled formats (slime, verl) are read with an allow-list unpickler that runs no code from
the file (``rollouts.safe_pickle``), one file (one rollout step) at a time. JSONL is read line by
line, parquet in record batches. Rows are converted, validated with the reader's own checks
(``validate.check_batch``) and written in chunks (``CHUNK_ROWS`` / ``CHUNK_TOKENS``), so memory
does not grow with the size of a dump.

Bad rows follow the reader's ``on_bad`` rules: ``fail`` raises ``RolloutError`` (one line:
file, row, column, what to do) at the first one; ``skip`` leaves the row out, counts it and
appends it to the quarantine JSONL. Row numbers are 0-based; in a JSONL file row N is line N+1.

The output folder only ever holds a complete conversion: shards are written into a hidden
staging folder inside it and moved in when every input was converted; on any failure the
staging folder is removed and the output folder is left as it was.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import schema as S
from .errors import Problem, Quarantine, RolloutError
from .fileio import publish_files
from .provenance import ROLLOUTS_MANIFEST
from .sources import BadFile, BadRow, GenericSource, NemoRLSource, SlimeSource, Source, VerlSource, prompt_hash, show
from .validate import check_batch
from .writer import DEFAULT_SHARD_ROWS, ShardWriter, table_from_rows

OnBad = Literal["fail", "skip"]
ProgressCallback = Callable[[str], None]

CHUNK_ROWS = 1024
CHUNK_TOKENS = 1 << 21
"""Rows are converted, validated and written in chunks of at most ``CHUNK_ROWS`` rows or
``CHUNK_TOKENS`` tokens (python lists cost ~40 bytes a token: long agentic rows need the
token bound), which bounds memory whatever the size of a dump."""
MAX_PROBLEMS_KEPT = 1000
"""Problems kept on ``ConvertResult`` (counts are complete; the quarantine file has all)."""

_SHARD_NAME = re.compile(r"part-\d{5}\.parquet")
_STAGING_PREFIX = ".convert-"
# Arrow's errors for a python value that does not fit a column type.
_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


@dataclass
class ConvertResult:
    """What a conversion read, wrote and left out."""

    out_dir: Path
    files: int
    """Input files read (bad ones included)."""
    bad_files: int
    rows_read: int
    """Source rows seen (JSONL lines that were not blank, parquet rows)."""
    rows_written: int
    rows_skipped: int
    shards: list[Path]
    problem_counts: Counter = field(default_factory=Counter)
    """Problems by kind (``missing_field``, ``bad_json``, ``length_mismatch``, ...)."""
    problems: list[Problem] = field(default_factory=list)
    """The first ``MAX_PROBLEMS_KEPT`` problems."""
    quarantine: Path | None = None
    collected: dict = field(default_factory=dict)
    """What the dump said of its collecting run (framework, max length; ``provenance.Collection``)."""

    def summary(self) -> str:
        """One line for humans."""
        line = (f"converted {self.files} file(s)"
                + (f" ({self.bad_files} unreadable)" if self.bad_files else "")
                + f": {self.rows_written:,} rows written to {len(self.shards)} shard(s) in {self.out_dir}, "
                  f"{self.rows_skipped:,} rows skipped")
        if self.problem_counts:
            line += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(self.problem_counts.items())) + ")"
        return line






# --------------------------------------------------------------------------------------
# Sources: turn one record of a dump into one row of schema columns (python values).
# --------------------------------------------------------------------------------------

































# --------------------------------------------------------------------------------------
# The engine: chunked conversion, validation, bad-row routing, staged output.
# --------------------------------------------------------------------------------------

class _Sink:
    """Collects converted rows of one file at a time, validates and writes them in chunks."""

    def __init__(self, source: Source, writer: ShardWriter, on_bad: OnBad, quarantine: Path | None):
        self.source = source
        self.writer = writer
        self.on_bad = on_bad
        self.counts: Counter = Counter()
        self.problems: list[Problem] = []
        self.rows_read = 0
        self.rows_skipped = 0
        self.bad_files = 0
        self._seen_ids: set[str] = set()
        self._extra: pa.Schema | None = None
        self._buf: list[tuple[int, dict]] = []
        self._buf_tokens = 0
        self._file = ""
        self._quarantine = Quarantine(quarantine).__enter__()

    def close(self) -> None:
        self._quarantine.__exit__()

    def convert_file(self, path: Path) -> int:
        """Convert one input file; returns the rows read from it."""
        self._file = str(path)
        before = self.rows_read
        try:
            for row, rec in self.source.records(path):
                self.rows_read += 1
                if isinstance(rec, BadRow):
                    self._bad_row(row, rec)
                    continue
                try:
                    out = self.source.convert(path, row, rec)
                except BadRow as bad:
                    self._bad_row(row, bad)
                    continue
                row_out = _normalise(out, self.source)
                self._buf.append((row, row_out))
                if isinstance(row_out["input_ids"], list):
                    self._buf_tokens += len(row_out["input_ids"])
                if len(self._buf) >= CHUNK_ROWS or self._buf_tokens >= CHUNK_TOKENS:
                    self._flush()
            self._flush()
        except BadFile as bad:
            self._flush()  # rows before a corrupt part are good
            self.bad_files += 1
            self._report(Problem(self._file, bad.row, None, bad.reason, bad.fix, kind=bad.kind), whole_file=True)
        return self.rows_read - before

    def _bad_row(self, row: int, bad: BadRow) -> None:
        self._report(Problem(self._file, row, bad.column, bad.reason, bad.fix, kind=bad.kind))

    def _report(self, problem: Problem, whole_file: bool = False) -> None:
        if self.on_bad == "fail":
            raise RolloutError(problem)
        if not whole_file:
            self.rows_skipped += 1
        self.counts[problem.kind] += 1
        if len(self.problems) < MAX_PROBLEMS_KEPT:
            self.problems.append(problem)
        self._quarantine.add(problem)

    def _flush(self) -> None:
        rows, self._buf, self._buf_tokens = self._buf, [], 0
        if not rows:
            return
        src_rows, table = self._table(rows)
        if table is None:
            return
        if self.source.derive_group_id:
            table = table.set_column(table.schema.get_field_index("group_id"), "group_id",
                                     prompt_group_ids(table.column("input_ids"), table.column("loss_mask")))
        batch = table.combine_chunks().to_batches()[0]
        res = check_batch(self._file, batch, 0, self._seen_ids)
        for p in res.problems:
            self._report(self._from_source(p, src_rows[p.row]))
        if len(res.rows):
            self.writer.write_table(table.take(res.rows))

    def _table(self, rows: list[tuple[int, dict]]) -> tuple[list[int], pa.Table | None]:
        """Arrow table of the rows; rows whose values do not fit their column are reported."""
        outs = [o for _, o in rows]
        extra = self._extra_schema(outs)
        try:
            return [r for r, _ in rows], table_from_rows(outs, extra)
        except _CONVERSION_ERRORS as error:
            good = []
            for row, out in rows:
                bad = self._bad_cell(out, extra)
                if bad is None:
                    good.append((row, out))
                else:
                    self._bad_row(row, bad)
            if len(good) == len(rows):
                raise error  # not a value problem: let it surface
            if not good:
                return [], None
            return [r for r, _ in good], table_from_rows([o for _, o in good], extra)

    def _bad_cell(self, out: dict, extra: pa.Schema | None) -> BadRow | None:
        types = {name: S.BY_NAME[name].type for name in self.source.columns}
        if extra is not None:
            types.update({f.name: f.type for f in extra})
        for name, type_ in types.items():
            try:
                pa.array([out.get(name)], type=type_)
            except _CONVERSION_ERRORS:
                source_field = self.source.field_of(name) or name
                kind = S.expected_kind(name) if name in S.BY_NAME else f"{type_} like the rows before"
                return BadRow(source_field, f"'{source_field}' is {show(out.get(name))}; expected {kind}",
                               self.source.fix_for(name), "wrong_type")
        return None

    def _extra_schema(self, outs: list[dict]) -> pa.Schema | None:
        """Types of the extra columns, fixed by the first chunk (an all-null field becomes text)."""
        if not self.source.extra_names:
            return None
        if self._extra is None:
            fields = []
            for name in self.source.extra_names:
                try:
                    type_ = pa.array([o.get(name) for o in outs]).type
                except _CONVERSION_ERRORS:
                    raise RolloutError(Problem(self._file, None, name, "extra field mixes types within the first rows",
                                               "convert without --keep-extra", kind="wrong_type")) from None
                fields.append(pa.field(name, pa.string() if pa.types.is_null(type_) else type_))
            self._extra = pa.schema(fields)
        return self._extra

    def _from_source(self, problem: Problem, row: int) -> Problem:
        """A validation problem, with the source row and the source field it came from."""
        source_field = self.source.field_of(problem.column) if problem.column else None
        reason = problem.reason
        if source_field and source_field != problem.column:
            reason += f" (source field '{source_field}')"
        return dataclasses.replace(problem, row=row, reason=reason)


def _normalise(out: dict, source: Source) -> dict:
    """Every output column present, and the loose input types the schema accepts made canonical."""
    row = {name: out.get(name) for name in source.columns}
    mask = row.get("loss_mask")
    if isinstance(mask, list) and mask and type(mask[0]) is bool:
        row["loss_mask"] = [int(x) for x in mask]
    for name in ("sample_id", "group_id"):
        if type(row.get(name)) is int:
            row[name] = str(row[name])
    if row.get("truncated") in (0, 1) and type(row.get("truncated")) is int:
        row["truncated"] = bool(row["truncated"])
    for name in source.extra_names:
        row[name] = out.get(name)
    return row


def prompt_group_ids(input_ids: pa.ChunkedArray | pa.Array, loss_mask: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Stable id of each row's prompt: a hash of the tokens before the first policy token.

    Rollouts sampled from one prompt share it, so they stay on one side of a train/val split.
    The hash is of little-endian int64 token ids: the same on every machine and run.
    """
    ids = _one_chunk(input_ids)
    mask = _one_chunk(loss_mask)
    id_len = pc.fill_null(pc.list_value_length(ids), 0).to_numpy(zero_copy_only=False)
    mask_len = pc.fill_null(pc.list_value_length(mask), 0).to_numpy(zero_copy_only=False)
    id_flat = pc.list_flatten(ids).fill_null(0).to_numpy(zero_copy_only=False).astype("<i8")
    policy = pc.list_flatten(mask).fill_null(0).to_numpy(zero_copy_only=False) == 1
    id_start = np.concatenate([[0], np.cumsum(id_len)])
    mask_start = np.concatenate([[0], np.cumsum(mask_len)])
    out = []
    for i in range(len(ids)):
        row_policy = policy[mask_start[i]:mask_start[i + 1]]
        prompt_len = int(row_policy.argmax()) if row_policy.any() else int(mask_len[i])
        out.append(prompt_hash(id_flat[id_start[i]:id_start[i] + min(prompt_len, int(id_len[i]))]))
    return pa.array(out, pa.string())


def _one_chunk(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


# --------------------------------------------------------------------------------------
# Output folder: refuse or replace, stage, publish.
# --------------------------------------------------------------------------------------

def _prepare_out(out: Path, overwrite: bool, quarantine: Path | None) -> tuple[list[Path], bool]:
    """(shards to replace, whether the folder was created here); refuses unsafe targets."""
    if out.exists() and not out.is_dir():
        raise RolloutError(f"{out}: --out must be a folder, and this is a file")
    if not out.exists():
        out.mkdir(parents=True)
        return [], True
    q = quarantine.resolve() if quarantine is not None else None
    # Left-over staging folders of a killed conversion are hidden, and readers skip them.
    entries = sorted(e for e in out.iterdir()
                     if e.resolve() != q and not e.name.startswith(_STAGING_PREFIX))
    if not entries:
        return [], False
    if not overwrite:
        raise RolloutError(f"{out}: the output folder is not empty ({len(entries)} entries, e.g. "
                           f"'{entries[0].name}'); pass --overwrite to replace its shards, or choose an empty folder")
    foreign = [e for e in entries
               if not (e.is_file() and (_SHARD_NAME.fullmatch(e.name) or e.name == ROLLOUTS_MANIFEST))]
    if foreign:
        raise RolloutError(f"{out}: --overwrite only replaces rollout shards (part-NNNNN.parquet), but the folder "
                           f"also holds '{foreign[0].name}'; empty it yourself or choose another folder")
    return entries, False


def _run(source: Source, out_dir: str | os.PathLike, *, shard_rows: int, on_bad: OnBad,
         quarantine: str | os.PathLike | None, overwrite: bool, progress: ProgressCallback | None) -> ConvertResult:
    """Convert every file of ``source`` into shards staged in ``out_dir`` and published at the end."""
    if on_bad not in ("fail", "skip"):
        raise ValueError(f"on_bad must be 'fail' or 'skip', got {on_bad!r}")
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    ignored = getattr(source, "ignored", [])  # dump sources: other files found in the folders given
    if progress is not None and ignored:
        kinds = ", ".join(sorted({f.suffix for f in ignored}))
        progress(f"ignored {len(ignored)} other {kinds} file(s), e.g. {ignored[0]}")
    out = Path(out_dir)
    q = Path(quarantine) if quarantine else None
    old, created = _prepare_out(out, overwrite, q)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=out))
    sink = None
    try:
        with ShardWriter(staging, shard_rows=shard_rows) as writer:
            sink = _Sink(source, writer, on_bad, q)
            for path in source.files:
                rows = sink.convert_file(path)
                if progress is not None:
                    progress(f"{path}: {rows:,} rows")
        # Nothing converted: a previous conversion in --out stays as it was.
        shards = publish_files(writer.paths, out, old) if writer.rows_written else []
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        if sink is not None:
            sink.close()
    collected = getattr(source, "collected", None)
    return ConvertResult(out_dir=out, files=len(source.files), bad_files=sink.bad_files,
                         rows_read=sink.rows_read, rows_written=writer.rows_written,
                         rows_skipped=sink.rows_skipped, shards=shards, problem_counts=sink.counts,
                         problems=sink.problems, quarantine=q, collected=collected() if collected else {})


# --------------------------------------------------------------------------------------
# Python API
# --------------------------------------------------------------------------------------

def convert_nemo_rl(paths: str | os.PathLike | Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
                    reward_field: str = "rewards", keep_extra: bool = False,
                    shard_rows: int = DEFAULT_SHARD_ROWS, on_bad: OnBad = "fail",
                    quarantine: str | os.PathLike | None = None, overwrite: bool = False,
                    progress: ProgressCallback | None = None) -> ConvertResult:
    """Convert NeMo-RL ``train_data_step<N>.jsonl`` dumps (files, folders, globs) into shards.

    ``reward_field``: ``rewards`` (the run's total reward per rollout) or, with dynamic
    sampling, ``filtered_rewards``. ``keep_extra`` keeps the other fields (advantages,
    logprobs, content, ...) as extra columns, per-token ones unpadded.

    >>> res = convert_nemo_rl("logs/exp_001", "rollouts/run1", on_bad="skip", quarantine="bad.jsonl")
    >>> print(res.summary())
    """
    source = NemoRLSource(paths, reward_field=reward_field, keep_extra=keep_extra)
    return _run(source, out_dir, shard_rows=shard_rows, on_bad=on_bad, quarantine=quarantine,
                overwrite=overwrite, progress=progress)


def convert_slime(paths: str | os.PathLike | Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
                  reward_key: str | None = None, keep_extra: bool = False, shard_rows: int = DEFAULT_SHARD_ROWS,
                  on_bad: OnBad = "fail", quarantine: str | os.PathLike | None = None, overwrite: bool = False,
                  progress: ProgressCallback | None = None) -> ConvertResult:
    """Convert slime's ``--save-debug-rollout-data`` files (``<rollout_id>.pt``; files, folders,
    globs) into shards. ``reward_key``: the key of a dict reward (slime's ``--reward-key``).

    >>> convert_slime("dump_details/rollout_data", "rollouts/run1")
    """
    source = SlimeSource(paths, reward_key=reward_key, keep_extra=keep_extra)
    return _run(source, out_dir, shard_rows=shard_rows, on_bad=on_bad, quarantine=quarantine,
                overwrite=overwrite, progress=progress)


def convert_verl(paths: str | os.PathLike | Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
                 reward_field: str | None = None, keep_extra: bool = False, shard_rows: int = DEFAULT_SHARD_ROWS,
                 on_bad: OnBad = "fail", quarantine: str | os.PathLike | None = None, overwrite: bool = False,
                 progress: ProgressCallback | None = None) -> ConvertResult:
    """Convert verl's ``skip.rollout`` cache (``gen_batch.dp`` files; files, folders, globs) into
    shards. ``reward_field``: default ``token_level_scores``, else ``rm_scores``.

    >>> convert_verl("~/.verl/rollout_dump/exp_proj", "rollouts/run1")
    """
    source = VerlSource(paths, reward_field=reward_field, keep_extra=keep_extra)
    return _run(source, out_dir, shard_rows=shard_rows, on_bad=on_bad, quarantine=quarantine,
                overwrite=overwrite, progress=progress)


def convert_generic(paths: str | os.PathLike | Iterable[str | os.PathLike], out_dir: str | os.PathLike,
                    mapping: Mapping[str, str] | None = None, *, prompt_field: str | None = None,
                    response_field: str | None = None, keep_extra: bool = False, pad_id: int | None = None,
                    mask_field: str | None = None,
                    shard_rows: int = DEFAULT_SHARD_ROWS, on_bad: OnBad = "fail",
                    quarantine: str | os.PathLike | None = None, overwrite: bool = False,
                    progress: ProgressCallback | None = None) -> ConvertResult:
    """Convert JSONL or parquet rows (files, folders, globs) into shards.

    ``mapping``: schema column -> source field (``a.b`` follows nested objects); a source
    field named like a schema column is used without a mapping. ``prompt_field`` +
    ``response_field`` build ``input_ids`` as their concatenation with ``loss_mask`` 0 on the
    prompt and 1 on the response. ``group_id`` defaults to a hash of the prompt tokens.
    Padded token lists: ``mask_field`` names a 0/1 attention (or response) mask whose 0s are
    dropped, or ``pad_id`` strips runs of that id at the padded ends (every per-token column is
    cut alike).

    >>> convert_generic("dump.jsonl", "rollouts/x", {"input_ids": "tokens", "loss_mask": "mask",
    ...                                              "reward": "score"})
    """
    source = GenericSource(paths, mapping, prompt_field=prompt_field, response_field=response_field,
                      keep_extra=keep_extra, pad_id=pad_id, mask_field=mask_field)
    return _run(source, out_dir, shard_rows=shard_rows, on_bad=on_bad, quarantine=quarantine,
                overwrite=overwrite, progress=progress)
