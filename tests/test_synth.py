"""Tests for rollouts.synth: schema, determinism, shape of the data, and the exactness of
``oracle_values`` (against Monte-Carlo continuations and closed forms)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rollouts import SAMPLE_DIR, RolloutError, RolloutReader, check, synth
from rollouts.cli import main as rollouts_cli_main
from rollouts.cli import run_command


def rollouts_main(argv: list[str]) -> int:
    """``python -m rollouts ARGV`` in process: the command and its error handler."""
    return run_command(rollouts_cli_main, argv)

# Short rows and a tight cap, so truncation is common and values depend on the position.
SMALL = {"max_length": 256, "median_length": 80}
# The same with discounting and a per-token penalty.
SHAPED = {**SMALL, "gamma": 0.99, "token_penalty": 0.002}


@pytest.fixture(scope="module")
def small() -> pa.Table:
    return synth.generate(480, seed=1, **SMALL)


@pytest.fixture(scope="module")
def default() -> pa.Table:
    return synth.generate(1200, seed=0)


def rows_of(table: pa.Table) -> list[dict]:
    return table.to_pylist()


def first_index(ids: list[int], wanted) -> int | None:
    return next((i for i, t in enumerate(ids) if t in wanted), None)


ACTIONS = set(range(synth.ACT_GOOD, synth.ACT_BAD + synth.N_ACT_IDS))
ANSWERS = set(range(synth.ANSWER_GOOD, synth.ANSWER_BAD + synth.N_ANSWER_IDS))


# ---------------------------------------------------------------------------------------------
# Schema, determinism, files
# ---------------------------------------------------------------------------------------------


def test_generate_is_deterministic_per_seed() -> None:
    a = synth.generate(40, seed=3, **SMALL)
    assert a.equals(synth.generate(40, seed=3, **SMALL))
    assert not a.column("input_ids").equals(synth.generate(40, seed=4, **SMALL).column("input_ids"))


def test_write_gives_generate_s_rows_in_valid_shards(tmp_path: Path) -> None:
    paths = synth.write(tmp_path, 100, seed=3, shard_rows=40, **SMALL)
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    reader = check(tmp_path)
    assert reader.problems == [] and reader.summary.rows == 100
    assert RolloutReader(tmp_path).read_all().equals(synth.generate(100, seed=3, **SMALL))
    manifest = json.loads((tmp_path / synth.MANIFEST).read_text())
    assert manifest["rows"] == 100 and manifest["seed"] == 3 and manifest["params"]["max_length"] == 256
    from rollouts.provenance import ROLLOUTS_MANIFEST, RewardsLogged, rewards_logged, write_manifest
    logged = rewards_logged(tmp_path)  # the environment's own rewards: the archive states them raw
    assert logged.is_raw and logged.stated_by == "rollouts synth (_synth.json)"
    write_manifest(tmp_path, rewards=RewardsLogged(2.0, -1.0, stated_by="--rewards-scaled").to_dict())
    assert rewards_logged(tmp_path).scale == 2.0  # a _rollouts.json that says otherwise wins
    (tmp_path / ROLLOUTS_MANIFEST).unlink()

    with pytest.raises(RolloutError, match="already holds"):
        synth.write(tmp_path, 10, seed=3, **SMALL)
    assert [p.name for p in synth.write(tmp_path, 10, seed=3, overwrite=True, **SMALL)] == ["part-00000.parquet"]
    assert check(tmp_path).summary.rows == 10


def test_columns_follow_the_vocabulary_and_groups_share_a_prompt(small: pa.Table) -> None:
    env = synth.make_env(**SMALL)
    rows = rows_of(small)
    assert len({r["sample_id"] for r in rows}) == len(rows)
    for r in rows:
        ids = np.array(r["input_ids"])
        assert ids[0] == synth.BOS and ids.max() < synth.VOCAB_SIZE
        assert np.array_equal(r["loss_mask"], synth.IS_POLICY_TOKEN[ids].astype(int))
        assert len(r["oracle_values"]) == len(ids)
        assert r["policy_version"] == 0
    for r in rows[:40]:  # every token is one the chain can emit there
        env.trace(r["input_ids"])
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r)
    assert {len(g) for g in by_group.values()} == {synth.SynthParams().group_size}
    for group in by_group.values():
        prompts = {tuple(r["input_ids"][: r["input_ids"].index(synth.PROMPT_END) + 1]) for r in group}
        assert len(prompts) == 1


def test_token_penalty_adds_token_rewards_on_policy_tokens() -> None:
    table = synth.generate(24, seed=5, **SHAPED)
    for r in rows_of(table):
        assert np.allclose(r["token_rewards"], -0.002 * np.array(r["loss_mask"]))
    assert "token_rewards" not in synth.generate(8, seed=5, **SMALL).column_names


# ---------------------------------------------------------------------------------------------
# Oracle values
# ---------------------------------------------------------------------------------------------


def probe_positions(rows: list[dict], max_length: int) -> list[tuple[dict, int]]:
    """(row, position) pairs where values move: prompt, actions, verdicts, status, answers,
    and deep in truncated rows, where the chance of running out of room matters."""
    first = rows[0]
    act = first_index(first["input_ids"], ACTIONS)
    verdict = first_index(first["input_ids"], {synth.OK, synth.FAIL})
    probes = [(first, t) for t in (1, 2, 3, act, act + 1, verdict, verdict + 1, verdict + 2)]
    for r in [r for r in rows if first_index(r["input_ids"], ANSWERS) is not None][:2]:
        t = first_index(r["input_ids"], ANSWERS)
        probes += [(r, t), (r, t + 1)]
    for r in [r for r in rows if r["truncated"]][:2]:
        probes += [(r, max_length - 60), (r, max_length - 8)]
    for r in [r for r in rows if r["input_ids"][-1] == synth.GAME_OVER][:1]:
        probes.append((r, max(i for i, t in enumerate(r["input_ids"]) if t in ACTIONS)))
    return probes


@pytest.mark.parametrize("params", [SMALL, SHAPED], ids=["plain", "gamma_and_penalty"])
def test_oracle_values_equal_monte_carlo_estimates(params: dict) -> None:
    env = synth.make_env(**params)
    probes = probe_positions(rows_of(synth.generate(160, seed=2, **params)), params["max_length"])
    assert len(probes) >= 14
    for i, (row, t) in enumerate(probes):
        oracle = row["oracle_values"][t]
        mean, se = env.monte_carlo_value(row["input_ids"][:t], n_samples=6000, seed=i)
        assert abs(oracle - mean) <= 4 * se + 1e-6, (t, row["input_ids"][t], oracle, mean, se)


def test_oracle_value_at_position_zero_is_zero(small: pa.Table) -> None:
    assert all(r["oracle_values"][0] == 0.0 for r in rows_of(small))


def test_value_after_the_answer_token_is_the_chance_that_eos_still_fits(small: pa.Table) -> None:
    # After ANSWER_GOOD at t, the reward is 1 iff the answer's m >= 1 filler tokens and EOS
    # end by position L - 1: P = sum_c w_c (1 - (1 - q_c) ** (L - t - 2)). After ANSWER_BAD: 0.
    env = synth.make_env(**SMALL)
    law, L = env.lengths("policy"), SMALL["max_length"]
    checked = 0
    for r in rows_of(small):
        ids, values = r["input_ids"], r["oracle_values"]
        t = first_index(ids, ANSWERS)
        if t is None or t + 1 >= len(ids):
            continue
        good = ids[t] < synth.ANSWER_BAD
        expected = float((law.weights * (1 - (1 - law.stop) ** (L - t - 2))).sum()) if good else 0.0
        assert values[t + 1] == pytest.approx(expected, rel=1e-5, abs=1e-7)
        if synth.EOS in ids:  # once the reward is received nothing is left
            assert not any(values[ids.index(synth.EOS) + 1:])
            assert r["reward"] == float(good) and not r["truncated"]
        checked += 1
    assert checked > 50


def test_oracle_is_calibrated_against_realised_rewards(default: pa.Table) -> None:
    # Rollouts are independent given the prompt, so reward - V(first action) has mean 0.
    gaps = []
    for r in rows_of(default):
        gaps.append(r["reward"] - r["oracle_values"][first_index(r["input_ids"], ACTIONS)])
    gaps = np.array(gaps)
    assert abs(gaps.mean()) < 4 * gaps.std() / np.sqrt(len(gaps))


def test_lost_games_have_zero_value_once_the_last_verdict_is_known(small: pa.Table) -> None:
    for r in rows_of(small):
        ids = r["input_ids"]
        if ids[-1] == synth.GAME_OVER:
            last_verdict = max(i for i, t in enumerate(ids) if t in (synth.OK, synth.FAIL))
            assert not any(r["oracle_values"][last_verdict + 1:]) and r["reward"] == 0.0


# ---------------------------------------------------------------------------------------------
# Shape of the data
# ---------------------------------------------------------------------------------------------


def test_rows_are_multi_turn_and_some_end_on_environment_tokens(default: pa.Table) -> None:
    rows = rows_of(default)
    turns = [int(np.sum(np.diff(np.concatenate([[0], r["loss_mask"]])) == 1)) for r in rows]
    assert max(turns) >= 4 and np.mean(np.array(turns) >= 3) > 0.3
    last = {r["input_ids"][-1] for r in rows if r["loss_mask"][-1] == 0}
    assert {synth.GAME_OVER, synth.GRADER_END} <= last
    assert any(r["reward"] == 1.0 and r["input_ids"][-1] == synth.GRADER_END for r in rows)


def test_lengths_are_long_tailed_and_capped(default: pa.Table, small: pa.Table) -> None:
    lengths = np.array([len(x) for x in default.column("input_ids").to_pylist()])
    p50, p99 = np.percentile(lengths, [50, 99])
    assert 170 <= p50 <= 230 and p99 / p50 > 3 and lengths.max() <= 2048
    L = SMALL["max_length"]
    rows = rows_of(small)
    truncated = [r for r in rows if r["truncated"]]
    assert len(truncated) >= 5
    assert all(len(r["input_ids"]) == L and r["reward"] == 0.0 for r in truncated)
    assert all(len(r["input_ids"]) <= L for r in rows)


def test_rewards_and_values_depend_on_difficulty_and_on_the_rollout(default: pa.Table) -> None:
    stats = synth.value_stats(default)
    by_difficulty = stats["reward_mean_by_difficulty"]
    assert np.mean(by_difficulty[:2]) > np.mean(by_difficulty[-2:]) + 0.4
    var = stats["oracle_variance"]
    assert var["total"] == pytest.approx(var["between_prompts"] + var["between_rollouts_of_a_prompt"]
                                         + var["within_rollouts"])
    assert var["between_prompts"] > 0.3 * var["total"]
    assert var["between_rollouts_of_a_prompt"] + var["within_rollouts"] > 0.2 * var["total"]
    ev = stats["explained_variance"]
    assert ev["oracle"] > ev["prompt_only"] + 0.1


# ---------------------------------------------------------------------------------------------
# CLI, packaging, bundled sample
# ---------------------------------------------------------------------------------------------


def test_cli_writes_shards_and_prints_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "synth"
    argv = ["synth", "--out", str(out), "--rows", "50", "--seed", "2", "--shard-rows", "20",
            "--max-length", "256", "--median-length", "80"]
    assert rollouts_main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wrote 50 tools rows") and "slope" in lines[0]
    assert len(list(out.glob("part-*.parquet"))) == 3 and check(out).problems == []
    assert rollouts_main(["synth", "--out", str(tmp_path / "x"), "--rows", "5", "--max-turns", "99"]) == 2
    assert "max_turns" in capsys.readouterr().err


def test_rollouts_package_does_not_import_torch() -> None:
    code = "import sys, rollouts, rollouts.synth; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_bundled_sample_is_valid_and_documented() -> None:
    reader = check(SAMPLE_DIR)
    assert reader.problems == []
    manifest = json.loads((SAMPLE_DIR / synth.MANIFEST).read_text())
    assert reader.summary.rows == manifest["rows"]
    assert "oracle_values" in RolloutReader(SAMPLE_DIR).read_all().column_names
