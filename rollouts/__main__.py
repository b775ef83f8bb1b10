"""``python -m rollouts ...``: the same as ``critic-pretrain rollouts ...`` (torch-free)."""

import sys

from .cli import main, run_command

sys.exit(run_command(main, sys.argv[1:]))
