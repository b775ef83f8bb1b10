"""Command line: ``critic-pretrain <command> ...`` (see ``--help``).

Every command reports bad input as one ``error: ...`` line and a non-zero exit code,
never a traceback; ``CRITIC_PRETRAIN_DEBUG=1`` shows the traceback for bug reports.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import USER_ERRORS, UserError

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def _train(args: argparse.Namespace) -> int:
    from .train import main as train_main
    return train_main(args.rest)


def _demo(args: argparse.Namespace) -> int:
    if not DEMO_CONFIG.is_file():
        raise UserError(f"{DEMO_CONFIG} not found: run the demo from a checkout of critic-pretrain")
    from .train import main as train_main
    return train_main(["--config", str(DEMO_CONFIG), *args.rest])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="critic-pretrain",
                                     description="Pretrain a PPO critic offline on collected rollouts.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", add_help=False, help="train a value model (--config FILE key=value ...)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_train)
    p = sub.add_parser("demo", add_help=False,
                       help="train the tiny default on the bundled sample rollouts (configs/demo.yaml)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_demo)
    from rollouts import cli as rollouts_cli
    rollouts_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        if os.environ.get("CRITIC_PRETRAIN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
