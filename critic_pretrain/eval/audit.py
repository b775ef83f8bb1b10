"""Monte-Carlo values from the policy itself (``critic-pretrain audit``), VinePPO's check.

Users have no oracle, but they have the policy. From a state inside a held-out response the
policy can be sampled ``n`` more times; the mean reward of those continuations is an unbiased
estimate of that state's value (its standard error shrinks as 1/sqrt(n)). Comparing the critic's
value at the same states with those estimates says whether the critic knows more than the
prompt-only value (the leave-one-out mean return of the prompt's other responses: GRPO's baseline).

What is measured, per held-out rollout:

- **Cut points.** ``K`` states inside the rollout's *last* policy turn, at token positions
  ``a + floor(k * P / K)``, k = 0..K-1 (``a``: the turn's first token, ``P``: its length). Position
  ``t`` means the prefix ``tokens[:t]``: k = 0 is the state before the turn's first token.
  Only the last turn is cut, so every continuation ends the episode.
- **Critic value** at ``t``: ``token_values`` of the whole rollout at ``t`` (the head on the hidden
  state of token ``t - 1``: DESIGN's alignment, the value PPO reads for the action at ``t``).
- **MC value** at ``t``: the mean over ``n`` continuations, sampled from ``tokens[:t]`` with the
  rollouts' sampling settings (temperature, top-p, the turn's token budget less what is already
  written), of ``gamma ** (tokens from t to the end - 1) * transform(reward)``: the return in the
  units the critic was trained on (the run's reward transform and gamma; rewards are an outcome
  on the last token). The reward function scores ``(prompt text, response text)``, both decoded
  with special tokens skipped; the response is everything from the first policy token on.

The summary compares the correlation of critic and prompt-only values with the MC values, with
bootstrap standard errors over rollouts, and states the ceiling the MC noise allows:
``sqrt(1 - mean(se^2) / var(MC))``, the correlation a perfect value would reach with these
noisy estimates. Library code: it prints nothing; ``commands.audit`` reports progress.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from rollouts.tokenizer import fingerprint

from .. import checkpoint as ckpt
from .. import preflight
from ..config_io import load_config
from ..data import store as store_mod
from ..errors import UserError
from ..model import position_limit
from .from_checkpoint import (
    _rows_to_evaluate,
    checked_step_dir,
    checkpoint_model_config,
    load_checkpoint_model,
    resolve_device,
)
from .policy_sampling import HFSampler, Sampling, VLLMSampler, load_policy, load_tokenizer, vllm_available

CUTS = 4
SAMPLES = 8
MAX_ROLLOUTS = 24
BOOTSTRAP = 400


# ---------------------------------------------------------------------------------------------
# The reward function

def load_reward_fn(spec: str) -> Callable[[str, str], float]:
    """``module:function`` (importable from the current folder) or ``path/file.py:function``:
    a callable ``fn(prompt: str, response: str) -> float``. A user's own code, run by the user's
    own command line (never a name taken from a checkpoint or a rollout folder)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UserError(f"--reward {spec}: expected module:function or path/file.py:function "
                        "(e.g. examples.smollm2.task:reward)")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UserError(f"--reward {spec}: no such file {where}")
        mod_spec = importlib.util.spec_from_file_location(f"_critic_audit_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:  # the user's file: say which and why in one line
            raise UserError(f"--reward {spec}: importing {where} failed ({type(e).__name__}: {e})") from None
    else:
        if os.getcwd() not in sys.path:  # `examples.smollm2.task` from a checkout, as python -m would
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UserError(f"--reward {spec}: cannot import {where} ({e}); run from the folder that holds it, "
                            "or pass path/file.py:function") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UserError(f"--reward {spec}: {where} has no function {name}")
    return fn


# ---------------------------------------------------------------------------------------------
# Where to cut

@dataclasses.dataclass
class Rollout:
    """One audited rollout: its tokens, where its policy text starts and its last turn lies."""

    row: int
    """Its row in the prepared store."""
    regime: str
    """``prompt`` (a prompt the critic never trained on), ``response`` (a fresh response to a
    trained prompt: PPO's regime) or ``unknown``."""
    ids: list[int]
    first: int
    """Index of the first policy token (the prompt is ``ids[:first]``)."""
    turn: tuple[int, int]
    """(a, e): the last policy turn's first and last token index."""
    reward: float
    """The outcome on the last policy token, in target units (after the run's reward transform)."""
    prompt_only: float
    """The leave-one-out mean return of the prompt's other rollouts (nan when it has none)."""
    row_hash: str
    """xxh3-64 of its token ids (hex): how the report finds it again."""
    cuts: list[Cut] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Cut:
    """One state of a rollout: ``position`` t (the prefix ``ids[:t]``), the critic's value there,
    and the MC estimate from ``returns`` (one per continuation)."""

    k: int
    position: int
    budget: int
    """New tokens a continuation may take (the turn's budget less what is already written)."""
    critic: float = math.nan
    returns: list[float] = dataclasses.field(default_factory=list)

    @property
    def mc(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan

    @property
    def mc_se(self) -> float:
        n = len(self.returns)
        return float(np.std(self.returns, ddof=1) / math.sqrt(n)) if n > 1 else 0.0


def last_turn(mask: np.ndarray) -> tuple[int, int]:
    """(first, last) token index of the last maximal run of ``mask == 1``."""
    on = np.flatnonzero(mask)
    if not len(on):
        raise ValueError("no policy token")
    e = int(on[-1])
    gaps = np.flatnonzero(np.diff(on) > 1)
    a = int(on[gaps[-1] + 1]) if len(gaps) else int(on[0])
    return a, e


def cut_positions(turn: tuple[int, int], k: int) -> list[int]:
    """``k`` distinct positions ``a + floor(i * P / k)`` inside the turn (fewer when P < k)."""
    a, e = turn
    length = e - a + 1
    return sorted({a + (i * length) // k for i in range(k)})


def select_rollouts(store, rows: np.ndarray, regimes: np.ndarray, max_rollouts: int, cuts: int, max_new_tokens: int,
                    seed: int) -> list[Rollout]:
    """Up to ``max_rollouts`` of ``rows`` in a seeded order that alternates the regimes (both show
    in the audit when both are there), with their cut points. Rollouts whose rewards are not one
    outcome on the last policy token are refused: a reward function cannot score per-token rewards."""
    import xxhash

    from .advantage import GroupStats

    rng = np.random.default_rng(seed)
    order = {r: list(rng.permutation(rows[regimes == r])) for r in dict.fromkeys(regimes.tolist())}
    picked: list[int] = []
    while len(picked) < max_rollouts and any(order.values()):
        for queue in order.values():
            if queue and len(picked) < max_rollouts:
                picked.append(int(queue.pop(0)))
    regime_of = dict(zip(rows.tolist(), regimes.tolist()))
    stats = GroupStats.of(store, np.array(picked, np.int64))
    table = store.table.take(np.array(picked, np.int64))
    out = []
    for i, row in enumerate(picked):
        ids = table.column("input_ids")[i].values.to_numpy().astype(np.int64).tolist()
        mask = table.column("loss_mask")[i].values.to_numpy()
        rewards = table.column("rewards")[i].values.to_numpy().astype(np.float64)
        a, e = last_turn(mask)
        if np.abs(np.delete(rewards, e)).max(initial=0.0) > 0:
            raise UserError(f"rollout {row} (group {table.column('split_key')[i]}): has rewards before its last "
                            "token; audit scores an outcome reward only (per-token rewards cannot be rebuilt by a "
                            "reward function)")
        first = int(np.flatnonzero(mask)[0])
        ro = Rollout(row, regime_of[row], ids, first, (a, e), float(rewards[e]), stats.loo_mean[row],
                     f"{xxhash.xxh3_64_intdigest(np.asarray(ids, np.int32).tobytes()):016x}")
        for k, t in enumerate(cut_positions((a, e), cuts)):
            ro.cuts.append(Cut(k, t, max(1, max_new_tokens - (t - a))))
        out.append(ro)
    return out


# ---------------------------------------------------------------------------------------------
# Critic values at the cuts

@torch.no_grad()
def critic_values(model: torch.nn.Module, rollouts: list[Rollout], device: torch.device) -> None:
    """Fill each cut's ``critic`` from one unpacked forward of its whole rollout (values[t])."""
    from ..model import token_values

    for ro in rollouts:
        ids = torch.tensor([ro.ids], device=device)
        pos = torch.arange(len(ro.ids), device=device)[None]
        values = token_values(model, ids, pos)[0].float().cpu()     # [T]; one host sync per rollout
        for cut in ro.cuts:
            cut.critic = float(values[cut.position])


# ---------------------------------------------------------------------------------------------
# Running it

@dataclasses.dataclass
class Job:
    rollout: Rollout
    cut: Cut


def jobs_of(rollouts: list[Rollout]) -> list[Job]:
    """Every (rollout, cut) still to sample (none reused), longest prefix first (similar lengths
    share a batch: less padding)."""
    jobs = [Job(ro, c) for ro in rollouts for c in ro.cuts if not c.returns]
    return sorted(jobs, key=lambda j: -j.cut.position)


def run_jobs(jobs: list[Job], sampler, tokenizer, reward_fn: Callable[[str, str], float], transform, gamma: float,
             n: int, batch: int) -> Iterator[int]:
    """Sample and score every job, ``batch`` prefixes at a time; yields the jobs done after each
    batch (a progress bar's steps). Returns are in target units, discounted to the cut."""
    for start in range(0, len(jobs), batch):
        part = jobs[start:start + batch]
        conts = sampler.sample([j.rollout.ids[:j.cut.position] for j in part], [j.cut.budget for j in part], n)
        for job, samples in zip(part, conts):
            ro, t = job.rollout, job.cut.position
            prompt = tokenizer.decode(ro.ids[:ro.first], skip_special_tokens=True)
            for cont in samples:
                response = tokenizer.decode(ro.ids[ro.first:t] + cont, skip_special_tokens=True)
                r = float(transform.apply_outcome(torch.tensor([float(reward_fn(prompt, response))]))[0])
                job.cut.returns.append(r * gamma ** max(len(cont) - 1, 0))
        yield len(part)


def check_policy_vocab(rollouts: list[Rollout], policy: str) -> None:
    """Token ids the policy has no embedding for mean the rollouts are not its own (rollouts
    without a recorded tokenizer pass the fingerprint check): one line, before any sampling."""
    from transformers import AutoConfig
    try:
        vocab = AutoConfig.from_pretrained(policy, trust_remote_code=False).vocab_size
    except (OSError, ValueError):
        return  # _load_policy says why, in one line, when it loads the model
    for ro in rollouts:
        top = max(ro.ids)
        if top >= vocab:
            raise UserError(f"rollout {ro.row}: token id {top} is outside the policy's vocabulary ({vocab} tokens): "
                            f"these rollouts were not sampled by --policy {policy}; pass the policy that sampled them")


def check_reward_fn(rollouts: list[Rollout], tokenizer, reward_fn, transform, spec: str) -> None:
    """The reward function must give each stored response its stored reward (after the run's
    transform): else the MC values are in other units than the critic's, and the audit would
    judge the reward function, not the critic."""
    for ro in rollouts:
        prompt = tokenizer.decode(ro.ids[:ro.first], skip_special_tokens=True)
        response = tokenizer.decode(ro.ids[ro.first:], skip_special_tokens=True)
        got = float(transform.apply_outcome(torch.tensor([float(reward_fn(prompt, response))]))[0])
        if abs(got - ro.reward) > 1e-4 * max(1.0, abs(ro.reward)):
            raise UserError(f"rollout {ro.row}: the reward function {spec} gives its stored response {got:.4g} (after "
                            f"the run's reward transform), the rollouts say {ro.reward:.4g}; pass the reward function "
                            f"the rollouts were scored with (response {response[:60]!r})")


# ---------------------------------------------------------------------------------------------
# What it says

def _corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; a constant predictor of a varying target scores 0 (it explains none
    of it: a critic that learned nothing is compared, not skipped)."""
    if len(x) < 3 or y.std() == 0:
        return math.nan
    if x.std() < 1e-9 * max(1.0, abs(float(x.mean()))):
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def compare(critic: np.ndarray, prompt: np.ndarray, mc: np.ndarray, se: np.ndarray, rollout: np.ndarray,
            boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Correlations of critic and prompt-only values with the MC values over the given cuts, their
    bootstrap standard errors over rollouts (the cuts of one rollout are resampled together), the
    MC-noise ceiling and noise-corrected MSEs (``mean((v - mc)^2) - mean(se^2)``: the MC noise
    adds ``se^2`` to every squared error in expectation)."""
    ok = ~np.isnan(prompt)
    critic, prompt, mc, se, rollout = critic[ok], prompt[ok], mc[ok], se[ok], rollout[ok]
    out = {"cuts": int(len(mc)), "rollouts": int(len(np.unique(rollout)))}
    if len(mc) < 3:
        return out
    noise = float(np.mean(se ** 2))
    var = float(mc.var())
    out.update(corr_critic=_corr(critic, mc), corr_prompt_only=_corr(prompt, mc),
               ceiling=math.sqrt(max(0.0, 1.0 - noise / var)) if var > 0 else math.nan,
               mse_critic=float(np.mean((critic - mc) ** 2)) - noise,
               mse_prompt_only=float(np.mean((prompt - mc) ** 2)) - noise, mc_noise=noise, mc_var=var)
    ids = np.unique(rollout)
    members = [np.flatnonzero(rollout == r) for r in ids]
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(boot):
        take = np.concatenate([members[i] for i in rng.integers(0, len(ids), len(ids))])
        c, p = _corr(critic[take], mc[take]), _corr(prompt[take], mc[take])
        draws.append((c, p, c - p))
    d = np.array(draws)
    se_c, se_p, se_d = (float(np.std(x[~np.isnan(x)], ddof=1)) if (~np.isnan(x)).sum() > 1 else math.nan
                        for x in d.T)
    out.update(corr_critic_se=se_c, corr_prompt_only_se=se_p, corr_diff=out["corr_critic"] - out["corr_prompt_only"],
               corr_diff_se=se_d)
    return out


def call(summary: dict) -> str:
    """``better``, ``no better`` or ``worse`` than the prompt-only value: the difference of the
    correlations beyond two bootstrap standard errors, else ``no better``; ``unknown`` without it."""
    d, se = summary.get("corr_diff"), summary.get("corr_diff_se")
    if d is None or se is None or math.isnan(d) or math.isnan(se):
        return "unknown"
    return "better" if d > 2 * se else "worse" if d < -2 * se else "no better"


CALL_TEXT = {"better": "the critic is **better** than the prompt-only value (by more than two standard errors)",
             "no better": "the critic is **no better** than the prompt-only value beyond two standard errors "
                          "(more rollouts narrow the interval: --max-rollouts)",
             "worse": "the critic is **worse** than the prompt-only value (by more than two standard errors)"}


def summarize(rollouts: list[Rollout], boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Overall, per cut index and per regime."""
    rows = [(ro.cuts[i].critic, ro.prompt_only, ro.cuts[i].mc, ro.cuts[i].mc_se, j, ro.cuts[i].k, ro.regime)
            for j, ro in enumerate(rollouts) for i in range(len(ro.cuts))]
    if not rows:
        return {"overall": {"cuts": 0, "rollouts": 0}, "call": "unknown", "by_cut": [], "by_regime": {}}
    c, p, m, s, r = (np.array([x[i] for x in rows], np.float64) for i in range(5))
    k, regime = np.array([x[5] for x in rows]), np.array([x[6] for x in rows])
    overall = compare(c, p, m, s, r, boot, seed)
    by_cut = [{"k": int(i), **compare(c[k == i], p[k == i], m[k == i], s[k == i], r[k == i], boot, seed)}
              for i in np.unique(k)]
    by_regime = {str(g): compare(c[regime == g], p[regime == g], m[regime == g], s[regime == g], r[regime == g],
                                 boot, seed) for g in np.unique(regime)}
    return {"overall": overall, "call": call(overall), "by_cut": by_cut, "by_regime": by_regime}


def to_json(rollouts: list[Rollout]) -> list[dict]:
    return [{"row": ro.row, "row_hash": ro.row_hash, "regime": ro.regime, "reward": ro.reward,
             "prompt_only": ro.prompt_only, "turn": list(ro.turn),
             "cuts": [{"k": c.k, "position": c.position, "budget": c.budget, "critic": c.critic, "mc": c.mc,
                       "mc_se": c.mc_se, "samples": len(c.returns), "returns": c.returns,
                       "prompt_only": ro.prompt_only}
                      for c in ro.cuts]} for ro in rollouts]


def summary_lines(summary: dict) -> list[str]:
    """The audit's findings as text (the command prints them; report.md quotes them)."""
    o = summary["overall"]
    if "corr_critic" not in o:
        return [f"audit: {o['cuts']} cut(s) with a prompt-only value: too few to compare"]
    lines = [f"correlation with the policy's Monte-Carlo values over {o['cuts']} states of {o['rollouts']} rollouts: "
             f"critic {o['corr_critic']:.3f} ± {o['corr_critic_se']:.3f}, prompt-only (leave-one-out group mean) "
             f"{o['corr_prompt_only']:.3f} ± {o['corr_prompt_only_se']:.3f}; difference {o['corr_diff']:+.3f} ± "
             f"{o['corr_diff_se']:.3f}: " + CALL_TEXT.get(summary["call"], "unknown"),
             f"MC noise: a perfect value would reach correlation {o['ceiling']:.3f} with these estimates; MSE "
             f"(noise removed) critic {o['mse_critic']:.4f}, prompt-only {o['mse_prompt_only']:.4f}"]
    for b in summary["by_cut"]:
        if "corr_critic" in b:
            lines.append(f"  cut {b['k']} ({b['cuts']} states): critic {b['corr_critic']:.3f} ± "
                         f"{b['corr_critic_se']:.3f}, prompt-only {b['corr_prompt_only']:.3f} ± "
                         f"{b['corr_prompt_only_se']:.3f}")
    for g, b in summary["by_regime"].items():
        if "corr_critic" in b:
            lines.append(f"  {g} regime ({b['rollouts']} rollouts): critic {b['corr_critic']:.3f} ± "
                         f"{b['corr_critic_se']:.3f}, prompt-only {b['corr_prompt_only']:.3f} ± "
                         f"{b['corr_prompt_only_se']:.3f}: {call(b)}")
    return lines


# ---------------------------------------------------------------------------------------------
# Putting it together (the command drives the batches: progress and estimate are its to print)

@dataclasses.dataclass
class AuditSetup:
    """Everything ``run_jobs`` needs, built and checked before the first continuation is sampled."""

    step_dir: Path
    step: int | None
    rollouts: list[Rollout]
    jobs: list[Job]
    sampler: object
    tokenizer: object
    reward_fn: Callable[[str, str], float]
    transform: object
    gamma: float
    sampling: Sampling
    samples: int
    batch: int
    split: str
    settings: dict
    reused: int = 0
    """States whose returns came from ``--mc-from`` (not sampled again)."""

    def run(self) -> Iterator[int]:
        return run_jobs(self.jobs, self.sampler, self.tokenizer, self.reward_fn, self.transform, self.gamma,
                        self.samples, self.batch)

    def result(self, seconds: float, boot: int = BOOTSTRAP) -> dict:
        summary = summarize(self.rollouts, boot, self.sampling.seed)
        return {"checkpoint": str(self.step_dir.resolve()), "step": self.step, "split": self.split,
                "settings": self.settings,
                "sampler": self.sampler.name if self.sampler else "none: every state's returns from --mc-from",
                "reused": self.reused, "seconds": round(seconds, 1),
                "summary": summary, "lines": summary_lines(summary), "rows": to_json(self.rollouts)}


def default_out(step_dir: Path) -> Path:
    """``<run>/eval/step_<n>-audit.json``: where ``report`` looks for it."""
    return step_dir.parent / "eval" / f"{step_dir.name}-audit.json"


def prepare(step_dir: str | Path, policy: str, reward: str, rollouts: list[str] | None, stack, *, cuts: int = CUTS,
            samples: int = SAMPLES, max_new_tokens: int | None = None, max_rollouts: int = MAX_ROLLOUTS,
            temperature: float | None = None, top_p: float | None = None, seed: int = 0, batch: int = 4,
            device: str | torch.device | None = None, cache_dir: str | None = None, use_vllm: bool | None = None,
            mc_from: str | None = None) -> AuditSetup:
    """Load the critic and the policy, pick the held-out rollouts and their cuts, check the reward
    function on the stored responses and fill the critic's values: everything but the sampling.

    ``rollouts``: rollouts of the policy (the critic's trained-on rollouts are left out, the rest
    split by whether it trained on their prompt); None: the run's own held-out sets. ``stack``:
    an ExitStack that owns temporary folders. ``use_vllm``: None uses it when installed.
    ``mc_from``: an earlier audit whose sampled returns are reused (``reuse_mc``)."""
    for flag, v in (("--cuts", cuts), ("--samples", samples), ("--max-rollouts", max_rollouts), ("--batch", batch)):
        if v < 1:
            raise UserError(f"{flag} {v} must be >= 1")
    step_dir = checked_step_dir(str(step_dir))
    cfg = load_config(ckpt.StepPaths(step_dir).config_yaml)
    reward_fn = load_reward_fn(reward)
    dev = resolve_device(device)
    tokenizer = load_tokenizer(policy)
    specs = list(rollouts) if rollouts else [p for src in cfg.data.all_sources() for p in src.paths]
    preflight.check_rollouts_tokenizer(specs, fingerprint(tokenizer),
                                       "pass the policy that sampled these rollouts (--policy)",
                                       synthetic_ok=cfg.data.synthetic_on_pretrained)
    sampling = Sampling.of(recorded_generation(specs), temperature=temperature, top_p=top_p,
                           max_new_tokens=max_new_tokens, seed=seed)
    configs = checkpoint_model_config(step_dir, cfg)
    manifest = ckpt.Manifest.read(step_dir) or ckpt.Manifest({})
    held = _rows_to_evaluate(step_dir, cfg, manifest, rollouts, cache_dir, stack,
                             model_limit=position_limit(configs[1]), vocab_size=configs[1].vocab_size,
                             leave_out_trained=True)
    store = held[0].store
    rows, regimes = _rows_and_regimes(held, step_dir)
    picked = select_rollouts(store, rows, regimes, max_rollouts, cuts, sampling.max_new_tokens, seed)
    check_policy_vocab(picked, policy)
    transform = store_mod.reward_transform(cfg.targets)
    check_reward_fn(picked, tokenizer, reward_fn, transform, reward)
    critic = load_checkpoint_model(step_dir, cfg, dev, configs=configs)
    critic_values(critic, picked, dev)
    del critic
    n = 1 if sampling.temperature == 0 else samples  # greedy: one continuation says it all
    settings = {"policy": policy, "reward": reward, "rollouts": list(rollouts) if rollouts else None, "cuts": cuts,
                "samples": n, "max_rollouts": max_rollouts, "batch": batch, **dataclasses.asdict(sampling),
                "gamma": cfg.targets.gamma, "reward_transform": transform.to_dict(), "mc_from": mc_from}
    reused = reuse_mc(picked, mc_from, settings) if mc_from else 0
    jobs = jobs_of(picked)
    torch.manual_seed(seed)
    return AuditSetup(step_dir, (ckpt.StepPaths(step_dir).read_training_info() or {}).get("total_steps"), picked,
                      jobs, _sampler(policy, tokenizer, sampling, dev, use_vllm) if jobs else None, tokenizer,
                      reward_fn, transform, cfg.targets.gamma, sampling, n, batch,
                      held[0].split if rollouts else ", ".join(h.split for h in held), settings, reused)


def _sampler(policy: str, tokenizer, sampling: Sampling, dev: torch.device, use_vllm: bool | None):
    """vLLM on CUDA when installed (or when asked), else transformers ``generate``."""
    if vllm_available() and dev.type == "cuda" if use_vllm is None else use_vllm:
        return VLLMSampler(policy, sampling)
    return HFSampler(load_policy(policy, dev), tokenizer, sampling, dev)


SAME_MC = ("reward", "cuts", "samples", "temperature", "top_p", "top_k", "max_new_tokens", "gamma", "reward_transform")
"""Settings two audits must share for one's Monte-Carlo returns to serve the other."""


def reuse_mc(rollouts: list[Rollout], path: str | Path, settings: dict) -> int:
    """Take the continuations' returns of states an earlier audit sampled (``--mc-from``): MC
    values belong to the policy, not the critic, so another checkpoint of the same run is scored
    on them at no sampling cost. States are matched by the rollout's token hash and the cut's
    position; the audits must share ``SAME_MC`` (and the policy's name). Returns the states reused."""
    try:
        old = json.loads(Path(path).read_text())
        rows = {r["row_hash"]: {c["position"]: c["returns"] for c in r["cuts"]} for r in old["rows"]}
        theirs = old["settings"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--mc-from {path}: not an audit JSON with the continuations' returns ({type(e).__name__}: "
                        f"{e}); pass a file written by `critic-pretrain audit`") from None
    for key in (*SAME_MC, "policy"):
        if theirs.get(key) != settings.get(key):
            raise UserError(f"--mc-from {path}: its {key} is {theirs.get(key)!r}, this audit's {settings.get(key)!r}; "
                            "its Monte-Carlo values answer another question: drop --mc-from or match the setting")
    n = 0
    for ro in rollouts:
        for cut in ro.cuts:
            returns = rows.get(ro.row_hash, {}).get(cut.position)
            if returns:
                cut.returns, n = list(returns), n + 1
    return n


def recorded_generation(specs: list) -> dict | None:
    """The first ``generation`` record among the rollout archives' ``_rollouts.json``."""
    from rollouts.paths import archive_folder
    from rollouts.provenance import read_manifest
    for folder in map(archive_folder, specs):
        generation = read_manifest(folder).get("generation") if folder is not None else None
        if generation:
            return generation
    return None


def _rows_and_regimes(held, step_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """[R] store rows and their regime: a held-out set's own, or for given rollouts whether the
    critic trained on the prompt (``step_<n>/data/trained.safetensors``)."""
    if held[0].regime is not None:  # the run's val/ (prompt) and val_response/ sets share one store
        rows = np.concatenate([h.idx for h in held])
        return rows, np.concatenate([np.full(len(h.idx), h.regime) for h in held])
    part = held[0]
    trained = ckpt.StepPaths(step_dir).read_trained()
    if trained is None:
        return part.idx, np.full(len(part.idx), "unknown")
    seen = np.isin(part.store.row_hashes(prompt_only=True)[part.idx], trained["prompts"])
    return part.idx, np.where(seen, "response", "prompt")
