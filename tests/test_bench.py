"""The throughput benchmark runs end to end at tiny size on CPU (figures are not asserted)."""

from __future__ import annotations

import json

from critic_pretrain.bench import Result, main


def test_bench_tiny_cpu(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["--shape", "tiny", "--steps", "2", "--warmup", "1", "--max-tokens", "1024", "--median", "100",
                 "--max-len", "512", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["results"]["ours"]["padding"] == 0.0
    assert res["results"]["baseline"]["padding"] > 0.1  # long-tailed lengths waste padded tokens
    for r in res["results"].values():
        assert r["tokens_per_s"] > 0 and 0 <= r["data_wait"] < 1
    assert res["pipeline"]["prepare_tokens_per_s"] > 0


def test_mfu_formula():
    # 6 * N * tokens + 12 * layers * hidden * sum(L^2), over time and peak
    r = Result("x", steps=1, seconds=2.0, real_tokens=1000, padded_tokens=1000, attn_sum_sq=1e6, data_wait=0.0,
               peak_mem_gb=0.0)
    flops = 6 * 1e9 * 1000 + 12 * 10 * 100 * 1e6
    assert abs(r.mfu(n_matmul=10**9, layers=10, hidden=100, peak_tflops=1.0) - flops / 2.0 / 1e12) < 1e-12
