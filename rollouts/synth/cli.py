"""``rollouts synth``: generate a synthetic archive from the command line."""

from __future__ import annotations

import argparse

from ..errors import RolloutError
from ..writer import DEFAULT_SHARD_ROWS
from .archive import write_with_manifest
from .chain import SynthParams
from .envs import ENVIRONMENTS
from .vocab import MAX_NEED, MAX_TURNS

_PARAMS = {  # flag -> (SynthParams field, type, help); unset flags take the environment's defaults
    "--median-length": ("median_length", float, "target median row length in tokens"),
    "--max-length": ("max_length", int, "rows are truncated at this many tokens"),
    "--length-sigma": ("length_sigma", float, "length tail heaviness"),
    "--group-size": ("group_size", int, "rollouts per prompt"),
    "--max-turns": ("max_turns", int, f"policy turns before GAME_OVER, <= {MAX_TURNS}"),
    "--max-need": ("max_need", int, f"most successful turns / key steps / test pairs a task needs, <= {MAX_NEED}"),
    "--token-penalty": ("token_penalty", float, "reward of -X on every policy token, written as token_rewards"),
    "--step-reward": ("step_reward", float, "tools: +X on a good action's token, -X on a bad one's (token_rewards)"),
    "--gamma": ("gamma", float, "discount per policy token for oracle_values"),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = SynthParams()
    p = sub.add_parser("synth", help="generate synthetic rollouts with exact oracle values",
                       description="Generate synthetic rollouts (schema v1) whose true state values are known "
                                   "exactly (oracle_values), from one of several environments, each with a "
                                   "credit structure of its own (--list). Writes part-*.parquet shards and a "
                                   "_synth.json manifest with the parameters, value statistics and the "
                                   "calibration check of the values.")
    p.add_argument("--out", help="output folder")
    p.add_argument("--rows", type=int, help="number of rollouts")
    p.add_argument("--env", default="tools", choices=list(ENVIRONMENTS),
                   help="the environment (default tools, the bundled sample's); --list says what each tests")
    p.add_argument("--list", action="store_true", help="print the environments and where their credit sits")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--shard-rows", type=int, default=DEFAULT_SHARD_ROWS,
                   help=f"rows per shard (default {DEFAULT_SHARD_ROWS})")
    for flag, (name, kind, text) in _PARAMS.items():
        p.add_argument(flag, type=kind, default=None, help=f"{text} (default {getattr(d, name):g}, or the "
                                                             "environment's own)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace part-*.parquet shards already in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name, env in ENVIRONMENTS.items():
            changed = ", ".join(f"{k}={v:g}" for k, v in env.defaults.items())
            print(f"{name:10s} {env.credit}" + (f" ({changed})" if changed else ""))
        return 0
    if args.out is None or args.rows is None:
        raise RolloutError("rollouts synth needs --out FOLDER and --rows N (or --list)")
    params = {name: getattr(args, flag[2:].replace("-", "_")) for flag, (name, _, _) in _PARAMS.items()}
    params = {k: v for k, v in params.items() if v is not None}
    try:
        paths, manifest = write_with_manifest(args.out, args.rows, args.seed, args.shard_rows, args.overwrite,
                                              {"env": args.env, **params})
    except RolloutError:
        raise
    except ValueError as e:  # bad parameters: a user error like any other
        raise RolloutError(str(e)) from None
    st = manifest["stats"]
    length, value, ev, cal = st["length"], st["oracle_value"], st["explained_variance"], st["calibration"]
    print(f"wrote {st['rows']:,} {args.env} rows ({st['tokens']:,} tokens) in {len(paths)} shard(s) to {args.out}: "
          f"length p50 {length['p50']:.0f} p99 {length['p99']:.0f} max {length['max']} "
          f"({st['truncated_rows']} truncated), reward mean {st['reward_mean']:.3f}, oracle value at "
          f"policy tokens mean {value['mean']:.3f} std {value['std']:.3f}, explained variance of "
          f"returns: oracle {ev['oracle']:.3f}, prompt only {ev['prompt_only']:.3f}; return on value at "
          f"{cal['states']:,} random states: slope {cal['slope']:.3f} ± {cal['slope_se']:.3f}, intercept "
          f"{cal['intercept']:+.3f} ± {cal['intercept_se']:.3f} (exact values: 1 and 0)")
    return 0
