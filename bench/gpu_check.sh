#!/usr/bin/env bash
# The prepared GPU check (one H200, about 10 minutes): GPU-marked tests, then the throughput
# benchmark at Qwen2.5-0.5B and 1.5B shape, ours vs the plain padded loop in the same run.
# Results land in $OUT (the device tool brings them back) or ./bench/out.
#   device tool:  bash bench/gpu_check.sh
#   any CUDA box: OUT=bench/out bash bench/gpu_check.sh
set -uo pipefail
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_model.py tests/test_attention.py 2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
for shape in qwen2.5-0.5b qwen2.5-1.5b; do
  timeout 240 python3 bench/throughput.py --shape "$shape" --steps 20 --warmup 3 \
      --json "$OUT/bench_$shape.json" 2>&1 | grep -v Warning | tail -12 | tee "$OUT/bench_$shape.md"
done
