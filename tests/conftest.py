"""Shared fixtures: tiny rollouts and tiny model configs (random init, nothing downloaded)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path


def _share_the_cores() -> None:
    """Under pytest-xdist, size each worker's torch/BLAS thread pool to its share of the CPUs.

    Left alone, every worker (and every CLI or accelerate subprocess it starts, which inherit the
    variable) runs one thread per CPU, so 2 workers on 2 cores spin 4 threads: the suite took 11
    minutes, against 7 with one thread each and 12.6 in one process (docs/LOG.md, session twenty).
    Set before numpy and torch are imported, which read it once. A value the caller set wins.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cpus // workers)))


_share_the_cores()

import numpy as np  # noqa: E402  (after the thread count)
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_MODEL = {
    "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}


def toy_rows(n: int, seed: int = 0, vocab: int = 64) -> list[dict]:
    """Multi-turn rollouts whose outcome is visible in the tokens (learnable by a tiny model)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        prompt = rng.integers(8, vocab, int(rng.integers(3, 8))).tolist()
        good = int(rng.integers(0, 2))
        ids, mask = [1 + good] + prompt, [0] * (1 + len(prompt))
        for turn in range(int(rng.integers(1, 4))):
            act = rng.integers(8, vocab, int(rng.integers(2, 12))).tolist()
            ids += act
            mask += [1] * len(act)
            if rng.random() < 0.6:  # a tool reply the policy did not generate
                tool = rng.integers(8, vocab, int(rng.integers(1, 5))).tolist()
                ids += tool
                mask += [0] * len(tool)
        rows.append({"input_ids": ids, "loss_mask": mask, "reward": float(good),
                     "sample_id": f"r{seed}-{i}", "group_id": f"p{seed}-{i // 4}"})
    return rows


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    from rollouts import write_rows
    d = tmp_path_factory.mktemp("toy")
    write_rows(d, toy_rows(240), shard_rows=100)
    return d


def tiny_overrides(out: Path, data: Path, **extra) -> list[str]:
    """key=value overrides for a seconds-long CPU run."""
    import json
    base = {
        "output_dir": str(out), "data.train": f"[{data}]", "model.config": json.dumps(TINY_MODEL),
        "data.max_tokens": 256, "data.val_fraction": 0.1, "optim.lr": 3e-3, "optim.warmup_steps": 2,
        "train.max_steps": 12, "train.log_every": 1, "train.progress": "false", "eval.every": 0,
        "checkpoint.save_every": 4,
    }
    base.update({k: (str(v) if not isinstance(v, bool) else str(v).lower()) for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def free_port() -> int:
    """A TCP port no one listens on now, for a launcher's rendezvous: fixed ports collide when
    two suites (or two pytest-xdist workers) launch 2-rank runs at the same time."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_main(argv: list[str]) -> int:
    """``critic-pretrain train ARGV`` in-process, through the one router and error handler."""
    from critic_pretrain.cli import main
    return main(["train", *argv])


@pytest.fixture
def python() -> str:
    return sys.executable
