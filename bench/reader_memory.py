"""Streaming a rollout archive larger than we want in memory: peak RSS and throughput.

Writes an archive of ``--gb`` GB (incompressible random token ids, lognormal lengths,
several shards), then reads and validates it with ``RolloutReader`` in a fresh
subprocess and reports that process's peak RSS and rows/tokens per second.

    .venv/bin/python bench/reader_memory.py --gb 2 [--dir /tmp/critic-bench]

The issue's bar: a 2 GB archive reads in under 1 GB RSS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollouts import ShardWriter  # noqa: E402

CHUNK_ROWS = 1024


def make_archive(out: Path, gb: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    target = gb * 1e9
    written, chunk = 0, 0
    with ShardWriter(out, shard_rows=16 * CHUNK_ROWS, compression="zstd") as w:
        while written < target:
            lengths = np.clip(rng.lognormal(np.log(1400), 0.8, CHUNK_ROWS), 64, 8192).astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            n_tok = int(offsets[-1])
            ids = rng.integers(0, 150_000, n_tok, dtype=np.int32)
            pos = np.arange(n_tok) - np.repeat(offsets[:-1], lengths)
            mask = (pos >= np.repeat(lengths // 4, lengths)).astype(np.int8)  # prompt = first quarter
            table = pa.table({
                "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
                "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
                "reward": pa.array(rng.integers(0, 2, CHUNK_ROWS).astype(np.float64)),
                "sample_id": pa.array([f"c{chunk}-{i}" for i in range(CHUNK_ROWS)]),
            })
            w.write_table(table.cast(pa.schema([
                ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                ("reward", pa.float64()), ("sample_id", pa.string())])))
            written = sum(p.stat().st_size for p in out.glob("*.parquet*"))
            chunk += 1


def read_child(path: str) -> None:
    import resource

    from rollouts import RolloutReader

    t0 = time.perf_counter()
    reader = RolloutReader(path, on_bad="fail")
    for _ in reader:
        pass
    dt = time.perf_counter() - t0
    s = reader.summary
    print(json.dumps({"seconds": dt, "rows": s.rows, "tokens": s.tokens, "files": s.files,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp/critic-bench-archive")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return read_child(args.child)
    out = Path(args.dir) / f"{args.gb:g}gb"
    if not out.exists() or not any(out.glob("*.parquet")):
        t0 = time.perf_counter()
        make_archive(out, args.gb)
        print(f"wrote {out} in {time.perf_counter() - t0:.0f}s")
    size = sum(p.stat().st_size for p in out.glob("*.parquet"))
    res = json.loads(subprocess.run([sys.executable, __file__, "--child", str(out)], check=True,
                                    capture_output=True, text=True).stdout)
    print("| archive | files | rows | tokens | read+validate | tokens/s | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {size / 1e9:.2f} GB | {res['files']} | {res['rows']:,} | {res['tokens'] / 1e6:.0f}M | "
          f"{res['seconds']:.1f} s | {res['tokens'] / res['seconds'] / 1e6:.1f}M | {res['peak_rss_mb']:.0f} MB |")
    if res["peak_rss_mb"] > 1024:
        print("FAIL: peak RSS above 1 GB", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
