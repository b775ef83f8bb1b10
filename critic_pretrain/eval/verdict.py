"""Will this critic help PPO? Oracle-free measures on held-out rollouts, bootstrap intervals over
prompts, and one verdict: **helps**, **no better than the group mean** or **harmful**.

Users have no true values; what they can compare is the critic with the baselines a PPO run
has for free. Over the policy tokens of held-out rollouts (``G`` the Monte-Carlo return at each
token, ``V`` the critic's value, ``g`` the leave-one-out mean return of the rollout's other
responses to the same prompt, GRPO's baseline; the batch mean when no prompt has two
responses):

- ``ev_vs_group_mean`` = 1 - Var(G - V) / Var(G - g): EVPO's criterion (arXiv 2604.19485) with
  the group mean as the rival baseline. Above 0 the critic's advantages vary less than the group
  mean's, so it reduces the policy gradient's variance; at or below 0 it does not.
- ``ev_vs_batch_mean`` = 1 - Var(G - V) / Var(G): the same against the batch mean, which PPO's
  advantage whitening subtracts anyway (the plain explained variance, on the same tokens).
  Below 0 the critic adds variance even over no critic at all.
- ``rho``: the least-squares weight of the critic in a baseline ``g + rho (V - g)`` (centred,
  as whitening centres advantages): Cov(G - g, V - g) / Var(V - g). Near 0: use the group mean;
  near 1: the critic alone; in between: a mix would beat both.
- ``sibling_auc_q1..q4``: among responses to one prompt with different returns, the share of
  (better, worse) pairs whose mean value over the same quarter of the response ranks the better
  one higher (ties count half). Early quarters measure what the critic reads from the start of
  a response, q4 what it knows near the end; 0.5 is chance.
- ``terminal_auc``: with 0/1 outcomes, the value at the last policy token (it has read all but
  that token) as a classifier of success, over all held-out rollouts.

Intervals: percentile bootstrap over prompts (``BOOTSTRAP`` resamples of the groups with
replacement, seed 0), so a prompt's correlated responses move together. The verdict:

- **helps**: the intervals of ``ev_vs_group_mean`` and ``ev_vs_batch_mean`` both lie above 0:
  the critic beats both baselines PPO has for free. Beating the group mean alone is not enough:
  where prompts differ little, the leave-one-out mean of a few siblings is a noisier baseline
  than the batch mean, and a constant value (a critic that learned nothing) beats it;
- **harmful**: the interval of ``ev_vs_batch_mean`` lies below 0 (worse than no critic);
- **no better than the group mean**: everything else (a free baseline does as well).

Cost: the device adds ``N_FIELDS`` sums per rollout (``row_sums``, into the evaluation's one
all-reduce); the host work here is a few matrix products over the groups.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..packed import PackedBatch

BOOTSTRAP = 400
"""Bootstrap resamples of the prompts behind every interval."""
LEVEL = 0.95
"""Coverage of the intervals."""
QUARTERS = 4

# Per-rollout sums (``row_sums``), weighted by the token weights w:
N, S_GV, S_GV2, S_GG, S_GG2, S_VG, S_VG2, S_GGVG, S_G, S_G2 = range(10)
"""Σw, Σw(G-V), Σw(G-V)², Σw(G-g), Σw(G-g)², Σw(V-g), Σw(V-g)², Σw(G-g)(V-g), ΣwG, ΣwG²."""
Q_SUM = 10
"""Σ V over the policy tokens of each quarter of the response (4 columns), then their counts (4)."""
Q_COUNT = Q_SUM + QUARTERS
V_LAST, V_FIRST, MEASURED = Q_COUNT + QUARTERS, Q_COUNT + QUARTERS + 1, Q_COUNT + QUARTERS + 2
N_FIELDS = MEASURED + 1

CALLS = {"helps": 1.0, "no better than the group mean": 0.0, "harmful": -1.0}
PLATEAU_AUC = 0.65
"""Below this ``sibling_auc_q4`` a critic ranks one prompt's better and worse responses near chance
by their last quarter: it has learned the prompt's value and little credit inside the responses
(the prompt-only plateau). On the synthetic archives the runs that never left it ended at
0.52-0.60, those that did at 0.72-0.98 (bench/recipes.md)."""
PLATEAU_PAIRS = 100
"""Sibling pairs below which ``plateau_note`` says nothing: too few to tell chance from a weak critic."""


MIN_PROMPTS = 3
"""Fewer prompts get no call (unknown): over 2 a percentile bootstrap has 3 distinct resamples and
a bound equals the estimate, so "helps (0.059 [0.059, 0.313])" was a call the interval could not
support (two new-user trials read it as one)."""
FEW_PROMPTS = 10
"""Below this many prompts the line says its intervals are too narrow: a percentile bootstrap over
few clusters understates their spread. The call stands, with the note: on the real SmolLM2 sample
6 new prompts gave **helps** and the audit against the policy's own Monte-Carlo values agreed
(bench/verdict_proof.json)."""


def few_prompts_note(groups: int) -> str | None:
    """One line for a verdict over fewer than ``FEW_PROMPTS`` prompts, else None."""
    if groups >= FEW_PROMPTS:
        return None
    return (f"only {groups} prompts: a bootstrap over fewer than {FEW_PROMPTS} understates the uncertainty, so read "
            "the interval as optimistic and evaluate on more prompts before relying on the call")


def plateau_note(auc_q4: float | None, pairs: float | None) -> str | None:
    """One line for a critic on the prompt-only plateau (``PLATEAU_AUC``), else None. A hint next to
    the verdict, not a verdict: on 200 validation rows such a critic can still be called **helps**
    (its prompt values beat a few siblings' mean), while on more rollouts it is not."""
    if auc_q4 is None or pairs is None or math.isnan(auc_q4) or pairs < PLATEAU_PAIRS or auc_q4 >= PLATEAU_AUC:
        return None
    return (f"its values rank a prompt's better and worse responses near chance by their last quarter (sibling AUC "
            f"q4 {auc_q4:.2f} over {int(pairs)} pairs; below {PLATEAU_AUC:g}): it has learned each prompt's value and "
            "little credit inside the responses; another `seed=` or a longer schedule may leave this plateau "
            "(docs/warm.md, *the prompt-only plateau*)")


def beats_with_oracle(critic: float, control: float, tokens: int | None) -> bool:
    """The rule with exact values: the critic's advantage correlation with the true advantages
    beats the control's (the group mean as a constant value) by more than two standard errors of
    a correlation over ``tokens`` tokens (about 1/sqrt(n)). A critic that collapsed to a constant
    ties the control up to rounding, which is no win (0.0387 vs 0.0386 on 1,000 tokens)."""
    margin = 2.0 / math.sqrt(tokens) if tokens else 0.0
    return critic - control > margin
"""The verdict and the number ``{prefix}/verdict`` logs for it."""


# ---------------------------------------------------------------------------------------------
# Device: per-rollout sums of one micro-batch

def row_sums(values: torch.Tensor, batch: PackedBatch, baseline: torch.Tensor, measured: torch.Tensor) -> torch.Tensor:
    """[k, N_FIELDS] float64 sums of each rollout of a packed micro-batch.

    ``values``: [1, N] predictions; ``baseline``: [k] the rollout's group baseline ``g``;
    ``measured``: [k] bool, rollouts that have one (others get zeros). ``batch.targets`` are the
    Monte-Carlo returns ``G`` evaluation measures against."""
    pr = batch.policy_rows()
    mask = pr.mask                                                     # [k, W]
    k = mask.shape[0]
    w = pr.rows(batch.weights).double() * measured[:, None]            # [k, W]
    G, V = pr.rows(batch.targets).double(), pr.rows(values.detach()).double()
    g = baseline.double()[:, None]
    gv, gg, vg = G - V, G - g, V - g
    out = torch.zeros(k, N_FIELDS, dtype=torch.float64, device=values.device)
    for col, x in ((S_GV, gv), (S_GG, gg), (S_VG, vg), (S_G, G)):   # each sum, then its sum of squares
        out[:, col] = (w * x).sum(1)
        out[:, col + 1] = (w * x * x).sum(1)
    out[:, N] = w.sum(1)
    out[:, S_GGVG] = (w * gg * vg).sum(1)
    n_policy = mask.sum(1, keepdim=True)                               # [k, 1]
    col = torch.arange(mask.shape[1], device=mask.device)[None, :]
    quarter = (QUARTERS * col) // n_policy.clamp_min(1)                # [k, W] as eval's position buckets
    m = mask & measured[:, None]
    for q in range(QUARTERS):
        at = m & (quarter == q)
        out[:, Q_SUM + q] = (V * at).sum(1)
        out[:, Q_COUNT + q] = at.sum(1)
    if V.shape[1]:  # W == 0: no rollout of the micro-batch keeps a policy token (all cut inside the prompt)
        last = (n_policy[:, 0] - 1).clamp_min(0)
        out[:, V_LAST] = V.gather(1, last[:, None])[:, 0] * measured
        out[:, V_FIRST] = V[:, 0] * measured
    out[:, MEASURED] = measured.double()
    return out


# ---------------------------------------------------------------------------------------------
# Host: measures, intervals, verdict

@dataclass
class Interval:
    est: float
    lo: float
    hi: float

    def text(self, fmt: str = ".3f") -> str:
        if math.isnan(self.est):
            return "n/a"
        return f"{self.est:{fmt}} [{self.lo:{fmt}}, {self.hi:{fmt}}]"


@dataclass
class Verdict:
    """The measures with their intervals and the call (module docstring)."""

    call: str
    """helps | no better than the group mean | harmful | unknown (too few rollouts)."""
    baseline: str
    """What ``g`` was: the leave-one-out group mean, or the batch mean (no groups)."""
    ev_vs_group_mean: Interval
    ev_vs_batch_mean: Interval
    rho: Interval
    sibling_auc: list[Interval]
    """Per quarter of the response (q1..q4)."""
    sibling_pairs: int
    """(better, worse) sibling pairs in mixed-outcome groups."""
    terminal_auc: Interval | None
    """None unless the outcomes are 0/1 (two values)."""
    first_token_ev_vs_group_mean: Interval
    """``ev_vs_group_mean`` at each response's first policy token: the prompt's value against the group mean."""
    groups: int
    rows: int
    regime: str = ""
    """Which held-out rollouts (``data.REGIMES``), set by the caller."""
    bootstrapped: bool | None = None
    """Whether the critic trained on its own values (``targets.values_from=critic``), set by a
    caller that knows; None: unknown. The advice for **no better** depends on it."""
    extra: dict = field(default_factory=dict)

    @property
    def fix(self) -> str:
        if self.call == "helps":
            return (f"warm-start PPO from it (least-squares weight of the critic against the group mean rho = "
                    f"{self.rho.est:.2f}" + ("; below 1, a mix with the group mean would do better still)"
                                              if self.rho.hi < 1 else ")"))
        if self.call == "harmful":
            return ("do not warm-start from it: its values add advantage variance even over the batch mean; check the "
                    "reward scale against the PPO run (seed check --ppo-config) and that the rollouts come from the "
                    "policy PPO starts from, then retrain")
        if self.call == "unknown":
            return "evaluate on more rollouts (several prompts, two or more responses each, with different returns)"
        bootstrap = {None: "bootstrapped targets (targets.values_from=critic, if it did not use them), ",
                     False: "bootstrapped targets (targets.values_from=critic), ", True: ""}[self.bootstrapped]
        already = " (it already bootstraps from its own values)" if self.bootstrapped else ""
        return ("a free baseline (the group mean of GRPO, or the batch mean PPO subtracts anyway) does as well: "
                f"retrain with {bootstrap}more rollouts of this policy or a longer schedule{already}, or start PPO "
                "without it")

    def line(self) -> str:
        """The one line that ends ``seed check`` and report.md."""
        if self.call == "unknown":
            return (f"{self.regime or 'held-out rollouts'}: unknown ({self.rows} rollouts, {self.groups} prompts): "
                    f"{self.fix}")
        auc = self.sibling_auc[-1]
        parts = ([f"EV over the group mean {self.ev_vs_group_mean.text()}",
                  f"over the batch mean {self.ev_vs_batch_mean.text()}", f"rho {self.rho.text('.2f')}"]
                 if self.baseline.endswith("group mean") else
                 [f"EV over the batch mean {self.ev_vs_batch_mean.text()} (no prompt has two responses)"])
        if not math.isnan(auc.est):
            parts.append(f"sibling AUC q4 {auc.text('.2f')}")
        if self.terminal_auc is not None:
            parts.append(f"terminal AUC {self.terminal_auc.text('.2f')}")
        notes = [n for n in (few_prompts_note(self.groups), plateau_note(auc.est, self.sibling_pairs)) if n]
        return (f"{self.regime or 'held-out rollouts'}: **{self.call}** ({'; '.join(parts)}; {self.rows} rollouts of "
                f"{self.groups} prompts, {int(LEVEL * 100)}% bootstrap intervals over prompts): {self.fix}"
                + "".join(f". Note: {n}" for n in notes))

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}/verdict": CALLS.get(self.call, math.nan)}
        for name in ("ev_vs_group_mean", "ev_vs_batch_mean", "rho"):
            iv = getattr(self, name)
            out.update({f"{prefix}/{name}": iv.est, f"{prefix}/{name}_lo": iv.lo, f"{prefix}/{name}_hi": iv.hi})
        for q, iv in enumerate(self.sibling_auc, 1):
            out[f"{prefix}/sibling_auc_q{q}"] = iv.est
        out[f"{prefix}/sibling_pairs"] = float(self.sibling_pairs)
        out[f"{prefix}/prompts"] = float(self.groups)
        if self.terminal_auc is not None:
            out[f"{prefix}/terminal_auc"] = self.terminal_auc.est
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "fix": self.fix, "line": self.line()}


def _ev(n, s_res, s_res2, s_ref, s_ref2) -> np.ndarray:
    """1 - Var(residual) / Var(reference) from weighted sums (arrays broadcast; NaN where the
    reference does not vary)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        var_res = s_res2 / n - (s_res / n) ** 2
        var_ref = s_ref2 / n - (s_ref / n) ** 2
        return np.where(var_ref > 1e-12, 1.0 - var_res / var_ref, np.nan)


def _rho(s: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        n = s[..., N]
        cov = s[..., S_GGVG] / n - (s[..., S_GG] / n) * (s[..., S_VG] / n)
        var = s[..., S_VG2] / n - (s[..., S_VG] / n) ** 2
        return np.where(var > 1e-12, cov / var, np.nan)


def _first_token_sums(rows: np.ndarray, outcome: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """[R, 5] (1, G-V, (G-V)², G-g, (G-g)²) at each rollout's first policy token (G = its return)."""
    gv, gg = outcome - rows[:, V_FIRST], outcome - baseline
    return np.stack([np.ones_like(gv), gv, gv * gv, gg, gg * gg], axis=1)


def sibling_pairs(values: np.ndarray, outcome: np.ndarray) -> tuple[float, float]:
    """(concordant + half the ties, pairs) over the (better, worse) pairs of one prompt's
    responses (``values`` [r], NaN: no value for this quarter; ``outcome`` [r])."""
    better = outcome[:, None] > outcome[None, :]
    ok = better & np.isfinite(values)[:, None] & np.isfinite(values)[None, :]
    diff = values[:, None] - values[None, :]
    return float(((diff > 0) & ok).sum() + 0.5 * ((diff == 0) & ok).sum()), float(ok.sum())


def weighted_auc(score: np.ndarray, label: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUC of ``score`` [n] for the binary ``label`` [n] under each row of ``weights`` [B, n]
    (a row's weight counts it that many times; ties count half): [B]."""
    order = np.argsort(score, kind="stable")
    s, y, w = score[order], label[order].astype(bool), weights[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])               # blocks of tied scores
    block = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1
    neg = np.add.reduceat(w * ~y, starts, axis=1)                       # [B, blocks]
    below = np.cumsum(neg, axis=1) - neg
    num = (w * y * (below[:, block] + 0.5 * neg[:, block])).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / ((w * y).sum(1) * (w * ~y).sum(1))


def judge(rows: np.ndarray, group: np.ndarray, outcome: np.ndarray, baseline: np.ndarray, *, grouped: bool,
          seed: int = 0, resamples: int = BOOTSTRAP) -> Verdict:
    """The verdict from the reduced per-rollout sums ``rows`` [R, N_FIELDS] (``row_sums``),
    each rollout's group index ``group`` [R], return ``outcome`` [R] and baseline [R]."""
    keep = rows[:, MEASURED] > 0
    rows, group, outcome, baseline = rows[keep], group[keep], outcome[keep], baseline[keep]
    base = "leave-one-out group mean" if grouped else "batch mean (no prompt has two responses)"
    _, group = np.unique(group, return_inverse=True)
    n_groups = int(group.max()) + 1 if len(group) else 0
    nan = Interval(math.nan, math.nan, math.nan)
    if n_groups < MIN_PROMPTS or rows[:, N].sum() <= 0:
        return Verdict("unknown", base, nan, nan, nan, [nan] * QUARTERS, 0, None, nan, n_groups, int(keep.sum()))
    per_group = np.zeros((n_groups, N_FIELDS))
    np.add.at(per_group, group, rows)
    first = np.zeros((n_groups, 5))
    np.add.at(first, group, _first_token_sums(rows, outcome, baseline))
    pairs = np.zeros((n_groups, QUARTERS, 2))                           # concordant, pairs per group
    with np.errstate(divide="ignore", invalid="ignore"):
        quarter_mean = rows[:, Q_SUM:Q_SUM + QUARTERS] / rows[:, Q_COUNT:Q_COUNT + QUARTERS]
    order = np.argsort(group, kind="stable")
    for gi, members in enumerate(np.split(order, np.flatnonzero(np.diff(group[order])) + 1)):
        if len(members) < 2 or np.ptp(outcome[members]) == 0:
            continue
        for q in range(QUARTERS):
            pairs[gi, q] = sibling_pairs(quarter_mean[members, q], outcome[members])
    counts = np.random.default_rng(seed).multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=resamples)
    weights = np.vstack([np.ones(n_groups), counts])                    # row 0: the estimate itself

    def interval(x: np.ndarray) -> Interval:
        boot = x[1:][np.isfinite(x[1:])]
        if not np.isfinite(x[0]) or len(boot) < resamples // 2:
            return Interval(float(x[0]), math.nan, math.nan)
        lo, hi = np.quantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        return Interval(float(x[0]), float(lo), float(hi))

    s = weights @ per_group                                             # [1 + B, N_FIELDS]
    f = weights @ first
    ev_g = interval(_ev(s[:, N], s[:, S_GV], s[:, S_GV2], s[:, S_GG], s[:, S_GG2]))
    ev_b = interval(_ev(s[:, N], s[:, S_GV], s[:, S_GV2], s[:, S_G], s[:, S_G2]))
    p = np.einsum("bg,gqc->bqc", weights, pairs)
    with np.errstate(divide="ignore", invalid="ignore"):
        aucs = [interval(np.where(p[:, q, 1] > 0, p[:, q, 0] / p[:, q, 1], np.nan)) for q in range(QUARTERS)]
    terminal = None
    values = np.unique(outcome)
    if len(values) == 2:
        label = outcome == values[1]
        terminal = interval(np.concatenate([weighted_auc(rows[:, V_LAST], label, weights[b:b + 64][:, group])
                                            for b in range(0, len(weights), 64)]))   # [64, R] at a time
    # returns that do not vary (every held-out rollout solved) leave both EVs 0/0: nothing to judge
    call = ("unknown" if not math.isfinite(ev_b.est) else
            "helps" if ev_g.lo > 0 and ev_b.lo > 0 else "harmful" if ev_b.hi < 0 else "no better than the group mean")
    return Verdict(call, base, ev_g, ev_b, interval(_rho(s)), aucs, int(pairs[:, 0, 1].sum()), terminal,
                   interval(_ev(f[:, 0], f[:, 1], f[:, 2], f[:, 3], f[:, 4])), n_groups, int(keep.sum()))
