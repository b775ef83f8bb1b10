"""Benchmark: vectorised value targets vs the per-timestep reference loop.

    .venv/bin/python bench/targets.py [--batch 256 --length 8192 --repeat 3]

Builds multi-turn masks (prompt, then alternating policy and tool segments, then padding; rows
may end on a tool segment), times ``compute_returns`` / ``compute_gae`` against the
``reference_gae`` loop on the same float32 inputs, checks that they agree, and prints one
markdown table row per case. Times are the best of ``--repeat`` runs after one warm-up; torch's
thread count is left as it is. Other processes competing for the cores distort the
figures a lot (oversubscribed GEMM threads), hence the load average in the header.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference loop lives with the tests

from reference_gae import reference_gae  # noqa: E402

from critic_pretrain.targets import compute_gae, length_adaptive_lambda  # noqa: E402


def multi_turn_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``[batch, length]`` bool: prompt (0), then policy (1) / tool (0) turns, then padding (0)."""
    mask = torch.zeros(batch, length, dtype=torch.bool)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=gen))

    for row in range(batch):
        end = draw(length // 4, length + 1)  # rollout length; the rest is padding
        pos = draw(16, 512)  # prompt
        while pos < end:
            turn = draw(32, 1024)
            mask[row, pos : min(pos + turn, end)] = True
            pos += turn + draw(16, 512)  # tool / environment output
    return mask


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls after one warm-up, in seconds."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(args.seed)
    mask = multi_turn_mask(args.batch, args.length, gen)
    rewards = torch.zeros(args.batch, args.length)
    last = args.length - 1 - mask.flip(1).int().argmax(1)  # last policy token per row
    rewards[torch.arange(args.batch), last] = torch.rand(args.batch, generator=gen) * mask.any(1)
    values = torch.randn(args.batch, args.length, generator=gen)

    cases = {
        "GAE gamma=1 lam=0.95, values": {"gamma": 1.0, "lam": 0.95, "values": values},
        "Monte-Carlo gamma=1 lam=1": {"gamma": 1.0, "lam": 1.0, "values": None},
        "GAE gamma=0.99, per-row lam (VAPO alpha=0.05), values": {
            "gamma": 0.99,
            "lam": length_adaptive_lambda(mask.sum(1), alpha=0.05),
            "values": values,
        },
    }

    policy_share = mask.float().mean().item()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; "
        f"[{args.batch}, {args.length}] float32, policy tokens {policy_share:.0%}, best of {args.repeat}, "
        f"1-min load average at start {os.getloadavg()[0]:.2f}\n"
    )
    print("| case | vectorised (ms) | reference loop (ms) | speedup | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    for name, kwargs in cases.items():
        fast = compute_gae(rewards, mask, **kwargs)
        slow = reference_gae(rewards, mask, **kwargs)
        diff = max((a - b).abs().max().item() for a, b in zip(fast, slow))
        if diff > 1e-3:
            raise SystemExit(f"{name}: vectorised and reference disagree (max abs diff {diff:.3g})")
        t_fast = best_time(lambda: compute_gae(rewards, mask, **kwargs), args.repeat)
        t_slow = best_time(lambda: reference_gae(rewards, mask, **kwargs), args.repeat)
        print(f"| {name} | {t_fast * 1e3:.1f} | {t_slow * 1e3:.0f} | {t_slow / t_fast:.1f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
