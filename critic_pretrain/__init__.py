"""critic-pretrain: pretrain a PPO critic offline and export it as a warm-start seed.

Kept import-light: ``import critic_pretrain`` does not import torch, so the CLI's data
commands start fast. Import submodules (``critic_pretrain.targets``, ...) for the API.
"""

__version__ = "0.1.0"
