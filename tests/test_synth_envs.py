"""The named synthetic environments (rollouts.synth.envs): each one's values are exact, checked
two independent ways, and each one has the credit structure its docstring promises."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rollouts import synth
from rollouts.synth.fatal import p_mistake
from rollouts.synth.reveal import posterior

ENVS = list(synth.ENVIRONMENTS)
LONG = ("long", "long-tools")
KEYS = set(range(synth.ACT_GOOD, synth.ACT_BAD + synth.N_ACT_IDS))


def rows(name: str, n: int = 600, seed: int = 5) -> list[dict]:
    return _table(name, n, seed).to_pylist()


_CACHE: dict = {}


def _table(name: str, n: int, seed: int) -> pa.Table:
    if (name, n, seed) not in _CACHE:
        _CACHE[name, n, seed] = synth.generate(n, seed=seed, env=name)
    return _CACHE[name, n, seed]


def calibration(table: pa.Table, env: synth.SynthEnv, values=None) -> dict:
    if values is not None:
        table = table.set_column(table.column_names.index("oracle_values"), "oracle_values", values)
    stats = synth.ValueStats(env.params.gamma, seed=1, horizon=int(2 * env.params.median_length))
    stats.add(table)
    return stats.calibration()


def valued_by(table: pa.Table, traced: synth.SynthEnv, valuer: synth.SynthEnv) -> pa.ListArray:
    """The rows' oracle_values column as ``valuer``'s chain values the states ``traced``'s chain
    reads off the tokens (0 at each row's first token, the alignment)."""
    flat = table.column("input_ids").combine_chunks()
    states = np.concatenate([traced.trace(r)[:-1] for r in flat.to_pylist()])
    positions = np.concatenate([np.arange(len(r)) for r in flat.to_pylist()])
    values = valuer.values(states, positions)
    values[flat.offsets.to_numpy()[:-1]] = 0.0
    return pa.ListArray.from_arrays(flat.offsets, pa.array(values))


@pytest.mark.parametrize("name", ENVS)
def test_return_regressed_on_the_value_has_slope_one_and_intercept_zero(name: str) -> None:
    env = synth.make_env(name)
    c = calibration(_table(name, 1200 if name in LONG else 5000, 11), env)
    assert c["slope_se"] < 0.06 and c["intercept_se"] < 0.04, c  # enough states to catch a wrong value
    assert abs(c["slope"] - 1) < 4 * c["slope_se"] and abs(c["intercept"]) < 4 * c["intercept_se"], c


@pytest.mark.parametrize("name, change", [("fatal", {"p_good_hard": 0.5}), ("key-steps", {"p_good_hard": 0.5}),
                                          ("reveal", {"p_ok_good": 0.9, "p_ok_bad": 0.1})])
def test_the_calibration_check_fails_values_of_a_slightly_wrong_chain(name: str, change: dict) -> None:
    """The same rows valued by a chain a little off (a better policy, more telling tests): the
    check must fail, or passing it would prove nothing."""
    table, env = _table(name, 5000, 11), synth.make_env(name)
    c = calibration(table, env, valued_by(table, env, synth.make_env(name, **change)))
    assert abs(c["slope"] - 1) > 4 * c["slope_se"] or abs(c["intercept"]) > 4 * c["intercept_se"], c


@pytest.mark.parametrize("name", ENVS)
def test_oracle_values_equal_monte_carlo_continuations_where_they_move(name: str) -> None:
    """At the tokens where the value moves (and a few random ones), the oracle equals the mean
    return of continuations sampled from that exact prefix by the generator's own chain."""
    env = synth.make_env(name)
    rng = np.random.default_rng(0)
    probes = []
    for r in rows(name, 60):
        ids, v = r["input_ids"], r["oracle_values"]
        moves = [t for t in range(1, len(ids) - 1) if abs(v[t + 1] - v[t]) > 1e-3]
        probes += [(r, t) for t in moves[:2]] + [(r, t + 1) for t in moves[:1]]
        probes.append((r, int(rng.integers(1, len(ids)))))
    assert len(probes) >= 100
    for i, (r, t) in enumerate(probes[:: len(probes) // 40]):
        mean, se = env.monte_carlo_value(r["input_ids"][:t], n_samples=2000, seed=i)
        assert abs(r["oracle_values"][t] - mean) <= 4.5 * se + 1e-6, (name, t, r["input_ids"][t])


def moved(r: dict, tol: float = 1e-2) -> list[int]:
    """Positions t whose token moves the value: |V[t + 1] - V[t]| > tol (above what a filler
    token's length class does to the chance of running out of room)."""
    v = r["oracle_values"]
    return [t for t in range(1, len(v) - 1) if abs(v[t + 1] - v[t]) > tol]


def fits(name: str, ids: list[int], t: int) -> float:
    """Chance that a policy filler run in progress before position ``t`` (its class read off the
    filler id at t - 1) ends with EOS by the last position: 1 - (1 - stop_c) ** (L - t)."""
    env = synth.make_env(name)
    c = (ids[t - 1] - synth.FILLER_POLICY) // synth.FILLER_IDS_PER_CLASS
    return 1 - (1 - env.lengths("policy").stop[c]) ** (env.params.max_length - t)


def short(name: str) -> list[dict]:
    """Rows far from the length cap (2048), where the chance of running out of room is negligible
    and a filler token's length class does not move the value."""
    return [r for r in rows(name) if len(r["input_ids"]) < 400]


def key_steps(ids: list[int]) -> tuple[int, int, list[int]]:
    """A key-step row's difficulty, number of key steps and the positions of its key tokens."""
    keys = [t for t in range(ids.index(synth.PROMPT_END) + 1, len(ids)) if ids[t] in KEYS]
    return ids[1] - synth.DIFFICULTY, ids[2] - synth.NEED + 1, keys


def test_key_steps_value_moves_only_at_the_key_tokens_inside_one_turn() -> None:
    for r in short("key-steps"):
        ids, mask = r["input_ids"], r["loss_mask"]
        answer = ids.index(synth.PROMPT_END) + 1
        assert all(mask[answer:]) and ids[-1] == synth.EOS or r["truncated"]  # one turn, no env tokens
        keys = [t for t in range(answer, len(ids)) if ids[t] in KEYS]
        assert len(keys) == ids[3 - 1] - synth.NEED + 1 or r["truncated"]
        # After the prompt only the keys move it (and the length class a run's first filler picks,
        # which sets the chance of running out of room: the longest class has a mean of ~350 tokens).
        assert {t for t in moved(r) if t >= answer} <= set(keys) | {answer} | {t + 1 for t in keys}
        if not r["truncated"]:  # the value before EOS is the share of good keys
            good = sum(ids[t] < synth.ACT_BAD for t in keys)
            expected = good / len(keys) * fits("key-steps", ids, len(ids) - 1)
            assert r["oracle_values"][len(ids) - 1] == pytest.approx(expected, abs=1e-5)  # and fits


def test_undo_a_bad_key_step_throws_away_the_streak_before_it() -> None:
    """Closed forms that share nothing with the chain's backward induction: before EOS the value is
    the streak's share s / k; right after a key step, with r steps left at p = p_good[d], it is
    (s p^r + p + ... + p^r) / k (the final streak is at least m iff the last m steps are good, or
    all r are and the streak carries). Far from the length cap, times the chance that the rest
    fits in it: between 98% and 100% on these rows."""
    p_good, checked = synth.make_env("undo").params.p_good(), 0
    for r in short("undo"):
        ids, v = r["input_ids"], r["oracle_values"]
        if r["truncated"]:
            continue
        d, k, keys = key_steps(ids)
        assert len(keys) == k
        streak = 0
        for j, t in enumerate(keys, start=1):
            streak = streak + 1 if ids[t] < synth.ACT_BAD else 0
            p, left = p_good[d], k - j
            expected = (streak * p ** left + sum(p ** m for m in range(1, left + 1))) / k
            assert 0.98 * expected - 1e-6 <= v[t + 1] <= expected + 1e-6, (j, streak, v[t + 1], expected)
            checked += 1
        assert v[len(ids) - 1] == pytest.approx(streak / k * fits("undo", ids, len(ids) - 1), abs=1e-5)
    assert checked > 500


def test_undo_differs_from_key_steps_where_a_mistake_follows_good_steps() -> None:
    """The same rows valued by key-steps' additive chain (same parameters, same tokens): the
    calibration check fails, so ``undo`` is a credit structure of its own, not key-steps renamed."""
    table, env = _table("undo", 5000, 11), synth.make_env("undo")
    additive = synth.make_env("key-steps", **{k: getattr(env.params, k) for k in synth.ENVIRONMENTS["undo"].defaults})
    c = calibration(table, env, valued_by(table, additive, additive))
    assert abs(c["slope"] - 1) > 4 * c["slope_se"] or abs(c["intercept"]) > 4 * c["intercept_se"], c


def test_prefix_only_the_good_key_steps_before_the_first_mistake_count() -> None:
    """Closed forms that share nothing with the chain's backward induction: right after key step j
    with r steps left at p = p_good[d], the value is (g + p + ... + p^r) / k while no step has
    been bad (g = j good ones; the rest count until the first bad one), and g / k frozen from the
    first bad step on, whatever follows. Far from the length cap, times the chance that the rest
    fits in it: between 98% and 100% on these rows."""
    p_good, checked, after_a_mistake = synth.make_env("prefix").params.p_good(), 0, 0
    for r in short("prefix"):
        ids, v = r["input_ids"], r["oracle_values"]
        if r["truncated"]:
            continue
        d, k, keys = key_steps(ids)
        assert len(keys) == k
        good, stopped = 0, False
        for j, t in enumerate(keys, start=1):
            after_a_mistake += stopped
            if ids[t] < synth.ACT_BAD and not stopped:
                good += 1
            stopped = stopped or ids[t] >= synth.ACT_BAD
            p, left = p_good[d], k - j
            expected = (good + (0 if stopped else sum(p ** m for m in range(1, left + 1)))) / k
            assert 0.98 * expected - 1e-6 <= v[t + 1] <= expected + 1e-6, (j, good, stopped, v[t + 1], expected)
            checked += 1
        assert v[len(ids) - 1] == pytest.approx(good / k * fits("prefix", ids, len(ids) - 1), abs=1e-5)
    assert checked > 500 and after_a_mistake > 50


def test_prefix_differs_from_key_steps_where_a_good_step_follows_a_mistake() -> None:
    """The same rows valued by key-steps' additive chain (same parameters, same tokens): the
    calibration check fails, so ``prefix`` is a credit structure of its own. (Against ``undo``'s
    streak this global check has too little power, slope 0.97 +/- 0.02 on these rows; the closed
    forms above tell the two apart: after the first mistake a prefix value never moves, where
    undo's climbs with every later good step.)"""
    table, env = _table("prefix", 5000, 11), synth.make_env("prefix")
    valuer = synth.make_env("key-steps", **{k: getattr(env.params, k) for k in synth.ENVIRONMENTS["prefix"].defaults})
    c = calibration(table, env, valued_by(table, valuer, valuer))
    assert abs(c["slope"] - 1) > 4 * c["slope_se"] or abs(c["intercept"]) > 4 * c["intercept_se"], c


def test_synergy_a_good_step_is_worth_more_after_good_steps() -> None:
    """Closed forms that share nothing with the chain's backward induction: right after key step j
    with g good so far and r steps left at p = p_good[d], the value is E[(g + X)^2] / k^2 for X
    binomial(r, p): (g^2 + 2 g r p + r p (1 - p) + (r p)^2) / k^2; before EOS it is (g / k)^2.
    And the key-steps chain (the share, not its square) fails the calibration on the same rows."""
    p_good, checked = synth.make_env("synergy").params.p_good(), 0
    for r in short("synergy"):
        ids, v = r["input_ids"], r["oracle_values"]
        if r["truncated"]:
            continue
        d, k, keys = key_steps(ids)
        assert len(keys) == k
        good = 0
        for j, t in enumerate(keys, start=1):
            good += ids[t] < synth.ACT_BAD
            p, left = p_good[d], k - j
            expected = (good ** 2 + 2 * good * left * p + left * p * (1 - p) + (left * p) ** 2) / k ** 2
            assert 0.98 * expected - 1e-6 <= v[t + 1] <= expected + 1e-6, (j, good, v[t + 1], expected)
            checked += 1
        assert v[len(ids) - 1] == pytest.approx((good / k) ** 2 * fits("synergy", ids, len(ids) - 1), abs=1e-5)
    assert checked > 500
    table, env = _table("synergy", 5000, 11), synth.make_env("synergy")
    same = {k: getattr(env.params, k) for k in synth.ENVIRONMENTS["synergy"].defaults}
    additive = synth.make_env("key-steps", **same)
    c = calibration(table, env, valued_by(table, additive, additive))
    assert abs(c["slope"] - 1) > 4 * c["slope_se"] or abs(c["intercept"]) > 4 * c["intercept_se"], c


def test_fatal_mistake_ends_the_episode_at_once_with_value_zero() -> None:
    dead = 0
    for r in rows("fatal"):
        ids, v = r["input_ids"], r["oracle_values"]
        bad = [t for t, x in enumerate(ids) if synth.ACT_BAD <= x < synth.ACT_BAD + synth.N_ACT_IDS]
        if bad:
            dead += 1
            t = bad[0]
            assert ids[t + 1:] == [synth.GAME_OVER] and r["reward"] == 0.0 and v[t + 1] == 0.0
            assert r["loss_mask"][t - 1] == 1 and ids[t - 1] >= synth.FILLER_POLICY  # mid-turn, after filler
            d = ids[1] - synth.DIFFICULTY
            assert v[t] > 0 and p_mistake(synth.make_env("fatal").params)[d] > 0
    assert 60 < dead < 540


def test_reveal_value_moves_on_tool_outputs_and_is_the_posterior() -> None:
    p, checked = synth.make_env("reveal").params, 0
    for r in short("reveal"):
        ids, mask, v = r["input_ids"], r["loss_mask"], r["oracle_values"]
        plan = ids.index(synth.PROMPT_END) + 1
        first_fillers = {t for t in range(1, len(ids)) if ids[t - 1] in (synth.ENV_END, synth.OK, synth.FAIL)}
        after_plan = [t for t in moved(r) if t > plan + 1 and t not in first_fillers]  # those pick a length class
        checked += len(after_plan)
        assert all(ids[t] in (synth.OK, synth.FAIL) and not mask[t] for t in after_plan)
        tests = [t for t in range(plan, len(ids)) if ids[t] in (synth.OK, synth.FAIL)]
        if r["truncated"] or not tests:
            continue
        passes = sum(ids[t] == synth.OK for t in tests)
        expected = posterior(p, ids[plan] < synth.ACT_BAD, passes, len(tests) - passes)
        assert v[len(ids) - 1] == pytest.approx(expected * fits("reveal", ids, len(ids) - 1), abs=1e-5)
    assert checked > 100


@pytest.mark.parametrize("name", LONG)
def test_long_rows_have_2k_policy_tokens(name: str) -> None:
    policy = [sum(r["loss_mask"]) for r in rows(name, 200)]
    assert np.median(policy) >= 2000


def test_dense_rewards_sit_on_every_action_and_policy_token() -> None:
    for r in rows("dense", 100):
        ids, mask, tr = np.array(r["input_ids"]), np.array(r["loss_mask"]), np.array(r["token_rewards"])
        good = (ids >= synth.ACT_GOOD) & (ids < synth.ACT_BAD)
        bad = (ids >= synth.ACT_BAD) & (ids < synth.ACT_BAD + synth.N_ACT_IDS)
        expected = 0.1 * good - 0.1 * bad - 0.001 * mask
        assert np.allclose(tr, expected, atol=1e-7)


def test_each_environment_differs_from_the_default_and_unknown_ones_are_refused() -> None:
    tables = {name: _table(name, 40, 3) for name in ENVS if name not in LONG}
    ids = {name: t.column("input_ids") for name, t in tables.items()}
    assert all(not ids["tools"].equals(ids[n]) for n in ids if n not in ("tools", "dense"))
    with pytest.raises(ValueError, match="unknown synth environment"):
        synth.make_env("maze")
    with pytest.raises(ValueError, match="unknown synth parameter"):
        synth.make_env("fatal", p_goood=0.3)
