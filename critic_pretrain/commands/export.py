"""``critic-pretrain export``: a checkpoint for NeMo-RL, verl (hf), OpenRLHF, TRL, ROLL or SkyRL
(argparse and printing over ``critic_pretrain.interop.export``)."""

from __future__ import annotations

import argparse

from ..interop.export import CONSTANT_TOTAL_ITERS, FORMAT_ALIASES, FORMATS, SCHEDULERS, export
from ..interop.export import __doc__ as LIBRARY_DOC


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="critic-pretrain export", description=LIBRARY_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step_dir", metavar="STEP_DIR", help="the step_<n> checkpoint to export")
    p.add_argument("--format", required=True, choices=[*FORMATS, *FORMAT_ALIASES], help="the consumer (verl = hf)")
    p.add_argument("--out", required=True, help="output folder (nemo-rl writes OUT/step_<n>)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast the weights")
    p.add_argument("--tokenizer", help="tokenizer folder or hub id to include (default: the checkpoint's)")
    p.add_argument("--drop-optimizer", action="store_true", help="nemo-rl: leave out value/optimizer")
    p.add_argument("--scheduler", choices=SCHEDULERS, default="lambda",
                   help="nemo-rl: scheduler state for an older NeMo-RL that loads it: lambda (no value.scheduler) or "
                        "sequential (value.scheduler = ConstantLR + milestones: [], the PPO example)")
    p.add_argument("--lr", type=float, help="nemo-rl: learning rate the optimizer state carries (an older NeMo-RL "
                                            "continues from it); default: the run's peak lr when rewriting")
    p.add_argument("--total-iters", type=int, default=CONSTANT_TOTAL_ITERS,
                   help="nemo-rl, --scheduler sequential: ConstantLR total_iters of the PPO config")
    p.add_argument("--copy", action="store_true", help="nemo-rl: copy files instead of hard-linking them")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = export(args.step_dir, args.format, args.out, dtype=args.dtype, drop_optimizer=args.drop_optimizer,
                    tokenizer=args.tokenizer, scheduler=args.scheduler, lr=args.lr, total_iters=args.total_iters,
                    link=not args.copy, overwrite=args.overwrite)
    print(result.summary())
    return 0
