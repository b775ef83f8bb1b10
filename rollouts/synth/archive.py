"""Synthetic archives on disk: schema-v1 shards plus a ``_synth.json`` manifest."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..errors import RolloutError
from ..fileio import publish_files, write_json
from ..provenance import SYNTH_MANIFEST
from ..writer import DEFAULT_SHARD_ROWS, ShardWriter
from .envs import make_env
from .oracle import ValueStats
from .vocab import VOCAB_SIZE

MANIFEST = SYNTH_MANIFEST
"""Manifest next to the shards; the leading underscore makes pyarrow / pandas dataset readers skip it.
Its presence also states the rewards raw (``provenance.rewards_logged``)."""


def write(out_dir: str | os.PathLike, rows: int, seed: int, shard_rows: int = DEFAULT_SHARD_ROWS, *,
          overwrite: bool = False, **env_params) -> list[Path]:
    """Write ``generate(rows, seed, **env_params)`` as schema-v1 shards (``part-*.parquet``)
    under ``out_dir`` plus a ``_synth.json`` manifest (parameters, seed, ``value_stats``).
    Refuses a folder that already holds parquet files unless ``overwrite``, which replaces
    earlier ``part-*.parquet`` shards (and nothing else)."""
    return write_with_manifest(out_dir, rows, seed, shard_rows, overwrite, env_params)[0]


def write_with_manifest(out_dir: str | os.PathLike, rows: int, seed: int, shard_rows: int, overwrite: bool,
           env_params: dict) -> tuple[list[Path], dict]:
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    env = make_env(**env_params)
    out = Path(out_dir)
    old = _shards_to_replace(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    # Staged in a hidden folder inside `out` (readers skip it): the folder shows the old shards
    # or the new ones, never a half-written mix, whatever stops the generator.
    staging = Path(tempfile.mkdtemp(prefix=".synth-", dir=out))
    try:
        stats = ValueStats(env.params.gamma, seed, horizon=int(2 * env.params.median_length))
        with ShardWriter(staging, shard_rows=shard_rows) as writer:
            for table in env.tables(rows, seed):
                stats.add(table)
                writer.write_table(table)
        manifest = {
            "generator": "rollouts.synth",
            "rows": rows,
            "seed": seed,
            "shard_rows": shard_rows,
            "params": asdict(env.params),
            "length_scale": env.scale,
            "vocab_size": VOCAB_SIZE,
            "shards": [p.name for p in writer.paths],
            "stats": stats.result(),
        }
        write_json(staging / MANIFEST, manifest)
        published = publish_files([*writer.paths, staging / MANIFEST], out, old)
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [p for p in published if p.suffix == ".parquet"], manifest


def _shards_to_replace(out: Path, overwrite: bool) -> list[Path]:
    """The shards new ones will replace; refuses to mix with other parquet files."""
    existing = sorted(out.glob("*.parquet")) if out.is_dir() else []
    if not existing:
        return []
    if not overwrite:
        raise RolloutError(f"{out} already holds {len(existing)} parquet file(s); write to an empty "
                           "folder, or pass --overwrite to replace its part-*.parquet shards")
    foreign = [p.name for p in existing if not p.match("part-*.parquet")]
    if foreign:
        raise RolloutError(f"{out} holds parquet files this generator does not write ({', '.join(foreign[:3])}); "
                           "refusing to mix them with synthetic shards: use another folder")
    return existing
