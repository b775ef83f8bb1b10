"""What an evaluation measures, and its sums: per-token buckets, per-group sufficient sums, metrics.

What is measured, over policy tokens (loss mask 1) of the evaluated rollouts:

- value loss ``Σ w·(V−R)² / n`` and explained variance ``1 − Var(R−V) / Var(R)``
  (R: the value target, built exactly as in training; V: the prediction);
- the same per **position bucket**: the quartile of a token among its rollout's policy
  tokens (token i of P goes to quartile ``floor(4i/P)``: q1 is the start of the
  response, q4 its end) and the **policy turn** it belongs to (a turn is a maximal run of
  consecutive policy tokens; turns 1, 2, 3 and 4+);
- **calibration**: mean target and mean prediction per predicted-value decile;
- with ``oracle_values`` in the rollouts (synthetic data), all of the above against the
  true values as well (``oracle_*``).

Cost model: every metric is a function of per-group sufficient sums (the
``metrics.value_sums`` layout, one row per group), accumulated on the device with one
``index_add_`` per micro-batch and target kind, and all-reduced once at the end: no host
sync per micro-batch, one ``reduce`` and one device-to-host copy per evaluation.

Calibration bins need edges before the predictions are known. Instead of a second pass we
histogram the predictions on a fixed fine grid (``CALIBRATION_GRID`` cells spanning the
targets' mean ± 4 std, from the store's statistics, plus an underflow and an overflow
cell); the host then merges adjacent cells into ten groups of about equal token count.
A decile's edges are exact to one grid cell (8 std / 512); cells are never split, so when
predictions pile up in one cell the table has fewer than ten rows.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from rollouts import fileio

from ..data import RolloutStore
from ..metrics import N_SUMS, summarize, token_terms
from ..packed import PackedBatch

log = logging.getLogger(__name__)


POSITION_BUCKETS = ("q1", "q2", "q3", "q4")


TURN_BUCKETS = ("1", "2", "3", "4plus")


CALIBRATION_GRID = 512
"""Fine cells of the prediction histogram between the grid's edges (plus 2 overflow cells)."""


CALIBRATION_GROUPS = 10


GRID_HALF_WIDTH_STD = 4.0


# Rows of the per-group sums matrix: all tokens, position quartiles, turns, calibration cells.
_POS0 = 1


_TURN0 = _POS0 + len(POSITION_BUCKETS)


_CAL0 = _TURN0 + len(TURN_BUCKETS)


# The two target kinds (first axis of the sums tensor).
AGAINST_TARGET, AGAINST_ORACLE = 0, 1


@dataclass(frozen=True)
class CalibrationGrid:
    """Fixed edges of the prediction histogram that calibration deciles are merged from."""

    lo: float
    hi: float
    cells: int = CALIBRATION_GRID

    @classmethod
    def for_store(cls, store: RolloutStore) -> "CalibrationGrid":
        """Mean ± 4 std of the store's value targets (known before any prediction)."""
        mean, std = store.stats.mean_target, math.sqrt(max(store.stats.target_var, 0.0))
        half = GRID_HALF_WIDTH_STD * std if std > 1e-6 else 1.0
        return cls(mean - half, mean + half)

    def edges(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[cells + 1] float32 boundaries; ``torch.bucketize`` maps a value to 0..cells+1."""
        return torch.linspace(self.lo, self.hi, self.cells + 1, dtype=torch.float32, device=device)

    def cell_bounds(self, cell: int) -> tuple[float, float]:
        """(lower, upper) edge of histogram cell ``cell`` (0 and cells+1 are the overflow cells)."""
        e = self.edges().tolist()
        return (-math.inf if cell == 0 else e[cell - 1]), (math.inf if cell == self.cells + 1 else e[cell])


def n_groups(cells: int) -> int:
    """Rows of the sums matrix for a calibration grid of ``cells`` cells (+2 overflow cells)."""
    return _CAL0 + cells + 2


def token_buckets(weights: torch.Tensor, position_ids: torch.Tensor, n_rollouts: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(position quartile 0..3, turn bucket 0..3) for every token of a packed row.

    ``weights`` / ``position_ids``: [1, N] (rollouts start where ``position_ids == 0``);
    ``n_rollouts`` is a host int (``len(seq_lens)``), so sizing the per-rollout counts needs
    no sync. Values for non-policy tokens are in range but meaningless (they weigh 0).
    """
    policy = (weights[0] > 0).long()                                   # [N]
    start = position_ids[0] == 0
    seg = (torch.cumsum(start.long(), 0) - 1).clamp_min(0)              # rollout of each token

    def within_rollout_cumsum(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(inclusive running count of ``flags`` restarted at every rollout, count per rollout)."""
        per_rollout = torch.zeros(n_rollouts, dtype=torch.long, device=flags.device).index_add_(0, seg, flags)
        before = torch.cumsum(per_rollout, 0) - per_rollout
        return torch.cumsum(flags, 0) - before[seg], per_rollout

    nth_policy, n_policy = within_rollout_cumsum(policy)                # 1-based among policy tokens
    quartile = (4 * (nth_policy - 1).clamp_min(0)) // n_policy[seg].clamp_min(1)
    prev = torch.cat([policy.new_zeros(1), policy[:-1]])
    turn_start = policy * ((prev == 0) | start).long()
    turn, _ = within_rollout_cumsum(turn_start)                         # 1-based turn index
    return quartile.clamp(0, 3), (turn.clamp(1, 4) - 1)


def group_index(values: torch.Tensor, weights: torch.Tensor, position_ids: torch.Tensor, n_rollouts: int,
                edges: torch.Tensor) -> torch.Tensor:
    """[4, N] row of the sums matrix each token adds to: all, position, turn, calibration cell."""
    quartile, turn = token_buckets(weights, position_ids, n_rollouts)
    cell = torch.bucketize(values[0].detach().float(), edges)           # 0..cells+1
    return torch.stack([torch.zeros_like(quartile), _POS0 + quartile, _TURN0 + turn, _CAL0 + cell])


def token_sums(values: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[N, 6] float64 per-token terms of ``metrics.value_sums`` for a packed [1, N] batch."""
    return token_terms(values[0], targets[0], weights[0])


def group_sums(values: torch.Tensor, batch: PackedBatch, edges: torch.Tensor) -> torch.Tensor:
    """[2, groups, 6] sums of one packed micro-batch: against targets, and against the oracle
    (zeros without one). Adds across micro-batches and ranks."""
    groups = group_index(values, batch.weights, batch.position_ids, len(batch.seq_lens), edges)
    out = torch.zeros(2, n_groups(len(edges) - 1), N_SUMS, dtype=torch.float64, device=values.device)
    kinds = [(AGAINST_TARGET, batch.targets, batch.weights)]
    if batch.oracle is not None:
        oracle = batch.oracle
        kinds.append((AGAINST_ORACLE, torch.nan_to_num(oracle), batch.weights * torch.isfinite(oracle)))
    flat = groups.reshape(-1)
    for kind, target, weights in kinds:
        per_token = token_sums(values, target, weights)                  # [N, 6]
        out[kind].index_add_(0, flat, per_token.repeat(groups.shape[0], 1))
    return out


@dataclass
class Evaluation:
    """One evaluation: flat scalars for ``metrics.jsonl`` and the tables behind them."""

    metrics: dict[str, float]
    buckets: dict[str, list[dict]]
    """``{"position": [...4 rows], "turn": [...4 rows]}``; each row: bucket, tokens, loss,
    explained_variance, target_mean, value_mean and (with oracle values) oracle_*."""
    calibration: list[dict]
    """Predicted-value deciles: lo, hi (grid edges; None = unbounded), tokens, value_mean,
    target_mean and (with oracle values) oracle_mean."""
    grid: CalibrationGrid
    advantages: list[dict] = dataclasses.field(default_factory=list)
    """``advantage.table``: correlation and MSE of each estimator's advantages against the true
    one-step advantages (rollouts with ``oracle_values`` only)."""
    turn_change: list[dict] = dataclasses.field(default_factory=list)
    """``advantage.turn_changes``: value change across a turn vs the rollout's outcome."""
    verdict: object = None
    """``verdict.Verdict``: the oracle-free measures with intervals and the call (None when empty)."""
    judge_rows: object = None
    """``judge_rows(mask [R] bool) -> Verdict``: the verdict of a subset of the evaluated rollouts
    (in ``eval_rows`` order) from the same per-rollout sums, without another forward pass."""
    eval_rows: np.ndarray | None = None
    """[R] the evaluated store rows, in the order ``judge_rows`` takes its mask."""

    def to_json(self) -> dict:
        return fileio.plain({"metrics": self.metrics, "buckets": self.buckets, "calibration": self.calibration,
                             "advantages": self.advantages, "turn_change": self.turn_change,
                             "verdict": self.verdict.to_json() if self.verdict is not None else None,
                             "calibration_grid": {**dataclasses.asdict(self.grid), "method": (
                            "predictions histogrammed on a fixed grid (targets' mean +- 4 std); adjacent cells "
                            "merged into deciles of about equal token count")}})


def _stats(row: torch.Tensor) -> dict[str, float]:
    """summarize() of one sums row without a prefix: loss, explained_variance, means, tokens."""
    return {k.split("/", 1)[1]: v for k, v in summarize(row, "_").items()}


def _bucket_rows(sums: torch.Tensor, first: int, names: tuple[str, ...], has_oracle: bool) -> list[dict]:
    rows = []
    for i, name in enumerate(names):
        s = _stats(sums[AGAINST_TARGET, first + i])
        row = {"bucket": name, "tokens": int(s.get("valid_tokens", 0)), "loss": s.get("loss", math.nan),
               "explained_variance": s.get("explained_variance", math.nan),
               "target_mean": s.get("target_mean", math.nan), "value_mean": s.get("value_mean", math.nan)}
        if has_oracle:
            o = _stats(sums[AGAINST_ORACLE, first + i])
            row.update(oracle_loss=o.get("loss", math.nan), oracle_explained_variance=o.get("explained_variance",
                                                                                              math.nan))
        rows.append(row)
    return rows


def merge_cells(counts: np.ndarray, groups: int = CALIBRATION_GROUPS) -> np.ndarray:
    """Group id (0..groups-1) per histogram cell: adjacent cells, about equal token counts.

    A cell goes to the group its middle token falls in, so cells are never split.
    """
    total = counts.sum()
    if total <= 0:
        return np.zeros(len(counts), np.int64)
    middle = np.cumsum(counts) - counts / 2
    return np.minimum((middle * groups / total).astype(np.int64), groups - 1)


def calibration_table(sums: torch.Tensor, grid: CalibrationGrid, has_oracle: bool) -> list[dict]:
    """Deciles of the prediction histogram: mean prediction vs mean target (and oracle)."""
    cells = sums[:, _CAL0:_CAL0 + grid.cells + 2].numpy()              # [2, cells+2, 6]
    counts = cells[AGAINST_TARGET, :, 0]
    group = merge_cells(counts)
    rows = []
    for g in np.unique(group[counts > 0]):
        members = np.flatnonzero((group == g) & (counts > 0))
        t = cells[AGAINST_TARGET, members].sum(0)
        n, r, d = t[0], t[2], t[4]
        row = {"lo": grid.cell_bounds(int(members[0]))[0], "hi": grid.cell_bounds(int(members[-1]))[1],
               "tokens": int(n), "value_mean": (r - d) / n, "target_mean": r / n}
        if has_oracle:
            o = cells[AGAINST_ORACLE, members].sum(0)
            row["oracle_mean"] = o[2] / o[0] if o[0] > 0 else math.nan
        rows.append(row)
    return rows


def calibration_error(table: list[dict], key: str = "target_mean") -> float:
    """Token-weighted mean |mean ``key`` − mean prediction| over the deciles (0: calibrated)."""
    n = sum(r["tokens"] for r in table)
    if n == 0:
        return math.nan
    return sum(r["tokens"] * abs(r[key] - r["value_mean"]) for r in table) / n


def finish(sums: torch.Tensor, grid: CalibrationGrid, *, has_oracle: bool, prefix: str = "val") -> Evaluation:
    """Metrics and tables from all-reduced [2, groups, 6] host sums."""
    metrics = summarize(sums[AGAINST_TARGET, 0], prefix)
    if not metrics:
        return Evaluation({}, {"position": [], "turn": []}, [], grid)
    if has_oracle:
        metrics.update({k.replace(f"{prefix}/", f"{prefix}/oracle_"): v
                        for k, v in summarize(sums[AGAINST_ORACLE, 0], prefix).items()
                        if k.endswith(("/loss", "/explained_variance"))})
    buckets = {"position": _bucket_rows(sums, _POS0, POSITION_BUCKETS, has_oracle),
               "turn": _bucket_rows(sums, _TURN0, TURN_BUCKETS, has_oracle)}
    for kind in ("loss", "oracle_loss") if has_oracle else ("loss",):
        for family, short in (("position", "pos_"), ("turn", "turn_")):
            metrics.update({f"{prefix}/{kind}_{short}{row['bucket']}": row[kind] for row in buckets[family]})
    table = calibration_table(sums, grid, has_oracle)
    metrics[f"{prefix}/calibration_error"] = calibration_error(table)
    if has_oracle:
        metrics[f"{prefix}/oracle_calibration_error"] = calibration_error(table, "oracle_mean")
    return Evaluation(metrics, buckets, table, grid)
