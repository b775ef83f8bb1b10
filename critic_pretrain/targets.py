"""Value targets for critic pretraining: reward placement, reward transforms, GAE / Monte-Carlo returns.

Every function takes ``[B, T]`` tensors (batch, token positions). ``mask`` marks the positions the
policy generated (1) versus prompt, tool/environment output and padding (0). Semantics follow
NeMo-RL and verl (see docs/design.md, "Targets"):

* an outcome reward sits on the last position whose mask is 1;
* GAE uses *carry-forward* masking: positions with mask 0 are skipped, so the discount and the
  next value carry across them. Equivalently: compress each row to its mask-1 positions, run
  standard GAE with terminal value 0, scatter the result back;
* ``return_t = A_t + V_t``; with ``values=None`` (all-zero values) and ``lam=1`` this is the
  Monte-Carlo discounted reward-to-go over policy positions (the VC-PPO / VAPO critic recipe).

Verified against upstream source (read via the code search index):

* NeMo-RL ``nemo_rl/algorithms/advantage_estimator.py`` (commit 00925dd1),
  ``GeneralizedAdvantageEstimator``:
  ``_compute_gae`` runs ``for t in reversed(range(T))`` with
  ``delta = r_t + gamma * next_values - V_t``, ``new = delta + gamma * lam * last_gae_lam`` and
  keeps ``next_values``/``last_gae_lam`` unchanged where ``mask[t] == 0``, so a reward on a
  mask-0 position never enters the result; ``returns = advantages + values``.
  ``_build_token_level_rewards`` puts the outcome reward on ``T - 1 - mask.fliplr().argmax(1)``
  only for rows with ``mask.any()``, then multiplies by the mask. ``_resolve_lambda_policy``
  computes the length-adaptive lambda as ``1 - 1 / (alpha * mask.sum(1)).clamp(min=1)``,
  clamped to [0, 1], and ``lam`` may be a per-row tensor. Decoupled lambda: the value returns
  use ``gae_lambda_value``, the advantages ``gae_lambda_policy`` (two GAE passes).
* verl ``verl/trainer/ppo/core_algos.py::compute_gae_advantage_return`` (commit 012be9d9): the
  same carry-forward loop (``nextvalues``/``lastgaelam`` kept on observation tokens).

Deliberate differences from those loops: at mask-0 positions (which get no loss) the loops leave
the carried advantage (and ``A + V_t``), we return 0; and masks must be binary, where the loops
would interpolate their accumulators for fractional masks.

Targets are constants for the critic loss, so the public functions run under ``torch.no_grad``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from .packed import PackedBatch

__all__ = [
    "RewardTransform",
    "build_targets",
    "compute_gae",
    "compute_returns",
    "length_adaptive_lambda",
    "critic_lambda",
    "bootstrapped_returns",
    "place_outcome_rewards",
    "token_level_rewards",
]

# Positions per chunk in the scan. Each level does a [C, C] matmul per chunk (~2*C flops per
# element) and recurses on the T/C chunk sums (depth log_C T: 3 levels for T = 8192). On a 2-core
# CPU at [256, 8192], 16 to 64 time alike; small chunks keep the per-row (batched) matmul cheap.
_CHUNK = 32


# --------------------------------------------------------------------------------------------
# Reward placement and transforms
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def place_outcome_rewards(reward: Tensor, mask: Tensor) -> Tensor:
    """Put each row's scalar reward on its last policy position.

    Args:
        reward: ``[B]`` outcome reward per row.
        mask: ``[B, T]`` policy mask (bool or 0/1).

    Returns:
        ``[B, T]`` tensor (dtype of ``reward``, float32 if it is not floating) that is zero
        except at the last position whose mask is 1. A row that ends on tool/environment
        tokens still gets its reward on the last *policy* token (verl >= 0.5 would put it on the
        last non-padding token and lose it). A row with no mask-1 position gets no reward at
        all (it has no position that could carry it), as in NeMo-RL.
    """
    m = _as_bool_mask(mask)
    if reward.shape != m.shape[:1]:
        raise ValueError(f"reward must have shape [{m.shape[0]}], got {list(reward.shape)}")
    dtype = reward.dtype if reward.is_floating_point() else torch.float32
    positions = torch.arange(1, m.shape[1] + 1, device=m.device)
    # [B]: 1 + index of the last mask-1 position, 0 for rows without one.
    last_plus_one = (m * positions).amax(dim=1)
    has_policy = last_plus_one > 0
    out = torch.zeros(m.shape, dtype=dtype, device=m.device)
    out.scatter_(
        1,
        (last_plus_one - 1).clamp(min=0).unsqueeze(1),
        torch.where(has_policy, reward.to(dtype), 0).unsqueeze(1),
    )
    return out


@dataclass(frozen=True)
class RewardTransform:
    """Affine map plus optional clipping applied to rewards before computing targets.

    A critic is calibrated only for the reward scale it was trained on, so the seed records
    this transform (``to_dict``) next to gamma and lambda.

    Outcome rewards: ``clip(scale * r + shift, clip_min, clip_max)``.
    Per-token rewards: ``scale * r`` only. A shift on every token would add
    ``shift * (number of policy tokens)`` to the return, i.e. a length-dependent reward, and
    clipping them would change the reward per token rather than the outcome's range.
    """

    scale: float = 1.0
    shift: float = 0.0
    clip_min: float | None = None
    clip_max: float | None = None

    def __post_init__(self) -> None:
        if self.clip_min is not None and self.clip_max is not None and self.clip_min > self.clip_max:
            raise ValueError(f"clip_min ({self.clip_min}) must be <= clip_max ({self.clip_max})")

    @classmethod
    def unit_to_symmetric(cls) -> RewardTransform:
        """NeMo-RL recipes' mapping of a [0, 1] reward onto [-1, 1] (``2 * r - 1``)."""
        return cls(scale=2.0, shift=-1.0)

    def apply_outcome(self, reward: Tensor) -> Tensor:
        """``[B]`` outcome rewards -> ``[B]`` transformed rewards."""
        out = reward * self.scale + self.shift
        if self.clip_min is not None or self.clip_max is not None:
            out = out.clamp(min=self.clip_min, max=self.clip_max)
        return out

    def apply_token(self, token_rewards: Tensor) -> Tensor:
        """``[B, T]`` per-token rewards -> ``[B, T]`` scaled rewards (no shift, no clip)."""
        return token_rewards * self.scale

    def to_dict(self) -> dict[str, float | None]:
        """Plain dict for a checkpoint's metadata."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RewardTransform:
        """Inverse of ``to_dict``; unknown keys raise ``TypeError``."""
        return cls(**data)


def length_adaptive_lambda(policy_lengths: Tensor, alpha: float) -> Tensor:
    """VAPO's length-adaptive GAE lambda ``1 - 1 / (alpha * length)``, clamped to [0, 1].

    Args:
        policy_lengths: ``[B]`` number of policy tokens per row (e.g. ``mask.sum(1)``).
        alpha: VAPO uses 0.05 for the actor's advantages; the critic itself uses lambda = 1.

    Returns:
        ``[B]`` float lambdas. Like NeMo-RL, ``alpha * length`` is clamped to >= 1 before the
        division, so rows with ``alpha * length <= 1`` (including empty rows) get lambda 0.
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lengths = policy_lengths.to(torch.float64 if policy_lengths.dtype == torch.float64 else torch.float32)
    return (1.0 - 1.0 / (alpha * lengths).clamp(min=1.0)).clamp(0.0, 1.0)


# --------------------------------------------------------------------------------------------
# Returns and advantages (vectorised)
# --------------------------------------------------------------------------------------------


def compute_returns(
    rewards: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    lam: float | Tensor,
    values: Tensor | None = None,
) -> Tensor:
    """Critic targets: GAE returns ``A_t + V_t`` with carry-forward masking.

    Args:
        rewards: ``[B, T]`` per-token rewards (outcome reward already placed, see
            ``place_outcome_rewards``). Rewards on mask-0 positions are ignored.
        mask: ``[B, T]`` policy mask (bool or 0/1).
        gamma: discount in [0, 1], applied per policy token.
        lam: GAE lambda in [0, 1], a float or a per-row ``[B]`` tensor. Pass the *critic's*
            lambda here (1.0 for Monte-Carlo targets); the actor's may differ (VC-PPO).
        values: ``[B, T]`` value estimates, or ``None`` for all-zero values (then the result is
            the discounted reward-to-go over policy positions).

    Returns:
        ``[B, T]`` returns, zero where mask is 0; float64 if any input is float64, else float32.
    """
    return compute_gae(rewards, mask, gamma=gamma, lam=lam, values=values)[1]


@torch.no_grad()
def compute_gae(
    rewards: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    lam: float | Tensor,
    values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns with carry-forward masking (arguments as ``compute_returns``).

    Decoupled lambda (VC-PPO): the critic's targets must come from the critic's lambda, the
    actor's advantages from the actor's; call this once per lambda (NeMo-RL does the same).
    Advantages are not whitened.

    Returns:
        ``(advantages, returns)``, each ``[B, T]``, zero where mask is 0.
    """
    m = _as_bool_mask(mask)
    _check_shape("rewards", rewards, m.shape)
    if values is not None:
        _check_shape("values", values, m.shape)
    dtype = _accumulation_dtype(rewards, values)
    factor = _decay_factor(gamma, lam, m.shape[0], dtype, m.device)  # [B, 1] or [1, 1]

    # Compress each row to its policy positions: the k-th policy token of a row goes to column
    # k of a [B, width] buffer (width = most policy tokens in a row). slot: [B, T] int64, the
    # column of each position; mask-0 positions all go to a spare column `width`, which
    # compression discards and expansion reads as 0. int32 cumsum: several times faster.
    policy_count = m.cumsum(dim=1, dtype=torch.int32)  # [B, T]
    width = int(policy_count[:, -1].max()) if m.numel() else 0
    slot = torch.where(m, policy_count - 1, width).long()

    r = _compress(rewards, slot, width, dtype)  # [B, width]
    # Columns past a row's end hold r = 0 and V = 0 (the terminal value), so deltas there are
    # exactly 0 and add nothing to earlier positions (nor to the expanded result).
    if values is None:
        deltas, v = r, None
    else:
        v = _compress(values, slot, width, dtype)
        deltas = r - v
        deltas[:, :-1].add_(v[:, 1:], alpha=gamma)  # r_k + gamma * V_{k+1} - V_k
    adv = _reverse_discounted_cumsum(deltas, factor)  # A_k = sum_j (gamma*lam)^(j-k) delta_j

    advantages = _expand(adv, slot)
    returns = advantages if v is None else _expand(adv + v, slot)
    return advantages, returns


@torch.no_grad()
def build_targets(
    reward: Tensor | None,
    token_rewards: Tensor | None,
    mask: Tensor,
    *,
    gamma: float,
    lam: float | Tensor,
    transform: RewardTransform,
    values: Tensor | None = None,
) -> Tensor:
    """Critic targets from raw rewards: transform, place, add per-token rewards, compute returns.

    Args:
        reward: ``[B]`` outcome reward, transformed with ``transform.apply_outcome`` and placed
            on the last policy token; or ``None``.
        token_rewards: ``[B, T]`` per-token rewards, scaled with ``transform.apply_token``
            (entries on mask-0 positions are ignored); or ``None``.
        mask, gamma, lam, values: as in ``compute_returns``.

    Returns:
        ``[B, T]`` returns, zero where mask is 0.
    """
    rewards = token_level_rewards(reward, token_rewards, mask, transform)
    return compute_returns(rewards, mask, gamma=gamma, lam=lam, values=values)


@torch.no_grad()
def token_level_rewards(reward: Tensor | None, token_rewards: Tensor | None, mask: Tensor,
                        transform: RewardTransform) -> Tensor:
    """``[B, T]`` rewards the targets are computed from: the transformed outcome on the last
    policy token plus the scaled per-token rewards (arguments as ``build_targets``).
    Entries on mask-0 positions are kept as given; GAE ignores them."""
    if reward is None and token_rewards is None:
        raise ValueError("give an outcome reward, per-token rewards, or both")
    rewards = torch.zeros(mask.shape, dtype=_accumulation_dtype(reward, token_rewards), device=mask.device)
    if reward is not None:
        rewards = rewards + place_outcome_rewards(transform.apply_outcome(reward), mask)
    if token_rewards is not None:
        rewards = rewards + transform.apply_token(token_rewards)
    return rewards


def critic_lambda(mask: Tensor, lam: float, alpha: float | None) -> float | Tensor:
    """The critic's GAE lambda for rows of ``mask`` [B, T]: ``lam``, or with ``alpha``
    (``targets.lam_alpha``) the per-row length-adaptive ``[B]`` lambdas."""
    return lam if alpha is None else length_adaptive_lambda(_as_bool_mask(mask).sum(1), alpha)


@torch.no_grad()
def bootstrapped_returns(values: Tensor, batch: "PackedBatch", *, gamma: float, lam: float,
                         lam_alpha: float | None = None) -> Tensor:
    """TD(lambda) targets of a packed micro-batch from the critic's own (detached) values:
    GAE returns ``A_t + V_t`` with ``V`` the current predictions (``targets.values_from:
    critic``, semi-gradient TD(lambda), as PPO's critic update bootstraps from the values of
    the rollout's critic). ``values`` / ``batch.rewards``: [1, N]; returns [1, N] float32,
    0 off policy tokens. Costs one GAE over the policy rows; no extra forward."""
    rows = batch.policy_rows()
    returns = compute_returns(rows.rows(batch.rewards), rows.mask, gamma=gamma,
                              lam=critic_lambda(rows.mask, lam, lam_alpha), values=rows.rows(values.detach()))  # [k, W]
    return rows.packed(returns, values.shape[1])


def _reverse_discounted_cumsum(x: Tensor, factor: Tensor, chunk: int = _CHUNK) -> Tensor:
    """``y[:, k] = sum_{j >= k} factor^(j - k) * x[:, j]`` along dim 1, without a loop over T.

    Chunked scan: inside each chunk of ``C`` positions one matmul with the upper-triangular
    ``[C, C]`` matrix of powers ``factor^(j - i)`` gives the within-chunk sums; the value at each
    chunk's start then obeys the same recurrence over chunks with factor ``factor^C``, solved
    by recursion (depth log_C T). Only non-negative powers appear, so nothing grows like
    ``factor^-t`` and ``factor = 0`` or ``1`` need no special case.

    Args:
        x: ``[B, L]``.
        factor: ``[B, 1]`` per-row or ``[1, 1]`` shared decay, values in [0, 1].
        chunk: chunk size ``C >= 2`` (tests use small ones to exercise the recursion).

    Returns:
        ``[B, L]``, dtype of ``x``.
    """
    batch, length = x.shape
    if length == 0:
        return x
    # Off CPU, a global TF32 / reduced-precision matmul setting (common in training scripts)
    # would round the power matrix to ~3 significant digits; fp64 GEMMs of this size are cheap.
    work = x.dtype if x.device.type == "cpu" else torch.float64
    size = min(chunk, length)
    n_chunks = -(-length // size)
    blocks = x.to(work)
    if n_chunks * size > length:
        blocks = F.pad(blocks, (0, n_chunks * size - length))
    blocks = blocks.view(batch, n_chunks, size)  # [B, N, C]

    idx = torch.arange(size, device=x.device)
    decay = factor.to(work).unsqueeze(-1)  # [B or 1, 1, 1]
    powers = _powers(decay, idx.unsqueeze(0) - idx.unsqueeze(1))  # [B or 1, C, C]: [b, i, j] = factor^(j-i)
    if factor.shape[0] == 1:
        # Shared factor: one [B*N, C] x [C, C] GEMM instead of a batched one.
        local = (blocks.reshape(-1, size) @ powers[0].T).view(batch, n_chunks, size)
    else:
        local = torch.bmm(blocks, powers.transpose(1, 2))  # [B, N, C]

    if n_chunks > 1:
        # starts[:, n] = full sum from the first position of chunk n to the end of the row.
        starts = _reverse_discounted_cumsum(local[:, :, 0], factor**size, chunk)  # [B, N]
        next_start = F.pad(starts[:, 1:], (0, 1)).unsqueeze(-1)  # [B, N, 1]
        local = local + _powers(decay, size - idx) * next_start  # position i is C - i steps away
    return local.reshape(batch, -1)[:, :length].to(x.dtype)


def _powers(base: Tensor, exponents: Tensor) -> Tensor:
    """``base ** exponents``, 0 where an exponent is negative or the power is subnormal.

    Subnormal operands slow CPU matmuls by orders of magnitude and change nothing visible.
    """
    powers = base ** exponents.clamp(min=0)
    return torch.where((exponents >= 0) & (powers >= torch.finfo(powers.dtype).tiny), powers, 0)


def _compress(x: Tensor, slot: Tensor, width: int, dtype: torch.dtype) -> Tensor:
    """``[B, T]`` -> ``[B, width]``: each row's policy entries, left-aligned, zero-padded.

    Mask-0 entries (whatever they hold, NaN included) land in the spare column and are dropped.
    """
    out = torch.zeros(slot.shape[0], width + 1, dtype=dtype, device=x.device)
    return out.scatter_(1, slot, x.to(dtype))[:, :width]


def _expand(xc: Tensor, slot: Tensor) -> Tensor:
    """Inverse of ``_compress``: ``[B, width]`` -> ``[B, T]``, zero at mask-0 positions."""
    return F.pad(xc, (0, 1)).gather(1, slot)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _as_bool_mask(mask: Tensor) -> Tensor:
    """``[B, T]`` bool view of a bool or 0/1 mask; other values raise (no fractional masks)."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {list(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must contain only 0 and 1")
    return mask != 0


def _check_shape(name: str, x: Tensor, shape: torch.Size) -> None:
    if x.shape != shape:
        raise ValueError(f"{name} must have the mask's shape {list(shape)}, got {list(x.shape)}")


def _accumulation_dtype(*tensors: Tensor | None) -> torch.dtype:
    """float64 if any input is float64, else float32 (half types accumulate in float32)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _decay_factor(gamma: float, lam: float | Tensor, batch: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``gamma * lam`` as ``[1, 1]`` (scalar lam) or ``[B, 1]`` (per-row lam)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if isinstance(lam, Tensor):
        if lam.shape != (batch,):
            raise ValueError(f"a lam tensor must have shape [{batch}], got {list(lam.shape)}")
        if not bool(((lam >= 0) & (lam <= 1)).all()):
            raise ValueError("lam must be in [0, 1]")
        return (gamma * lam.to(device=device, dtype=dtype)).unsqueeze(1)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    return torch.full((1, 1), gamma * lam, dtype=dtype, device=device)
