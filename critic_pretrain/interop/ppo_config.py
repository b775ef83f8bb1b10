"""The PPO run's conventions against the seed's (``seed check --ppo-config``).

The most common silent failure of a warm start is a convention mismatch: another gamma, a
reward scaled differently from what the critic saw, another base model or a longer context.
No PPO framework checks this. ``rollouts.ppo_config.read_ppo_config`` reads the PPO run's
config; ``compare`` turns differences into problems (the warm start would be wrong: gamma, the
reward map, the model's architecture) and warnings (worth a look: the critic's lambda, reward
shaping or normalisation, a context longer than the critic was trained on).

Rewards are compared relative to the reward function's raw output. The critic's scale is its
``targets`` transform applied to the archive's rewards, and the archive's own relation to the
raw ones (``rollouts.provenance.RewardsLogged``: NeMo-RL dumps hold rewards after NeMo-RL's
``reward_scaling``) when the archive recorded it. When it did not, rewards outside the PPO
run's ``reward_scaling`` source range but inside its target range are taken for what they
almost always are, rewards scaled already, and the seed fails instead of advising a second
scaling.
"""

from __future__ import annotations

from pathlib import Path

from rollouts.ppo_config import PPOSettings, read_ppo_config
from rollouts.provenance import RewardsLogged

__all__ = ["PPOSettings", "compare", "local_model", "read_ppo_config"]

EPS = 1e-6


def local_model(settings: PPOSettings) -> str | None:
    """The PPO run's critic model when it is a local folder (its architecture is then checked
    like ``--model-config``)."""
    if settings.model and Path(settings.model).expanduser().is_dir():
        return str(Path(settings.model).expanduser())
    return None


def compare(report, settings: PPOSettings, step_config: dict | None, *, model_checked: bool) -> None:
    """Add one problem or warning per mismatch to ``report`` (a ``check.SeedReport``)."""
    t = report.facts.get("targets") or {}
    where = f"--ppo-config {settings.source} ({settings.framework})"
    gamma = t.get("gamma", 1.0)
    if abs(settings.gamma - gamma) > 1e-9:
        report.fail("convention", f"{where}: gamma {settings.gamma:g}, but the critic was trained with gamma "
                    f"{gamma:g}: its values estimate another return; set the PPO gamma to {gamma:g}, or retrain "
                    f"with targets.gamma={settings.gamma:g}")
    compare_rewards(report, settings, t, report.facts.get("rewards") or {}, where)
    lam = t.get("lam", 1.0)
    if abs(settings.lam - lam) > 1e-9:
        report.warn(f"{where}: the PPO run trains the critic with lambda {settings.lam:g}, it was pretrained with "
                    f"{lam:g}: both estimate the same values, but the first PPO steps move it towards other targets")
    trained = _trained_length(step_config)
    if settings.max_length and trained and settings.max_length > trained:
        report.warn(f"{where}: sequences up to {settings.max_length} tokens, the critic was trained on at most "
                    f"{trained}: its values past that are untested; raise data.max_length or cap the PPO run")
    report.facts["ppo_config"] = {"framework": settings.framework, "gamma": settings.gamma, "lam": settings.lam,
                                  "reward_scale": settings.reward_scale, "reward_shift": settings.reward_shift,
                                  "model": settings.model, "max_length": settings.max_length}
    if settings.model and not model_checked:
        report.warn(f"{where}: the critic model {settings.model} is not a local folder here, so its architecture "
                    "was not compared; pass --model-config with its folder or config.json")


def compare_rewards(report, settings: PPOSettings, t: dict, rewards: dict, where: str) -> None:
    """The reward scale the critic saw against the one the PPO critic will see, both relative to
    the raw reward; NeMo-RL's clamp to its source range; reward shaping on either side.

    ``t``: the seed's targets, already relative to the raw reward when the archive recorded how
    it logged them (``checkpoint.Manifest.effective_targets``); ``rewards``: the manifest's ``data.rewards``
    (``logged``: a ``RewardsLogged`` dict or None, ``min`` / ``max``: the archive's range)."""
    logged = RewardsLogged.from_dict(rewards["logged"]) if rewards.get("logged") else None
    lo, hi = rewards.get("min"), rewards.get("max")
    scale, shift = t.get("reward_scale", 1.0), t.get("reward_shift", 0.0)
    in_range = False  # the critic's raw rewards are known to lie where the PPO run's clamp does nothing
    if settings.reward_source and lo is not None:
        smin, smax = settings.reward_source
        raw_lo, raw_hi = sorted((logged.to_raw(lo), logged.to_raw(hi))) if logged else (lo, hi)
        in_range = smin - EPS <= raw_lo and raw_hi <= smax + EPS
        if not in_range:
            tmin, tmax = settings.reward_clip
            if logged is None and tmin - EPS <= lo and hi <= tmax + EPS:
                report.fail("convention", f"{where}: the critic's rollouts hold rewards in [{lo:g}, {hi:g}], outside "
                            f"the PPO run's reward_scaling source range [{smin:g}, {smax:g}] and inside its target "
                            f"range [{tmin:g}, {tmax:g}]: they are almost certainly scaled already (NeMo-RL logs "
                            "rewards after reward_scaling), and scaling them again gives the critic another scale; "
                            "re-convert them with rollouts convert --ppo-config <the collecting run's YAML> (or "
                            "--rewards-scaled SCALE,SHIFT / --rewards-raw) and retrain")
                return
            report.warn(f"{where}: the PPO run clamps raw rewards to [{smin:g}, {smax:g}] before scaling them; the "
                        f"critic's rollouts reach [{raw_lo:g}, {raw_hi:g}] in raw units: its values for rollouts "
                        "past that range are on another scale")
    if abs(settings.reward_scale - scale) > EPS or abs(settings.reward_shift - shift) > EPS:
        a, b = (logged.scale, logged.shift) if logged else (1.0, 0.0)
        need = settings.reward_scale / a
        assumed = (f" (the rollouts logged them as {logged.formula()}, {logged.stated_by})" if logged else
                   " (taking the rollouts' rewards as raw: the archive does not say how they were logged)")
        report.fail("convention", f"{where}: the PPO run's rewards are "
                    f"{_affine(settings.reward_scale, settings.reward_shift)} "
                    f"of the raw ones, the critic's were {_affine(scale, shift)}{assumed}: its values are on another "
                    f"scale; retrain with targets.reward_scale={need:g} targets.reward_shift="
                    f"{settings.reward_shift - need * b:g}, or change the PPO reward scaling")
    elif settings.reward_clip and not t.get("reward_clip") and not in_range:
        report.warn(f"{where}: the PPO run clips rewards to "
                    f"[{settings.reward_clip[0]:g}, {settings.reward_clip[1]:g}]; "
                    "the critic saw them unclipped (the same if raw rewards stay in the source range)")
    for note in settings.reward_notes:
        report.warn(f"{where}: {note}")
    shaped = logged.shaped if logged else None
    if settings.reward_shaping and shaped is None:
        report.warn(f"{where}: ppo.reward_shaping is enabled "
                    "(overlong penalties change the rewards of long responses); "
                    "the archive does not say whether the critic's rollouts were shaped (rollouts convert --ppo-config "
                    "records it)")
    elif shaped is not None and settings.reward_shaping != shaped:
        report.warn(f"{where}: " + ("ppo.reward_shaping is enabled, the critic's rollouts were logged without it"
                                    if settings.reward_shaping else
                                    "the critic's rollouts were logged with reward shaping, this PPO run does not "
                                    "shape") + ": rewards of long responses differ from what the critic saw")


def _trained_length(step_config: dict | None) -> int | None:
    data = (step_config or {}).get("data") or {}
    return data.get("max_length") or data.get("max_tokens")


def _affine(scale: float, shift: float) -> str:
    if (scale, shift) == (1.0, 0.0):
        return "r (as given)"
    return f"{scale:g}*r {'+' if shift >= 0 else '-'} {abs(shift):g}"
