"""What a rollout archive knows of its collecting run: ``_rollouts.json`` beside the shards.

``rollouts convert`` writes it; training reads it before step 1 (and prints what the collecting
run was), and copies what it says into every checkpoint's manifest, where ``seed check`` reads
it. It holds the tokenizer's fingerprint (``rollouts.tokenizer``), what the archive knows of the
run that collected it (``Collection``: framework and version, model, chat-template hash, max
length), and how the logged rewards relate to the reward function's (``RewardsLogged``):
NeMo-RL logs ``rewards`` *after* its ``reward_scaling`` and ``reward_shaping`` (grpo.py and the
PPO loop call ``scale_rewards`` before the training-data log), so a critic trained on such a dump
has seen scaled rewards already.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import UserError
from .fileio import write_json

ROLLOUTS_MANIFEST = "_rollouts.json"
"""Written next to converted shards: what produced them (the leading underscore makes parquet
dataset readers skip it)."""

SYNTH_MANIFEST = "_synth.json"
"""Written next to ``rollouts synth``'s shards (rollouts.synth.archive): its rewards are the
environment's own, so the archive states raw rewards without a ``_rollouts.json``."""

NEMO_RL_SOURCE_RANGE = (0.0, 1.0)
"""NeMo-RL's default ``reward_scaling.source_min`` / ``source_max``."""


@dataclass(frozen=True)
class RewardsLogged:
    """How the rewards in the archive relate to the reward function's raw ones:
    ``logged = clip(scale * clamp(raw, source_range) + shift)``, shaped when ``shaped``."""

    scale: float = 1.0
    shift: float = 0.0
    clip: tuple[float, float] | None = None
    """The logged range after NeMo-RL's mapping (target_min, target_max)."""
    source_range: tuple[float, float] | None = None
    """NeMo-RL clamped raw rewards to this range before mapping them."""
    shaped: bool = False
    """Overlong reward shaping was applied before logging."""
    stated_by: str = ""
    """Where this comes from: ``--ppo-config FILE``, ``--rewards-raw``, ``--rewards-scaled``."""

    @property
    def is_raw(self) -> bool:
        return (self.scale, self.shift, self.clip, self.shaped) == (1.0, 0.0, None, False)

    def to_raw(self, logged: float) -> float:
        """The raw reward a logged one came from (the affine part; clamping is not undone)."""
        return (logged - self.shift) / self.scale

    def formula(self) -> str:
        """``2*r - 1``-style text of the map from raw rewards ``r`` to logged ones."""
        if (self.scale, self.shift) == (1.0, 0.0):
            text = "r (as given)"
        else:
            text = f"{self.scale:g}*r {'+' if self.shift >= 0 else '-'} {abs(self.shift):g}"
        return text + (", shaped" if self.shaped else "")

    def compose(self, targets: dict) -> dict:
        """A manifest's ``targets`` (a reward transform of the logged rewards) as a transform of
        the raw rewards: ``targets(logged(r))``. The logged clip becomes the clip when the targets
        set none."""
        ts, tb, clip = targets.get("reward_scale", 1.0), targets.get("reward_shift", 0.0), targets.get("reward_clip")
        if clip is None and self.clip is not None:
            clip = sorted((ts * self.clip[0] + tb, ts * self.clip[1] + tb))
        return {**targets, "reward_scale": ts * self.scale, "reward_shift": ts * self.shift + tb, "reward_clip": clip}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RewardsLogged":
        d = dict(d)
        for key in ("clip", "source_range"):
            if d.get(key) is not None:
                d[key] = tuple(float(x) for x in d[key])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @classmethod
    def from_ppo_settings(cls, settings, stated_by: str) -> "RewardsLogged":
        """What the collecting run (a ``rollouts.ppo_config.PPOSettings``) applied before logging."""
        if settings.reward_notes:
            raise UserError(f"{stated_by}: {settings.reward_notes[0]}: a logged reward cannot be mapped back to the "
                            "raw one; state what the dump holds with --rewards-raw or --rewards-scaled SCALE,SHIFT")
        return cls(settings.reward_scale, settings.reward_shift, settings.reward_clip, settings.reward_source,
                   settings.reward_shaping, stated_by)

    @classmethod
    def parse(cls, text: str, stated_by: str) -> "RewardsLogged":
        """``SCALE,SHIFT`` (``--rewards-scaled 2,-1``: logged = 2 * raw - 1)."""
        try:
            scale, shift = (float(x) for x in text.split(","))
        except ValueError:
            raise UserError(f"{stated_by} {text!r}: write SCALE,SHIFT, "
                            "e.g. 2,-1 for rewards logged as 2*r - 1") from None
        if scale == 0:
            raise UserError(f"{stated_by} {text}: SCALE must not be 0")
        return cls(scale, shift, stated_by=f"{stated_by} {text}")


@dataclass(frozen=True)
class Collection:
    """What an archive knows of the run that collected it (``_rollouts.json``, key ``collected``;
    the tokenizer's fingerprint has its own key, ``tokenizer``). None: not known."""

    framework: str | None = None
    """``nemo-rl``, ``slime``, ``verl`` (a generic conversion does not know)."""
    version: str | None = None
    """The framework's version, as the user stated it (no dump records it)."""
    model: str | None = None
    """The policy that generated the rollouts: a hub id or a folder."""
    tokenizer_path: str | None = None
    """The folder whose tokenizer was fingerprinted (``--tokenizer``, or slime's
    ``<dump_details>/tokenizer`` found beside the dump)."""
    chat_template_sha256: str | None = None
    """First 16 hex digits of SHA-256 over the tokenizer's chat template (``rollouts.tokenizer``)."""
    max_length: int | None = None
    """The longest prompt + response the collecting run allowed (verl: its batch width; NeMo-RL:
    ``policy.max_total_sequence_length`` from ``--ppo-config``)."""

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "Collection":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def merged(self, **facts) -> "Collection":
        """These facts where given (not None), ours elsewhere."""
        return Collection(**{**asdict(self), **{k: v for k, v in facts.items() if v is not None}})

    def describe(self) -> str:
        """``slime (version unknown), model Qwen/..., chat template 1a2b..., max length 4096``."""
        return (f"{self.framework or 'an unknown framework'}"
                + (f" {self.version}" if self.version else " (version unknown)")
                + f", model {self.model or 'unknown'}"
                + f", chat template {self.chat_template_sha256 or 'unknown'}"
                + f", max length {self.max_length if self.max_length is not None else 'unknown'}")


def collection(folder: str | Path | None) -> Collection | None:
    """What the archive in ``folder`` says of its collecting run; None when it says nothing."""
    d = read_manifest(folder).get("collected") if folder is not None else None
    return Collection.from_dict(d) if isinstance(d, dict) else None


def write_manifest(out_dir: str | Path, **facts) -> None:
    """``OUT/_rollouts.json`` with what the converter knows (None values left out)."""
    write_json(Path(out_dir) / ROLLOUTS_MANIFEST, {k: v for k, v in facts.items() if v is not None})


def read_manifest(folder: str | Path) -> dict:
    """``_rollouts.json`` of ``folder`` ({} without one or when unreadable)."""
    try:
        doc = json.loads((Path(folder) / ROLLOUTS_MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def rewards_logged(folder: str | Path) -> RewardsLogged | None:
    """What the archive in ``folder`` says of its rewards; None when it does not say. A synthetic
    archive (``SYNTH_MANIFEST``) says raw: its generator wrote the environment's rewards."""
    d = read_manifest(folder).get("rewards")
    if isinstance(d, dict):
        return RewardsLogged.from_dict(d)
    if is_synthetic(folder):
        return RewardsLogged(stated_by=f"rollouts synth ({SYNTH_MANIFEST})")
    return None


def is_synthetic(folder: str | Path | None) -> bool:
    """Whether ``folder`` holds ``rollouts synth``'s output (its manifest): toy ids with no text,
    and the environment's own (raw) rewards."""
    return folder is not None and (Path(folder) / SYNTH_MANIFEST).is_file()


def synth_manifest(folder: str | Path) -> dict:
    """``SYNTH_MANIFEST`` of ``folder`` ({} without one or when unreadable): seed, params, vocab_size."""
    try:
        doc = json.loads((Path(folder) / SYNTH_MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def synthetic_id_clash(folders: list[str | Path]) -> str | None:
    """Two ``rollouts synth`` archives of one ``--seed`` and different environments or settings:
    their sample_ids and group_ids (``s<seed>-...``) coincide while their rollouts differ, so
    de-duplication would drop one archive's rows as repeats and prompts of both would share a
    group. The problem as one sentence, or None."""
    by_seed: dict = {}
    for folder in folders:
        doc = synth_manifest(folder) if is_synthetic(folder) else {}
        if not doc:
            continue
        first = by_seed.setdefault(doc.get("seed"), (folder, doc.get("params")))
        if first[1] != doc.get("params"):
            return (f"{first[0]} and {folder} were both written by rollouts synth with --seed {doc.get('seed')} but "
                    "different environments or settings: their sample_ids and group_ids coincide, so one archive's "
                    "rollouts would be dropped as repeats of the other's and their prompts merged; write one again "
                    "with another --seed")
    return None
