"""Advantage quality: would PPO's advantages computed with this critic beat what the run gets
without one?

A critic is worth its GPU hours only through the advantages PPO computes from it. With
``oracle_values`` in the rollouts (the synthetic environment's exact values) the truth is
known: the one-step advantage ``A*_t = r_t + gamma * V*_{t'} - V*_t`` (``t'`` the next policy
token: carry-forward across prompt and environment tokens, as the targets; ``V* = 0`` after
the last policy token). For each estimator and GAE lambda in ``LAMS`` we accumulate, against
``A*``, at **turn-first** tokens (the first policy token of each turn, where the decision and
almost all of the true advantage sit) and at **all** policy tokens:

- ``critic``: GAE with this critic's values (what PPO computes at its first step);
- ``cold``: GAE with the step-0 model (same seed, same head init) -- what PPO would start from
  without pretraining (``critic-pretrain eval`` only, on a sample of the micro-batches);
- ``group_mean``: GAE with the leave-one-out mean return of the rollout's group held as a
  constant value (a critic that knows the prompt's difficulty and nothing else);
- ``oracle_values``: GAE with the true values (the ceiling for that lambda; lam 0 is exact);
- ``grpo``: the rollout's return minus its group's mean on every token (GRPO's baseline,
  without the division by the group's std so the MSE is in reward units);
- ``reinforce``: the discounted reward-to-go (no baseline).

Without an oracle (real rollouts) two measures need none:

- ``ev_group_mean``: explained variance of the value targets by the leave-one-out group mean
  return. A critic whose EV is not above it has learned the prompt's difficulty at most;
- ``turn_change``: correlation between the value change across a policy turn (value at the
  next turn's first token minus at this turn's) and the rollout's outcome against its group
  (return minus the leave-one-out mean). A critic that only knows the prompt does not move
  between turns; one that does credit assignment moves up in rollouts that end well.

Statistics are mergeable sums ``(n, Σx, Σy, Σx², Σy², Σxy)`` (``pair_terms``), added over
micro-batches and reduced once with the rest of the evaluation. Rollouts of a group of one
(no ``group_id``) have no group baseline; when any group has two or more rollouts, only such
groups' rollouts are measured, so every estimator is scored on the same tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc
import torch

from ..metrics import N_SUMS, token_terms
from ..packed import PackedBatch
from ..targets import compute_gae

LAMS = (0.0, 0.95, 1.0)
WHERE = ("first", "all")
VALUE_ESTIMATORS = ("critic", "cold", "group_mean", "oracle_values")
"""Estimators that are a value function: GAE at each lambda of ``LAMS``."""
FIXED_ESTIMATORS = ("grpo", "reinforce")
"""Estimators that do not depend on lambda."""
ROWS = tuple((e, lam) for e in VALUE_ESTIMATORS for lam in LAMS) + tuple((e, None) for e in FIXED_ESTIMATORS)
"""Rows of the pair-sums tensor against the true advantages, in order."""
TURN_ESTIMATORS = ("critic", "cold", "oracle_values")
N_ROWS = len(ROWS) * len(WHERE) + len(TURN_ESTIMATORS)
N_EV = 3
"""ev rows (``metrics.token_terms`` layout): the group-mean value against the targets and
against the true values, and the true values against the targets (the EV ceiling)."""


def lam_tag(lam: float | None) -> str:
    return "" if lam is None else f"lam{lam:g}"


def row_index(estimator: str, lam: float | None, where: str) -> int:
    return ROWS.index((estimator, lam)) * len(WHERE) + WHERE.index(where)


def turn_index(estimator: str) -> int:
    return len(ROWS) * len(WHERE) + TURN_ESTIMATORS.index(estimator)


# ---------------------------------------------------------------------------------------------
# Per-rollout group statistics (host, once per evaluation)

@dataclass
class GroupStats:
    """Per store row (of the evaluated rows): return, group mean, leave-one-out group mean."""

    outcome: dict[int, float]
    group_mean: dict[int, float]
    loo_mean: dict[int, float]
    grouped: bool
    """Some group has two or more evaluated rollouts: only those are measured."""
    rows: np.ndarray
    """[R] the evaluated store rows, in evaluation order (a rollout's slot is its place here)."""
    group: np.ndarray
    """[R] their group (prompt) index."""
    slot: dict[int, int]
    """store row -> its place in ``rows``."""

    @classmethod
    def of(cls, store, rows: np.ndarray) -> "GroupStats":
        """Group statistics of ``rows``, each group's mean taken over **all** of its rollouts in
        ``store``: for held-out prompts that is the held-out group itself; for held-out responses
        of trained prompts (``data.val_split=response``) the prompt's other responses, most of them
        in training, estimate its mean return as a fresh group would (GRPO's baseline), where the
        one or two held-out siblings alone would be a noisy baseline that flatters the critic."""
        rows = np.asarray(rows, np.int64)
        all_outcome = store.table.column("outcome").to_numpy().astype(np.float64)
        codes = pc.dictionary_encode(store.table.column("split_key")).combine_chunks().indices
        all_group = codes.to_numpy(zero_copy_only=False).astype(np.int64)
        outcome, group = all_outcome[rows], all_group[rows]
        size = np.bincount(all_group)[group].astype(np.float64)
        total = np.bincount(all_group, weights=all_outcome)[group]
        grouped = bool((size >= 2).any())
        if grouped:
            loo = np.where(size >= 2, (total - outcome) / np.maximum(size - 1, 1), np.nan)
            mean = np.where(size >= 2, total / size, np.nan)
        else:  # no groups: the mean over all evaluated rollouts stands in for the outcome's baseline
            mean = loo = np.full(len(rows), outcome.mean() if len(rows) else np.nan)
        ids = rows.tolist()
        return cls(dict(zip(ids, outcome.tolist())), dict(zip(ids, mean.tolist())), dict(zip(ids, loo.tolist())),
                   grouped, rows, group, {r: i for i, r in enumerate(ids)})

    def column(self, name: str) -> np.ndarray:
        """[R] float64 of ``outcome``, ``group_mean`` or ``loo_mean`` in ``rows`` order."""
        d = getattr(self, name)
        return np.array([d[r] for r in self.rows.tolist()], dtype=np.float64)

    def tensor(self, rows: np.ndarray, device: torch.device) -> torch.Tensor:
        """[k, 3] float32 (outcome, group mean, leave-one-out mean) of a micro-batch's rows."""
        return torch.tensor([[self.outcome[r], self.group_mean[r], self.loo_mean[r]] for r in rows.tolist()],
                            dtype=torch.float32).to(device, non_blocking=True)


# ---------------------------------------------------------------------------------------------
# Per micro-batch sums (device only)

def pair_terms(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """[6] float64 ``(n, Σx, Σy, Σx², Σy², Σxy)`` over entries where ``m`` is True."""
    w = m.to(torch.float64)
    x, y = x.to(torch.float64) * w, y.to(torch.float64) * w
    return torch.stack([w.sum(), x.sum(), y.sum(), x.square().sum(), y.square().sum(), (x * y).sum()])


def estimator_sums(values: torch.Tensor, batch: PackedBatch, row_stats: torch.Tensor, gamma: float, *, grouped: bool,
               cold_values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([N_ROWS, 6] pair sums, [N_EV, 6] group-mean EV sums) of one packed micro-batch.

    ``values`` / ``cold_values``: [1, N] predictions; ``row_stats``: ``GroupStats.tensor``
    of the micro-batch's rows. GAE runs on the policy rows (``batch.policy_rows()``): one
    ``targets.compute_gae`` call per lambda with every estimator's rows stacked.
    """
    dev = values.device
    pr = batch.policy_rows()
    mask = pr.mask                                                    # [k, W]
    k, width = mask.shape
    rewards = pr.rows(batch.rewards)
    pos = batch.position_ids[0]
    policy = batch.weights[0] > 0
    starts_turn = policy & ((pos == 0) | ~torch.nn.functional.pad(policy[:-1], (1, 0)))   # [N]
    first = pr.rows(starts_turn) > 0                                  # [k, W] turn-first tokens
    outcome, group_mean, loo = row_stats.unbind(1)                    # [k] each
    measured = torch.isfinite(loo) if grouped else torch.ones(k, dtype=torch.bool, device=dev)
    baseline = torch.nan_to_num(loo)
    pair = torch.zeros(N_ROWS, N_SUMS, dtype=torch.float64, device=dev)
    ev = torch.zeros(N_EV, N_SUMS, dtype=torch.float64, device=dev)

    estimates = {"critic": pr.rows(values), "group_mean": baseline[:, None].expand(k, width)}
    if cold_values is not None:
        estimates["cold"] = pr.rows(cold_values)
    oracle = None
    if batch.oracle is not None:
        finite = torch.isfinite(batch.oracle[0]).float()
        known = torch.zeros(k, device=dev).index_add_(0, pr.seg, 1 - finite[pr.index]) == 0   # [k]
        oracle = pr.rows(batch.oracle.nan_to_num())
        estimates["oracle_values"] = oracle
        measured = measured & known

    turns = turn_slots(first)                                         # one host sync
    if turns is not None:
        target = (outcome - baseline)[:, None]                        # [k, 1] outcome against its group
        for name in TURN_ESTIMATORS:
            if name in estimates:
                pair[turn_index(name)] = turn_change_sums(estimates[name], *turns, target, measured)
    seg = pr.token_seg                                                # [N] rollout of each token
    w = batch.weights * measured[seg][None]
    oracle_packed = batch.oracle.nan_to_num() if oracle is not None else None
    if grouped:  # explained variance of the targets (and true values) by the leave-one-out group mean
        ev[0] = token_terms(baseline[seg][None], batch.targets, w).reshape(-1, N_SUMS).sum(0)
        if oracle is not None:
            ev[1] = token_terms(baseline[seg][None], oracle_packed, w).reshape(-1, N_SUMS).sum(0)
    if oracle is None:
        return pair, ev
    ev[2] = token_terms(oracle_packed, batch.targets, w).reshape(-1, N_SUMS).sum(0)   # the EV ceiling
    grpo = (outcome - group_mean).nan_to_num()[:, None].expand(k, width)
    at = torch.stack([first, mask]) & measured[None, :, None]        # [2, k, W] (WHERE order)
    for (e, lam), sums in advantage_sums(estimates, oracle, grpo, rewards, mask, at, gamma).items():
        i = row_index(e, lam, WHERE[0])
        pair[i:i + len(WHERE)] = sums
    return pair, ev


def turn_slots(first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(slot [k, W]: turn index at each turn-first token, else the spare column n_turns;
    has_next [k, n_turns - 1]: the turn has a next one), or None when no rollout has two turns.
    ``first``: [k, W] turn-first flags of the policy rows. One host sync (the turn count)."""
    n_first = first.sum(1)                                            # [k] turns per rollout
    n_turns = int(n_first.max()) if first.shape[0] else 0             # host sync
    if n_turns < 2:
        return None
    slot = torch.where(first, first.long().cumsum(1) - 1, n_turns)
    has_next = torch.arange(n_turns - 1, device=first.device)[None, :] < (n_first - 1)[:, None]
    return slot, has_next


def turn_change_sums(values: torch.Tensor, slot: torch.Tensor, has_next: torch.Tensor, target: torch.Tensor,
                     measured: torch.Tensor) -> torch.Tensor:
    """[6] pair sums of (value at the next turn's first token - value at this turn's, the
    rollout's outcome against its group) over turns that have a next turn. ``values``: [k, W]
    policy rows; ``slot`` / ``has_next``: ``turn_slots``; ``target``: [k, 1]."""
    k, n_turns = values.shape[0], has_next.shape[1] + 1
    v = torch.zeros(k, n_turns + 1, device=values.device).scatter_(1, slot, values)[:, :n_turns]
    return pair_terms(v[:, 1:] - v[:, :-1], target.expand(k, n_turns - 1), has_next & measured[:, None])


def advantage_sums(estimates: dict[str, torch.Tensor], oracle: torch.Tensor, grpo: torch.Tensor,
                   rewards: torch.Tensor, mask: torch.Tensor, at: torch.Tensor, gamma: float
                   ) -> dict[tuple[str, float | None], torch.Tensor]:
    """{(estimator, lambda): [2, 6] pair sums against the true one-step advantages} on the
    policy rows ([k, W] each; ``at``: [2, k, W] token sets in ``WHERE`` order). GAE runs once
    per lambda with every value estimator's rows stacked, plus the truth (the true values at
    lambda 0) and REINFORCE (no values, lambda 1)."""
    k, width = mask.shape
    runs = {**{e: v for e, v in estimates.items() if e in VALUE_ESTIMATORS},
            "truth": oracle, "reinforce": torch.zeros_like(oracle)}
    adv = {}
    for lam in LAMS:  # a shared decay runs as one GEMM per scan level
        names = [e for e in VALUE_ESTIMATORS if e in runs] + {0.0: ["truth"], 1.0: ["reinforce"]}.get(lam, [])
        out = compute_gae(rewards.repeat(len(names), 1), mask.repeat(len(names), 1), gamma=gamma, lam=lam,
                          values=torch.cat([runs[e] for e in names]))[0].view(len(names), k, width)
        adv.update({(e, lam): a for e, a in zip(names, out)})
    adv[("grpo", None)], adv[("reinforce", None)] = grpo, adv.pop(("reinforce", 1.0))
    truth = adv.pop(("truth", 0.0))                                   # [k, W] A*
    keys = [key for key in ROWS if key in adv]
    sums = pair_sums(torch.stack([adv[key] for key in keys]), truth, at)   # [P, 2, 6]
    return dict(zip(keys, sums))


def pair_sums(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """[P, W, 6] ``pair_terms`` of P estimates ``x`` [P, k, L] against ``y`` [k, L] under W
    masks ``m`` [W, k, L], as a few matmuls over the flattened tokens."""
    x = x.reshape(x.shape[0], -1).to(torch.float64)                                # [P, K]
    y = y.reshape(-1).to(torch.float64)                                            # [K]
    w = m.reshape(m.shape[0], -1).to(torch.float64)                                # [W, K]
    n, sy, syy = w.sum(1), w @ y, w @ y.square()                                   # [W]
    sx, sxx, sxy = x @ w.T, x.square() @ w.T, (x * y) @ w.T                        # [P, W]
    full = lambda v: v.expand_as(sx)  # noqa: E731
    return torch.stack([full(n), sx, full(sy), sxx, full(syy), sxy], dim=-1)


# ---------------------------------------------------------------------------------------------
# From sums to metrics (host)

def corr_mse(s: list[float]) -> tuple[float, float, int]:
    """(correlation, mean squared error, n) from pair sums; NaN correlation when either side
    is constant (e.g. a value that never moves between turns)."""
    n, sx, sy, sxx, syy, sxy = s
    if n <= 0:
        return math.nan, math.nan, 0
    vx, vy = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
    cov = sxy / n - sx * sy / n ** 2
    corr = cov / math.sqrt(vx * vy) if vx > 1e-12 and vy > 1e-12 else math.nan
    return corr, max(sxx - 2 * sxy + syy, 0.0) / n, int(n)


def table(pair: torch.Tensor) -> list[dict]:
    """The advantage table: one row per (estimator, lambda, where) that has tokens."""
    out, host = [], pair.tolist()
    for e, lam in ROWS:
        for where in WHERE:
            corr, mse, n = corr_mse(host[row_index(e, lam, where)])
            if n:
                out.append({"estimator": e, "lam": lam, "tokens": where, "corr": corr, "mse": mse, "n": n})
    return out


def metrics(pair: torch.Tensor, ev: torch.Tensor, prefix: str) -> dict[str, float]:
    """Flat scalars for ``metrics.jsonl``: ``{prefix}/adv_corr_{first|all}_lam{λ}[_{estimator}]``
    (no suffix: this critic), ``{prefix}/turn_change_corr[_{estimator}]``,
    ``{prefix}/ev_group_mean`` (``oracle_ev_group_mean`` against the true values) and
    ``{prefix}/ev_oracle_values`` (the targets' variance the true values explain: the ceiling
    of ``{prefix}/explained_variance``)."""
    from ..metrics import summarize

    out = {}
    for row in table(pair):
        suffix = "" if row["estimator"] == "critic" else f"_{row['estimator']}"
        tag = lam_tag(row["lam"])
        out[f"{prefix}/adv_corr_{row['tokens']}{'_' + tag if tag else ''}{suffix}"] = row["corr"]
    host = pair.tolist()
    for e in TURN_ESTIMATORS:
        corr, _, n = corr_mse(host[turn_index(e)])
        if n:
            out[f"{prefix}/turn_change_corr{'' if e == 'critic' else '_' + e}"] = corr
    for i, name in enumerate(("ev_group_mean", "oracle_ev_group_mean", "ev_oracle_values")):
        s = summarize(ev[i], "_")
        if s:
            out[f"{prefix}/{name}"] = s["_/explained_variance"]
    return out


def turn_changes(pair: torch.Tensor) -> list[dict]:
    out, host = [], pair.tolist()
    for e in TURN_ESTIMATORS:
        corr, _, n = corr_mse(host[turn_index(e)])
        if n:
            out.append({"estimator": e, "corr": corr, "turns": n})
    return out


# ---------------------------------------------------------------------------------------------
# Tables for people (``critic-pretrain eval`` prints text, ``report.md`` has markdown)

def table_cells(rows: list[dict]) -> list[tuple[str, list[str], str]]:
    """(estimator, one "turn-first / all" correlation cell per lambda, note) per estimator
    present in an ``advantages`` table; lambda-free estimators have one cell."""
    by = {(r["estimator"], r["lam"], r["tokens"]): r for r in rows}
    out = []
    for e in (*VALUE_ESTIMATORS, *FIXED_ESTIMATORS):
        lams = LAMS if e in VALUE_ESTIMATORS else (None,)
        if (e, lams[0], "first") not in by:
            continue
        cells = [f"{_num(by[(e, lam, 'first')]['corr'])} / {_num(by[(e, lam, 'all')]['corr'])}"
                 if (e, lam, "first") in by else "" for lam in lams]
        note = {"grpo": "any lambda", "reinforce": "any lambda",
                "cold": f"a sample: {by[(e, lams[0], 'first')]['n']} turn-first tokens"}.get(e, "")
        out.append((e, cells, note))
    return out


def summary_lines(report: dict, prefix: str) -> list[str]:
    """The measures that need no oracle, one line each."""
    m, lines = report.get("metrics", {}), []
    if f"{prefix}/ev_group_mean" in m:
        lines.append(f"EV of the leave-one-out group mean return: {_num(m[f'{prefix}/ev_group_mean'])} "
                     f"(this critic: {_num(m.get(f'{prefix}/explained_variance'))}"
                     + (f", true values: {_num(m[f'{prefix}/ev_oracle_values'])}"
                        if f"{prefix}/ev_oracle_values" in m else "") + ")")
    if f"{prefix}/turn_change_corr" in m:
        lines.append("value change across a policy turn vs the rollout's outcome against its group (corr): "
                     f"{_num(m[f'{prefix}/turn_change_corr'])}"
                     + (f" (true values: {_num(m[f'{prefix}/turn_change_corr_oracle_values'])})"
                        if f"{prefix}/turn_change_corr_oracle_values" in m else ""))
    return lines


def summary_text(report: dict, prefix: str) -> str:
    """Aligned text of an eval report's advantage measures (empty when it has none)."""
    lines = []
    cells = table_cells(report.get("advantages") or [])
    if cells:
        lines += ["advantage quality: correlation with the true one-step advantages "
                  "(turn-first tokens / all policy tokens)",
                  f"  {'estimator':<14}" + "".join(f"{'lam ' + format(lam, 'g'):>16}" for lam in LAMS)]
        lines += [f"  {e:<14}" + "".join(f"{c:>16}" for c in row) + (f"   ({note})" if note else "")
                  for e, row, note in cells]
    return "\n".join(lines + summary_lines(report, prefix))


def advantage_markdown(report: dict, prefix: str) -> list[str]:
    """Markdown lines of the same (a table, then bullets)."""
    lines = []
    cells = table_cells(report.get("advantages") or [])
    if cells:
        lines += ["Advantage quality: correlation with the true one-step advantages, turn-first tokens / all "
                  "policy tokens (how to read it: docs/warm.md, *Advantage quality*):", "",
                  "| estimator | " + " | ".join(f"lam {lam:g}" for lam in LAMS) + " | |", "|---|---|---|---|---|"]
        lines += [f"| {e} | " + " | ".join(row + [""] * (len(LAMS) - len(row))) + f" | {note} |"
                  for e, row, note in cells]
        lines.append("")
    return lines + [f"- {line}" for line in summary_lines(report, prefix)]


def _num(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"
