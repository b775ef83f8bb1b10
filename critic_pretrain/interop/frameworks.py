"""What each PPO framework loads as a critic, in one table, and the lines a user pastes into it.

Sources (docs/design.md and docs/export.md have the links): NeMo-RL's DTensor value worker builds
``AutoModelForTokenClassification(config, num_labels=1)`` and loads ``value/weights`` with
strict keys; verl's critic is the same class from ``critic.model.path``; OpenRLHF builds an
``AutoModel`` backbone plus a bias-free ``Linear`` named by ``config.value_head_prefix``; TRL's
PPO value model is ``AutoModelForSequenceClassification`` whose ``score`` has no bias; ROLL's
``trl`` critic is TRL's ``AutoModelForCausalLMWithValueHead`` over a causal-LM folder, its
``v_head.summary`` (with bias) read from LLaMA-Factory's ``value_head.safetensors`` sidecar;
SkyRL builds an ``AutoModel`` backbone plus a bias-free ``Linear`` named ``value_head``.
Every one of them aligns values the same way: value[t] = head(hidden[t-1]).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HEAD = "score"
"""The value head's name in every class above (OpenRLHF: ``value_head_prefix``, which we set)."""

# NeMo-RL's PPO example (examples/configs/ppo_math_1B.yaml, value.scheduler): ConstantLR
# with this many iterations inside SequentialLR with no milestones.
CONSTANT_TOTAL_ITERS = 10_000_000_000


@dataclass(frozen=True)
class Framework:
    name: str
    """What `seed check --for` takes."""
    export_format: str
    """What `export --format` writes for it."""
    head_bias: bool
    """Whether its critic head has a bias (HF *ForTokenClassification: yes; OpenRLHF, TRL: no)."""
    needs: str
    """One line: what it loads, for the seed check's summary."""
    export_repairs: frozenset
    """Seed-check problem areas its export fixes (a missing bias added as 0, the optimizer
    not carried by Hugging Face folders)."""
    head: str = HEAD
    """The value head's name in the consumer's weights (``<head>.weight``, ``<head>.bias``)."""


FRAMEWORKS = {
    "nemo-rl": Framework(
        "nemo-rl", "nemo-rl", True,
        "<step>/value/weights/model/*.safetensors with exactly the keys of "
        "AutoModelForTokenClassification(config, num_labels=1) (score.weight [1, H], score.bias [1]); "
        "optimizer state optional (ignored on a warm start since PR #4213; older versions load it)",
        frozenset({"bias"})),
    "verl": Framework(
        "verl", "hf", True,
        "a Hugging Face *ForTokenClassification folder (config.json num_labels 1, model.safetensors) "
        "for critic.model.path: `critic-pretrain export STEP --format hf`",
        frozenset({"bias", "optimizer"})),
    "openrlhf": Framework(
        "openrlhf", "openrlhf", False,
        "an AutoModel backbone + a bias-free Linear named by config.value_head_prefix: "
        "`critic-pretrain export STEP --format openrlhf`",
        frozenset({"optimizer"})),
    "trl": Framework(
        "trl", "trl", False,
        "an AutoModelForSequenceClassification folder (score without bias): "
        "`critic-pretrain export STEP --format trl`",
        frozenset({"optimizer"})),
    "roll": Framework(
        "roll", "roll", True,
        "a *ForCausalLM backbone folder + value_head.safetensors (v_head.summary.weight [1, H], v_head.summary.bias "
        "[1]) for a critic with model_type: trl: `critic-pretrain export STEP --format roll`",
        frozenset({"bias", "optimizer"}), head="v_head.summary"),
    "skyrl": Framework(
        "skyrl", "skyrl", False,
        "an AutoModel backbone + a bias-free Linear named value_head (trainer.algorithm.value_head_prefix): "
        "`critic-pretrain export STEP --format skyrl`",
        frozenset({"optimizer"}), head="value_head"),
}
TARGETS = tuple(FRAMEWORKS)
BIASED_TARGETS = tuple(name for name, f in FRAMEWORKS.items() if f.head_bias)
FORMATS = tuple(f.export_format for f in FRAMEWORKS.values())
FORMAT_ALIASES = {"verl": "hf"}


def framework_of_format(fmt: str) -> Framework:
    """The framework an export format is for (``hf`` -> verl)."""
    return next(f for f in FRAMEWORKS.values() if f.export_format == fmt)


# ---------------------------------------------------------------------------------------------
# Descriptions and the lines to paste

def describe_head(head: dict) -> str:
    name, w = head.get("name", HEAD), head.get("weight_shape")
    bias = head.get("bias")
    text = f"{name}.weight {w}"
    if bias is not None:
        text += f" + {name}.bias [1] = {bias:+.4g}"
    else:
        text += " (no bias)"
    if head.get("dropped_bias") is not None:
        text += f"; bias {head['dropped_bias']:+.4g} dropped at export"
    return text


def describe_targets(targets: dict | None) -> str:
    if not targets:
        return "unknown (no critic_pretrain.json)"
    source = {"critic": " (TD(lambda) bootstrapped from its own values)",
              "data": " (bootstrapped from the rollouts' values)"}.get(targets.get("values_from"), "")
    if targets.get("lam_end") is not None:  # targets.lam_end: `lam` is this step's (checkpoint.Manifest)
        source += f", this step's on a schedule from {targets.get('lam_start', targets.get('lam', 1.0)):g} to " \
                  f"{targets['lam_end']:g}"
    return (f"rewards {reward_formula(targets)}, gamma {targets.get('gamma', 1.0):g}, critic lambda "
            f"{targets.get('lam', 1.0):g}" + (" (Monte-Carlo returns)" if targets.get("lam", 1.0) == 1.0 else source)
            + "; value[t] = head(hidden[t-1]), 0 at each sequence start")


def _shared_lambda(t: dict) -> tuple[str, str]:
    """(value, comment) for frameworks with one lambda for actor and critic. Any lambda
    estimates the same values, so a critic pretrained with TD(lambda < 1) does not impose its
    lambda on the actor; Monte-Carlo pretraining (lambda 1) is printed as trained."""
    if not t:
        return "<actor's lambda>", "one lambda for actor and critic; the critic's is unknown (no critic_pretrain.json)"
    lam = t.get("lam", 1.0)
    if lam < 1.0:
        return "<actor's lambda>", (f"one lambda for actor and critic; the critic's TD({lam:g}) pretraining "
                                    "estimates the same values, so keep the actor's")
    return f"{lam:g}", "one lambda for actor and critic"


def describe_optimizer(opt: dict) -> str:
    lr = opt["lr"]  # 0.0024917112325092907 from a cosine schedule: four digits say it
    lr = f"{lr:.4g}" if isinstance(lr, float) else lr
    return (f"{opt['kind']} state over {opt['parameters']} tensors, {opt['param_groups']} group(s), "
            f"lr {lr}, scheduler {opt['scheduler']} at step {opt['last_epoch']}")


def reward_formula(targets: dict) -> str:
    scale, shift, clip = targets.get("reward_scale", 1.0), targets.get("reward_shift", 0.0), targets.get("reward_clip")
    if (scale, shift, clip) == (1.0, 0.0, None):
        return "as given (no transform)"
    text = f"r' = {scale:g}*r {'+' if shift >= 0 else '-'} {abs(shift):g}"
    return text + (f", clipped to [{clip[0]:g}, {clip[1]:g}]" if clip else "")


RAW_UNSTATED = ("the rollouts' rewards as they are, taken as raw: the archive does not say how they were logged "
                "(NeMo-RL logs them after reward_scaling; seed check --ppo-config compares)")
"""What a paste-in says of untransformed rewards whose archive recorded nothing (``data.rewards.logged``
None): "raw" is then an assumption, not a fact (docs/converters.md, "Rewards: what the dump logged")."""


def raw_rewards_phrase(facts: dict) -> str:
    """"the raw rewards", or ``RAW_UNSTATED`` when the seed's facts say its archive did not record them."""
    rewards = facts.get("rewards")  # None: facts that do not carry data.rewards at all (older seeds): say "raw"
    return RAW_UNSTATED if isinstance(rewards, dict) and not rewards.get("logged") else "the raw rewards"


def nemo_rl_reward_scaling(targets: dict | None, raw: str = "the raw rewards") -> list[str]:
    """``ppo.reward_scaling`` lines (NeMo-RL RewardScalingConfig: clamp to [source_min,
    source_max], map linearly to [target_min, target_max]) matching our reward transform;
    ``raw``: how an untransformed reward is described (``raw_rewards_phrase``)."""
    if not targets:
        return ["  # reward scale unknown (no critic_pretrain.json): set ppo.reward_scaling to the scale the",
                "  # critic was trained on"]
    scale, shift, clip = targets.get("reward_scale", 1.0), targets.get("reward_shift", 0.0), targets.get("reward_clip")
    if (scale, shift, clip) == (1.0, 0.0, None):
        return ["  reward_scaling:", f"    enabled: false        # the critic was trained on {raw}"]
    if clip:
        lo, hi = sorted(((clip[0] - shift) / scale, (clip[1] - shift) / scale))
        note = "exact: our transform clips the scaled reward to the same range"
    else:
        lo, hi = 0.0, 1.0
        note = "NeMo-RL clamps raw rewards to [source_min, source_max]: set them to your raw reward range"
    return ["  reward_scaling:         # the critic was trained on rewards " + reward_formula(targets),
            "    enabled: true", f"    source_min: {lo:g}", f"    source_max: {hi:g}",
            f"    target_min: {scale * lo + shift:g}", f"    target_max: {scale * hi + shift:g}", f"    # {note}"]


def config_lines(target: str, location: Path, facts: dict, *, scheduler: str | None = None,
                 total_iters: int = CONSTANT_TOTAL_ITERS) -> list[str]:
    """The config lines a user pastes into ``target`` to warm-start its critic from ``location``.

    ``scheduler``: for NeMo-RL, the scheduler class of the seed's optimizer state (``lambda``,
    ``sequential`` or None when it has none).
    """
    t = facts.get("targets") or {}
    # Unknown without our manifest: a placeholder the PPO config cannot parse, never a guess.
    gamma = f"{t.get('gamma', 1.0):g}" if t else "<the gamma the critic was trained with>"
    lam = f"{t.get('lam', 1.0):g}" if t else "<the lambda the critic was trained with>"
    loc = str(Path(location).resolve())
    raw = raw_rewards_phrase(facts)
    if target == "nemo-rl":
        lines = ["# NeMo-RL PPO config: warm-start the critic from this seed",
                 "ppo:", f"  warm_start_value_checkpoint: {loc}",
                 "  policy_training_start_step: 0   # warm-started from this seed: no critic-only steps",
                 "  adv_estimator:", "    name: gae", f"    gae_gamma: {gamma}          # as the critic was trained",
                 f"    gae_lambda_value: {lam}   # the critic's lambda (decoupled from the actor's gae_lambda)",
                 *nemo_rl_reward_scaling(facts.get("targets"), raw), "value:"]
        name = facts.get("model_name_or_path")
        arch = facts.get("arch") or {}
        if name:
            lines.append(f"  model_name: {name}   # the backbone the critic was trained from")
        else:
            lines.append(f"  # model_name: a model with this critic's architecture ({arch.get('model_type')}, hidden "
                         f"{arch.get('hidden_size')}, {arch.get('num_layers')} layers, vocab {arch.get('vocab_size')})")
        if scheduler == "sequential":
            lines += ["  scheduler:   # must build the class the seed's scheduler state came from (NeMo-RL < PR #4213)",
                      "  - name: torch.optim.lr_scheduler.ConstantLR",
                      f"    kwargs: {{factor: 1.0, total_iters: {total_iters}}}", "  - milestones: []"]
        elif scheduler == "lambda":
            lines.append("  # no value.scheduler: the seed's scheduler state is LambdaLR (what NeMo-RL builds "
                         "without one)")
        return lines
    if target == "verl":
        return ["# verl PPO config (critic.model.path loads AutoModelForTokenClassification, num_labels=1)",
                f"critic.model.path: {loc}",
                "trainer.critic_warmup: 0          # warm-started from this seed",
                "algorithm.adv_estimator: gae", f"algorithm.gamma: {gamma}",
                f"algorithm.lam: {_shared_lambda(t)[0]}              # verl: {_shared_lambda(t)[1]}",
                *_plain_reward_note(t, "verl has no reward-scaling option: make the reward function return it",
                                    raw)]
    if target == "openrlhf":
        norm = (facts.get("normalization") or {}).get("mean") is not None
        lines = ["# OpenRLHF PPO (train_ppo_ray): flat CLI (<= 0.8) / nested CLI (newer)",
                 f"--critic_pretrain {loc}            # newer: --critic.model_name_or_path {loc}",
                 "--value_head_prefix score           # newer: --ds.value_head_prefix score (config.json pins it too)",
                 "--advantage_estimator gae           # newer: --algo.advantage.estimator gae",
                 f"--gamma {gamma} --lambd {_shared_lambda(t)[0]}           # newer: --algo.advantage.gamma "
                 f"{gamma} --algo.advantage.lambd; {_shared_lambda(t)[1]}",
                 "# leave --freezing_actor_steps / --critic.freezing_steps unset: warm-started from this seed"]
        if norm:
            lines.append("--normalize_reward                  # newer: --reward.normalize_enable; applies the folded "
                         "head bias (config.json mean/std), see the note above")
        return lines + _plain_reward_note(t, "OpenRLHF has no linear reward transform: produce rewards on that "
                                             "scale", raw)
    if target in ("roll", "skyrl"):
        return _roll_lines(loc, t, raw, gamma) if target == "roll" else _skyrl_lines(loc, t, raw, gamma)
    return _trl_lines(loc, t, raw, gamma)


def _trl_lines(loc: str, t: dict, raw: str, gamma: str) -> list[str]:
    return ["# TRL 1.12 PPO (trl.experimental.ppo)",
            "from transformers import AutoModelForSequenceClassification",
            "from trl.experimental.ppo import PPOConfig, PPOTrainer",
            f"value_model = AutoModelForSequenceClassification.from_pretrained({loc!r}, num_labels=1)",
            f"args = PPOConfig(..., gamma={gamma}, lam={_shared_lambda(t)[0]})   # gamma as the "
            f"critic was trained; {_shared_lambda(t)[1]}",
            "trainer = PPOTrainer(args=args, ..., value_model=value_model)",
            *_plain_reward_note(t, "TRL has no reward transform: make the reward model's score that scale", raw)]


def _roll_lines(loc: str, t: dict, raw: str, gamma: str) -> list[str]:
    return ["# ROLL pipeline config: a trl-type critic loads the backbone + value_head.safetensors",
            "critic:", "  model_args:", f"    model_name_or_path: {loc}", "    model_type: trl",
            "adv_estimator: gae", f"gamma: {gamma}",
            f"lambd: {_shared_lambda(t)[0]}              # ROLL: {_shared_lambda(t)[1]}",
            "critic_warmup: 0          # warm-started from this seed",
            *_plain_reward_note(t, "ROLL's reward_clip and norm_mean_type/norm_std_type are not affine maps of the "
                                   "reward: make the reward function return that scale", raw)]


def _skyrl_lines(loc: str, t: dict, raw: str, gamma: str) -> list[str]:
    return ["# SkyRL (skyrl.train.entrypoints.main_base) overrides",
            f"trainer.critic.model.path={loc}",
            "trainer.algorithm.value_head_prefix=value_head   # the default: the export's head name",
            "trainer.algorithm.advantage_estimator=gae", f"trainer.algorithm.gamma={gamma}",
            f"trainer.algorithm.lambd={_shared_lambda(t)[0]}   # SkyRL: {_shared_lambda(t)[1]}",
            "# keep trainer.policy.model.path different from the critic's: SkyRL re-initialises the value head "
            "when they are equal",
            *_plain_reward_note(t, "SkyRL has no reward transform: make the reward function return that scale",
                                raw)]


def _plain_reward_note(targets: dict, how: str, raw: str) -> list[str]:
    if not targets:
        return ["# reward scale unknown (no critic_pretrain.json): use the scale the critic was trained on"]
    if (targets.get("reward_scale", 1.0), targets.get("reward_shift", 0.0), targets.get("reward_clip")) \
            == (1.0, 0.0, None):
        return [f"# the critic was trained on {raw}: no reward transform"]
    return [f"# the critic was trained on rewards {reward_formula(targets)}; {how}"]


def trl_bias_snippet() -> list[str]:
    """TRL: put a biased head back on the exported model (our bias is stored in its config)."""
    return ["# exact: TRL's PPOTrainer only calls value_model.score(hidden), so a biased head restores our values",
            "import torch",
            "head = torch.nn.Linear(value_model.config.hidden_size, 1, bias=True, "
            "dtype=value_model.score.weight.dtype)",
            "head.weight.data.copy_(value_model.score.weight.data)",
            "head.bias.data.fill_(value_model.config.critic_pretrain_head_bias)",
            "value_model.score = head"]
