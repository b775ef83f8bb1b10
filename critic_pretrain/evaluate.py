"""Held-out evaluation of a value model, and ``critic-pretrain eval``.

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

``evaluate`` (used by ``train.py``) returns the flat dict of scalars logged to
``metrics.jsonl``; ``evaluate_detailed`` also returns the per-bucket and calibration
tables (``Evaluation``), which ``critic-pretrain eval`` writes as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from rollouts import fileio

from . import advantage, preflight
from . import checkpoint as ckpt
from .data import Layout, RolloutStore, loader, pack
from .errors import UserError
from .metrics import N_SUMS, summarize, token_terms
from .model import token_values
from .packed import PackedBatch

log = logging.getLogger(__name__)

POSITION_BUCKETS = ("q1", "q2", "q3", "q4")
TURN_BUCKETS = ("1", "2", "3", "4plus")
CALIBRATION_GRID = 512
"""Fine cells of the prediction histogram between the grid's edges (plus 2 overflow cells)."""
CALIBRATION_GROUPS = 10
COLD_EVERY = 10
"""``critic-pretrain eval`` scores the step-0 model on every 10th micro-batch: about 10% more model time."""
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


# ---------------------------------------------------------------------------------------------
# Per-token bucketing and per-group sums (device tensors only: no host syncs)

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

    rank, n_policy = within_rollout_cumsum(policy)                      # 1-based among policy tokens
    quartile = (4 * (rank - 1).clamp_min(0)) // n_policy[seg].clamp_min(1)
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


def batch_sums(values: torch.Tensor, batch: PackedBatch, edges: torch.Tensor) -> torch.Tensor:
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


# ---------------------------------------------------------------------------------------------
# From sums to metrics (host)

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

    def to_json(self) -> dict:
        return fileio.plain({"metrics": self.metrics, "buckets": self.buckets, "calibration": self.calibration,
                             "advantages": self.advantages, "turn_change": self.turn_change,
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


# ---------------------------------------------------------------------------------------------
# The evaluation loop

def eval_batches(store: RolloutStore, indices: np.ndarray, max_tokens: int, max_length: int,
                 token_cap: int | None) -> list[np.ndarray]:
    """All ranks' micro-batches (rows sorted by length: similar lengths pack together).

    ``token_cap``: evaluate a fixed random subset (seed 0) of about that many tokens -- the
    same rollouts at every evaluation, so capped curves stay comparable, and not biased to
    short rollouts as cutting the length-sorted list would be.
    """
    if token_cap is not None:
        perm = np.random.default_rng(0).permutation(len(indices))
        tokens = np.cumsum(np.minimum(store.lengths[indices[perm]], max_length))
        indices = indices[perm[: max(int(np.searchsorted(tokens, token_cap, side="right")), 1)]]
    order = indices[np.argsort(store.lengths[indices], kind="stable")]
    return [order[b] for b in pack(np.minimum(store.lengths[order], max_length), max_tokens)]


@torch.no_grad()
def evaluate_detailed(model: torch.nn.Module, store: RolloutStore, indices: np.ndarray, *, max_tokens: int,
                      max_length: int, layout: Layout, device: torch.device,
                      reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                      token_cap: int | None = None, prefix: str = "val", cold_model: torch.nn.Module | None = None,
                      cold_every: int = 1) -> Evaluation:
    """Metrics and tables over ``indices`` of ``store``; micro-batches go round-robin to ranks.

    ``reduce`` sums a tensor over ranks (``accelerator.reduce(t, "sum")``); it is called once.
    ``cold_model``: the step-0 model, scored as the ``cold`` advantage estimator on every
    ``cold_every``-th micro-batch (length-sorted, so the sample covers all lengths).
    """
    was_training = model.training
    model.eval()
    grid = CalibrationGrid.for_store(store)
    edges = grid.edges(device)
    batches = eval_batches(store, indices, max_tokens, max_length, token_cap)
    mine = batches[layout.rank::layout.world]
    # Every rank runs the same number of forwards (FSDP all-gathers parameters, DDP syncs
    # buffers in forward): ranks with fewer batches repeat one and discard its sums.
    real = len(mine)
    mine += batches[:1] * (-(-len(batches) // layout.world) - real)
    groups = advantage.GroupStats.of(store, np.concatenate(batches) if batches else np.zeros(0, np.int64))
    gamma = float(store.meta["targets"]["gamma"])
    sums = torch.zeros(2, n_groups(grid.cells), N_SUMS, dtype=torch.float64, device=device)
    pair = torch.zeros(advantage.N_ROWS, N_SUMS, dtype=torch.float64, device=device)
    ev = torch.zeros(advantage.N_EV, N_SUMS, dtype=torch.float64, device=device)
    for i, (rows, mb) in enumerate(zip(mine, loader(store, mine, max_length, extra=True))):
        mb = mb.to(device)
        values = token_values(model, mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)
        cold_values = None
        if cold_model is not None and i < real and i % cold_every == 0:  # single-process `eval` only
            cold_values = token_values(cold_model, mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)
        if i < real:
            sums += batch_sums(values, mb, edges)
            p, e = advantage.batch_sums(values, mb, groups.tensor(rows, device), gamma, grouped=groups.grouped,
                                        cold_values=cold_values)
            pair += p
            ev += e
    model.train(was_training)
    flat = reduce(torch.cat([sums.flatten(), pair.flatten(), ev.flatten()])).cpu()  # the one collective + sync
    sums, pair, ev = flat.split([sums.numel(), pair.numel(), ev.numel()])
    result = finish(sums.view(2, -1, N_SUMS), grid, has_oracle=store.has_oracle, prefix=prefix)
    result.advantages = advantage.table(pair.view(advantage.N_ROWS, N_SUMS))
    result.turn_change = advantage.turn_changes(pair.view(advantage.N_ROWS, N_SUMS))
    if result.metrics:
        result.metrics.update(advantage.metrics(pair.view(advantage.N_ROWS, N_SUMS), ev.view(advantage.N_EV, N_SUMS),
                                                prefix))
    return result


def evaluate(model: torch.nn.Module, store: RolloutStore, indices: np.ndarray, *, max_tokens: int,
             max_length: int, layout: Layout, device: torch.device,
             reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
             token_cap: int | None = None, prefix: str = "val") -> dict[str, float]:
    """Flat scalar metrics (``{prefix}/loss``, ``/explained_variance``, ``/oracle_*``,
    ``/loss_pos_q1``.., ``/loss_turn_1``.., ``/calibration_error``) for ``metrics.jsonl``."""
    return evaluate_detailed(model, store, indices, max_tokens=max_tokens, max_length=max_length, layout=layout,
                             device=device, reduce=reduce, token_cap=token_cap, prefix=prefix).metrics


# ---------------------------------------------------------------------------------------------
# Evaluating a checkpoint: `critic-pretrain eval`

def checkpoint_model_config(step_dir: Path, cfg, trust_remote_code: bool = False):
    """(ModelConfig, HF config) of ``step_dir``'s value model, from its own config.json (no
    backbone download), with the run's head settings and attention. ``trust_remote_code``
    comes from the caller (the user's command line), never from the checkpoint's config.yaml."""
    from .model import build_config

    hf_config = json.loads(ckpt.StepPaths(step_dir).hf_config.read_text())
    model_cfg = dataclasses.replace(cfg.model, name_or_path=None, config=hf_config, init_from="backbone",
                                    trust_remote_code=trust_remote_code)
    return model_cfg, build_config(model_cfg)


def load_checkpoint_model(step_dir: Path, cfg, device: torch.device, trust_remote_code: bool = False, *,
                          configs=None) -> torch.nn.Module:
    """The value model of ``step_dir``, weights loaded strictly. ``configs``: what
    ``checkpoint_model_config`` returned, when the caller already has it."""
    from .model import build_value_model

    model_cfg, hf_config = configs or checkpoint_model_config(step_dir, cfg, trust_remote_code)
    model = build_value_model(model_cfg, init_head=False, config=hf_config)
    ckpt.load_weights(model, step_dir)
    return model.to(device).eval()


def cold_critic(step_dir: Path, cfg, device: torch.device, configs, trust_remote_code: bool = False
                ) -> tuple[torch.nn.Module | None, str]:
    """(the run's step-0 model, how it was built) -- the critic PPO would start from without
    pretraining: the same seed, backbone and head init as ``train.setup``. (None, why) when the
    backbone is not available here (``model.name_or_path`` moved or is not cached)."""
    from .model import build_value_model, set_head_bias_value

    model_cfg, hf_config = configs
    if cfg.model.name_or_path:
        model_cfg = dataclasses.replace(cfg.model, trust_remote_code=trust_remote_code)
    # Training seeds torch (accelerate's set_seed) right before building the model; forking
    # the RNG keeps this process's own streams untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        try:
            model = build_value_model(model_cfg, init_head=True, config=hf_config)
        except UserError as e:
            return None, f"unavailable: {e}"
    how = f"seed {cfg.seed}, {'weights of ' + cfg.model.name_or_path if cfg.model.name_or_path else 'random init'}"
    manifest = ckpt.StepPaths(step_dir).read_manifest() or {}
    mean_target = manifest.get("data", {}).get("stats", {}).get("mean_target")
    if cfg.model.bias_init == "mean_target" and cfg.model.init_from == "backbone" and mean_target is not None:
        set_head_bias_value(model, mean_target)
        how += f", head bias {mean_target:.4g} (the training data's mean target)"
    return model.to(device).eval(), how


def checked_step_dir(path: str) -> Path:
    """``path`` as a complete ``step_<n>`` checkpoint folder, or a one-line UserError."""

    step_dir = Path(path)
    if not step_dir.exists():
        raise UserError(f"{path}: no such checkpoint folder; pass a step_<n> folder of a critic-pretrain run")
    if not step_dir.is_dir():
        raise UserError(f"{path}: not a folder; pass a step_<n> folder of a critic-pretrain run")
    problem = ckpt.verify(step_dir, content=True)
    if problem:
        raise UserError(f"{path}: not a complete critic-pretrain checkpoint ({problem}); "
                        "pass a step_<n> folder written by `critic-pretrain train`")
    if not ckpt.StepPaths(step_dir).config_yaml.is_file():
        raise UserError(f"{path}: has no config.yaml (needed to build targets as in training); "
                        "pass a step_<n> folder written by `critic-pretrain train`")
    return step_dir


def default_out(step_dir: Path, rollouts: list[str] | None) -> Path:
    """``<run>/eval/step_<n>-val.json`` (the run's validation split) or ``-<hash>.json``
    (other rollouts; hash of the specs), next to the run's checkpoints."""
    tag = "val" if not rollouts else hashlib.sha1("\0".join(rollouts).encode()).hexdigest()[:8]
    return step_dir.parent / "eval" / f"{step_dir.name}-{tag}.json"


def evaluate_checkpoint(step_dir: str | Path, rollouts: list[str] | None = None, *, token_cap: int | None = None,
                        batch_tokens: int | None = None, cache_dir: str | Path | None = None,
                        device: str | torch.device | None = None, trust_remote_code: bool = False,
                        cold_every: int = COLD_EVERY) -> dict:
    """Evaluate checkpoint ``step_dir`` and return the JSON-ready report.

    Targets are built with the checkpoint's own ``config.yaml`` (gamma, lambda, reward
    transform, values_from), so they match what the critic was trained on. ``rollouts``:
    any rollout specs; None evaluates the run's own validation split (its ``data_cache``
    is reused when still valid). ``cache_dir``: where other rollouts are prepared (default:
    a temporary folder, removed afterwards). ``cold_every``: score the step-0 model (``cold``
    advantage estimator) on every n-th micro-batch; 0 skips it.
    """
    from .config import load_config
    from .data import build_train_data, max_length_of, prepare_store
    from .model import position_limit

    step_dir = checked_step_dir(str(step_dir))
    cfg = load_config(ckpt.StepPaths(step_dir).config_yaml)
    dev = resolve_device(device)
    configs = checkpoint_model_config(step_dir, cfg, trust_remote_code)
    hf_config = configs[1]
    model_limit, vocab_size = position_limit(hf_config), hf_config.vocab_size
    max_length = max_length_of(cfg.data, model_limit)  # as in training
    batch_tokens = batch_tokens or cfg.data.max_tokens
    if batch_tokens < max_length:
        raise UserError(f"--batch-tokens {batch_tokens} is below the run's max_length {max_length}; "
                        "a rollout must fit into one micro-batch: raise it")
    t0 = time.perf_counter()
    manifest = ckpt.StepPaths(step_dir).read_manifest() or {}
    with contextlib.ExitStack() as stack:
        if rollouts:
            preflight.check_rollouts_tokenizer(list(rollouts), manifest.get("tokenizer"),
                                               "evaluate on rollouts of the critic's own tokenizer")
            where = cache_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="critic-eval-"))
            store = prepare_store(list(rollouts), where, cfg.data, cfg.targets, name="eval", vocab_size=vocab_size)
            indices, split = np.arange(len(store)), "all rows"
        else:
            run_cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else step_dir.parent / "data_cache"
            data = build_train_data(cfg.data, cfg.targets, run_cache, main_first=contextlib.nullcontext,
                                    progress=False, model_limit=model_limit, vocab_size=vocab_size)
            store, indices, split = data.val, data.val_idx, "validation split of the run"
            if len(indices) == 0:
                raise UserError(f"{step_dir}: the run has no validation split (data.val_fraction=0, no data.val); "
                                "pass --rollouts PATH to evaluate on other rollouts")
            preflight.check_split_unchanged(step_dir, manifest, cfg, len(data.train_idx), len(indices),
                                            fix="pass --rollouts PATH with rollouts it never trained on")
        model = load_checkpoint_model(step_dir, cfg, dev, configs=configs)
        cold, cold_how = None, "off (--cold-every 0)"
        if cold_every and store.has_oracle:
            cold, cold_how = cold_critic(step_dir, cfg, dev, configs, trust_remote_code)
        with _autocast(dev, cfg.train.mixed_precision):
            result = evaluate_detailed(model, store, indices, max_tokens=batch_tokens, max_length=max_length,
                                       layout=Layout(1, 0, 1), device=dev, token_cap=token_cap, prefix="eval",
                                       cold_model=cold, cold_every=cold_every or 1)
        data_summary = _data_summary(store, indices, rollouts, split, max_length)
    info = ckpt.StepPaths(step_dir).read_training_info() or {}
    return {
        "checkpoint": {"path": str(step_dir.resolve()), "step": info.get("total_steps"),
                       "targets": dataclasses.asdict(cfg.targets)},
        "data": data_summary,
        **result.to_json(),
        "cold_critic": {"built": cold_how, "every": cold_every} if store.has_oracle else None,
        "device": str(dev), "seconds": round(time.perf_counter() - t0, 2),
    }


def resolve_device(name: str | torch.device | None) -> torch.device:
    """``name``, or cuda when available, else cpu; an unusable name is a UserError."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a torch device; use cpu, cuda or cuda:<index>") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu")
    return dev


def _autocast(device: torch.device, mixed_precision: str):
    """Training's numerics: bf16 autocast where training used it (``auto`` on CUDA)."""
    if device.type == "cuda" and mixed_precision in ("auto", "bf16") and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if device.type == "cuda" and mixed_precision == "fp16":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _data_summary(store: RolloutStore, indices: np.ndarray, rollouts: list[str] | None, split: str,
                  max_length: int) -> dict:
    """What was evaluated (rows, tokens) and what the prepared store read and left out (its stats)."""
    files = [f["path"] if isinstance(f, dict) else str(f) for f in store.meta.get("files", [])]
    return {"rollouts": list(rollouts) if rollouts else None, "files": files, "split": split,
            "rows": int(len(indices)), "tokens": int(store.lengths[indices].sum()),
            "longer_than_max_length": int((store.lengths[indices] > max_length).sum()),
            "has_oracle": store.has_oracle, "store": dataclasses.asdict(store.stats)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="critic-pretrain eval",
        description="Evaluate a step_<n> checkpoint on rollouts (default: its run's validation split) and write "
                    "JSON: metrics, position/turn buckets, calibration deciles, data summary.")
    p.add_argument("step_dir", metavar="STEP_DIR", help="a step_<n> folder written by critic-pretrain train")
    p.add_argument("--rollouts", nargs="+", metavar="PATH",
                   help="rollout files, folders or globs (default: the run's own validation split)")
    p.add_argument("--out", metavar="FILE.json",
                   help="where to write the JSON (default: <run>/eval/step_<n>-val.json, or -<hash>.json "
                        "for --rollouts)")
    p.add_argument("--max-tokens", type=int, metavar="N", help="evaluate at most about N tokens (default: all)")
    p.add_argument("--batch-tokens", type=int, metavar="N", help="tokens per micro-batch (default: the run's "
                   "data.max_tokens)")
    p.add_argument("--cold-every", type=int, default=COLD_EVERY, metavar="N",
                   help="score the run's step-0 model (the 'cold' advantage estimator, rollouts with oracle_values "
                        f"only) on every N-th micro-batch (default {COLD_EVERY}: about 1/{COLD_EVERY} more model "
                        "time); 1: all of them, 0: off")
    p.add_argument("--cache-dir", metavar="DIR", help="where --rollouts are prepared (default: a temporary folder)")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow modelling code shipped with the checkpoint's config.json (never taken from the "
                        "checkpoint's own config.yaml)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for n, flag in ((args.max_tokens, "--max-tokens"), (args.batch_tokens, "--batch-tokens")):
        if n is not None and n <= 0:
            raise UserError(f"{flag} {n} must be > 0")
    if args.cold_every < 0:
        raise UserError(f"--cold-every {args.cold_every} must be >= 0 (0: off)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    out = Path(args.out) if args.out else default_out(Path(args.step_dir), args.rollouts)
    report = evaluate_checkpoint(args.step_dir, args.rollouts, token_cap=args.max_tokens,
                                 batch_tokens=args.batch_tokens, cache_dir=args.cache_dir, device=args.device,
                                 trust_remote_code=args.trust_remote_code, cold_every=args.cold_every)
    write_json(report, out)
    m = report["metrics"]
    print("  ".join(f"{k.split('/', 1)[1]}={v:.4g}" for k, v in m.items()
                    if v is not None and "_pos_" not in k and "_turn_" not in k and "adv_corr" not in k))
    print(advantage.summary_text(report, 'eval'))
    print(f"wrote {out}")
    return 0


def write_json(obj: dict, out: Path) -> None:
    """Write ``obj`` as indented JSON (NaN as null; parents created); an unwritable place is a UserError."""
    try:
        fileio.write_json(out, obj)
    except OSError as e:
        raise UserError(f"cannot write {out} ({e.strerror}); pass --out FILE.json somewhere writable") from None


if __name__ == "__main__":
    from .cli import main as cli_main
    sys.exit(cli_main(["eval", *sys.argv[1:]]))
