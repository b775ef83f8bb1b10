"""critic-pretrain: pretrain a PPO critic offline and export it as a warm-start seed.

Kept import-light: ``import critic_pretrain`` does not import torch, so the CLI's data
commands start fast. Import submodules (``critic_pretrain.targets``, ...) for the API.
"""

__version__ = "0.1.0"


def load_metrics(run_dir):
    """A run's ``metrics.jsonl`` as a pandas DataFrame: one row per step (the train and the
    validation record of a step merged), sorted by step; a column per metric (NaN where a step
    did not log it). For notebooks: ``load_metrics("runs/x")[["step", "val/loss"]].dropna()``."""
    from .errors import require
    from .report import load_run

    pd = require("pandas", "critic_pretrain.load_metrics")

    frame = pd.DataFrame(load_run(run_dir).records)
    return frame.groupby("step", as_index=False).first().sort_values("step").reset_index(drop=True)
