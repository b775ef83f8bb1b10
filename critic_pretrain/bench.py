"""Throughput benchmark: our packed trainer vs a plain padded Hugging Face loop, in one run.

    critic-pretrain bench --shape qwen2.5-1.5b --steps 30          # on a GPU
    critic-pretrain bench --shape tiny --steps 10                   # on CPU (what the tests run)
    python bench/throughput.py ...                                  # the same

Both variants train the same value model (same shape, init, optimizer settings, autocast,
gradient checkpointing) on the same rollouts, whose lengths follow a long-tailed
distribution like real RL rollouts (lognormal, median ``--median``, capped at ``--max-len``)
or the bundled sample's (``--lengths sample``):

- ``baseline``: what a user writes with the HF Trainer: a fixed number of rollouts per batch
  in random order, dynamic padding to the longest, ``sdpa`` attention with a padding mask
  (``eager`` for families without sdpa, e.g. Gemma 2),
  ``torch.optim.AdamW`` defaults, DataLoader without workers;
- ``ours``: the training step of ``critic_pretrain.train`` on the real data path: token-budget
  packing without padding, ``critic_packed`` attention (torch varlen on CUDA), fused AdamW on
  CUDA, prefetching DataLoader workers.

Reported per variant: real (non-padding) tokens/s, MFU against ``--peak-tflops`` with
docs/design.md's formula (6 * matmul params * tokens + 12 * layers * hidden * sum(L_i^2); no LM
head, no embeddings), peak device memory, padding fraction, and the share of step time spent
waiting for data. Plus the CPU pipeline: rollout reading + validation + targets, and packing,
in tokens/s, against what the device consumed.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SHAPES = {
    "tiny": dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768),
    # windowed attention (Mistral-style, every layer) and Gemma 2 (alternating windows, logit softcap):
    # windows shorter than most rollouts, so the exact windowed paths are what is timed
    "tiny-window": dict(model_type="mistral", vocab_size=512, hidden_size=64, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=32768, sliding_window=128),
    "tiny-gemma2": dict(model_type="gemma2", vocab_size=512, hidden_size=64, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=32768, sliding_window=128, attn_logit_softcapping=50.0,
                        query_pre_attn_scalar=16, pad_token_id=0),
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, tie_word_embeddings=True),
}
H200_BF16_TFLOPS = 989.0


@dataclass
class Result:
    name: str
    steps: int
    seconds: float
    real_tokens: int
    padded_tokens: int
    attn_sum_sq: float
    """sum over rollouts of L_i^2 (attention FLOPs)."""
    data_wait: float
    peak_mem_gb: float

    def tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds

    def mfu(self, n_matmul: int, layers: int, hidden: int, peak_tflops: float) -> float:
        flops = 6 * n_matmul * self.real_tokens + 12 * layers * hidden * self.attn_sum_sq
        return flops / self.seconds / (peak_tflops * 1e12)

    def padding(self) -> float:
        return 1.0 - self.real_tokens / max(self.padded_tokens, 1)


def sample_lengths(n: int, how: str, median: float, sigma: float, max_len: int, seed: int) -> np.ndarray:
    if how == "sample":
        import pyarrow.compute as pc

        from rollouts import RolloutReader
        lens = np.concatenate([pc.list_value_length(b.column("input_ids")).to_numpy()
                               for _, _, b in RolloutReader("builtin:sample", columns=["input_ids"])])
        return np.random.default_rng(seed).choice(lens, n).astype(np.int64)
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(math.log(median), sigma, n), 16, max_len).astype(np.int64)


def write_rollouts(folder: Path, lengths: np.ndarray, vocab: int, seed: int) -> None:
    """Random tokens; the first quarter of each rollout is the prompt; reward in {0, 1}."""
    import pyarrow as pa

    from rollouts import ShardWriter
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(0, vocab, int(offsets[-1]), dtype=np.int32)
    pos = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    mask = (pos >= np.repeat(lengths // 4, lengths)).astype(np.int8)
    off = pa.array(offsets.astype(np.int32))
    table = pa.table({"input_ids": pa.ListArray.from_arrays(off, pa.array(ids)),
                      "loss_mask": pa.ListArray.from_arrays(off, pa.array(mask)),
                      "reward": pa.array(rng.integers(0, 2, len(lengths)).astype(np.float64)),
                      "sample_id": pa.array([f"b{i}" for i in range(len(lengths))])})
    with ShardWriter(folder) as w:
        w.write_table(table)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mem(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # CPU: process peak RSS


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    import contextlib
    return contextlib.nullcontext()


def run_baseline(model, store, indices, batch_rows: int, steps: int, warmup: int, device, lr: float) -> Result:
    """A plain padded loop: fixed rollouts per batch, pad to the longest, mask, MSE on policy tokens."""

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(0)
    order = rng.permutation(indices)
    batches = [order[i:i + batch_rows] for i in range(0, len(order) - batch_rows + 1, batch_rows)]

    def collate(rows):
        seqs = [store.table.column("input_ids")[int(r)].values.to_numpy() for r in rows]
        masks = [store.table.column("loss_mask")[int(r)].values.to_numpy() for r in rows]
        targets = [store.table.column("returns")[int(r)].values.to_numpy() for r in rows]
        T = max(len(s) for s in seqs)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        am = torch.zeros(len(rows), T, dtype=torch.long)
        w = torch.zeros(len(rows), T)
        tgt = torch.zeros(len(rows), T)
        for i, (s, m, t) in enumerate(zip(seqs, masks, targets)):
            ids[i, :len(s)], am[i, :len(s)] = torch.from_numpy(s.astype(np.int64)), 1
            w[i, :len(s)], tgt[i, :len(s)] = torch.from_numpy(m.astype(np.float32)), torch.from_numpy(t.copy())
        return ids, am, w, tgt, [len(s) for s in seqs]

    return _timed("baseline", steps, warmup, device, batches, collate, lambda b: _baseline_step(model, opt, b, device))


def _baseline_step(model, opt, batch, device):
    from critic_pretrain.model import token_values
    ids, am, w, tgt, lens = batch
    ids, am, w, tgt = ids.to(device), am.to(device), w.to(device), tgt.to(device)
    pos = torch.arange(ids.shape[1], device=device).expand_as(ids)
    with _autocast(device):
        values = token_values(model, ids, pos, am)
    loss = (w * (values - tgt).square()).sum() / w.sum().clamp_min(1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return sum(lens), ids.numel(), float(sum(n * n for n in lens))


def run_ours(model, store, indices, lengths, max_tokens: int, steps: int, warmup: int, device, lr: float,
             num_workers: int) -> Result:
    from accelerate import Accelerator

    from critic_pretrain.config import Config, DataConfig
    from critic_pretrain.data import Layout, loader, plan_epoch
    from critic_pretrain.optim import build_optimizer
    from critic_pretrain.train import train_step

    cfg = Config(data=DataConfig(train=["x"], max_tokens=max_tokens))
    cfg.optim.lr = lr
    accelerator = Accelerator(mixed_precision="bf16" if device.type == "cuda" else "no",
                              cpu=device.type == "cpu")
    opt = build_optimizer(model, cfg.optim, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model, opt = accelerator.prepare(model, opt)
    plan = plan_epoch(indices, lengths, seed=0, epoch=0, data=cfg.data, layout=Layout(1, 0, 1))
    it = loader(store, plan, max_tokens, num_workers=num_workers, pin_memory=device.type == "cuda")

    def step(mb):
        mb = mb.to(device)
        train_step(model, opt, sched, [mb], accelerator, cfg)
        lens = mb.seq_lens.tolist()
        return sum(lens), sum(lens), float(sum(n * n for n in lens))

    return _timed("ours", steps, warmup, device, it, lambda b: b, step)


def _timed(name, steps, warmup, device, batches, collate, step) -> Result:
    it = iter(batches)
    real = padded = 0
    attn = wait = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0, real, padded, attn, wait = time.perf_counter(), 0, 0, 0.0, 0.0
        tw = time.perf_counter()
        batch = collate(next(it))
        wait += time.perf_counter() - tw
        r, p, a = step(batch)
        real, padded, attn = real + r, padded + p, attn + a
    _sync(device)
    return Result(name, steps, time.perf_counter() - t0, real, padded, attn, wait, _peak_mem(device))


def baseline_attention(shape: dict) -> str:
    """What a plain HF loop gets: ``sdpa``, or ``eager`` for families without it (Gemma 2's softcap)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING
    cls = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING[type(AutoConfig.for_model(**shape))]
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def cpu_pipeline(folder: Path, cache: Path, max_tokens: int) -> dict:
    """Reading + validation + targets (prepare_store), and packing + collation, in tokens/s."""
    from critic_pretrain.config import DataConfig, TargetsConfig
    from critic_pretrain.data import Layout, collate_packed, plan_epoch, prepare_store
    t0 = time.perf_counter()
    store = prepare_store([str(folder)], cache / "pipeline", DataConfig(train=["x"]), TargetsConfig())
    t_prepare = time.perf_counter() - t0
    idx = np.arange(len(store))
    t0 = time.perf_counter()
    plan = plan_epoch(idx, store.lengths, seed=0, epoch=0, data=DataConfig(train=["x"], max_tokens=max_tokens),
                      layout=Layout(1, 0, 1))
    for mb in plan:
        collate_packed(store, mb, max_tokens)
    t_pack = time.perf_counter() - t0
    tokens = int(store.lengths.sum())
    return {"tokens": tokens, "prepare_tokens_per_s": tokens / t_prepare, "pack_tokens_per_s": tokens / t_pack}


# long: one benchmark, read top to bottom: arguments, both variants on the same rollouts, one table
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="critic-pretrain bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="token budget per step (default: 16384 on GPU, 4096 on CPU)")
    ap.add_argument("--lengths", choices=["lognormal", "sample"], default="lognormal")
    ap.add_argument("--median", type=float, default=None,
                    help="median rollout length (default 1400 on GPU, 200 on CPU)")
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--max-len", type=int, default=None, help="longest rollout (default 8192 on GPU, 1024 on CPU)")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                    help="default: on for the Qwen shapes")
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader workers for ours (default 2 on GPU, 0 on CPU)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's peak, for MFU (default on GPU: H200 bf16 dense, 989; on CPU: no MFU)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    from transformers import AutoConfig  # noqa: F401 (fail early if missing)

    from critic_pretrain.config import DataConfig, ModelConfig, TargetsConfig
    from critic_pretrain.data import prepare_store
    from critic_pretrain.model import build_value_model, count_parameters, enable_checkpointing

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    max_tokens = args.max_tokens or (16384 if gpu else 4096)
    median = args.median or (1400 if gpu else 200)
    max_len = min(args.max_len or (8192 if gpu else 1024), max_tokens)
    workers = args.workers if args.workers is not None else (2 if gpu else 0)
    ckpting = (args.gradient_checkpointing if args.gradient_checkpointing is not None
               else not args.shape.startswith("tiny"))
    shape = SHAPES[args.shape]

    # Enough rollouts for both variants' warmup + timed steps.
    n_rows = int((args.warmup + args.steps + 4) * max_tokens / median * 1.6) + 64
    lengths = sample_lengths(n_rows, args.lengths, median, args.sigma, max_len, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_rollouts(tmp / "rollouts", lengths, shape["vocab_size"], seed=0)
        pipeline = cpu_pipeline(tmp / "rollouts", tmp / "cache", max_tokens)
        store = prepare_store([str(tmp / "rollouts")], tmp / "cache", DataConfig(train=["x"]), TargetsConfig())
        idx = np.arange(len(store))
        results = {}
        for name in ("baseline", "ours"):
            torch.manual_seed(0)
            attn = baseline_attention(shape) if name == "baseline" else "auto"
            model = build_value_model(ModelConfig(config=dict(shape), attn_implementation=attn)).to(device)
            if ckpting:
                enable_checkpointing(model)
            model.train()
            if name == "baseline":
                batch_rows = max(1, int(max_tokens / store.lengths.mean()))
                results[name] = run_baseline(model, store, idx, batch_rows, args.steps, args.warmup, device, 1e-5)
            else:
                results[name] = run_ours(model, store, idx, store.lengths, max_tokens, args.steps, args.warmup,
                                         device, 1e-5, workers)
            n = count_parameters(model)
            del model
            if gpu:
                torch.cuda.empty_cache()

    layers, hidden = shape["num_hidden_layers"], shape["hidden_size"]
    dev_name = torch.cuda.get_device_name(device) if gpu else "CPU"
    print(f"# bench: shape {args.shape} ({n['matmul'] / 1e6:.1f}M matmul params), {dev_name}, "
          f"torch {torch.__version__}, "
          f"max_tokens {max_tokens}, lengths {args.lengths} median {median:g} max {max_len}, "
          f"gradient checkpointing {ckpting}, {args.steps} timed steps")
    # MFU against a GPU's peak means nothing for a CPU run ("MFU 0.0%" read as a broken bench)
    peak = args.peak_tflops or (H200_BF16_TFLOPS if gpu else None)
    print(f"| variant | real tokens/s | MFU ({f'of {peak:g} TFLOP/s' if peak else 'n/a on CPU: --peak-tflops'}) "
          "| peak mem (GB) | padding | data wait |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = {}
    for name, r in results.items():
        mfu = r.mfu(n["matmul"], layers, hidden, peak) if peak else None
        rows[name] = {"tokens_per_s": r.tokens_per_s(), "mfu": mfu,
                      "peak_mem_gb": r.peak_mem_gb, "padding": r.padding(), "data_wait": r.data_wait / r.seconds}
        x = rows[name]
        mfu = f"{x['mfu']:.1%}" if x["mfu"] is not None else "-"
        print(f"| {name} | {x['tokens_per_s']:,.0f} | {mfu} | {x['peak_mem_gb']:.1f} | {x['padding']:.1%} | "
              f"{x['data_wait']:.1%} |")
    ratio = rows["ours"]["tokens_per_s"] / rows["baseline"]["tokens_per_s"]
    print(f"\nours / baseline tokens/s: {ratio:.2f}x")
    consumed = rows["ours"]["tokens_per_s"]
    print(f"CPU pipeline (1 process): read+validate+targets {pipeline['prepare_tokens_per_s']:,.0f} tokens/s "
          f"({pipeline['prepare_tokens_per_s'] / consumed:.1f}x what the device consumed), "
          f"pack+collate {pipeline['pack_tokens_per_s']:,.0f} tokens/s "
          f"({pipeline['pack_tokens_per_s'] / consumed:.1f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "device": dev_name, "torch": torch.__version__,
                                               "results": rows, "ratio": ratio, "pipeline": pipeline}, indent=2))
    return 0


if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["bench", *sys.argv[1:]]))
