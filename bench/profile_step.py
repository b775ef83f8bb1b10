"""Where a training step's time goes: torch.profiler over a few steps of the throughput
benchmark's variants (critic_pretrain/bench.py), top operators by device and host time.

    python bench/profile_step.py --shape qwen2.5-0.5b            # GPU
    python bench/profile_step.py --shape tiny --steps 2          # CPU (what the tests run)

Prints, per variant: tokens/s over the profiled steps, then the operators that took the most
self device time (CUDA) or self host time (CPU), so a slow step names its culprit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from critic_pretrain import bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(bench.SHAPES), default="tiny")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per variant")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 16384 on GPU, 2048 on CPU")
    ap.add_argument("--variants", nargs="+", default=["ours", "baseline"], choices=["ours", "baseline"])
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)

    from torch.profiler import ProfilerActivity, profile

    from critic_pretrain.config import DataConfig, ModelConfig, TargetsConfig
    from critic_pretrain.data import prepare_store
    from critic_pretrain.model import build_value_model, enable_checkpointing

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    max_tokens = args.max_tokens or (16384 if gpu else 2048)
    median, max_len = (1400, min(8192, max_tokens)) if gpu else (200, min(1024, max_tokens))
    ckpt = args.gradient_checkpointing if args.gradient_checkpointing is not None else not args.shape.startswith("tiny")
    shape = bench.SHAPES[args.shape]
    n_rows = int((args.warmup + args.steps + 4) * max_tokens / median * 1.6) + 64
    lengths = bench.sample_lengths(n_rows, "lognormal", median, 0.8, max_len, seed=0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    sort = "self_cuda_time_total" if gpu else "self_cpu_time_total"
    where = torch.cuda.get_device_name() if gpu else "CPU"
    print(f"# profile: shape {args.shape}, {where}, torch {torch.__version__}, "
          f"max_tokens {max_tokens}, gradient checkpointing {ckpt}, tf32 matmul "
          f"{torch.backends.cuda.matmul.allow_tf32}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bench.write_rollouts(tmp / "rollouts", lengths, shape["vocab_size"], seed=0)
        store = prepare_store([str(tmp / "rollouts")], tmp / "cache", DataConfig(train=["x"]), TargetsConfig())
        idx = np.arange(len(store))
        for name in args.variants:
            torch.manual_seed(0)
            attn = bench.baseline_attention(shape) if name == "baseline" else "auto"
            model = build_value_model(ModelConfig(config=dict(shape), attn_implementation=attn)).to(device)
            print(f"\n## {name}: parameters {next(model.parameters()).dtype}, attention "
                  f"{model.config._attn_implementation}")
            if ckpt:
                enable_checkpointing(model)
            model.train()
            with profile(activities=activities) as prof:
                if name == "baseline":
                    rows = max(1, int(max_tokens / store.lengths.mean()))
                    r = bench.run_baseline(model, store, idx, rows, args.steps, args.warmup, device, 1e-5)
                else:
                    r = bench.run_ours(model, store, idx, store.lengths, max_tokens, args.steps, args.warmup,
                                       device, 1e-5, num_workers=0)
            print(f"{r.tokens_per_s():,.0f} real tokens/s over {r.steps} steps (warm-up included in the table below), "
                  f"{r.seconds / r.steps:.3f} s/step")
            print(prof.key_averages().table(sort_by=sort, row_limit=args.top, max_name_column_width=60))
            del model, prof
            if gpu:
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
