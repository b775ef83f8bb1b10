"""``critic-pretrain plan``: memory per GPU and the largest data.max_tokens that fits (argparse
and printing over ``critic_pretrain.plan``)."""

from __future__ import annotations

import argparse

from ..plan import __doc__ as LIBRARY_DOC
from ..plan import make_plan, render


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="critic-pretrain plan", description=LIBRARY_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="run config (configs/*.yaml); its model section is planned")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. model.config=...")
    p.add_argument("--world", type=int, default=8, help="ranks (GPUs) the run will use (default 8)")
    p.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU in GB (default 80; H200: 141)")
    return p


def main(argv: list[str] | None = None) -> int:
    from ..config_io import load_config
    from ..errors import UserError
    args = build_parser().parse_args(argv)
    if args.world < 1 or args.gpu_gb <= 0:
        raise UserError("--world must be >= 1 and --gpu-gb > 0")
    cfg = load_config(args.config, ["data.train=[plan]", *args.overrides])
    print(render(make_plan(cfg), args.world, args.gpu_gb))
    return 0
