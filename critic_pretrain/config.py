"""Run configuration: typed dataclasses, one per section, each field with its docstring (the
string literal under it) and its range checked next to it (the section's ``__post_init__``).

Reading YAML, dotted ``key=value`` overrides, type coercion and the docs/config.md table are
``config_io``. A failed check is a one-line ``UserError`` naming the key and what to do.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import UserError

VAL_PREFIXES = ("val", "val_response")
"""Metric prefixes of the held-out sets: `val/` (the first set), `val_response/` (the response
regime of `data.val_split=both`); checkpoints carry them as `val:` and `val_response:`."""


@dataclass
class ModelConfig:
    name_or_path: str | None = None
    """Backbone to start from: a local folder or a hub id of a causal LM (or of a reward
    model, see `init_from`). Empty means random init from `config`."""
    config: dict[str, Any] | None = None
    """Hugging Face config fields for a random-init backbone (needs `model_type`), or
    overrides applied on top of `name_or_path`'s config. A key must be a field of the family's
    config class or one its modeling code reads (Qwen2's `head_dim`); anything else is refused
    as a typo, with a did-you-mean."""
    tokenizer: str | None = None
    """Tokenizer folder or hub id, copied into `value/tokenizer/` of each checkpoint.
    Defaults to `name_or_path` when that folder holds tokenizer files."""
    init_from: Literal["backbone", "reward_model"] = "backbone"
    """`backbone`: load a causal LM's body and add a new value head; `reward_model`: also
    take the head (`score`) of a sequence-classification reward model at `name_or_path`, or of
    a critic exported with `export --format hf` (a second stage starts from the first's critic)."""
    head_init: Literal["zero", "normal"] = "normal"
    """Init of a new value head's weight: `zero` (all zeros) or `normal` (std `head_std`)."""
    head_std: float = 0.02
    """Std of the value head's weight init when `head_init` is `normal`."""
    head_bias: bool = True
    """Give the value head a bias (NeMo-RL, verl and ROLL expect one; OpenRLHF, TRL and SkyRL
    heads have none: train with false to export to them losslessly)."""
    bias_init: Literal["zero", "mean_target"] = "mean_target"
    """Init of a new head's bias: 0, or the mean value target over the training data."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the weights the optimizer updates (fp32 master weights are the default;
    mixed precision is set by `train.mixed_precision`)."""
    attn_implementation: str = "auto"
    """Attention kernel. `auto`: our packed attention, exact for each layer's window, softcap,
    scale and sinks (torch varlen on CUDA, else per-rollout SDPA, the eager formula for softcap); or any
    transformers name (`sdpa`, `eager`, `flash_attention_2`, ...)."""
    trust_remote_code: bool = False
    """Allow custom modelling code from `name_or_path`."""

    def __post_init__(self):
        if self.name_or_path is None and isinstance(self.config, dict):
            need("model_type" in self.config, "model.config needs model_type (e.g. qwen2, llama) for random init")
        need(self.init_from == "backbone" or self.name_or_path,
             "model.init_from=reward_model needs model.name_or_path pointing at the reward model")


@dataclass
class SourceConfig:
    paths: list[str] = field(default_factory=list)
    """Parquet files, folders (recursive) and globs of this source."""
    name: str | None = None
    """Label in logs and manifests (default: the first path)."""
    weight: float = 1.0
    """Sampling weight: each rollout of the source appears `weight` times per epoch on
    average (2: twice; 0.5: a different half each epoch)."""
    policy_version: list[int] | None = None
    """Keep rollouts whose `policy_version` is in [min, max] (rows without one are dropped)."""
    reward: list[float] | None = None
    """Keep rollouts whose outcome `reward` (before any transform) is in [min, max]."""
    min_policy_tokens: int = 1
    """Keep rollouts with at least this many policy tokens."""
    max_length: int | None = None
    """Keep rollouts of at most this many tokens."""


@dataclass
class DataConfig:
    train: list[str] = field(default_factory=list)
    """Training rollouts: parquet files, folders (recursive) and globs (one source of
    weight 1 without filters; see `sources` for more)."""
    sources: list[SourceConfig] = field(default_factory=list)
    """More training sources, each with a weight and filters (added to `train`). Rollouts
    are de-duplicated by `sample_id` across all sources (the first occurrence is kept). The
    start-up log gives each source's kept rollouts and warns about one that trains nothing."""
    val: list[str] = field(default_factory=list)
    """Validation rollouts. Empty: hold out `val_fraction` of the training prompts."""
    val_fraction: float = 0.05
    """Share of prompts (by `group_id`, else `sample_id`) held out when `val` is empty; above 0
    at least one prompt is held out and one kept (the start-up line says how many); 0: no
    validation (then `checkpoint.keep_best` and `train.stop_when` are refused)."""
    val_split: Literal["prompt", "response", "both"] = "prompt"
    """What validation holds out of the training rollouts: `prompt` (`val_fraction` of the
    prompts, every response of each: a critic meeting new prompts), `response` (`val_fraction`
    of each prompt's responses, the prompt keeping the others in training: PPO's regime, fresh
    responses to prompts the critic has seen), or `both` (prompts first, then responses of the
    prompts left; logged as `val/` and `val_response/`). A response's side depends on its
    group and its tokens only; a prompt with one response is never split."""
    on_bad: Literal["fail", "skip"] = "fail"
    """Bad rows or files: stop with the first error, or skip them into `quarantine.jsonl`."""
    max_tokens: int = 8192
    """Token budget of one micro-batch per device (packed: sum of rollout lengths)."""
    max_length: int | None = None
    """Longest rollout kept whole; longer ones follow `overlong`. Default: `max_tokens`. Never
    more than the model supports (`max_position_embeddings` or its RoPE scaling limit)."""
    length_warmup_steps: int = 0
    """Sequence-length warm-up: over the first n optimizer steps every rollout is cut at
    `length_warmup_from` tokens for `length_warmup_hold` steps, then at a length growing linearly
    to `max_length` (cut rollouts keep their whole return as targets, as `overlong: truncate`;
    each step still holds the same rollouts, and early steps cost less). For a random-init critic
    that has to find a few decisive tokens among thousands. Not in the recipes: on the synthetic
    `long` rollouts neither warm-up tried learned by step 500-650 (docs/LOG.md). 0: off."""
    length_warmup_from: int = 1024
    """The cut length at the start of `length_warmup_steps` (capped at `max_length`)."""
    length_warmup_hold: int = 0
    """Steps the cut stays at `length_warmup_from` before it grows (within `length_warmup_steps`):
    the short range has to be learned before the cut grows past it."""
    overlong: Literal["truncate", "skip"] = "truncate"
    """Rollouts longer than `max_length`: keep the first `max_length` tokens (their targets
    still see the whole rollout's rewards), or leave them out. Counted either way."""
    shuffle: bool = True
    """Shuffle rollouts each epoch (deterministic from `seed` and the epoch)."""
    recency_half_life: float | None = None
    """Weight rollouts by policy age: a rollout `h` policy versions older than the newest in
    the training data weighs `0.5 ** (h / recency_half_life)` in the loss and in validation
    (rows without `policy_version` weigh as the oldest). For a critic that PPO will use on the
    newest policy. Null: every version alike."""
    weighting: Literal["token", "turn"] = "token"
    """How the training loss weighs a rollout's policy tokens: `token` (each alike), or `turn`
    (each policy turn of a rollout an equal share of its policy tokens, so a short decisive turn
    counts as much as a long one; the rollout's total weight is unchanged). Validation metrics
    stay token-weighted."""
    num_workers: int | None = None
    """DataLoader workers that pack and prefetch micro-batches. Default: 2 on CUDA, 0 on CPU."""
    cache_dir: str | None = None
    """Where the validated, memory-mapped copy of the data lives. Default:
    `<output_dir>/data_cache`."""
    max_bad_fraction: float = 0.05
    """With `on_bad: skip`, stop with an error when more than this share of rows (or of
    files) is bad, instead of silently training on what is left."""
    allow_changes: bool = False
    """On resume, accept rollout files that changed since the checkpoint (added, removed or
    modified); the change is recorded in the next checkpoints' manifests. Off: stop."""
    synthetic_on_pretrained: bool = False
    """Accept synthetic rollouts (`rollouts synth`: toy token ids, no text) with a model that has
    a real tokenizer. Off: refused, since the model reads them as other text and the seed is no
    critic of its real rollouts. On: to probe a pretrained backbone as a sequence model on the
    synthetic credit structures (bench/backbone_envs.py); eval and seed check of such a
    checkpoint accept them too."""

    def absolute_paths(self) -> None:
        """`train`, `val` and each source's `paths` as absolute paths, in place (``absolute_spec``):
        the run's config.yaml, which `eval` and `report` read to find its held-out and training
        rollouts, then names them from any folder (relative ones failed outside the one the run
        was started in). A resume compares sources with their paths made absolute on both sides."""
        self.train, self.val = [absolute_spec(s) for s in self.train], [absolute_spec(s) for s in self.val]
        for src in self.sources:
            src.paths = [absolute_spec(s) for s in src.paths]

    def all_sources(self) -> list[SourceConfig]:
        """`train` as one plain source, then `sources`."""
        return ([SourceConfig(paths=list(self.train), name="train")] if self.train else []) + list(self.sources)

    def __post_init__(self):
        for i, src in enumerate(self.sources):
            key = f"data.sources[{i}]"
            need(bool(src.paths), f"{key}.paths is empty; give files, folders or globs")
            need(src.weight >= 0, f"{key}.weight={src.weight} must be >= 0")
            for name in ("policy_version", "reward"):
                rng = getattr(src, name)
                need(rng is None or (len(rng) == 2 and rng[0] <= rng[1]), f"{key}.{name}={rng} must be [min, max]")
        need(0.0 <= self.max_bad_fraction <= 1.0, "data.max_bad_fraction must be in [0, 1]")
        need(0.0 <= self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction} must be in [0, 1)")
        need(not (self.val and self.val_split == "response"),
             "data.val_split=response holds out responses of the training prompts, and data.val gives held-out "
             "prompts: set data.val_split=both to validate on both, or leave data.val empty")
        need(self.val_fraction > 0 or self.val_split == "prompt",
             f"data.val_split={self.val_split} needs data.val_fraction > 0 (the share of responses held out)")
        need(self.max_tokens > 0, "data.max_tokens must be > 0 (tokens per micro-batch)")
        if self.max_length is not None:
            need(0 < self.max_length <= self.max_tokens,
                 f"data.max_length={self.max_length} must be in (0, data.max_tokens={self.max_tokens}]: "
                 "a rollout must fit into one micro-batch")
        need(self.length_warmup_steps >= 0, f"data.length_warmup_steps={self.length_warmup_steps} must be >= 0 "
             "(0: off)")
        need(self.length_warmup_from > 0, f"data.length_warmup_from={self.length_warmup_from} must be > 0 (tokens)")
        need(0 <= self.length_warmup_hold <= self.length_warmup_steps,
             f"data.length_warmup_hold={self.length_warmup_hold} must be in [0, data.length_warmup_steps="
             f"{self.length_warmup_steps}]: the hold is part of the warm-up")
        need(self.recency_half_life is None or self.recency_half_life > 0,
             f"data.recency_half_life={self.recency_half_life} must be > 0 (policy versions), or null for no "
             "recency weighting")
        need(self.num_workers is None or self.num_workers >= 0, "data.num_workers must be >= 0")


def scheduled_lam(lam: float, lam_end: float | None, step: int, max_steps: int) -> float:
    """`targets.lam_end`'s schedule: lambda at optimizer step ``step`` of ``max_steps``, linear
    from ``lam`` to ``lam_end`` (``lam`` throughout when ``lam_end`` is None). Owned here so
    training and a checkpoint's reader (``checkpoint.Manifest``) agree on it."""
    if lam_end is None:
        return lam
    return lam + (lam_end - lam) * min(max(step / max(max_steps, 1), 0.0), 1.0)


@dataclass
class TargetsConfig:
    gamma: float = 1.0
    """Discount. 1.0 with `lam` 1.0 gives Monte-Carlo returns (the VC-PPO/VAPO recipe)."""
    lam: float = 1.0
    """Critic GAE lambda (decoupled from the actor's). Below 1 needs bootstrap values
    (`values_from: data` or `critic`)."""
    values_from: Literal["none", "data", "critic"] = "none"
    """Bootstrap values for lambda < 1: `none` (zeros: Monte-Carlo), `data` (the collecting
    critic's `values` column), `critic` (this critic's own detached predictions, recomputed
    every micro-batch: semi-gradient TD(lambda); validation is still against Monte-Carlo
    returns so runs stay comparable)."""
    lam_alpha: float | None = None
    """Lambda per horizon (VAPO's length-adaptive lambda, for the critic's targets): a rollout of
    `n` policy tokens bootstraps with lambda = 1 - 1 / (lam_alpha * n), so long rollouts lean on
    their rewards and short ones on the values; replaces `lam` (needs bootstrap values). Null:
    `lam` for every rollout."""
    lam_end: float | None = None
    """With `values_from: critic` and no `lam_alpha`: lambda moves linearly from `lam` at step 0
    to this at `train.max_steps`, above or below `lam` (a function of the optimizer step alone,
    so a resume is exact; a resume that changes `train.max_steps` would rescale it and is refused
    unless allowed). Logged as `train/lambda`; the seed check reports the step's lambda. Null:
    `lam` throughout. On the synthetic environments 0.98 -> 0.8 won on short rollouts and lost
    2k-token ones (bench/recipes.md)."""
    refresh_every: int = 0
    """With `values_from: critic`: bootstrap from a frozen copy of the critic (a target network)
    refreshed every this many optimizer steps, as PPO bootstraps from the values of the critic
    that collected a batch; 0: from the values being trained (semi-gradient TD). Costs one more
    forward per micro-batch and a copy of the weights (saved with each checkpoint, so a resume is
    exact); not with FSDP yet."""
    reward_scale: float = 1.0
    """Outcome and per-token rewards are multiplied by this (before `reward_shift`)."""
    reward_shift: float = 0.0
    """Added to the outcome reward after scaling (NeMo-RL's [0,1] -> [-1,1]: scale 2, shift -1)."""
    reward_clip: list[float] | None = None
    """Optional [min, max] clip of the transformed outcome reward."""

    def kinds(self) -> tuple[str, str]:
        """(what training regresses on, what validation measures against), for logs and plots:
        with `values_from: critic` the train loss and EV are against the critic's own TD targets,
        validation against Monte-Carlo returns, and the two are not comparable."""
        if self.values_from == "critic":
            lam = f"{self.lam:g}" if self.lam_end is None else f"{self.lam:g} -> {self.lam_end:g}"
            return f"TD({lam}) of its own values", "Monte-Carlo returns"
        if self.values_from == "data":
            kind = f"GAE({self.lam:g}) returns of the rollouts' values"
            return kind, kind
        return "Monte-Carlo returns", "Monte-Carlo returns"

    def lam_at(self, step: int, max_steps: int) -> float:
        """The critic's lambda at optimizer step ``step`` of ``max_steps`` (`lam_end`'s schedule)."""
        return scheduled_lam(self.lam, self.lam_end, step, max_steps)

    def __post_init__(self):
        need(0.0 < self.gamma <= 1.0, f"targets.gamma={self.gamma} must be in (0, 1]")
        need(0.0 <= self.lam <= 1.0, f"targets.lam={self.lam} must be in [0, 1]")
        need(self.lam == 1.0 or self.values_from != "none",
             f"targets.lam={self.lam} < 1 needs bootstrap values; set targets.values_from=data "
             "(the rollouts' `values` column), targets.values_from=critic (its own predictions) or targets.lam=1.0")
        need(self.lam_alpha is None or self.lam_alpha > 0, f"targets.lam_alpha={self.lam_alpha} must be > 0 or null")
        need(self.lam_alpha is None or self.values_from != "none",
             f"targets.lam_alpha={self.lam_alpha} needs bootstrap values (targets.values_from=critic or data)")
        need(self.lam_end is None or 0.0 <= self.lam_end <= 1.0, f"targets.lam_end={self.lam_end} must be in [0, 1]")
        need(self.lam_end is None or (self.values_from == "critic" and self.lam_alpha is None),
             f"targets.lam_end={self.lam_end} needs targets.values_from=critic and no targets.lam_alpha (the "
             "schedule moves the lambda of the critic's own TD targets)")
        need(self.refresh_every >= 0, f"targets.refresh_every={self.refresh_every} must be >= 0 (0: no target network)")
        need(self.refresh_every == 0 or self.values_from == "critic",
             f"targets.refresh_every={self.refresh_every} needs targets.values_from=critic (it refreshes the copy "
             "of the critic the TD targets bootstrap from)")
        if self.reward_clip is not None:
            need(len(self.reward_clip) == 2 and self.reward_clip[0] <= self.reward_clip[1],
                 f"targets.reward_clip={self.reward_clip} must be [min, max] with min <= max")


@dataclass
class OptimConfig:
    lr: float = 1e-5
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of a linear or cosine decay."""
    weight_decay: float = 0.0
    """AdamW weight decay (one parameter group, as NeMo-RL builds it)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    schedule: Literal["constant", "linear", "cosine"] = "cosine"
    """LR schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup from 0 over this many optimizer steps."""
    fused: bool | None = None
    """Fused AdamW kernel; default: on for CUDA."""
    head_lr: float | None = None
    """Learning rate of the value head (null: `lr`). Applied by scaling the head's AdamW step, so
    the optimizer keeps the one parameter group NeMo-RL expects; follows the same schedule."""

    def __post_init__(self):
        need(self.lr > 0, f"optim.lr={self.lr} must be > 0")
        need(0 <= self.min_lr <= self.lr, f"optim.min_lr={self.min_lr} must be in [0, optim.lr]")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             f"optim.betas={self.betas} must be two numbers in [0, 1)")
        need(self.warmup_steps >= 0, "optim.warmup_steps must be >= 0")
        need(self.head_lr is None or self.head_lr > 0, f"optim.head_lr={self.head_lr} must be > 0 or null")


@dataclass
class StopConfig:
    metric: str | None = None
    """Validation metric that can end the run early (e.g. `val/loss`,
    `val/explained_variance`; `val_response/...` with `data.val_split=both`); null: run to
    `train.max_steps`. A name the run does not log stops it before step 1, with a did-you-mean."""
    above: float | None = None
    """Stop once the metric is above this for `patience` evaluations in a row."""
    below: float | None = None
    """Stop once the metric is below this for `patience` evaluations in a row."""
    patience: int = 3
    """Evaluations in a row. Without `above`/`below`: evaluations without an improvement of
    more than `min_delta` (a plateau)."""
    min_delta: float = 0.0
    """Smallest change that counts as an improvement for the plateau rule."""
    mode: Literal["auto", "min", "max"] = "auto"
    """Direction of improvement; `auto`: min for names containing `loss` or `error`, else max."""

    def __post_init__(self):
        if self.metric is not None:
            need(self.metric.split("/", 1)[0] in VAL_PREFIXES and "/" in self.metric,
                 f"train.stop_when.metric={self.metric!r} must be a validation metric such as val/loss "
                 "(or val_response/loss with data.val_split=both)")
            need(self.patience >= 1, "train.stop_when.patience must be >= 1")
            need(self.above is None or self.below is None, "train.stop_when: set above or below, not both")


@dataclass
class TrainConfig:
    max_steps: int = 100
    """Optimizer steps to run in total (a resumed run stops at the same step)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step per device (replaced when `rollouts_per_step` is set)."""
    rollouts_per_step: int | None = None
    """Size the optimizer step in rollouts, not tokens: `grad_accum` becomes the fewest micro-batches
    per device whose step holds at least this many rollouts on average over the first pass,
    ceil(N / (devices x mean rollouts per micro-batch)), fixed for the run (a resume keeps the
    checkpoint's micro-batches per step) and written into its resolved config. Long rollouts pack
    1-2 per `data.max_tokens` micro-batch, and steps of 2 rollouts learned ~10x slower per rollout
    than steps of 13 (docs/warm.md, *When the critic learns nothing*). null: `grad_accum` as set."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this (None: no clipping, norm still logged)."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """accelerate mixed precision; `auto` is bf16 on CUDA and off on CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about 30% more compute)."""
    log_every: int = 1
    """Log metrics every this many steps (each log syncs the device once)."""
    progress: bool = True
    """Show progress on the main process: a bar in a terminal; without one (SLURM, `> file`,
    CI) a log line every `progress_every_s` seconds instead of bar redraws."""
    progress_every_s: float = 30.0
    """Without a terminal: seconds between progress lines (step, loss, EV, tokens/s, ETA)."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers, through accelerate, with `metrics.jsonl`'s names and steps:
    `tensorboard` (events in `<output_dir>/tensorboard`), `wandb` (a re-run of the same command
    continues the same W&B run; `WANDB_MODE=offline` works), `mlflow` (`<output_dir>/mlruns`
    unless `MLFLOW_TRACKING_URI` is set), or any other accelerate tracker name. `[]`: none.
    `metrics.jsonl` is always written and is the source of truth."""
    tracker_project: str = "critic-pretrain"
    """W&B project / MLflow experiment of the run (the run itself is named after `output_dir`)."""
    tensorboard: bool = True
    """Deprecated, use `report_to`: false drops `tensorboard` from it."""
    stop_when: StopConfig = field(default_factory=StopConfig)
    """Optional early stop on a validation metric; the run saves a final checkpoint."""
    on_collapse: Literal["stop", "warn"] = "stop"
    """A critic whose values collapse to a near-constant after it had learned (``val/value_std``
    under 5% of the targets' spread after reaching 20% at a validation EV of 0.2 or more;
    semi-gradient TD can do this): `stop`
    ends the run with an error before that step is saved (the checkpoints before it stay),
    `warn` logs one warning line and goes on."""
    freeze_backbone_steps: int = 0
    """Head-only warm-up: the first N optimizer steps update only the value head (the backbone's
    gradients are dropped, so AdamW leaves it and its moments alone). For critics started from
    a reward model or PRM (`model.init_from: reward_model`), as VAPO-style recipes do."""
    collective_timeout_s: float = 1800.0
    """With several ranks: how long a collective (a gradient reduction, a save's barrier) may wait
    for a rank before the run stops with an error instead of hanging."""
    allow_config_changes: list[str] = field(default_factory=list)
    """Keys (or sections, e.g. `targets`) a resume may change although they define the run
    (targets, model, optimizer schedule, data split and batching). A resume that changes any
    other such key stops; accepted changes are recorded in the checkpoint manifests."""

    def __post_init__(self):
        need(all(isinstance(t, str) and t for t in self.report_to),
             f"train.report_to={self.report_to} must be a list of tracker names, e.g. [tensorboard, wandb]")
        need(self.progress_every_s >= 0, f"train.progress_every_s={self.progress_every_s} must be >= 0")
        need(self.max_steps > 0, "train.max_steps must be > 0")
        need(self.grad_accum > 0, "train.grad_accum must be > 0")
        need(self.rollouts_per_step is None or self.rollouts_per_step > 0,
             f"train.rollouts_per_step={self.rollouts_per_step} must be > 0, or null to use train.grad_accum")
        need(self.grad_clip is None or self.grad_clip > 0, "train.grad_clip must be > 0 or null")
        need(self.log_every > 0, "train.log_every must be > 0")
        need(self.freeze_backbone_steps >= 0, "train.freeze_backbone_steps must be >= 0")
        need(self.collective_timeout_s > 0, "train.collective_timeout_s must be > 0 (seconds)")


@dataclass
class CheckpointConfig:
    save_every: int = 0
    """Save `step_<n>` every this many steps (0: only at the end). The last step is
    always saved."""
    load_step: int | None = None
    """Resume from exactly this step (an error if it does not exist). Default: the newest
    complete checkpoint in `output_dir`, or a fresh start when there is none. Steps after it
    move to `output_dir/superseded/` (two trajectories never share the folder; nothing is
    deleted), and re-running the same command continues the new branch."""
    keep_last: int | None = None
    """Keep only the newest k checkpoints (never deleting the one the run resumed from)."""
    keep_best: int | None = None
    """Also keep the best k checkpoints by `best_metric` (read from each checkpoint's
    training_info.json); retention never deletes the newest one."""
    best_metric: str = "val:loss"
    """NeMo-RL-style `val:<metric>` key (`val_response:<metric>` with `data.val_split=both`)
    that ranks checkpoints for `keep_best` (min for names containing `loss` or `error`, else
    max). A checkpoint carries the metrics of its own step's evaluation only, so with
    `keep_best` `save_every` must be a multiple of `eval.every`."""
    save_optimizer: bool = True
    """Write `value/optimizer/` (needed to resume; NeMo-RL since PR #4213 ignores it on a
    warm start)."""

    def __post_init__(self):
        need(self.save_every >= 0, "checkpoint.save_every must be >= 0 (0: save only at the end)")
        need(self.load_step is None or self.load_step >= 0, "checkpoint.load_step must be >= 0")
        need(self.keep_last is None or self.keep_last >= 1, "checkpoint.keep_last must be >= 1")
        need(self.keep_best is None or self.keep_best >= 1, "checkpoint.keep_best must be >= 1")
        need(self.best_metric.split(":", 1)[0] in VAL_PREFIXES and ":" in self.best_metric,
             f"checkpoint.best_metric={self.best_metric!r} must be a val:<metric> key, e.g. val:loss "
             "(or val_response:loss with data.val_split=both)")


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate on the validation split every this many steps (0: only at the end)."""
    max_tokens: int | None = None
    """Cap on validation tokens per evaluation (None: the whole split)."""

    def __post_init__(self):
        need(self.every >= 0, "eval.every must be >= 0")


@dataclass
class Config:
    output_dir: str = "runs/default"
    """Run folder: checkpoints `step_<n>/`, `metrics.jsonl`, `config.yaml`."""
    seed: int = 0
    """Seed for init, data order and the validation split."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    targets: TargetsConfig = field(default_factory=TargetsConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_values(cfg: Config) -> None:
    """What a run needs beyond each section's own ranges (checked in its ``__post_init__``):
    an output folder, rollouts and a model."""
    need(bool(cfg.output_dir), "output_dir is empty; set output_dir=runs/<name>")
    need(bool(cfg.data.train or cfg.data.sources),
         "data.train is empty; set data.train=[path/to/rollouts] (files, folders or globs) or data.sources")
    need(cfg.model.name_or_path or cfg.model.config,
         "no model: set model.name_or_path=<local folder or hub id> or model.config (random init)")
    check_selection(cfg)


def check_selection(cfg: Config) -> None:
    """``train.stop_when`` and ``checkpoint.keep_best`` against the evaluations that feed them:
    `val_response/` exists only with ``data.val_split=both``, and a checkpoint is ranked by its
    own step's evaluation (one saved between evaluations carries none)."""
    ck, every = cfg.checkpoint, cfg.eval.every
    named = [("train.stop_when.metric", cfg.train.stop_when.metric or "", "val/"),
             ("checkpoint.best_metric", ck.best_metric if ck.keep_best else "", "val:")]
    for key, value, prefix in named:
        need(not value.startswith("val_response") or cfg.data.val_split == "both",
             f"{key}={value}: val_response metrics are logged only with data.val_split=both (now "
             f"{cfg.data.val_split}, whose held-out set is logged as {prefix}); use "
             f"{prefix}{value.split(prefix[-1], 1)[-1]} or set data.val_split=both")
    if ck.keep_best and ck.save_every:
        why = ("eval.every=0 evaluates only the last step" if not every else
               f"checkpoint.save_every={ck.save_every} is not a multiple of eval.every={every}")
        need(every > 0 and ck.save_every % every == 0,
             f"checkpoint.keep_best={ck.keep_best} ranks checkpoints by their own step's evaluation, but {why}: "
             "checkpoints saved between evaluations could not be ranked; set checkpoint.save_every to a multiple "
             "of eval.every")


def absolute_spec(spec):
    """A rollouts path made absolute from the current folder; `builtin:`, `hf:`, URLs and dataset
    objects as they are."""
    if not isinstance(spec, str) or spec.startswith(("builtin:", "hf:")) or "://" in spec:
        return spec
    return os.path.abspath(os.path.expanduser(spec))


def need(ok: bool, msg: str) -> None:
    """A config check: ``msg`` (the key, its value and the fix) as a one-line UserError."""
    if not ok:
        raise UserError(msg)
