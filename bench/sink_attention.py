"""gpt-oss attention sinks: through SDPA (what critic_packed runs) against the eager formula, in one run.

    python bench/sink_attention.py [--lengths 512 2048 4096] [--heads 4 --kv-heads 2 --head-dim 16] [--device cpu]

One rollout's attention per call, forward and backward, as training runs it: ``_sdpa_with_sinks``
(a sink key every query sees, O(L) memory where the kernel is flash) and the eager formula
(softmax over [logits, sink] with [H, L, L] logits in memory, what critic_packed ran for sinks
before session eighteen). The two alternate per repeat; the figure is the ratio of their medians
and the largest difference of their outputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from critic_pretrain import attention  # noqa: E402


def eager(q, k, v, sinks, scale):
    """The eager formula (transformers' gpt-oss eager attention on one sequence, no window)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    L = q.shape[2]
    logits = (q @ k.transpose(-1, -2) * scale).masked_fill(~attention._band(L, L, q.device), float("-inf"))
    sink = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, L, 1)
    return torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1] @ v


def timed(fn, args, device) -> float:
    t0 = time.perf_counter()
    out = fn(*args)
    out.sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", nargs="+", type=int, default=[512, 2048, 4096])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    print("| L | SDPA + sink key (ms) | eager formula (ms) | eager / SDPA | max abs diff |\n|---|---|---|---|---|")
    for L in args.lengths:
        torch.manual_seed(0)
        q = torch.randn(1, args.heads, L, args.head_dim, device=device, requires_grad=True)
        k, v = (torch.randn(1, args.kv_heads, L, args.head_dim, device=device, requires_grad=True) for _ in "kv")
        sinks = torch.randn(args.heads, device=device, requires_grad=True)
        scale = args.head_dim ** -0.5
        x = attention.Extras(sinks=sinks)
        ours = lambda: attention._attend(q, k, v, None, x)  # noqa: E731
        ref = lambda: eager(q, k, v, sinks, scale)  # noqa: E731
        with torch.no_grad():
            diff = float((ours() - ref()).abs().max())
        times = {"ours": [], "ref": []}
        for _ in range(args.repeats + 1):  # the first of each is a warm-up
            times["ours"].append(timed(ours, (), device))
            times["ref"].append(timed(ref, (), device))
        a, b = (statistics.median(times[n][1:]) * 1e3 for n in ("ours", "ref"))
        print(f"| {L} | {a:.1f} | {b:.1f} | {b / a:.1f}x | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
