"""Command line: ``critic-pretrain <command> ...`` (see ``--help``).

One command table (``COMMANDS``) for both packages: every command is a module with
``main(argv) -> int`` and its own argparse (``rollouts.cli`` for the torch-free data
commands, ``critic_pretrain.commands.*`` for the rest); this router imports a module only
when its command runs, so ``critic-pretrain rollouts ...`` starts fast.

Every command runs through ``rollouts.cli.run_command``, the one error handler: bad input is
one ``error: ...`` line and a non-zero exit code, never a traceback; ``CRITIC_PRETRAIN_DEBUG=1``
shows the traceback for bug reports. A module's ``main`` raises ``UserError``; it never prints
errors itself, and its ``__main__`` goes through this router.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rollouts.cli import run_command

# command -> (module with main(argv), one-line help)
COMMANDS = {
    "rollouts": ("rollouts.cli", "check, convert and synthesise rollout archives (torch-free)"),
    "train": ("critic_pretrain.commands.train", "train a value model: --config FILE [key=value ...]"),
    "demo": (None, "train the tiny default on the bundled sample rollouts (configs/demo.yaml)"),
    "eval": ("critic_pretrain.commands.eval", "evaluate a checkpoint on any rollouts and write JSON"),
    "report": ("critic_pretrain.commands.report", "PNG plots and a summary of one or more runs"),
    "export": ("critic_pretrain.commands.export",
               "export a checkpoint for NeMo-RL, verl (hf), OpenRLHF, TRL, ROLL or SkyRL"),
    "audit": ("critic_pretrain.commands.audit",
              "the critic against the policy's own Monte-Carlo values at states of held-out responses"),
    "seed": ("critic_pretrain.commands.seed", "check a seed before a PPO run loads it: seed check PATH"),
    "plan": ("critic_pretrain.commands.plan",
             "memory per GPU under DDP and FSDP2, and the largest data.max_tokens that fits"),
    "bench": ("critic_pretrain.bench", "throughput benchmark: ours vs a plain padded loop"),
    "batch": ("critic_pretrain.commands.batch", "run several train jobs from a JOBS.yaml, resumable, with a summary"),
}


def _run_module(name: str, argv: list[str]) -> int:
    if name is None:  # demo
        if "-h" in argv or "--help" in argv:  # else train's help would answer, under its own name
            print("critic-pretrain demo [key=value ...] runs `critic-pretrain train --config demo [key=value ...]`:\n"
                  "the bundled configs/demo.yaml, with the same dotted overrides. train's options follow.\n")
        name, argv = "critic_pretrain.commands.train", ["--config", "demo", *argv]  # the bundled configs/demo.yaml
    return importlib.import_module(name).main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="critic-pretrain",
                                     description="Pretrain a PPO critic offline on collected rollouts.")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for cmd, (module, help_) in COMMANDS.items():
        p = sub.add_parser(cmd, add_help=False, help=help_)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=lambda args, module=module: _run_module(module, args.rest))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not sys.stderr.isatty():  # a log file: no redrawn bars from transformers' weight loading (the hub's switch)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return run_command(_dispatch, argv)


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:  # the module parses its own options (even a leading --flag)
        return _run_module(COMMANDS[argv[0]][0], argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
