"""What every dump format shares: the ``Source`` protocol the conversion engine drives, the
bad-row and bad-file exceptions it turns into one-line problems, and JSONL / parquet record
readers with nested-field lookup."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import RolloutError
from ..paths import PARQUET_SUFFIXES, resolve

try:  # optional: parses dump lines about 7x faster than the standard library (docs/converters.md)
    import orjson
except ImportError:
    orjson = None

PARQUET_BATCH_ROWS = 64
MISSING = object()
"""``lookup``'s answer for a field a record does not have."""


class BadRow(Exception):
    """A source row that cannot be converted; the engine adds file and row."""

    def __init__(self, column: str | None, reason: str, fix: str, kind: str):
        super().__init__(reason)
        self.column, self.reason, self.fix, self.kind = column, reason, fix, kind


class BadFile(BadRow):
    """A whole input file that cannot be converted (from ``row`` on, when given)."""

    def __init__(self, reason: str, fix: str, kind: str, row: int | None = None):
        super().__init__(None, reason, fix, kind)
        self.row = row


class Source(Protocol):
    """What the engine needs from a dump format."""

    files: list[Path]
    columns: list[str]
    """Schema columns every output row carries (``None`` where a row has no value)."""
    extra_names: list[str]
    """Source fields kept as extra columns (``--keep-extra``)."""
    derive_group_id: bool
    """Fill ``group_id`` with a hash of the prompt tokens."""

    def records(self, path: Path) -> Iterator[tuple[int, dict | BadRow]]:
        """(row, record or problem) of one file; raises ``BadFile`` for an unusable file."""

    def convert(self, path: Path, row: int, rec: dict) -> dict:
        """Schema columns (and extras) of one record; raises ``BadRow``."""

    def field_of(self, column: str) -> str | None:
        """Source field a schema column comes from, for messages."""

    def fix_for(self, column: str) -> str:
        """What to do when ``column``'s source field holds the wrong type."""


def jsonl_records(path: Path) -> Iterator[tuple[int, dict | BadRow]]:
    """(0-based line number, object or problem) for each non-blank line."""
    with open(path, "rb") as f:
        for row, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = loads(line)
            except ValueError as e:  # also UnicodeDecodeError
                yield row, BadRow(None, f"not valid JSON ({short(e)})",
                                   "fix or delete the line (a dump cut off while being written ends in one)",
                                   "bad_json")
                continue
            if not isinstance(rec, dict):
                yield row, BadRow(None, f"a JSON {type(rec).__name__}, not an object",
                                   "each line must be one JSON object (one rollout)", "bad_json")
                continue
            yield row, rec


def loads(line: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass  # NaN/Infinity (Python's json.dumps writes them) or a broken line: json says which
    return json.loads(line)


def first_keys(path: Path) -> list[str]:
    """Field names of a file's first record (a JSONL line or the parquet schema)."""
    if path.suffix in PARQUET_SUFFIXES:
        try:
            return pq.read_schema(path).names
        except (pa.ArrowException, OSError):
            return []  # reported when the file is read
    for _, rec in jsonl_records(path):
        if isinstance(rec, dict):
            return list(rec)
    return []


def union_keys(files: Iterable[Path]) -> list[str]:
    keys: dict[str, None] = {}
    for f in files:
        keys.update(dict.fromkeys(first_keys(f)))
    return list(keys)


def unwrap(value: Any) -> Any:
    """NeMo-RL logs a batch of one per line: every field is wrapped in a one-element list."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def parquet_records(path: Path) -> Iterator[tuple[int, dict | BadRow]]:
    try:
        pf = pq.ParquetFile(path, memory_map=False, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise BadFile(f"not a readable parquet file ({short(e)})",
                       "the file is truncated or corrupt: re-copy or re-export it", "corrupt_file")
    with pf:
        row = 0
        # Small batches: to_pylist turns every token into a python object (see CHUNK_TOKENS).
        batches = pf.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as e:
                raise BadFile(f"cannot decode rows from here on ({short(e)})",
                               "the file is truncated or corrupt: re-copy or re-export it", "corrupt_file", row)
            for rec in batch.to_pylist():
                yield row, rec
                row += 1


def lookup(rec: dict, path: str) -> Any:
    """``rec[path]``, else follow a dotted path through nested objects; ``MISSING`` if absent."""
    if path in rec:
        return rec[path]
    value: Any = rec
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def top(path: str) -> str:
    return path.split(".", 1)[0]


def show(value: Any) -> str:
    """A value, short, for a message."""
    text = json.dumps(value) if isinstance(value, (list, dict, str)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def short(e: Exception) -> str:
    msg = " ".join(str(e).split())
    return msg[:160] + ("..." if len(msg) > 160 else "")


def prompt_hash(prompt: Any) -> str:
    """The ``group_id`` of a prompt: the first 16 hex digits of BLAKE2b over its token ids as
    little-endian int64 (the same on every machine and run; docs/converters.md)."""
    return hashlib.blake2b(np.asarray(prompt, dtype="<i8").tobytes(), digest_size=8).hexdigest()


def dump_files(paths, suffixes: tuple[str, ...], keep: Callable[[Path, bool], bool], missing: str,
               order: Callable[[Path], Any], check: Callable[[list[Path], list[Path], bool], None] | None = None
               ) -> tuple[list[Path], list[Path]]:
    """A dump's files (each spec: a file, folder or glob) in ``order``, and the other files of
    ``suffixes`` found in folders (ignored). ``keep(file, explicit)`` says which found files belong
    to the dump (``explicit``: the spec names that file); a spec with none is a one-line error
    ``{spec}: {missing}``; ``check(found, kept, explicit)`` may refuse a spec first."""
    files: list[Path] = []
    ignored: list[Path] = []
    for spec in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        found = resolve(spec, suffixes=suffixes)
        explicit = Path(spec).is_file()
        kept = [f for f in found if keep(f, explicit)]
        if check is not None:
            check(found, kept, explicit)
        if not kept:
            raise RolloutError(f"{spec}: {missing}")
        ignored += [f for f in found if f not in kept]
        files += sorted(kept, key=order)
    return list(dict.fromkeys(files)), ignored
