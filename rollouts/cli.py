"""``critic-pretrain rollouts ...`` (also ``python -m rollouts ...``): check, convert, synth, schema.

Torch-free. Each subcommand module exposes ``add_parser(subparsers)`` which registers its
parser with ``func=run``; ``run(args) -> int`` returns the exit code.

``run_command`` is the one error handler of every command of both packages (``critic-pretrain``
routes through it too): a ``UserError`` prints one ``error: ...`` line and exits with its code
(2), Ctrl-C exits 130, a closed pipe exits 0; ``CRITIC_PRETRAIN_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable

from .errors import RolloutError, UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollouts", help="check, convert and synthesise rollout archives",
                       description="Rollout archives: validate, convert other dumps into schema v1, "
                                   "generate synthetic rollouts.")
    rsub = p.add_subparsers(dest="rollouts_cmd", required=True, metavar="{check,convert,synth,schema}")
    _add_check(rsub)
    from . import convert, synth
    convert.add_parser(rsub)
    synth.add_parser(rsub)
    s = rsub.add_parser("schema", help="print rollout schema v1")
    s.set_defaults(func=lambda args: print(__import__("rollouts.schema").schema.describe()) or 0)


def _add_check(rsub) -> None:
    p = rsub.add_parser("check", help="validate rollouts and print a summary",
                        description="Validate rollout parquet files (files, folders, globs) and print a "
                                    "summary and a per-problem report. Exit code 1 when problems were found.")
    p.add_argument("paths", nargs="+", help="files, folders (searched recursively) or globs")
    p.add_argument("--on-bad", choices=["skip", "fail"], default="skip",
                   help="skip: report every bad row and continue (default); fail: stop at the first")
    p.add_argument("--quarantine", metavar="JSONL", help="write one line per bad row/file (file, row, reason)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--max-problems", type=int, default=20, help="problem lines to print (default 20)")
    vocab = p.add_mutually_exclusive_group()
    vocab.add_argument("--vocab-size", type=int, metavar="N", help="token ids must be below N (the model's vocabulary)")
    vocab.add_argument("--model", metavar="PATH", help="take --vocab-size from this model folder's config.json")
    p.set_defaults(func=run_check)


def vocab_size_of(model: str) -> int:
    """``vocab_size`` from a model folder's (or a config.json file's) config, without torch."""
    from pathlib import Path
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RolloutError(f"--model {model}: cannot read {path} ({getattr(e, 'strerror', None) or e}); "
                           "pass a local model folder with a config.json, or --vocab-size N") from None
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if not isinstance(size, int) or size <= 0:
        raise RolloutError(f"--model {model}: {path} has no vocab_size; pass --vocab-size N")
    return size


def run_check(args: argparse.Namespace) -> int:
    from .reader import check

    vocab = args.vocab_size if args.vocab_size is not None else (vocab_size_of(args.model) if args.model else None)
    if vocab is not None and vocab <= 0:
        raise RolloutError(f"--vocab-size {vocab} must be > 0")
    reader = check(args.paths, on_bad=args.on_bad, quarantine=args.quarantine, vocab_size=vocab)
    summary = reader.summary
    if args.json:
        print(json.dumps({"summary": summary.to_dict(),
                          "problems": [p.line() for p in reader.problems[: args.max_problems]]}, indent=2))
    else:
        print(summary.format())
        for warning in summary.warnings():
            print(f"\nwarning: {warning}")
        if reader.problems:
            print(f"\n{len(reader.problems)} problem(s):")
            for p in reader.problems[: args.max_problems]:
                print("  " + p.line())
            if len(reader.problems) > args.max_problems:
                print(f"  ... {len(reader.problems) - args.max_problems} more"
                      + (f" (all in {args.quarantine})" if args.quarantine else "; use --quarantine FILE for all"))
        else:
            print("\nno problems found")
    return 1 if reader.problems else 0


def run_command(fn: Callable[..., int], *args) -> int:
    """Run a command; the one place a user error becomes ``error: <message>`` and an exit code."""
    try:
        return fn(*args)
    except UserError as e:
        if os.environ.get("CRITIC_PRETRAIN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollouts")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = parser.parse_args(["rollouts", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args.func, args)
