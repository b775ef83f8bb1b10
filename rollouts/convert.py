"""Convert other rollout dumps into schema-v1 parquet shards: ``critic-pretrain rollouts convert``.

Two sources (see docs/converters.md for the field-by-field mapping and where it was checked):

- ``nemo-rl``: NeMo-RL's training-batch dumps ``train_data_step<N>.jsonl``, one JSON object
  per rollout with right-padded per-token lists;
- ``generic``: JSONL or parquet rows mapped onto schema columns with ``--map COLUMN=FIELD``,
  or built from a prompt field and a response field.

Both stream: a file is read line by line (JSONL) or in record batches (parquet), rows are
converted, validated with the reader's own checks (``validate.check_batch``) and written in
chunks (``CHUNK_ROWS`` / ``CHUNK_TOKENS``), so memory does not grow with the size of a dump.

Bad rows follow the reader's ``on_bad`` rules: ``fail`` raises ``RolloutError`` (one line:
file, row, column, what to do) at the first one; ``skip`` leaves the row out, counts it and
appends it to the quarantine JSONL. Row numbers are 0-based; in a JSONL file row N is line N+1.

The output folder only ever holds a complete conversion: shards are written into a hidden
staging folder inside it and moved in when every input was converted; on any failure the
staging folder is removed and the output folder is left as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import schema as S
from .errors import Problem, Quarantine, RolloutError
from .fileio import publish_files
from .provenance import ROLLOUTS_MANIFEST
from .sources import SOURCES, BadFile, BadRow, GenericSource, NemoRLSource, Source, show
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
        prompt = id_flat[id_start[i]:id_start[i] + min(prompt_len, int(id_len[i]))]
        out.append(hashlib.blake2b(prompt.tobytes(), digest_size=8).hexdigest())
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
    foreign = [e for e in entries if not (e.is_file() and (_SHARD_NAME.fullmatch(e.name) or e.name == ROLLOUTS_MANIFEST))]
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
    return ConvertResult(out_dir=out, files=len(source.files), bad_files=sink.bad_files,
                         rows_read=sink.rows_read, rows_written=writer.rows_written,
                         rows_skipped=sink.rows_skipped, shards=shards, problem_counts=sink.counts,
                         problems=sink.problems, quarantine=q)


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
    if progress is not None and source.ignored:
        progress(f"ignored {len(source.ignored)} other .jsonl file(s), e.g. {source.ignored[0]}")
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


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------

_EPILOG = """\
examples:
  critic-pretrain rollouts convert --from nemo-rl logs/exp_001 --out rollouts/run1
  critic-pretrain rollouts convert --from nemo-rl 'logs/exp_*/train_data_step*.jsonl' --out rollouts/run1 \\
      --on-bad skip --quarantine bad.jsonl
  critic-pretrain rollouts convert --from generic dump.jsonl --out rollouts/x \\
      --map input_ids=tokens --map loss_mask=mask --map reward=meta.score
  critic-pretrain rollouts convert --from generic padded.parquet --out rollouts/y \\
      --prompt-field prompt_ids --response-field response_ids --mask-field attention_mask --map reward=score
  critic-pretrain rollouts convert --from nemo-rl logs/exp_001 --out rollouts/run1 --ppo-config grpo.yaml

verl's trainer.rollout_data_dir dump is decoded text with the special tokens stripped
(batch_decode(..., skip_special_tokens=True)): token ids cannot be rebuilt from it, so it
cannot be converted; dump the token ids (prompts, responses, attention mask, reward) instead.
Row numbers in messages are 0-based; in a JSONL file row N is line N+1.
Field-by-field mapping of each format: docs/converters.md.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``rollouts convert``."""
    p = sub.add_parser(
        "convert", help="convert NeMo-RL dumps or other JSONL/parquet into schema-v1 shards",
        description="Convert rollout dumps into schema-v1 parquet shards (streamed, bounded memory). "
                    "The output folder receives the shards only when every input was converted.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="dump files, folders (searched recursively) or globs")
    p.add_argument("--from", dest="source", choices=list(SOURCES), required=True,
                   help="nemo-rl: train_data_step<N>.jsonl dumps; generic: JSONL/parquet with --map")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (must be empty, or --overwrite)")
    p.add_argument("--shard-rows", type=_positive_int, default=DEFAULT_SHARD_ROWS, metavar="N",
                   help=f"rollouts per shard (default {DEFAULT_SHARD_ROWS})")
    p.add_argument("--on-bad", choices=["fail", "skip"], default="fail",
                   help="fail: stop at the first bad row (default); skip: leave bad rows out and count them")
    p.add_argument("--quarantine", metavar="JSONL", help="write one line per bad row/file (file, row, reason)")
    p.add_argument("--overwrite", action="store_true", help="replace the shards of a previous conversion in --out")
    p.add_argument("--keep-extra", action="store_true",
                   help="keep source fields that map to no schema column as extra columns")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the tokenizer (or model folder) that produced the token ids: its fingerprint is recorded "
                        "in OUT/_rollouts.json, and training stops if the model's tokenizer differs")
    r = p.add_argument_group("rewards: what the dump's rewards are (NeMo-RL logs them after its reward_scaling "
                             "and reward_shaping), recorded in OUT/_rollouts.json for training and seed check")
    how = r.add_mutually_exclusive_group()
    how.add_argument("--ppo-config", metavar="YAML",
                     help="the collecting run's NeMo-RL config (ppo: or grpo:): its reward_scaling and reward_shaping "
                          "were applied before logging")
    how.add_argument("--rewards-raw", action="store_true",
                     help="the rewards are as the reward function returned them (no scaling, no shaping)")
    how.add_argument("--rewards-scaled", metavar="SCALE,SHIFT",
                     help="the rewards were logged as SCALE * raw + SHIFT, e.g. 2,-1 for [0,1] mapped to [-1,1]")
    g = p.add_argument_group("nemo-rl")
    g.add_argument("--reward-field", default="rewards", metavar="FIELD",
                   help="reward field (default rewards; with dynamic sampling maybe filtered_rewards)")
    g = p.add_argument_group("generic")
    g.add_argument("--map", action="append", default=[], type=_mapping_arg, metavar="COLUMN=FIELD",
                   help="take schema COLUMN from source FIELD (a.b for nested objects); repeatable")
    g.add_argument("--prompt-field", metavar="FIELD", help="prompt token ids (loss_mask 0)")
    g.add_argument("--response-field", metavar="FIELD", help="response token ids (loss_mask 1)")
    g.add_argument("--mask-field", metavar="FIELD",
                   help="a 0/1 attention mask over the tokens (or a response mask): tokens where it is 0 are padding "
                        "and dropped")
    g.add_argument("--pad-id", type=int, metavar="ID",
                   help="strip runs of this id at the padded ends (a prompt's left, a response's right); default: "
                        "the --tokenizer's pad id")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``rollouts convert``: convert, print a one-line summary; 1 when nothing was written."""
    common = dict(keep_extra=args.keep_extra, shard_rows=args.shard_rows, on_bad=args.on_bad,
                  quarantine=args.quarantine, overwrite=args.overwrite, progress=_stderr)
    rewards = _rewards_logged(args)
    tokenizer = None
    if args.tokenizer:
        from .tokenizer import fingerprint_of
        tokenizer = fingerprint_of(args.tokenizer)
        if tokenizer is None:
            raise RolloutError(f"--tokenizer {args.tokenizer}: no loadable tokenizer there; pass the folder with "
                               "tokenizer.json / tokenizer_config.json of the policy that generated the rollouts")
    if args.source == "nemo-rl":
        if args.map or args.prompt_field or args.response_field or args.mask_field or args.pad_id is not None:
            raise RolloutError("--map/--prompt-field/--response-field/--mask-field/--pad-id are for --from generic; "
                               "NeMo-RL dumps are mapped already (input_lengths cuts their padding)")
        result = convert_nemo_rl(args.paths, args.out, reward_field=args.reward_field, **common)
    else:
        mapping: dict[str, str] = {}
        for column, source_field in args.map:
            if column in mapping:
                raise RolloutError(f"--map {column}=...: given twice; map each column once")
            mapping[column] = source_field
        pad_id = args.pad_id
        if pad_id is None and tokenizer is not None and not args.mask_field:
            pad_id = tokenizer["special_ids"].get("pad_token_id")
            if pad_id is not None:
                _stderr(f"stripping runs of the tokenizer's pad id {pad_id} at the padded ends (--pad-id to change)")
        result = convert_generic(args.paths, args.out, mapping, prompt_field=args.prompt_field,
                                 response_field=args.response_field, pad_id=pad_id, mask_field=args.mask_field,
                                 **common)
    print(result.summary())
    if result.rows_written:  # replaces a previous conversion's (--overwrite)
        from .provenance import write_manifest
        write_manifest(result.out_dir, generator="rollouts.convert", **{"from": args.source}, tokenizer=tokenizer,
                       rewards=rewards.to_dict() if rewards else None)
        if rewards is None and args.source == "nemo-rl":
            _warn_scaled(result.shards)
    if result.rows_skipped or result.bad_files:
        print(f"bad rows and files are listed in {result.quarantine}" if result.quarantine
              else "pass --quarantine FILE.jsonl to list every bad row")
    if not result.rows_written:
        print("no rollout was converted", file=sys.stderr)
        return 1
    print(f"next: critic-pretrain rollouts check {result.out_dir}")
    return 0


def _rewards_logged(args: argparse.Namespace):
    """What ``--ppo-config`` / ``--rewards-raw`` / ``--rewards-scaled`` say of the dump's rewards, or None."""
    from .provenance import RewardsLogged
    if args.ppo_config:
        from .ppo_config import read_ppo_config
        settings = read_ppo_config(args.ppo_config, grpo=True)
        if settings.framework != "nemo-rl":
            raise RolloutError(f"--ppo-config {args.ppo_config}: a {settings.framework} config; only NeMo-RL applies its "
                               "reward settings before logging: state what the dump holds with --rewards-raw or "
                               "--rewards-scaled SCALE,SHIFT")
        return RewardsLogged.from_ppo_settings(settings, f"--ppo-config {args.ppo_config}")
    if args.rewards_raw:
        return RewardsLogged(stated_by="--rewards-raw")
    if args.rewards_scaled:
        return RewardsLogged.parse(args.rewards_scaled, "--rewards-scaled")
    return None


def _warn_scaled(shards: list[Path]) -> None:
    """Once, when NeMo-RL rewards fall outside its default reward_scaling source range: they are
    probably scaled already, and nothing says so."""
    from .provenance import NEMO_RL_SOURCE_RANGE
    rewards = pa.concat_arrays([pq.read_table(s, columns=["reward"]).column("reward").combine_chunks()
                                for s in shards])
    lo, hi = pc.min(rewards).as_py(), pc.max(rewards).as_py()
    smin, smax = NEMO_RL_SOURCE_RANGE
    if lo is not None and (lo < smin or hi > smax):
        _stderr(f"warning: the rewards span [{lo:g}, {hi:g}], outside [{smin:g}, {smax:g}] (NeMo-RL's default "
                "reward_scaling source range); NeMo-RL logs rewards after reward_scaling and reward_shaping, so "
                "these may be scaled already: re-convert with --ppo-config <the collecting run's YAML> (or "
                "--rewards-raw / --rewards-scaled SCALE,SHIFT) so that training and seed check know the scale")


def _mapping_arg(text: str) -> tuple[str, str]:
    column, sep, source_field = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"'{text}': write COLUMN=FIELD, e.g. input_ids=tokens")
    return column.strip(), source_field.strip()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)




