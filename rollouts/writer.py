"""Write schema-v1 parquet shards.

Shards are written to ``<name>.parquet.tmp`` and renamed when complete, so a crashed
conversion never leaves a half-written file that a reader would pick up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from .schema import COLUMNS, canonical_schema

# Row groups of a few thousand rollouts keep a streaming reader's memory small.
DEFAULT_ROW_GROUP_ROWS = 1024
DEFAULT_SHARD_ROWS = 65536


def table_from_rows(rows: Sequence[Mapping], extra: pa.Schema | None = None) -> pa.Table:
    """Build a canonical table from python rows (dicts). Unknown keys need ``extra`` types."""
    present = [c.name for c in COLUMNS if any(c.name in r for r in rows)]
    extra_names = [f.name for f in extra] if extra is not None else []
    schema = canonical_schema(present, extra)
    data = {name: [r.get(name) for r in rows] for name in present + extra_names}
    return pa.Table.from_pydict(data, schema=schema)


class ShardWriter:
    """Append tables (or rows) and roll over to a new shard every ``shard_rows`` rows.

    Use as a context manager; shards are named ``{prefix}-{index:05d}.parquet``.
    """

    def __init__(self, out_dir: str | os.PathLike, *, prefix: str = "part",
                 shard_rows: int = DEFAULT_SHARD_ROWS,
                 row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                 compression: str = "zstd"):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.shard_rows = shard_rows
        self.row_group_rows = row_group_rows
        self.compression = compression
        self.paths: list[Path] = []
        self.rows_written = 0
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._rows_in_shard = 0
        self._tmp: Path | None = None

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # do not publish a partial shard
            self._abort()

    def write_rows(self, rows: Sequence[Mapping], extra: pa.Schema | None = None) -> None:
        if rows:
            self.write_table(table_from_rows(rows, extra))

    def write_table(self, table: pa.Table) -> None:
        if self._schema is not None and not table.schema.equals(self._schema, check_metadata=False):
            table = table.cast(self._schema)
        offset = 0
        while offset < table.num_rows:
            if self._writer is None:
                self._open(table.schema)
            take = min(table.num_rows - offset, self.shard_rows - self._rows_in_shard)
            self._writer.write_table(table.slice(offset, take), row_group_size=self.row_group_rows)
            offset += take
            self._rows_in_shard += take
            self.rows_written += take
            if self._rows_in_shard >= self.shard_rows:
                self._finish_shard()

    def close(self) -> list[Path]:
        if self._writer is not None:
            self._finish_shard()
        return self.paths

    def _open(self, schema: pa.Schema) -> None:
        self._schema = schema
        final = self.out_dir / f"{self.prefix}-{len(self.paths):05d}.parquet"
        self._tmp = final.with_name(final.name + ".tmp")
        self._writer = pq.ParquetWriter(self._tmp, schema, compression=self.compression)
        self._rows_in_shard = 0

    def _finish_shard(self) -> None:
        assert self._writer is not None and self._tmp is not None
        self._writer.close()
        final = self._tmp.with_name(self._tmp.name[: -len(".tmp")])
        os.replace(self._tmp, final)
        self.paths.append(final)
        self._writer, self._tmp = None, None

    def _abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)
            self._writer, self._tmp = None, None


def write_rows(out_dir: str | os.PathLike, rows: Iterable[Mapping], *, chunk: int = 4096,
               **kwargs) -> list[Path]:
    """Write python rows into schema-v1 shards under ``out_dir``; returns the shard paths."""
    buf: list[Mapping] = []
    with ShardWriter(out_dir, **kwargs) as w:
        for r in rows:
            buf.append(r)
            if len(buf) >= chunk:
                w.write_rows(buf)
                buf = []
        w.write_rows(buf)
    return w.paths
