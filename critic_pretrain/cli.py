"""Command line: ``critic-pretrain <command> ...`` (see ``--help``).

Every command reports bad input as one ``error: ...`` line and a non-zero exit code,
never a traceback; ``CRITIC_PRETRAIN_DEBUG=1`` shows the traceback for bug reports.
"""

from __future__ import annotations

import argparse
import os
import sys

from rollouts.errors import RolloutError


class UserError(Exception):
    """Bad input or configuration: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="critic-pretrain",
                                     description="Pretrain a PPO critic offline on collected rollouts.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    from rollouts import cli as rollouts_cli
    rollouts_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RolloutError, UserError) as e:
        if os.environ.get("CRITIC_PRETRAIN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
