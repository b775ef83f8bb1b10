"""The evaluation loop: micro-batches round-robin to ranks, one ``EvalSums`` that owns every sum,
one all-reduce. ``evaluate`` (used by ``train.py``) returns the flat dict of scalars logged to
``metrics.jsonl``; ``evaluate_detailed`` also returns the per-bucket and calibration tables."""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np
import torch

from ..data import Layout, RolloutStore, loader, pack
from ..metrics import N_SUMS
from ..model import token_values
from ..packed import PackedBatch
from . import advantage, verdict
from .buckets import CalibrationGrid, Evaluation, finish, group_sums, n_groups

log = logging.getLogger(__name__)


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
    batches = eval_batches(store, indices, max_tokens, max_length, token_cap)
    rank_batches = batches[layout.rank::layout.world]
    # Every rank runs the same number of forwards (FSDP all-gathers parameters, DDP syncs
    # buffers in forward): ranks with fewer batches repeat one and discard its sums.
    real = len(rank_batches)
    rank_batches += batches[:1] * (-(-len(batches) // layout.world) - real)
    groups = advantage.GroupStats.of(store, np.concatenate(batches) if batches else np.zeros(0, np.int64))
    sums = EvalSums(grid, groups, gamma=float(store.meta["targets"]["gamma"]), device=device)
    for i, (rows, mb) in enumerate(zip(rank_batches, loader(store, rank_batches, max_length, with_rewards=True))):
        mb = mb.to(device)
        values = token_values(model, mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)
        cold_values = None
        if cold_model is not None and i < real and i % cold_every == 0:  # single-process `eval` only
            cold_values = token_values(cold_model, mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)
        if i < real:
            sums.add(values, mb, rows, cold_values)
    model.train(was_training)
    sums.reduce(reduce)
    return sums.evaluation(has_oracle=store.has_oracle, prefix=prefix)


class EvalSums:
    """Everything an evaluation adds up, one micro-batch at a time: per-group value sums against
    the targets and against the true values [2, G, 6] (G: position, turn and calibration groups),
    the advantage-pair sums [N_ROWS, 6], the group-mean EV sums [N_EV, 6], the spread of the
    values and targets [5] (weighted n, sum v, sum v^2, sum t, sum t^2) and the per-rollout sums
    of the verdict [R, verdict.N_FIELDS] (each rollout's row written by the rank that evaluates it). Sums add across
    micro-batches and ranks, so an evaluation costs one all-reduce and one host sync (``reduce``),
    whatever its size; ``evaluation`` turns the reduced sums into metrics and tables."""

    def __init__(self, grid: CalibrationGrid, groups: advantage.GroupStats, *, gamma: float, device: torch.device):
        self.grid, self.groups, self.gamma, self.device = grid, groups, gamma, device
        self.edges = grid.edges(device)
        self.values = torch.zeros(2, n_groups(grid.cells), N_SUMS, dtype=torch.float64, device=device)
        self.pair = torch.zeros(advantage.N_ROWS, N_SUMS, dtype=torch.float64, device=device)
        self.ev = torch.zeros(advantage.N_EV, N_SUMS, dtype=torch.float64, device=device)
        self.spread = torch.zeros(5, dtype=torch.float64, device=device)
        self.rollouts = torch.zeros(len(groups.rows), verdict.N_FIELDS, dtype=torch.float64, device=device)

    def add(self, values: torch.Tensor, batch: PackedBatch, rows: np.ndarray,
            cold_values: torch.Tensor | None = None) -> None:
        """One micro-batch: ``values`` [1, N] predictions (``cold_values``: the step-0 model's)."""
        self.values += group_sums(values, batch, self.edges)
        row_stats = self.groups.tensor(rows, self.device)                 # [k, 3]
        pair, ev = advantage.estimator_sums(values, batch, row_stats, self.gamma, grouped=self.groups.grouped,
                                            cold_values=cold_values)
        self.pair += pair
        self.ev += ev
        loo = row_stats[:, 2]
        measured = torch.isfinite(loo) if self.groups.grouped else torch.ones_like(loo, dtype=torch.bool)
        slots = torch.tensor([self.groups.slot[r] for r in rows.tolist()], device=self.device)
        self.rollouts[slots] = verdict.row_sums(values, batch, torch.nan_to_num(loo), measured)
        w, v, t = batch.weights.double(), values.detach().double(), batch.targets.double()         # [1, N]
        self.spread += torch.stack([w.sum(), (w * v).sum(), (w * v * v).sum(), (w * t).sum(), (w * t * t).sum()])

    def reduce(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Sum over ranks: the one collective, and the one host sync, of an evaluation."""
        parts = (self.values, self.pair, self.ev, self.spread, self.rollouts)
        flat = reduce(torch.cat([t.flatten() for t in parts])).cpu()
        self.values, self.pair, self.ev, self.spread, self.rollouts = (
            chunk.view(t.shape) for chunk, t in zip(flat.split([t.numel() for t in parts]), parts))

    def evaluation(self, *, has_oracle: bool, prefix: str) -> Evaluation:
        result = finish(self.values, self.grid, has_oracle=has_oracle, prefix=prefix)
        result.advantages = advantage.table(self.pair)
        result.turn_change = advantage.turn_changes(self.pair)
        if result.metrics:
            result.metrics.update(advantage.metrics(self.pair, self.ev, prefix))
            n, sv, svv, st, stt = self.spread.tolist()
            std = lambda s, ss: math.sqrt(max(ss / n - (s / n) ** 2, 0.0))  # noqa: E731
            result.metrics[f"{prefix}/value_std"] = std(sv, svv)  # a collapsed critic: near 0
            result.metrics[f"{prefix}/target_std"] = std(st, stt)
            g, sums = self.groups, self.rollouts.numpy()
            outcome, baseline = g.column("outcome"), np.nan_to_num(g.column("loo_mean"))

            def judge_rows(mask: np.ndarray) -> verdict.Verdict:
                return verdict.judge(sums[mask], g.group[mask], outcome[mask], baseline[mask], grouped=g.grouped)

            result.verdict = judge_rows(np.ones(len(g.rows), bool))
            result.judge_rows, result.eval_rows = judge_rows, g.rows
            result.metrics.update(result.verdict.metrics(prefix))
        return result


def evaluate(model: torch.nn.Module, store: RolloutStore, indices: np.ndarray, *, max_tokens: int,
             max_length: int, layout: Layout, device: torch.device,
             reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
             token_cap: int | None = None, prefix: str = "val") -> dict[str, float]:
    """Flat scalar metrics (``{prefix}/loss``, ``/explained_variance``, ``/oracle_*``,
    ``/loss_pos_q1``.., ``/loss_turn_1``.., ``/calibration_error``) for ``metrics.jsonl``."""
    return evaluate_detailed(model, store, indices, max_tokens=max_tokens, max_length=max_length, layout=layout,
                             device=device, reduce=reduce, token_cap=token_cap, prefix=prefix).metrics
