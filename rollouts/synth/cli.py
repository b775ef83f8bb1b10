"""``rollouts synth``: generate a synthetic archive from the command line."""

from __future__ import annotations

import argparse

from ..errors import RolloutError
from ..writer import DEFAULT_SHARD_ROWS
from .archive import write_with_manifest
from .multiturn import SynthParams
from .vocab import MAX_NEED, MAX_TURNS


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = SynthParams()
    p = sub.add_parser("synth", help="generate synthetic rollouts with exact oracle values",
                       description="Generate synthetic multi-turn rollouts (schema v1) whose true state "
                                   "values are known exactly (oracle_values). Writes part-*.parquet "
                                   "shards and a _synth.json manifest with the parameters and value "
                                   "statistics.")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--rows", type=int, required=True, help="number of rollouts")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--shard-rows", type=int, default=DEFAULT_SHARD_ROWS,
                   help=f"rows per shard (default {DEFAULT_SHARD_ROWS})")
    p.add_argument("--median-length", type=float, default=d.median_length,
                   help=f"target median row length in tokens (default {d.median_length:g})")
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help=f"rows are truncated at this many tokens (default {d.max_length})")
    p.add_argument("--length-sigma", type=float, default=d.length_sigma,
                   help=f"length tail heaviness (default {d.length_sigma:g})")
    p.add_argument("--group-size", type=int, default=d.group_size,
                   help=f"rollouts per prompt (default {d.group_size})")
    p.add_argument("--max-turns", type=int, default=d.max_turns,
                   help=f"policy turns before GAME_OVER, <= {MAX_TURNS} (default {d.max_turns})")
    p.add_argument("--max-need", type=int, default=d.max_need,
                   help=f"most successful turns a task needs, <= {MAX_NEED} (default {d.max_need})")
    p.add_argument("--token-penalty", type=float, default=d.token_penalty,
                   help="reward of -X on every policy token, written as token_rewards (default 0)")
    p.add_argument("--gamma", type=float, default=d.gamma,
                   help="discount per policy token for oracle_values (default 1)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace part-*.parquet shards already in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = {"median_length": args.median_length, "max_length": args.max_length,
              "length_sigma": args.length_sigma, "group_size": args.group_size,
              "max_turns": args.max_turns, "max_need": args.max_need,
              "token_penalty": args.token_penalty, "gamma": args.gamma}
    try:
        paths, manifest = write_with_manifest(args.out, args.rows, args.seed, args.shard_rows, args.overwrite, params)
    except RolloutError:
        raise
    except ValueError as e:  # bad parameters: a user error like any other
        raise RolloutError(str(e)) from None
    st = manifest["stats"]
    length, value, ev = st["length"], st["oracle_value"], st["explained_variance"]
    print(f"wrote {st['rows']:,} rows ({st['tokens']:,} tokens) in {len(paths)} shard(s) to {args.out}: "
          f"length p50 {length['p50']:.0f} p99 {length['p99']:.0f} max {length['max']} "
          f"({st['truncated_rows']} truncated), reward mean {st['reward_mean']:.3f}, oracle value at "
          f"policy tokens mean {value['mean']:.3f} std {value['std']:.3f}, explained variance of "
          f"returns: oracle {ev['oracle']:.3f}, prompt only {ev['prompt_only']:.3f}")
    return 0
