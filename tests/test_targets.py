"""Tests for critic_pretrain.targets: hand-computed targets and agreement with the reference loop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_gae import reference_gae, reference_returns

from critic_pretrain import targets
from critic_pretrain.targets import (
    RewardTransform,
    build_targets,
    compute_gae,
    compute_returns,
    length_adaptive_lambda,
    place_outcome_rewards,
)


def t64(rows: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# Hand-computed examples
# ---------------------------------------------------------------------------------------------


def test_single_turn_monte_carlo_gamma_one_gives_every_policy_token_the_final_reward() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]])  # prompt, prompt, 3 response tokens, padding
    rewards = place_outcome_rewards(t64([0.7]), mask)
    returns = compute_returns(rewards, mask, gamma=1.0, lam=1.0)
    assert_close(returns, t64([[0, 0, 0.7, 0.7, 0.7, 0]]))


def test_discount_applies_per_policy_token() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]])
    rewards = place_outcome_rewards(t64([1.0]), mask)
    returns = compute_returns(rewards, mask, gamma=0.5, lam=1.0)
    assert_close(returns, t64([[0, 0, 0.25, 0.5, 1.0, 0]]))


def test_multi_turn_discount_and_value_carry_across_a_tool_segment() -> None:
    # policy, policy, tool, tool, policy, policy. With the gap skipped, position 1 is two policy
    # steps from the reward (0.5^2); discounting the gap too would give 0.5^4.
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]])
    rewards = place_outcome_rewards(t64([1.0]), mask)
    returns = compute_returns(rewards, mask, gamma=0.5, lam=1.0)
    assert_close(returns, t64([[0.125, 0.25, 0, 0, 0.5, 1.0]]))


def test_lambda_below_one_with_values_and_a_masked_gap() -> None:
    # Compressed row: r = [0, 0, 1], V = [0.5, 0.2, 0.4], gamma = 1, lambda = 0.5.
    #   delta_2 = 1 - 0.4 = 0.6                 A_2 = 0.6             R_2 = 1.0
    #   delta_1 = 0 + 0.4 - 0.2 = 0.2           A_1 = 0.2 + 0.5*0.6   R_1 = 0.7
    #   delta_0 = 0 + 0.2 - 0.5 = -0.3          A_0 = -0.3 + 0.5*0.5  R_0 = 0.45
    # The tool token in between has a reward (5) and a value (99) that must both be ignored.
    mask = torch.tensor([[1, 0, 1, 1]])
    rewards = t64([[0.0, 5.0, 0.0, 1.0]])
    values = t64([[0.5, 99.0, 0.2, 0.4]])
    adv, returns = compute_gae(rewards, mask, gamma=1.0, lam=0.5, values=values)
    assert_close(returns, t64([[0.45, 0, 0.7, 1.0]]))
    assert_close(adv, t64([[-0.05, 0, 0.5, 0.6]]))


def test_outcome_plus_per_token_rewards() -> None:
    mask = torch.tensor([[1, 1, 1, 0]])
    token_rewards = t64([[-0.1, -0.1, -0.1, -5.0]])  # the -5 sits on a tool token: ignored
    identity = build_targets(t64([1.0]), token_rewards, mask, gamma=1.0, lam=1.0, transform=RewardTransform())
    assert_close(identity, t64([[0.7, 0.8, 0.9, 0]]))

    # [0,1] -> [-1,1]: the outcome 1 stays 1, token rewards are only scaled (x2), not shifted.
    mapped = build_targets(
        t64([1.0]), token_rewards, mask, gamma=1.0, lam=1.0, transform=RewardTransform.unit_to_symmetric()
    )
    assert_close(mapped, t64([[0.4, 0.6, 0.8, 0]]))


def test_build_targets_needs_some_reward() -> None:
    with pytest.raises(ValueError):
        build_targets(None, None, torch.ones(1, 3), gamma=1.0, lam=1.0, transform=RewardTransform())


def test_rows_without_policy_tokens_get_zero_targets() -> None:
    mask = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 0]])
    rewards = place_outcome_rewards(t64([3.0, 2.0]), mask)
    assert_close(rewards, t64([[0, 0, 0, 0], [0, 0, 2.0, 0]]))
    values = t64([[1.0, 2.0, 3.0, 4.0], [9.0, 0.5, 0.5, 9.0]])
    adv, returns = compute_gae(rewards, mask, gamma=1.0, lam=0.9, values=values)
    assert_close(returns[0], torch.zeros(4))
    assert_close(adv[0], torch.zeros(4))
    # Row 1: delta = [0 + 0.5 - 0.5, 2 - 0.5] = [0, 1.5]; A = [0.9 * 1.5, 1.5].
    assert_close(returns[1], t64([0, 0.5 + 1.35, 2.0, 0]))


def test_all_rows_without_policy_tokens() -> None:
    mask = torch.zeros(2, 5)
    adv, returns = compute_gae(torch.ones(2, 5), mask, gamma=1.0, lam=1.0, values=torch.ones(2, 5))
    assert torch.equal(returns, torch.zeros(2, 5))
    assert torch.equal(adv, torch.zeros(2, 5))


def test_lambda_per_row() -> None:
    # Same row twice; lambda 1 gives Monte-Carlo returns, lambda 0 one-step TD targets r + V_next.
    mask = torch.ones(2, 3)
    rewards = t64([[0.0, 0.0, 1.0]] * 2)
    values = t64([[0.5, 0.2, 0.4]] * 2)
    returns = compute_returns(rewards, mask, gamma=1.0, lam=t64([1.0, 0.0]), values=values)
    assert_close(returns, t64([[1.0, 1.0, 1.0], [0.2, 0.4, 1.0]]))
    for row, lam in enumerate([1.0, 0.0]):
        assert_close(returns[row], compute_returns(rewards, mask, gamma=1.0, lam=lam, values=values)[row])


def test_decoupled_lambda_returns_follow_the_given_lambda() -> None:
    mask = torch.ones(1, 3)
    rewards = t64([[0.0, 0.0, 1.0]])
    values = t64([[0.5, 0.2, 0.4]])
    critic_adv, critic_returns = compute_gae(rewards, mask, gamma=1.0, lam=1.0, values=values)
    actor_adv, actor_returns = compute_gae(rewards, mask, gamma=1.0, lam=0.5, values=values)
    assert_close(critic_returns, t64([[1.0, 1.0, 1.0]]))
    assert_close(actor_returns, t64([[0.45, 0.7, 1.0]]))
    assert_close(critic_adv, critic_returns - values)
    assert_close(actor_adv, actor_returns - values)


def test_nan_values_on_masked_positions_do_not_leak() -> None:
    mask = torch.tensor([[0, 1, 0, 1, 0]])
    values = t64([[float("nan"), 0.3, float("nan"), 0.1, float("inf")]])
    rewards = t64([[float("nan"), 0.0, 0.0, 1.0, float("nan")]])
    returns = compute_returns(rewards, mask, gamma=1.0, lam=0.5, values=values)
    # delta = [0 + 0.1 - 0.3, 1 - 0.1] = [-0.2, 0.9]; A = [-0.2 + 0.45, 0.9].
    assert_close(returns, t64([[0, 0.55, 0, 1.0, 0]]))


# ---------------------------------------------------------------------------------------------
# Reward placement and transforms
# ---------------------------------------------------------------------------------------------


def test_outcome_reward_lands_on_last_policy_token_when_row_ends_on_tool_tokens() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    placed = place_outcome_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    expected = torch.zeros(3, 5)
    expected[0, 2], expected[1, 4], expected[2, 0] = 1.0, 2.0, 3.0
    assert torch.equal(placed, expected)


def test_place_outcome_rewards_converts_integer_rewards() -> None:
    placed = place_outcome_rewards(torch.tensor([1]), torch.tensor([[True, False]]))
    assert placed.dtype == torch.float32
    assert placed.tolist() == [[1.0, 0.0]]


def test_reward_transform_outcome_affine_then_clip() -> None:
    transform = RewardTransform(scale=3.0, shift=-1.0, clip_min=-2.0, clip_max=1.5)
    out = transform.apply_outcome(t64([-1.0, 0.0, 0.5, 2.0]))
    assert_close(out, t64([-2.0, -1.0, 0.5, 1.5]))


def test_reward_transform_unit_to_symmetric() -> None:
    transform = RewardTransform.unit_to_symmetric()
    assert_close(transform.apply_outcome(t64([0.0, 0.5, 1.0])), t64([-1.0, 0.0, 1.0]))


def test_reward_transform_token_rewards_are_scaled_not_shifted_or_clipped() -> None:
    transform = RewardTransform(scale=2.0, shift=-1.0, clip_min=0.0, clip_max=0.1)
    assert_close(transform.apply_token(t64([[0.25, -0.5]])), t64([[0.5, -1.0]]))


def test_reward_transform_dict_round_trip_and_validation() -> None:
    transform = RewardTransform(scale=2.0, shift=-1.0, clip_min=-1.0, clip_max=None)
    data = transform.to_dict()
    assert data == {"scale": 2.0, "shift": -1.0, "clip_min": -1.0, "clip_max": None}
    assert RewardTransform.from_dict(data) == transform
    with pytest.raises(TypeError):
        RewardTransform.from_dict({**data, "bias": 1.0})
    with pytest.raises(ValueError):
        RewardTransform(clip_min=1.0, clip_max=0.0)


def test_length_adaptive_lambda() -> None:
    # alpha * length = [0, 0.5, 1, 5, 50] -> clamped to >= 1 -> 1 - 1/x.
    lam = length_adaptive_lambda(torch.tensor([0, 10, 20, 100, 1000]), alpha=0.05)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 0.0, 0.8, 0.98]))
    with pytest.raises(ValueError):
        length_adaptive_lambda(torch.tensor([10]), alpha=0.0)


# ---------------------------------------------------------------------------------------------
# Argument checks, dtype, autograd
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gamma": 1.1, "lam": 1.0},
        {"gamma": 1.0, "lam": -0.1},
        {"gamma": 1.0, "lam": torch.tensor([0.5, 1.5])},
        {"gamma": 1.0, "lam": torch.tensor([0.5])},
    ],
)
def test_rejects_out_of_range_parameters(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        compute_returns(torch.zeros(2, 3), torch.ones(2, 3), **kwargs)


def test_rejects_fractional_mask_and_shape_mismatch() -> None:
    with pytest.raises(ValueError):
        compute_returns(torch.zeros(1, 3), torch.tensor([[1.0, 0.5, 0.0]]), gamma=1.0, lam=1.0)
    with pytest.raises(ValueError):
        compute_returns(torch.zeros(1, 4), torch.ones(1, 3), gamma=1.0, lam=1.0)
    with pytest.raises(ValueError):
        place_outcome_rewards(torch.zeros(2), torch.ones(1, 3))


def test_dtypes_and_no_grad() -> None:
    mask = torch.ones(2, 4)
    values = torch.randn(2, 4, requires_grad=True)
    returns = compute_returns(torch.randn(2, 4, dtype=torch.bfloat16), mask, gamma=1.0, lam=0.9, values=values)
    assert returns.dtype == torch.float32
    assert not returns.requires_grad
    assert compute_returns(torch.randn(2, 4, dtype=torch.float64), mask, gamma=1.0, lam=0.9).dtype == torch.float64


# ---------------------------------------------------------------------------------------------
# Agreement with the per-timestep reference loop
# ---------------------------------------------------------------------------------------------


def random_case(seed: int, batch: int, length: int, dtype: torch.dtype, density: float):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, length, generator=gen) < density
    rewards = torch.randn(batch, length, generator=gen, dtype=dtype)
    values = torch.randn(batch, length, generator=gen, dtype=dtype)
    return mask, rewards, values


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    length=st.integers(0, 160),  # crosses the 32-position chunk and the first recursion level
    density=st.sampled_from([0.0, 0.3, 0.8, 1.0]),
    gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]) | st.floats(0.0, 1.0),
    lam=st.sampled_from([0.0, 0.95, 1.0]) | st.floats(0.0, 1.0),
    lam_per_row=st.booleans(),
    with_values=st.booleans(),
)
def test_matches_reference_loop_float64(
    seed: int,
    batch: int,
    length: int,
    density: float,
    gamma: float,
    lam: float,
    lam_per_row: bool,
    with_values: bool,
) -> None:
    mask, rewards, values = random_case(seed, batch, length, torch.float64, density)
    lam_arg = (torch.rand(batch, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
               if lam_per_row else lam)
    kwargs = {"gamma": gamma, "lam": lam_arg, "values": values if with_values else None}
    adv, returns = compute_gae(rewards, mask, **kwargs)
    ref_adv, ref_returns = reference_gae(rewards, mask, **kwargs)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(returns, ref_returns, rtol=1e-10, atol=1e-10)
    assert torch.equal(compute_returns(rewards, mask, **kwargs), returns)
    assert not returns[~mask].any()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 400),
    gamma=st.floats(0.9, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_matches_reference_loop_float32(seed: int, length: int, gamma: float, lam: float) -> None:
    mask, rewards, values = random_case(seed, 3, length, torch.float32, 0.6)
    returns = compute_returns(rewards, mask, gamma=gamma, lam=lam, values=values)
    assert returns.dtype == torch.float32
    expected = reference_returns(rewards.double(), mask, gamma=gamma, lam=lam, values=values.double())
    # Sums of up to ~240 unit-variance terms: float32 rounding stays well below 1e-3.
    torch.testing.assert_close(returns.double(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("chunk", [2, 3, 5, 32])
@pytest.mark.parametrize("factor", [0.0, 0.3, 0.97, 1.0])
def test_scan_kernel_with_small_chunks_exercises_deep_recursion(chunk: int, factor: float) -> None:
    x = torch.randn(3, 200, dtype=torch.float64, generator=torch.Generator().manual_seed(chunk))
    expected = torch.zeros_like(x)
    running = torch.zeros(3, dtype=torch.float64)
    for k in reversed(range(x.shape[1])):
        running = x[:, k] + factor * running
        expected[:, k] = running
    shared = targets._reverse_discounted_cumsum(x, torch.full((1, 1), factor, dtype=torch.float64), chunk)
    per_row = targets._reverse_discounted_cumsum(x, torch.full((3, 1), factor, dtype=torch.float64), chunk)
    torch.testing.assert_close(shared, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(per_row, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.999, 0.95), (0.99, 0.0)])
def test_long_rows_are_stable(gamma: float, lam: float) -> None:
    # ~4500 policy positions: two recursion levels above the 32-position chunk (4500 -> 141 -> 5),
    # and (gamma*lam)^T is far below float32's range, so any factor^-t scheme would blow up.
    mask, rewards, values = random_case(7, 2, 5000, torch.float64, 0.9)
    returns = compute_returns(rewards, mask, gamma=gamma, lam=lam, values=values)
    assert torch.isfinite(returns).all()
    expected = reference_returns(rewards, mask, gamma=gamma, lam=lam, values=values)
    torch.testing.assert_close(returns, expected, rtol=1e-9, atol=1e-9)

    rewards32, values32 = rewards.float(), values.float()
    returns32 = compute_returns(rewards32, mask, gamma=gamma, lam=lam, values=values32)
    # gamma = lambda = 1 sums ~4500 terms, so allow a few float32 ulps of the magnitude (~70).
    torch.testing.assert_close(returns32.double(), expected, rtol=1e-4, atol=1e-3)


def test_bootstrapped_returns_match_the_per_timestep_loop_per_rollout():
    """values_from=critic: TD(lambda) targets of a packed micro-batch from its own values equal
    the reference loop run on each rollout alone (carry-forward across tool tokens)."""
    from reference_gae import reference_gae

    from critic_pretrain.targets import bootstrapped_returns

    masks = [[0, 0, 1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0, 1], [0, 0, 0]]
    g = torch.Generator().manual_seed(0)
    flat = torch.tensor([m for mask in masks for m in mask], dtype=torch.float32)
    values, rewards = torch.randn(1, len(flat), generator=g), torch.randn(1, len(flat), generator=g)
    from critic_pretrain.packed import PackedBatch
    n = len(flat)
    batch = PackedBatch(input_ids=torch.zeros(1, n, dtype=torch.long),
                        position_ids=torch.cat([torch.arange(len(m)) for m in masks])[None],
                        targets=torch.zeros(1, n), weights=flat[None], seq_lens=torch.tensor([len(m) for m in masks]),
                        valid_tokens=int(flat.sum()), num_rows=len(masks), rewards=rewards)
    for alpha in (None, 0.5):  # lam_alpha: each rollout's own lambda, 1 - 1 / (alpha * its policy tokens)
        got = bootstrapped_returns(values, batch, gamma=0.9, lam=0.8, lam_alpha=alpha)[0]
        want, start = [], 0
        for m in masks:
            part = slice(start, start + len(m))
            lam = 0.8 if alpha is None else max(0.0, 1 - 1 / max(alpha * sum(m), 1.0))
            want.append(reference_gae(rewards[:, part], torch.tensor([m]), gamma=0.9, lam=lam,
                                      values=values[:, part])[1][0])
            start += len(m)
        torch.testing.assert_close(got, torch.cat(want), atol=1e-6, rtol=1e-6)
