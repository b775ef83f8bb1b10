"""``critic-pretrain report``: PNG plots, report.md and values.html of one or more runs (argparse and
printing over ``critic_pretrain.report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError
from ..report import PAGE_ROLLOUTS, write_report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="critic-pretrain report",
                                description="PNG plots and a summary (report.md) of one or more runs, overlaid.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="output_dir of a run (holds metrics.jsonl)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: <first RUN_DIR>/report)")
    p.add_argument("--no-eval", action="store_true",
                   help="do not evaluate a checkpoint for the calibration plot (use a cached eval JSON only)")
    p.add_argument("--page-rollouts", type=int, default=PAGE_ROLLOUTS, metavar="N",
                   help=f"held-out rollouts of the picked checkpoint that values.html shows token by token "
                        f"(default {PAGE_ROLLOUTS}; 0: no page; skipped with --no-eval)")
    p.add_argument("--eval", dest="eval_jsons", action="append", default=[], metavar="FILE.json",
                   help="also plot the calibration of this `critic-pretrain eval` output (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.page_rollouts < 0:
        raise UserError(f"--page-rollouts {args.page_rollouts}: must be >= 0 (0: no values.html)")
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report"
    written, text = write_report(args.run_dirs, out, evaluate=not args.no_eval, eval_jsons=args.eval_jsons,
                                 page_rollouts=args.page_rollouts)
    print(text)
    print(f"wrote {len(written)} files to {out}")
    return 0
