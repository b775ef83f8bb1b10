"""Held-out evaluation of a value model: loss and explained variance over policy tokens."""

from __future__ import annotations

import numpy as np
import torch

from .data import Layout, RolloutStore, loader, pack, to_device
from .metrics import N_SUMS, summarize, value_sums
from .model import token_values


@torch.no_grad()
def evaluate(model: torch.nn.Module, store: RolloutStore, indices: np.ndarray, *, max_tokens: int,
             max_length: int, layout: Layout, device: torch.device, reduce=lambda t: t,
             token_cap: int | None = None, prefix: str = "val") -> dict[str, float]:
    """Metrics over ``indices`` of ``store``; micro-batches are split round-robin over ranks.

    ``reduce`` sums a tensor over ranks (``accelerator.reduce(t, "sum")``). With oracle
    values in the data, ``{prefix}/oracle_*`` compare the model to the true values too.
    """
    was_training = model.training
    model.eval()
    order = indices[np.argsort(store.lengths[indices], kind="stable")]  # similar lengths together
    batches = [order[b] for b in pack(np.minimum(store.lengths[order], max_length), max_tokens)]
    if token_cap is not None:
        take = np.searchsorted(np.cumsum([min(int(store.lengths[b].sum()), max_tokens) for b in batches]), token_cap)
        batches = batches[: max(int(take), 1)]
    mine = batches[layout.rank::layout.world]
    sums = torch.zeros(N_SUMS, dtype=torch.float64, device=device)
    oracle = torch.zeros(N_SUMS, dtype=torch.float64, device=device)
    for mb in loader(store, mine, max_length, extra=True):
        mb = to_device(mb, device)
        values = token_values(model, mb["input_ids"], mb["position_ids"], seq_lens=mb["seq_lens"])
        sums += value_sums(values, mb["targets"], mb["weights"])
        if "oracle" in mb:
            w = mb["weights"] * torch.isfinite(mb["oracle"])
            oracle += value_sums(values, torch.nan_to_num(mb["oracle"]), w)
    model.train(was_training)
    out = summarize(reduce(sums), prefix)
    if store.has_oracle:
        out.update({k.replace(f"{prefix}/", f"{prefix}/oracle_"): v
                    for k, v in summarize(reduce(oracle), prefix).items()
                    if k.endswith(("/loss", "/explained_variance"))})
    return out
