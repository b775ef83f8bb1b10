"""The per-timestep GAE loop that NeMo-RL (``_compute_gae``) and verl run, kept as the
independent reference the vectorised ``critic_pretrain.targets.compute_gae`` is checked against
(tests/test_targets.py) and timed against (bench/targets.py)."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def reference_gae(rewards: Tensor, mask: Tensor, *, gamma: float, lam: float | Tensor,
                  values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(advantages, returns) [B, T], one iteration per position over [B] slices; the
    accumulators carry across mask-0 positions (prompt, tool output). Outputs are multiplied by
    the mask so they compare to ``compute_gae`` (the upstream loops leave the carried values at
    mask-0 positions). ``lam``: a float or a [B] tensor (one lambda per row)."""
    f64 = rewards.dtype == torch.float64 or (values is not None and values.dtype == torch.float64)
    dtype = torch.float64 if f64 else torch.float32
    m = (mask != 0).to(dtype)
    r = rewards.to(dtype)
    v = values.to(dtype) if values is not None else torch.zeros_like(r)
    lam_t = lam.to(dtype) if isinstance(lam, Tensor) else lam
    next_values = torch.zeros(m.shape[0], dtype=dtype, device=m.device)
    last_gae = torch.zeros_like(next_values)
    reversed_adv = []
    for t in reversed(range(m.shape[1])):
        delta = r[:, t] + gamma * next_values - v[:, t]
        new_gae = delta + gamma * lam_t * last_gae
        next_values = v[:, t] * m[:, t] + (1 - m[:, t]) * next_values
        last_gae = new_gae * m[:, t] + (1 - m[:, t]) * last_gae
        reversed_adv.append(last_gae)
    adv = torch.stack(reversed_adv[::-1], dim=1) if reversed_adv else torch.zeros_like(r)
    return adv * m, (adv + v) * m


def reference_returns(rewards: Tensor, mask: Tensor, *, gamma: float, lam: float | Tensor,
                      values: Tensor | None = None) -> Tensor:
    """Returns of ``reference_gae``."""
    return reference_gae(rewards, mask, gamma=gamma, lam=lam, values=values)[1]
