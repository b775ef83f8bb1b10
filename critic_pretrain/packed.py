"""The packed micro-batch: one type, built by ``data.collate_packed`` and read by its fields.

Shape legend (every docstring below uses it):

    N  tokens of the packed row (all rollouts of the micro-batch, concatenated, no padding)
    k  rollouts in the row
    P  policy tokens (weight > 0) among the N
    W  most policy tokens of one rollout

``position_ids`` restart at 0 at each rollout's first token, which is how the model and the
value alignment (``model.shift_values``) find the rollout boundaries; ``seq_lens`` says the same
on the host, so nothing about the boundaries needs a device sync.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class PackedBatch:
    """One micro-batch as one padding-free row (legend above)."""

    input_ids: Tensor
    """[1, N] int64."""
    position_ids: Tensor
    """[1, N] int64, 0 at each rollout's first token."""
    targets: Tensor
    """[1, N] float32 value targets (0 where the weight is 0)."""
    weights: Tensor
    """[1, N] float32 loss weights: loss_mask x sample_weight (x recency weight)."""
    seq_lens: Tensor
    """[k] int32 rollout lengths; stays on the host (``to`` leaves it there)."""
    valid_tokens: int
    """P: tokens with weight > 0 (a host int: the loss normaliser needs no sync to count them)."""
    num_rows: int
    """k."""
    rewards: Tensor | None = None
    """[1, N] transformed per-token rewards, outcome placed on the last policy token (a rollout
    cut at max_length gets its return at the last kept policy token); evaluation and TD targets."""
    outcome: Tensor | None = None
    """[k] each rollout's return (the Monte-Carlo return at its first policy token)."""
    oracle: Tensor | None = None
    """[1, N] true values in target units, NaN where unknown (synthetic rollouts)."""
    old_values: Tensor | None = None
    """[1, N] the collecting critic's values, NaN where unknown."""
    _rows: "PolicyRows | None" = field(default=None, repr=False, compare=False)

    def to(self, device: torch.device) -> "PackedBatch":
        """The tensors on ``device`` (non-blocking), ``seq_lens`` on the host."""
        moved = {f.name: (v.to(device, non_blocking=True) if isinstance(v, Tensor) and f.name != "seq_lens" else v)
                 for f in dataclasses.fields(self) if f.name != "_rows" for v in [getattr(self, f.name)]}
        return PackedBatch(**moved)

    def pin_memory(self) -> "PackedBatch":
        """For ``DataLoader(pin_memory=True)``, which calls it on custom batch types."""
        pinned = {f.name: (v.pin_memory() if isinstance(v, Tensor) else v)
                  for f in dataclasses.fields(self) if f.name != "_rows" for v in [getattr(self, f.name)]}
        return PackedBatch(**pinned)

    def policy_rows(self) -> "PolicyRows":
        """The policy tokens as left-aligned [k, W] rows, built once per batch (two host syncs)."""
        if self._rows is None:
            self._rows = PolicyRows.of(self)
        return self._rows


@dataclass
class PolicyRows:
    """The policy tokens of a packed micro-batch as left-aligned rows [k, W]. GAE's
    carry-forward masking skips every other token, so working on these rows is exact and
    touches only the policy tokens."""

    seg: Tensor
    """[P] rollout of each policy token."""
    column: Tensor
    """[P] its column: index among its rollout's policy tokens."""
    index: Tensor
    """[P] its position in the packed row."""
    mask: Tensor
    """[k, W] bool: the column holds a policy token."""
    token_seg: Tensor
    """[N] rollout of every token of the packed row."""

    @classmethod
    def of(cls, batch: PackedBatch) -> "PolicyRows":
        device = batch.weights.device
        lens = batch.seq_lens                                         # host [k]
        k, n = len(lens), batch.weights.shape[1]
        policy = batch.weights[0] > 0                                 # [N]
        seg = torch.repeat_interleave(torch.arange(k, device=device), lens.to(device), output_size=n)
        counts = torch.zeros(k, dtype=torch.long, device=device).index_add_(0, seg, policy.long())
        index = policy.nonzero().squeeze(1)                           # host sync (its size)
        seg_p = seg[index]
        column = (policy.long().cumsum(0) - 1)[index] - (counts.cumsum(0) - counts)[seg_p]
        width = int(counts.max()) if k else 0                         # host sync
        mask = torch.arange(width, device=device)[None, :] < counts[:, None]
        return cls(seg_p, column, index, mask, seg)

    def rows(self, x: Tensor) -> Tensor:
        """Packed [1, N] (or [N]) -> [k, W] float32, zeros past each rollout's policy tokens."""
        out = torch.zeros(self.mask.shape, dtype=torch.float32, device=self.mask.device)
        out[self.seg, self.column] = x.reshape(-1)[self.index].float()
        return out

    def packed(self, x: Tensor, n: int) -> Tensor:
        """Inverse of ``rows``: [k, W] -> packed [1, N] float32, 0 off policy tokens."""
        out = torch.zeros(n, dtype=torch.float32, device=x.device)
        out[self.index] = x[self.seg, self.column].float()
        return out[None]
