"""``critic-pretrain eval``: a checkpoint on its validation split or on any rollouts, as JSON
(argparse and printing over ``critic_pretrain.eval.from_checkpoint``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import UserError
from ..eval import advantage
from ..eval.from_checkpoint import COLD_EVERY, default_out, evaluate_checkpoint, write_json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="critic-pretrain eval",
        description="Evaluate a step_<n> checkpoint on rollouts (default: its run's validation split) and write "
                    "JSON: metrics, position/turn buckets, calibration deciles, data summary.")
    p.add_argument("step_dir", metavar="STEP_DIR", help="a step_<n> folder written by critic-pretrain train")
    p.add_argument("--rollouts", nargs="+", metavar="PATH",
                   help="rollout files, folders or globs (default: the run's own validation split)")
    p.add_argument("--out", metavar="FILE.json",
                   help="where to write the JSON (default: <run>/eval/step_<n>-val.json, or -<hash>.json "
                        "for --rollouts; -maxlen<N> / -tokens<N> added with --max-length / --max-tokens)")
    p.add_argument("--max-tokens", type=int, metavar="N", help="evaluate at most about N tokens (default: all)")
    p.add_argument("--batch-tokens", type=int, metavar="N", help="tokens per micro-batch (default: the run's "
                   "data.max_tokens)")
    p.add_argument("--max-length", type=int, metavar="N",
                   help="cut rollouts at N tokens (default: the run's data.max_length, as trained; never above the "
                        "model's position limit): score a critic trained on shorter rollouts at full length")
    p.add_argument("--cold-every", type=int, default=COLD_EVERY, metavar="N",
                   help="score the run's step-0 model (the 'cold' advantage estimator, rollouts with oracle_values "
                        f"only) on every N-th micro-batch (default {COLD_EVERY}: about 1/{COLD_EVERY} more model "
                        "time); 1: all of them, 0: off")
    p.add_argument("--cache-dir", metavar="DIR", help="where --rollouts are prepared (default: a temporary folder)")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow modelling code shipped with the checkpoint's config.json (never taken from the "
                        "checkpoint's own config.yaml)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for n, flag in ((args.max_tokens, "--max-tokens"), (args.batch_tokens, "--batch-tokens"),
                    (args.max_length, "--max-length")):
        if n is not None and n <= 0:
            raise UserError(f"{flag} {n} must be > 0")
    if args.cold_every < 0:
        raise UserError(f"--cold-every {args.cold_every} must be >= 0 (0: off)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    out = Path(args.out) if args.out else default_out(Path(args.step_dir), args.rollouts, max_length=args.max_length,
                                                      token_cap=args.max_tokens)
    report = evaluate_checkpoint(args.step_dir, args.rollouts, token_cap=args.max_tokens,
                                 batch_tokens=args.batch_tokens, max_length=args.max_length,
                                 cache_dir=args.cache_dir, device=args.device,
                                 trust_remote_code=args.trust_remote_code, cold_every=args.cold_every)
    write_json(report, out)
    m = report["metrics"]
    print("  ".join(f"{k.split('/', 1)[1]}={v:.4g}" for k, v in m.items()
                    if v is not None and "_pos_" not in k and "_turn_" not in k and "adv_corr" not in k))
    print(advantage.summary_text(report, 'eval'))
    regimes = report.get("regimes") or []
    if regimes and regimes[0].get("trained_on_left_out"):
        print(f"note: {regimes[0]['trained_on_left_out']} of these rollouts are ones the critic trained on (the same "
              "tokens): the metrics above include them, the verdicts below do not")
    for regime in regimes:
        print(f"verdict ({regime['rows']} rollouts) on {regime['verdict']['line'].replace('**', '')}")
    print(f"wrote {out}")
    return 0
