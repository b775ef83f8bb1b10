"""What a critic can learn from a synthetic archive: the oracle values' variance split, the
explained-variance ceiling, and an independent check that the values are exact (``ValueStats``)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from .vocab import DIFFICULTY, N_DIFFICULTY


class ValueStats:
    """What a critic can learn from an archive, accumulated table by table (groups must
    not straddle tables). Over policy tokens (loss_mask 1), token-weighted:

    - mean/std of the oracle values and their variance split: between prompts, between
      rollouts of a prompt, within rollouts (sums to the total);
    - explained variance of the Monte-Carlo return G by the oracle (the ceiling for a
      learned critic) and by the value at the row's first policy token (a critic that reads
      only the prompt). G is the return-to-go from the row's own rewards: the outcome on the
      last policy token plus ``token_rewards`` where the archive has them, discounted by
      ``gamma`` per policy token;
    - ``calibration``: G regressed on the value at one random position per row (rows are
      independent, so the OLS standard errors hold). Exact values give slope 1 and intercept 0
      up to sampling noise: a check of the backward induction that shares nothing with it. The
      position is drawn uniformly from 1..``horizon`` whatever the row, and rows shorter than it
      are skipped (they have ended: that is known from the prefix). Drawing it from the row's own
      length would not do: the length is the future (a row cut short by a mistake is short), and
      choosing states by the future biases the regression.
    """

    def __init__(self, gamma: float = 1.0, seed: int = 0, horizon: int = 400):
        self.gamma = gamma
        self.horizon = horizon
        self._rng = np.random.default_rng(seed)
        self._cal = np.zeros(6)  # n, sum v, sum g, sum vv, sum vg, sum gg over the sampled states
        self.rows = 0
        self.truncated = 0
        self.ends_on_env = 0
        self._lengths: list[np.ndarray] = []
        self._turns: list[np.ndarray] = []
        self._rewards: list[np.ndarray] = []
        self._difficulty: list[np.ndarray] = []
        self.n = 0
        self.s_v = self.s_vv = self.s_g = self.s_gg = self.s_err = self.s_err_prompt = 0.0
        self.ss_rows = self.ss_groups = 0.0  # sum over rows / groups of (sum V)^2 / count

    def add(self, table: pa.Table) -> None:
        ids = table.column("input_ids").combine_chunks()
        offsets = ids.offsets.to_numpy().astype(np.int64)
        tokens = ids.values.to_numpy()
        mask = table.column("loss_mask").combine_chunks().values.to_numpy().astype(bool)
        values = table.column("oracle_values").combine_chunks().values.to_numpy().astype(np.float64)
        reward = table.column("reward").to_numpy()
        lengths = np.diff(offsets)
        rows = len(lengths)
        row = np.repeat(np.arange(rows), lengths)
        self.rows += rows
        self.truncated += int(table.column("truncated").to_numpy().sum())
        self.ends_on_env += int((~mask[offsets[1:] - 1]).sum())
        self._lengths.append(lengths)
        self._rewards.append(reward)
        self._difficulty.append(tokens[offsets[:-1] + 1] - DIFFICULTY)
        starts = np.zeros(len(mask), dtype=bool)
        starts[1:] = mask[1:] & ~mask[:-1]
        starts[offsets[:-1]] = mask[offsets[:-1]]
        self._turns.append(np.bincount(row[starts], minlength=rows))

        prow = row[mask]
        G = returns_to_go(table, mask, prow, offsets, reward, self.gamma)
        V = values[mask]
        first = np.zeros(rows)
        rows_with_policy, first_at = np.unique(prow, return_index=True)
        first[rows_with_policy] = V[first_at]  # value at each row's first policy token
        groups = np.unique(table.column("group_id").to_numpy(zero_copy_only=False), return_inverse=True)[1]
        n_row = np.bincount(prow, minlength=rows)
        s_row = np.bincount(prow, weights=V, minlength=rows)
        n_grp = np.bincount(groups, weights=n_row)
        s_grp = np.bincount(groups, weights=s_row)
        self.n += len(V)
        self.s_v += V.sum()
        self.s_vv += (V * V).sum()
        self.s_g += G.sum()
        self.s_gg += (G * G).sum()
        self.s_err += ((G - V) ** 2).sum()
        self.s_err_prompt += ((G - first[prow]) ** 2).sum()
        self.ss_rows += (s_row[n_row > 0] ** 2 / n_row[n_row > 0]).sum()
        self.ss_groups += (s_grp[n_grp > 0] ** 2 / n_grp[n_grp > 0]).sum()
        # One state per row at a position drawn without looking at the row (see the docstring);
        # its return-to-go is G at the first policy token from there on, 0 if none is left.
        t = self._rng.integers(1, self.horizon + 1, size=rows)
        live = np.flatnonzero(t < lengths)
        at = offsets[live] + t[live]
        before = (cm := np.cumsum(mask))[at] - mask[at] - (cm - mask)[offsets[live]]  # policy tokens before t
        left = before < n_row[live]
        g = np.zeros(len(live))
        start = np.cumsum(n_row) - n_row
        g[left] = G[start[live[left]] + before[left]]
        v = values[at]
        self._cal += [len(v), v.sum(), g.sum(), (v * v).sum(), (v * g).sum(), (g * g).sum()]

    def result(self) -> dict:
        lengths = np.concatenate(self._lengths)
        rewards = np.concatenate(self._rewards)
        difficulty = np.concatenate(self._difficulty)
        turns = np.concatenate(self._turns)
        n = self.n
        mean = self.s_v / n
        c = self.s_v ** 2 / n
        ss_total = self.s_vv - c
        ss_g = self.s_gg - self.s_g ** 2 / n
        return {
            "rows": self.rows,
            "tokens": int(lengths.sum()),
            "policy_tokens": n,
            "length": {"p50": float(np.percentile(lengths, 50)), "p90": float(np.percentile(lengths, 90)),
                       "p99": float(np.percentile(lengths, 99)), "max": int(lengths.max())},
            "truncated_rows": self.truncated,
            "rows_ending_on_env": self.ends_on_env,
            "policy_turns": {str(k): int(v) for k, v in zip(*np.unique(turns, return_counts=True))},
            "reward_mean": float(rewards.mean()),
            "reward_mean_by_difficulty": [round(float(rewards[difficulty == d].mean()), 4)
                                          if (difficulty == d).any() else None for d in range(N_DIFFICULTY)],
            "oracle_value": {"mean": mean, "std": math.sqrt(max(ss_total, 0.0) / n)},
            "oracle_variance": {"total": ss_total / n,
                                "between_prompts": (self.ss_groups - c) / n,
                                "between_rollouts_of_a_prompt": (self.ss_rows - self.ss_groups) / n,
                                "within_rollouts": (self.s_vv - self.ss_rows) / n},
            "return_variance": ss_g / n,
            "explained_variance": {"oracle": 1 - self.s_err / ss_g,
                                   "prompt_only": 1 - self.s_err_prompt / ss_g},
            "calibration": self.calibration(),
        }

    def calibration(self) -> dict:
        """G = intercept + slope * V by least squares over the sampled states, with standard errors."""
        n, sv, sg, svv, svg, sgg = self._cal
        sxx, sxy, syy = svv - sv * sv / n, svg - sv * sg / n, sgg - sg * sg / n
        slope = sxy / sxx
        intercept = (sg - slope * sv) / n
        resid = max(syy - slope * sxy, 0.0) / (n - 2)
        return {"states": int(n), "slope": float(slope), "slope_se": math.sqrt(resid / sxx),
                "intercept": float(intercept), "intercept_se": math.sqrt(resid * (1 / n + (sv / n) ** 2 / sxx))}


def returns_to_go(table: pa.Table, mask: np.ndarray, prow: np.ndarray, offsets: np.ndarray, reward: np.ndarray,
                  gamma: float) -> np.ndarray:
    """G at every policy token (flat, row order): the rewards at this and later policy tokens of
    the row (``token_rewards`` if the table has them, the outcome on the last policy token),
    discounted by ``gamma`` per policy token."""
    r = np.zeros(int(mask.sum()))
    if "token_rewards" in table.column_names:
        r += table.column("token_rewards").combine_chunks().values.to_numpy()[mask]
    last = np.flatnonzero(np.r_[prow[1:] != prow[:-1], True])
    r[last] += reward[prow[last]]
    n = np.bincount(prow, minlength=len(offsets) - 1)
    start = np.cumsum(n) - n
    idx = np.arange(len(r)) - start[prow]                                # policy-token index in its row
    if gamma == 1.0:  # suffix sums: the row's total minus what came before
        c = np.cumsum(r)
        return np.bincount(prow, weights=r, minlength=len(n))[prow] - (c - r - (c - r)[start[prow]])
    grid = np.zeros((len(n), int(n.max()) + 1))                          # [rows, policy tokens + 1]
    grid[prow, idx] = r
    for j in range(grid.shape[1] - 2, -1, -1):
        grid[:, j] += gamma * grid[:, j + 1]
    return grid[prow, idx]


def value_stats(table: pa.Table, gamma: float = 1.0) -> dict:
    """``ValueStats`` of one table (a generated or read-back synthetic archive)."""
    stats = ValueStats(gamma)
    stats.add(table)
    return stats.result()
