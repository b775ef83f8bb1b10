"""``critic-pretrain seed``: check a seed before a PPO run loads it (argparse and printing over
``critic_pretrain.interop.check``)."""

from __future__ import annotations

import argparse
import json
import sys

from ..interop.check import __doc__ as LIBRARY_DOC
from ..interop.check import check_seed
from ..interop.frameworks import FRAMEWORKS, TARGETS, config_lines
from ..interop.seed_report import SeedReport


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="critic-pretrain seed", description=LIBRARY_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="check a seed before a PPO run loads it",
                           description="Check that a critic seed loads correctly into the PPO framework (keys, "
                                       "shapes, head, finite weights, optimizer, training info) and print the config "
                                       "lines to paste; optionally score it on the current policy's rollouts.")
    check.add_argument("path", help="the step_<n> folder (or, with --for another target, its exported folder)")
    check.add_argument("--for", dest="target", choices=TARGETS, default="nemo-rl",
                       help="the framework that will load it (default: nemo-rl)")
    check.add_argument("--model-config", help="the PPO model's folder or config.json: its hidden size, vocabulary "
                                              "and layers must match the seed")
    check.add_argument("--rollouts", nargs="+", metavar="PATH",
                       help="fresh rollouts of the PPO run's current policy: fail when the critic is no better there "
                            "than the group-mean baseline (with oracle_values: its lambda-0.95 advantage correlation "
                            "at turn-first tokens against the group mean held as the value; otherwise: its explained "
                            "variance against the leave-one-out group mean's)")
    check.add_argument("--ppo-config", metavar="FILE",
                       help="the PPO run's config: a NeMo-RL or verl YAML, verl key=value overrides, or an OpenRLHF "
                            "command line in a file; fails on a gamma or reward-scale mismatch, warns on lambda, "
                            "reward shaping/normalisation and context length, checks its critic model's architecture")
    check.add_argument("--legacy-nemo-rl", action="store_true",
                       help="also check what NeMo-RL before PR #4213 does with the optimizer state (its lr and "
                            "scheduler class); the current NeMo-RL warm-starts from the weights only")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = check_seed(args.path, args.target, args.model_config, rollouts=args.rollouts,
                        legacy_nemo_rl=args.legacy_nemo_rl, ppo_config=args.ppo_config)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return 0 if report.ok else 1
    return print_report(report)


def print_report(report: SeedReport) -> int:
    """Print a seed check the way the CLI does (problems and warnings to stderr, then the
    summary and the config lines to paste); 0 when the seed is usable, else 1."""
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not report.ok:
        print(report.summary(), file=sys.stderr)
        return 1
    print(report.summary())
    if report.export_source:
        print(f"\n# next: critic-pretrain export {report.path} --format "
              f"{FRAMEWORKS[report.target].export_format} --out <dir>, then check <dir> with --for {report.target}")
        return 0
    opt = report.facts.get("optimizer")
    sched = None if not opt else ("sequential" if opt["scheduler"].startswith("SequentialLR") else "lambda")
    print()
    print("\n".join(config_lines(report.target, report.path, report.facts, scheduler=sched)))
    return 0
