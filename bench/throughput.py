"""Throughput: ours vs a plain padded loop in one run (see critic_pretrain/bench.py).

    .venv/bin/python bench/throughput.py --shape qwen2.5-1.5b --steps 30   # GPU
    .venv/bin/python bench/throughput.py --shape tiny --steps 10           # CPU
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from critic_pretrain.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
