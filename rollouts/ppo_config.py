"""A PPO (or GRPO) run's conventions, read from its own config. Torch-free: ``rollouts convert
--ppo-config`` reads the collecting run's config, ``seed check --ppo-config`` the PPO run's
(``critic_pretrain.interop.ppo_config.compare`` holds them against a seed).

``read_ppo_config`` reads:

- a NeMo-RL PPO YAML (``ppo.adv_estimator``, ``ppo.reward_scaling``, ``ppo.reward_shaping``,
  ``value.model_name``, ``value`` / ``policy.max_total_sequence_length``; ``defaults:`` files
  merged and ``${a.b}`` references resolved, as NeMo-RL's OmegaConf loader does), or with
  ``grpo=True`` a NeMo-RL GRPO YAML (``grpo.reward_scaling``, ``grpo.reward_shaping``: what a
  GRPO run applied to the rewards it logged);
- a verl config YAML, or a file of verl's ``key=value`` command-line overrides
  (``algorithm.gamma`` / ``lam``, ``critic.model.path``, ``data.max_prompt_length`` +
  ``max_response_length``; verl has no reward transform);
- an OpenRLHF ``train_ppo_ray`` command line or args file, flat (``--gamma``, ``--lambd``,
  ``--normalize_reward``, ``--critic_pretrain``, ``--prompt_max_len`` + ``--generate_max_len``)
  or nested (``--algo.advantage.gamma`` ...).

Defaults are each framework's own where a key is absent (docs/design.md).
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, yaml_problem

REF = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")


@dataclass
class PPOSettings:
    """What a PPO config says about the conventions a warm critic must share."""

    framework: str
    source: Path
    gamma: float
    lam: float
    """The lambda the PPO run trains its critic with."""
    reward_scale: float = 1.0
    reward_shift: float = 0.0
    reward_clip: tuple[float, float] | None = None
    reward_source: tuple[float, float] | None = None
    """NeMo-RL clamps raw rewards to ``[source_min, source_max]`` before mapping them."""
    reward_shaping: bool = False
    """NeMo-RL ``reward_shaping.enabled``: overlong penalties change the rewards of long responses."""
    reward_notes: list[str] = field(default_factory=list)
    """Reward changes we cannot map onto the seed's transform (running normalisation)."""
    model: str | None = None
    """The critic's model in the PPO run (a folder or a hub id)."""
    max_length: int | None = None
    """Longest sequence (prompt + response) the PPO run feeds the critic."""


def read_ppo_config(path: str | Path, *, grpo: bool = False) -> PPOSettings:
    """Detect the framework from the file and read its settings; a one-line UserError otherwise.
    ``grpo``: also take a NeMo-RL GRPO config (its reward settings; it has no critic)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--ppo-config {path}: no such file; pass the PPO run's YAML (NeMo-RL, verl) or its "
                        "OpenRLHF command line saved to a file")
    text = p.read_text(errors="replace")
    if p.suffix in (".yaml", ".yml"):
        cfg = _load_yaml(p)
        if "ppo" in cfg:
            return _nemo_rl(cfg, p)
        if grpo and "grpo" in cfg:
            return _nemo_rl(cfg, p, section="grpo")
        if "algorithm" in cfg or "critic" in cfg:
            return _verl(cfg, p)
        raise UserError(f"--ppo-config {path}: neither a NeMo-RL PPO config (no `ppo:` section) nor a verl config "
                        "(no `algorithm:` or `critic:` section)")
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    if any(t.startswith("--") for t in tokens):
        return _openrlhf(_flags(tokens), p)
    overrides = dict(t.split("=", 1) for t in tokens if "=" in t and not t.startswith("-"))
    if any(k.lstrip("+").startswith(("algorithm.", "critic.", "data.")) for k in overrides):
        cfg: dict = {}
        for key, value in overrides.items():
            _set(cfg, key.lstrip("+").split("."), yaml.safe_load(value))
        return _verl(cfg, p)
    raise UserError(f"--ppo-config {path}: not a YAML file, an OpenRLHF command line (--flags) or verl overrides "
                    "(algorithm.gamma=...)")


# ---------------------------------------------------------------------------------------------
# Frameworks

READ_KEYS = {"adv_estimator": ("name", "gae_gamma", "gae_lambda", "gae_lambda_value"),
             "reward_scaling": ("enabled", "source_min", "source_max", "target_min", "target_max"),
             "algorithm": ("gamma", "lam")}
"""Per section, the keys a warm critic's conventions are read from (an absent one takes the
framework's default, so a misspelt one would pass unnoticed: ``_check_spelling``)."""


def _check_spelling(node: Any, where: str, p: Path) -> None:
    """A key of ``node`` that is a near miss of a key we read (``READ_KEYS``) and stands where that
    key is absent: one line with the did-you-mean, since the default would be read in its place."""
    if not isinstance(node, dict):
        return
    wanted = READ_KEYS[where.rpartition(".")[2]]
    for key in node:
        # stricter than errors.closest (0.6): these sections hold real keys we do not read (verl's kl_ctrl, ...)
        near = difflib.get_close_matches(str(key), wanted, n=1, cutoff=0.8)
        if key not in wanted and near and near[0] not in node:
            raise UserError(f"{p}: {where} has '{key}'; did you mean '{near[0]}'? As written it is ignored and "
                            f"{near[0]} takes the framework's default: fix the key")


def _nemo_rl(cfg: dict, p: Path, section: str = "ppo") -> PPOSettings:
    for part in ("adv_estimator", "reward_scaling"):
        _check_spelling(_get(cfg, f"{section}.{part}"), f"{section}.{part}", p)
    adv = _get(cfg, f"{section}.adv_estimator") or {}
    lam = adv.get("gae_lambda_value")
    s = PPOSettings("nemo-rl", p, gamma=float(adv.get("gae_gamma", 1.0)),
                    lam=float(lam if lam is not None else adv.get("gae_lambda", 1.0)))
    scaling = _get(cfg, f"{section}.reward_scaling") or {}
    if scaling.get("enabled"):  # clamp to [source_min, source_max], map linearly to [target_min, target_max]
        smin, smax = float(scaling.get("source_min", 0.0)), float(scaling.get("source_max", 1.0))
        tmin, tmax = float(scaling.get("target_min", 0.0)), float(scaling.get("target_max", 1.0))
        s.reward_scale = (tmax - tmin) / (smax - smin)
        s.reward_shift = tmin - smin * s.reward_scale
        s.reward_clip = (min(tmin, tmax), max(tmin, tmax))
        s.reward_source = (smin, smax)
    s.reward_shaping = bool((_get(cfg, f"{section}.reward_shaping") or {}).get("enabled"))
    s.model = _get(cfg, "value.model_name") or _get(cfg, "policy.model_name")
    length = _get(cfg, "value.max_total_sequence_length") or _get(cfg, "policy.max_total_sequence_length")
    s.max_length = int(length) if isinstance(length, (int, float)) else None
    return s


def _verl(cfg: dict, p: Path) -> PPOSettings:
    _check_spelling(cfg.get("algorithm"), "algorithm", p)
    s = PPOSettings("verl", p, gamma=float(_get(cfg, "algorithm.gamma", 1.0)),
                    lam=float(_get(cfg, "algorithm.lam", 1.0)))
    s.model = _get(cfg, "critic.model.path") or _get(cfg, "actor_rollout_ref.model.path")
    prompt, response = _get(cfg, "data.max_prompt_length", 512), _get(cfg, "data.max_response_length", 512)
    s.max_length = int(prompt) + int(response)
    return s


def _openrlhf(flags: dict[str, Any], p: Path) -> PPOSettings:
    nested = any("." in k for k in flags)

    def pick(new: str, old: str, default):
        return flags.get(new, flags.get(old, default))

    # Defaults: train_ppo_ray's own (nested CLI: gamma 1, lambd 1; flat CLI <= 0.8: gamma 1, lambd 0.95).
    s = PPOSettings("openrlhf", p, gamma=float(pick("algo.advantage.gamma", "gamma", 1.0)),
                    lam=float(pick("algo.advantage.lambd", "lambd", 1.0 if nested else 0.95)))
    if pick("reward.normalize_enable", "normalize_reward", False):
        s.reward_notes.append("reward normalisation is on (--normalize_reward / --reward.normalize_enable: rewards "
                              "divided by a running std); the critic saw unnormalised rewards")
    s.model = (pick("critic.model_name_or_path", "critic_pretrain", None)
               or pick("actor.model_name_or_path", "pretrain", None))
    if "data.max_len" in flags or nested:
        s.max_length = int(flags.get("data.max_len", 2048))
    else:
        s.max_length = int(flags.get("prompt_max_len", 1024)) + int(flags.get("generate_max_len", 1024))
    return s


# ---------------------------------------------------------------------------------------------
# Reading

def _load_yaml(p: Path, depth: int = 0) -> dict:
    try:
        cfg = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"--ppo-config {p}: not valid YAML ({yaml_problem(e)}); fix the file") from None
    if not isinstance(cfg, dict):
        raise UserError(f"--ppo-config {p}: the YAML is not a mapping of keys")
    parents = cfg.pop("defaults", None)
    if isinstance(parents, str) and depth < 10:  # NeMo-RL: `defaults: ../base.yaml`, the child wins
        parent = (p.parent / parents).resolve()
        if parent.is_file():
            cfg = _merge(_load_yaml(parent, depth + 1), cfg)
    return _resolve(cfg, cfg) if depth == 0 else cfg


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve(node: Any, root: dict, depth: int = 0) -> Any:
    """``${a.b}`` references (OmegaConf's plain interpolation) replaced by their values."""
    if isinstance(node, dict):
        return {k: _resolve(v, root, depth) for k, v in node.items()}
    if isinstance(node, str) and depth < 10 and (m := REF.match(node)):
        return _resolve(_get(root, m.group(1)), root, depth + 1)
    return node


def _get(cfg: dict, dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _set(cfg: dict, parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        cfg = cfg.setdefault(part, {})
    cfg[parts[-1]] = value


def _flags(tokens: list[str]) -> dict[str, Any]:
    """``--key value`` / ``--key=value`` / bare ``--flag`` (True), keys without the dashes."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            key, eq, value = tok[2:].partition("=")
            if not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                value, i = tokens[i + 1], i + 1
            out[key] = yaml.safe_load(value) if (eq or value) else True
        i += 1
    return out
