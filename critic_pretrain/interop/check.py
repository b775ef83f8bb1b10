"""Check a critic seed before a PPO run loads it: ``critic-pretrain seed check PATH``.

("Seed" here is the checkpoint a PPO run warm-starts its critic from; the RNG seed is ``seed``
in the run config.)

A seed that a PPO framework half-loads wastes a whole PPO allocation before anyone notices.
NeMo-RL's own check only asks that ``<path>/value/weights`` exists; its loader then ignores
extra keys and loads NaN weights silently (docs/design.md). This module checks what
the frameworks do not:

- the path: empty, misspelt, a run folder instead of a ``step_<n>`` folder, an unfinished
  ``tmp_step_*`` save;
- the weights: readable, no stray ``*.distcp`` / ``*adapter*`` files (they switch NeMo-RL's
  loader to another format), exactly the keys and shapes of the class the target builds
  (``AutoModelForTokenClassification(config, num_labels=1)`` for NeMo-RL and verl), the
  shapes of the PPO model (``--model-config``: hidden size, vocabulary, layers), all finite,
  a ``[1, H]`` head with the bias the target expects;
- ``training_info.json`` present and naming the folder's step;
- the optimizer folder, when present: a readable DCP checkpoint of ``{optim, sched}``
  covering every trainable parameter in one group with ``initial_lr``; the scheduler class;
- our manifest: the reward transform, gamma and lambda the critic was trained with.

``check_seed`` returns a :class:`SeedReport` (usable from notebooks); ``main`` is the CLI.
Exported Hugging Face folders (``critic-pretrain export --format hf|openrlhf|trl``) are
checked too when ``--for verl|openrlhf|trl`` is given.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollouts import fileio
from rollouts.provenance import RewardsLogged

from .. import checkpoint as ckpt
from .. import preflight
from ..errors import UserError, closest, first_line
from .dcp import dcp_metadata, read_dcp, scheduler_class
from rollouts.tokenizer import describe as describe_tokenizer
from rollouts.tokenizer import differences, fingerprint_of
from .frameworks import (BIASED_TARGETS, FRAMEWORKS, HEAD, TARGETS, _describe_head, _describe_optimizer,
                         _describe_targets, _target_std, config_lines)

log = logging.getLogger(__name__)

TMP_STEP_RE = re.compile(r"^tmp_step_(\d+)$")
LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
EXPORT_MANIFEST = ckpt.MANIFEST  # exported HF folders carry a copy of our manifest
DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64", "I64": "int64"}


@dataclass(frozen=True)
class Problem:
    """One failed check. ``area`` lets callers (export) decide which problems they repair."""

    area: str  # path | weights | keys | head | bias | arch | finite | info | manifest | optimizer
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class SeedReport:
    """The outcome of ``check_seed``: problems (each one line saying what to do), warnings,
    and the facts found (step, parameters, head, dtype, targets, optimizer...)."""

    path: Path
    target: str
    kind: str = "unknown"  # "step": a step_<n> tree; "hf": an exported Hugging Face folder
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, area: str, message: str) -> None:
        self.problems.append(Problem(area, message))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "target": self.target, "kind": self.kind, "ok": self.ok,
                "problems": [asdict(p) for p in self.problems], "warnings": list(self.warnings),
                "facts": self.facts}

    def summary(self) -> str:
        """Human-readable report: the verdict, the facts, then what the target needs."""
        f = self.facts
        if not self.ok:
            return f"FAILED  {self.path} is not a usable {self.target} critic seed ({len(self.problems)} problem(s))"
        lines = [f"OK  {self.path} is a valid critic seed for {self.target}"]
        arch = f.get("arch", {})
        shape = ", ".join(f"{k} {v}" for k, v in (("hidden", arch.get("hidden_size")),
                                                    ("layers", arch.get("num_layers")),
                                                    ("vocab", arch.get("vocab_size"))) if v is not None)
        lines.append(f"  step {f.get('step', '?')} · {f.get('parameters', 0):,} parameters · "
                     f"{'/'.join(f.get('dtypes', [])) or '?'} · {arch.get('model_type', '?')}: {shape}")
        lines.append(f"  head: {_describe_head(f.get('head', {}))}")
        norm = f.get("normalization") or {}
        if norm.get("mean") is not None:
            lines.append(f"  config.json mean {norm['mean']:.6g}, std {norm['std']:g}: OpenRLHF applies "
                         "(value - mean) / std only with --normalize_reward / --reward.normalize_enable")
        lines.append(f"  trained on: {_describe_targets(f.get('targets'))}")
        logged = (f.get("rewards") or {}).get("logged")
        if logged:
            r = RewardsLogged.from_dict(logged)
            lines.append(f"  rewards relative to the reward function's: the rollouts logged them as {r.formula()} "
                         f"({r.stated_by})")
        if self.kind == "step":
            lines.append(f"  tokenizer: {describe_tokenizer(f.get('tokenizer_fingerprint'))}")
        if f.get("training_info"):
            info = f["training_info"]
            headline = ("val:loss", "val:explained_variance", "val:oracle_loss", "val:oracle_explained_variance")
            val = ", ".join(f"{k} {info[k]:.4g}" for k in headline if isinstance(info.get(k), float))
            lines.append(f"  training: total_steps {info.get('total_steps')}" + (f", {val}" if val else ""))
        q = f.get("quality")
        if q and "critic" in q:
            tokens = f", {q['tokens']} turn-first tokens" if q.get("tokens") else ""
            lines.append(f"  quality on the current policy ({q['rows']} rollouts{tokens}): PASSED, {q['measure']} "
                         f"{q['critic']:.3f} > group-mean baseline {q['baseline']:.3f} (margin "
                         f"{q['critic'] - q['baseline']:.3f}; a small margin may be noise: check more rollouts)")
            if q.get("explained_variance") is not None:
                ceiling = f" (true values: {q['ceiling']:.3f})" if q.get("ceiling") is not None else ""
                lines.append(f"  explained variance there: {q['explained_variance']:.3f}{ceiling}; a low one means "
                             "the value levels are off for this policy, which PPO's first steps re-learn")
        opt = f.get("optimizer")
        if self.kind == "step":
            lines.append("  optimizer: " + (_describe_optimizer(opt) if opt else "none (the PPO run builds a fresh one)")
                         + (" (NeMo-RL since PR #4213 ignores it on a warm start; --legacy-nemo-rl checks it for "
                            "older versions)" if opt and self.target == "nemo-rl" and not f.get("legacy_nemo_rl")
                            else ""))
        lines.append(f"  {self.target} needs: {FRAMEWORKS[self.target].needs}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Entry point

def check_seed(path: str | Path | None, target: str = "nemo-rl", model_config: str | Path | None = None,
               *, finite: bool = True, rollouts: list[str] | None = None, legacy_nemo_rl: bool = False,
               ppo_config: str | Path | None = None) -> SeedReport:
    """Check that ``path`` is a critic seed ``target`` loads correctly; never raises for a bad seed.

    ``model_config``: the PPO run's model (a folder or its config.json) whose hidden size,
    vocabulary and layers the weights must match. ``finite=False`` skips reading every
    tensor (the NaN/Inf scan), for quick structural checks. ``rollouts``: fresh rollouts of
    the PPO run's current policy; the seed fails when its critic is no better there than the
    group-mean baseline (``check_quality``). ``legacy_nemo_rl``: also warn about what NeMo-RL
    before PR #4213 does with the optimizer state (its lr, its scheduler class); the current
    NeMo-RL warm-starts from the weights only and ignores that state. ``ppo_config``: the PPO
    run's config (NeMo-RL / verl YAML, OpenRLHF command line); its gamma, reward scaling,
    lambda, context length and critic model are compared with the seed's (``ppo_config.compare``).
    """
    if target not in TARGETS:
        raise UserError(f"unknown target {target!r}; use one of: {', '.join(TARGETS)}")
    ppo = None
    if ppo_config:
        from .ppo_config import local_model, read_ppo_config
        ppo = read_ppo_config(ppo_config)
        model_config = model_config or local_model(ppo)  # the PPO run's critic model, when it is here
    ppo_model = load_model_config(model_config) if model_config else None
    report = SeedReport(path=Path(str(path)) if path not in (None, "") else Path('""'), target=target)
    report.facts["legacy_nemo_rl"] = legacy_nemo_rl
    root = _resolve(report, path)
    if root is None:
        return report
    report.path = root
    if report.kind == "step":
        _check_step(report, root, ppo_model, model_config, finite)
    else:
        _check_hf_folder(report, root, ppo_model, model_config, finite)
    if model_config and report.ok:
        _check_tokenizer(report, Path(model_config))
    if ppo is not None:
        from .ppo_config import compare
        step_config = ckpt.StepPaths(root).read_config() if report.kind == "step" else None
        compare(report, ppo, step_config, model_checked=model_config is not None)
    if rollouts:
        if report.kind != "step":
            report.fail("quality", f"{root}: --rollouts needs a step_<n> folder (its config.yaml builds the targets); "
                                   "check the step the export came from")
        elif report.ok:
            check_quality(report, root, rollouts)
    return report


def _check_tokenizer(report: SeedReport, model: Path) -> None:
    """The PPO model's tokenizer (when its folder has one) against the seed's fingerprint."""
    ppo = fingerprint_of(model if model.is_dir() else model.parent)
    seed = report.facts.get("tokenizer_fingerprint")
    if ppo is None:
        return
    if seed is None:
        report.warn(f"{model}: has a tokenizer, the seed records none (random-init model or model.tokenizer unset), so "
                    "they cannot be compared; train with model.tokenizer=<the PPO model's folder>")
        return
    errors, warnings = differences(seed, ppo)
    for e in errors:
        report.fail("tokenizer", f"the PPO model's tokenizer ({model}) differs from the one the critic was trained "
                                 f"under: {e}; every token id means another string: retrain on rollouts tokenized "
                                 "by the PPO model's tokenizer")
    for w in warnings:
        report.warn(f"the PPO model's tokenizer ({model}): {w}")


QUALITY_LAM = 0.95
"""The actor lambda the quality check scores advantages at (PPO recipes' usual value)."""


def check_quality(report: SeedReport, step_dir: Path, rollouts: list[str]) -> None:
    """Is the critic still worth more than the group statistics on the current policy's rollouts?

    With oracle values: its GAE advantages (lambda ``QUALITY_LAM``) must correlate better with
    the true advantages at turn-first tokens than the group-mean-as-value control. Without:
    its explained variance must beat the leave-one-out group mean's. A stale critic (trained
    on an older policy) that fails this gives PPO worse advantages than no critic at all."""
    from ..evaluate import evaluate_checkpoint

    try:  # evaluate_checkpoint refuses them too; here it is a failed check, not an aborted one
        preflight.check_rollouts_tokenizer(rollouts, (ckpt.StepPaths(step_dir).read_manifest() or {}).get("tokenizer"),
                                           "check the seed on rollouts of its own tokenizer, or retrain it with "
                                           "the policy's tokenizer")
    except UserError as e:
        report.fail("quality", str(e))
        report.facts["quality"] = {"rollouts": list(rollouts), "passed": False}
        return
    ev = evaluate_checkpoint(step_dir, rollouts, cold_every=0)
    m = ev["metrics"]
    tag = f"lam{QUALITY_LAM:g}"
    q = {"rollouts": list(rollouts), "rows": ev["data"]["rows"], "explained_variance": m.get("eval/explained_variance"),
         "ev_group_mean": m.get("eval/ev_group_mean")}
    where = f"on {ev['data']['rows']} rollouts of {', '.join(rollouts)}"
    if f"eval/adv_corr_first_{tag}" in m and f"eval/adv_corr_first_{tag}_group_mean" in m:
        critic, control = m[f"eval/adv_corr_first_{tag}"], m[f"eval/adv_corr_first_{tag}_group_mean"]
        q.update(measure=f"advantage correlation at turn-first tokens, lambda {QUALITY_LAM:g}", critic=critic,
                 baseline=control, grpo=m.get("eval/adv_corr_first_grpo"), td0=m.get("eval/adv_corr_first_lam0"))
        q.update(ceiling=m.get("eval/ev_oracle_values"),
                 tokens=next((r["n"] for r in ev.get("advantages", []) if r["estimator"] == "critic"
                              and r["lam"] == QUALITY_LAM and r["tokens"] == "first"), None))
        if not critic > control:
            report.fail("quality", f"{where}: the critic's advantages (lambda {QUALITY_LAM:g}) correlate {critic:.3f} "
                        f"with the true ones at turn-first tokens, no better than the group mean return as a constant "
                        f"value ({control:.3f}; GRPO {q['grpo']:.3f}): the critic is stale for this policy or "
                        "under-trained; retrain with its rollouts in the data or start PPO without it")
    elif q["ev_group_mean"] is not None and q["explained_variance"] is not None:
        q.update(measure="explained variance of the value targets", critic=q["explained_variance"],
                 baseline=q["ev_group_mean"])
        if not q["explained_variance"] > q["ev_group_mean"]:
            report.fail("quality", f"{where}: the critic explains {q['explained_variance']:.3f} of the targets' "
                        f"variance, no more than each group's mean return does ({q['ev_group_mean']:.3f}): it knows "
                        "at most the prompts' difficulty for this policy (stale or under-trained); retrain with its "
                        "rollouts in the data or start PPO without it")
    else:
        report.warn(f"{where}: no group_id and no oracle_values, so there is no baseline to compare the critic "
                    f"with (its explained variance: {q['explained_variance']:.3f})")
    q["passed"] = not any(p.area == "quality" for p in report.problems) if "critic" in q else None
    report.facts["quality"] = q


def load_model_config(spec: str | Path):
    """The PPO model's HF config (``--model-config``: a model folder or a config.json), num_labels=1."""
    from transformers import AutoConfig

    p = Path(spec)
    if not p.exists():
        raise UserError(f"--model-config {spec}: no such file or folder; pass the PPO model's folder or its config.json")
    try:
        config = AutoConfig.from_pretrained(str(p))
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"--model-config {spec}: cannot read it as a Hugging Face config ({first_line(e)}); "
                        "pass the PPO model's folder or its config.json") from None
    config.num_labels = 1
    return config


# ---------------------------------------------------------------------------------------------
# The path

def _resolve(report: SeedReport, raw: str | Path | None) -> Path | None:
    """Classify the path (step tree or exported HF folder); None after a path problem."""
    text = "" if raw is None else str(raw)
    if not text.strip():
        report.fail("path", "the seed path is empty: pass the step_<n> folder of a critic-pretrain run, "
                            "e.g. runs/critic/step_370 (NeMo-RL rejects an empty ppo.warm_start_value_checkpoint too)")
        return None
    p = Path(text).expanduser()
    if not p.exists():
        hint = _did_you_mean(p)
        report.fail("path", f"{p} does not exist{f' ({hint})' if hint else ''}; pass an existing step_<n> folder")
        return None
    if not p.is_dir():
        report.fail("path", f"{p} is a file, not a folder; pass the step_<n> folder that contains value/weights")
        return None
    m = TMP_STEP_RE.match(p.name)
    if m:
        newest = _newest_step(p.parent)
        hint = f"use the newest complete checkpoint {newest}" if newest else "no complete step_<n> exists beside it yet"
        report.fail("path", f"{p} is an unfinished save (tmp_step_{m.group(1)}: the run crashed or is still writing it); "
                            f"{hint}, or wait for the save to finish")
        return None
    if ckpt.StepPaths(p).value_dir.is_dir():
        report.kind = "step"
        return p
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        report.kind = "hf"
        return p
    steps = sorted((d for d in p.iterdir() if d.is_dir() and ckpt.step_number(d) is not None), key=ckpt.step_number)
    if steps:
        newest = _newest_step(p)
        if newest:
            report.fail("path", f"{p} is a run folder, not a checkpoint; pass one of its step_<n> folders, "
                                f"e.g. the newest complete one: {newest}")
        else:
            report.fail("path", f"{p} is a run folder whose step_<n> folders are all incomplete "
                                f"({', '.join(d.name for d in steps[-3:])}); let the run save a checkpoint first")
        return None
    report.fail("path", f"{p} has no value/weights: it is not a critic seed; pass a step_<n> folder written by "
                        "critic-pretrain train or critic-pretrain export --format nemo-rl")
    return None


def _newest_step(run_dir: Path) -> Path | None:
    if not run_dir.is_dir():
        return None
    logging.disable(logging.WARNING)  # find_checkpoints logs every broken folder; the message names them
    try:
        found = ckpt.find_checkpoints(run_dir)
    finally:
        logging.disable(logging.NOTSET)
    return found[max(found)] if found else None


def _did_you_mean(p: Path) -> str:
    """'did you mean X?' for a misspelt component, or which ancestor exists ('' if none)."""
    parts = p.parts
    for i in range(len(parts) - 1, 0, -1):
        parent = Path(*parts[:i])
        if parent.is_dir():
            missing = parts[i]
            close = closest(missing, (d.name for d in parent.iterdir() if d.is_dir()))
            if close:
                return f"did you mean {Path(parent, close, *parts[i + 1:])}?"
            return f"{parent} exists but has no {missing!r}"
    return ""


# ---------------------------------------------------------------------------------------------
# A step_<n> tree

def _check_step(report: SeedReport, root: Path, ppo_config, ppo_config_path, finite: bool) -> None:
    p = ckpt.StepPaths(root)
    report.facts["step"] = ckpt.step_number(root)
    if not ckpt.StepPaths(root).weights_root.is_dir():
        report.fail("weights", f"{root} has no value/weights: NeMo-RL refuses it; pass a complete step_<n> "
                               "folder or re-export one with critic-pretrain export --format nemo-rl")
        return
    files = sorted(p.weights_dir.glob("*.safetensors")) if p.weights_dir.is_dir() else []
    _check_strays(report, ckpt.StepPaths(root).weights_root)
    manifest = _check_manifest(report, root)
    _check_training_info(report, root)
    if not files:
        report.fail("weights", f"no weights: {p.weights_dir} has no *.safetensors file (the save did not finish or "
                               "the copy is incomplete); copy the whole step_<n> folder again or use another step")
        return
    shapes = _read_shapes(report, files)
    if shapes is None:
        return
    seed_config = _read_config(report, p.hf_config)
    config = ppo_config if ppo_config is not None else seed_config
    source = f"--model-config {ppo_config_path}" if ppo_config is not None else "the seed's .hf_metadata/config.json"
    has_bias = f"{HEAD}.bias" in shapes
    want_bias = True if report.target in BIASED_TARGETS else has_bias
    expected = None
    if config is not None:
        expected, _ = expected_layout(config, "token", bias=want_bias)
    _check_head(report, shapes, want_bias, bias_area="bias" if report.target in BIASED_TARGETS else "head")
    _check_layout(report, shapes, expected, config, source)
    _facts(report, shapes, config, manifest)
    report.facts["head"]["bias"] = _read_scalar(files, f"{HEAD}.bias") if has_bias else None
    if finite:
        _check_finite(report, files, root)
    # The optimizer must match the weights as they are (a missing bias or another backbone is
    # reported above): its parameters are the seed's own, by its own config.
    own = seed_config if seed_config is not None else config
    own_params = expected_layout(own, "token", bias=has_bias)[1] if own is not None else _float_keys(shapes)
    _check_optimizer(report, p, own_params, {k: s for k, (s, _) in shapes.items()})
    report.facts["tokenizer"] = p.tokenizer_dir.is_dir()
    report.facts["tokenizer_fingerprint"] = ((manifest or {}).get("tokenizer")
                                             or (fingerprint_of(p.tokenizer_dir) if p.tokenizer_dir.is_dir() else None))


def _check_strays(report: SeedReport, weights_root: Path) -> None:
    """Files that switch NeMo-RL's loader to another format (docs/design.md, "NeMo-RL loads")."""
    distcp = sorted(weights_root.rglob("*.distcp"))
    if distcp:
        report.fail("weights", f"stray DCP file {distcp[0].relative_to(weights_root.parent.parent)} in value/weights: "
                               "NeMo-RL then reads the folder as a torch_dist checkpoint and fails; delete "
                               "the *.distcp files there")
    adapters = sorted(f for f in weights_root.rglob("*") if f.is_file() and "adapter" in f.name.lower())
    if adapters:
        report.fail("weights", f"{adapters[0].relative_to(weights_root.parent.parent)}: a file named '*adapter*' in "
                               "value/weights makes NeMo-RL load the seed as a PEFT adapter; rename or remove it")


def _check_manifest(report: SeedReport, root: Path) -> dict | None:
    manifest = fileio.read_json(root / ckpt.MANIFEST)
    if manifest is None:
        report.warn(f"no {ckpt.MANIFEST}: the reward transform, gamma and lambda this critic was trained with are "
                    "unknown; make sure the PPO run uses the reward scale it was trained on")
        return None
    problem = ckpt.verify(root, content=True)
    if problem:
        report.fail("manifest", f"{problem}: the folder is incomplete or was changed after it was saved; "
                                "copy it again from the run (or re-export it)")
    if manifest.get("format_version", 1) > ckpt.FORMAT_VERSION:
        report.warn(f"{ckpt.MANIFEST} has format_version {manifest['format_version']}, newer than this "
                    f"critic-pretrain reads ({ckpt.FORMAT_VERSION}); upgrade critic-pretrain")
    report.facts["targets"] = effective_targets(manifest)
    report.facts["rewards"] = (manifest.get("data") or {}).get("rewards")
    report.facts["model_name_or_path"] = (manifest.get("model") or {}).get("name_or_path")
    report.facts["target_std"] = _target_std(manifest)
    report.facts["exported"] = manifest.get("exported")
    return manifest


def _check_training_info(report: SeedReport, root: Path) -> None:
    path = ckpt.StepPaths(root).training_info
    if not path.is_file():
        report.fail("info", f"no training_info.json in {root}: NeMo-RL's checkpoint layout needs it; "
                            "copy the whole step_<n> folder or re-export it with critic-pretrain export --format nemo-rl")
        return
    info = fileio.read_json(path)
    if info is None:
        report.fail("info", f"{path} is not valid JSON; copy it again from the run")
        return
    report.facts["training_info"] = info
    _check_metrics(report, info, path)
    step = ckpt.step_number(root)
    if step is None:
        report.warn(f"{root.name} is not named step_<n>: the step in training_info.json "
                    f"({info.get('total_steps')}) cannot be checked against it")
    elif info.get("total_steps") != step:
        report.fail("info", f"training_info.json says total_steps={info.get('total_steps')} but the folder is "
                            f"step_{step}: it was renamed or mixed with another step's files; use the folder "
                            f"named after its step, or re-export it")


def effective_targets(manifest: dict) -> dict | None:
    """The manifest's targets with the reward transform taken relative to the raw reward: the
    archive's own scaling (``data.rewards.logged``, e.g. a NeMo-RL dump's) composed with the
    targets' transform. As recorded when the archive did not say."""
    targets = manifest.get("targets")
    logged = ((manifest.get("data") or {}).get("rewards") or {}).get("logged")
    return RewardsLogged.from_dict(logged).compose(targets) if targets and logged else targets


def _check_metrics(report: SeedReport, info: dict, path: Path) -> None:
    """A seed whose validation loss is NaN (null in JSON) was validated on nothing or diverged.
    Other metrics may be undefined for good reasons (an empty bucket, targets without variance)."""
    val = {k: v for k, v in info.items() if k.startswith("val:")}
    if "val:loss" in val and not (isinstance(val["val:loss"], (int, float)) and math.isfinite(val["val:loss"])):
        report.fail("metrics", f"{path}: val:loss is {val['val:loss']!r} (NaN): the critic was validated on no "
                               "policy token or its values are not finite; do not use this seed: check the training "
                               "log (data.max_tokens against the prompt lengths, a diverged loss) and retrain")


# ---------------------------------------------------------------------------------------------
# Weights

def _read_shapes(report: SeedReport, files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """key -> (shape, dtype) over every file, from the headers only (cheap)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    ok = True
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    if k in shapes:
                        report.fail("weights", f"{k} is in two weight files ({f.name} and another): the folder "
                                               "mixes two saves; keep one set of files")
                    sl = fh.get_slice(k)
                    shapes[k] = (tuple(sl.get_shape()), str(sl.get_dtype()))
        except Exception as e:  # safetensors raises its own error types for a bad header
            report.fail("weights", f"cannot read {f} ({first_line(e)}): the file is truncated or not safetensors; "
                                   "copy it again or use another step")
            ok = False
    return shapes if ok else None


def _read_config(report: SeedReport, path: Path):
    from transformers import AutoConfig

    if not path.is_file():
        report.warn(f"no {path}: key names and shapes cannot be checked without a model config; "
                    "pass --model-config")
        return None
    try:
        config = AutoConfig.from_pretrained(str(path.parent))
    except (OSError, ValueError, KeyError) as e:
        report.fail("keys", f"cannot read the seed's model config {path} ({first_line(e)}); copy it again from the run")
        return None
    config.num_labels = 1
    return config


def expected_layout(config, layout: str, *, bias: bool, head: str = HEAD,
                    ) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Key -> shape and trainable parameter names of the class a consumer builds.

    ``layout``: ``token`` (AutoModelForTokenClassification: NeMo-RL, verl), ``sequence``
    (AutoModelForSequenceClassification: TRL), ``openrlhf`` (AutoModel backbone under its
    ``base_model_prefix`` + a bias-free Linear named ``head``). Built on the meta device:
    no memory, no weights read.
    """
    import copy

    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    config = copy.deepcopy(config)
    config.num_labels = 1
    config.token_classification_bias = bias
    with torch.device("meta"):
        if layout == "token":
            model = AutoModelForTokenClassification.from_config(config)
        elif layout == "sequence":
            model = AutoModelForSequenceClassification.from_config(config)
        else:
            model = AutoModel.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    params = [n for n, p in model.named_parameters() if p.requires_grad]
    if layout == "openrlhf":
        prefix = model.base_model_prefix
        shapes = {f"{prefix}.{k}": v for k, v in shapes.items()}
        params = [f"{prefix}.{n}" for n in params]
        hidden = config.get_text_config().hidden_size
        shapes[f"{head}.weight"] = (1, hidden)
        params.append(f"{head}.weight")
    elif layout == "token" and bias and f"{HEAD}.bias" not in shapes:
        # transformers < 5 ignores token_classification_bias and always adds the bias anyway
        shapes[f"{HEAD}.bias"] = (1,)
    return shapes, params


def _check_head(report: SeedReport, shapes: dict, want_bias: bool, *, bias_area: str, head: str = HEAD) -> None:
    w = shapes.get(f"{head}.weight")
    if w is None:
        report.fail("head", f"no value head ({head}.weight) in the weights: this is a backbone or language-model "
                            "checkpoint, not a value model; train a critic with critic-pretrain train")
        return
    if len(w[0]) != 2 or w[0][0] != 1:
        report.fail("head", f"value head {head}.weight has shape {list(w[0])}, expected [1, hidden]: a value head has "
                            "one output (this looks like a classifier with several labels); train a critic with "
                            "critic-pretrain train")
    b = shapes.get(f"{head}.bias")
    if b is not None and b[0] != (1,):
        report.fail("head", f"value head {head}.bias has shape {list(b[0])}, expected [1]; train a critic with "
                            "critic-pretrain train")
    if want_bias and b is None:
        report.fail(bias_area, f"the value head has no bias (trained with model.head_bias=false) but {report.target} "
                               "builds AutoModelForTokenClassification(num_labels=1) with score.bias [1] and loads "
                               "strictly; export it with critic-pretrain export --format "
                               f"{'nemo-rl' if report.target == 'nemo-rl' else 'hf'} (adds a zero bias, values unchanged)")
    if not want_bias and b is not None and report.kind == "hf":
        report.fail("head", f"{head}.bias is in the weights but {report.target}'s value head is a bias-free Linear: "
                            "transformers drops it without an error and every value shifts by the bias; export with "
                            f"critic-pretrain export --format {report.target}")


def _check_layout(report: SeedReport, shapes: dict, expected: dict | None, config, source: str) -> None:
    """Architecture first (hidden, vocabulary, layers: one clear line each), then exact keys."""
    if expected is None:
        return
    text = config.get_text_config()
    arch_ok = True
    w = shapes.get(f"{HEAD}.weight") or shapes.get(_head_name(report) + ".weight")
    hidden = getattr(text, "hidden_size", None)
    if w and len(w[0]) == 2 and hidden is not None and w[0][1] != hidden:
        arch_ok = False
        report.fail("arch", f"hidden size {w[0][1]} in the seed (value head [1, {w[0][1]}]) but {source} has "
                            f"hidden_size={hidden}: the critic was trained on another backbone; point the PPO value "
                            "model (value.model_name) at the seed's backbone or retrain the critic on the PPO model")
    vocab = getattr(text, "vocab_size", None)
    emb = [k for k, v in expected.items() if len(v) == 2 and vocab is not None and v[0] == vocab and "embed" in k]
    if emb and emb[0] in shapes and shapes[emb[0]][0][0] != vocab:
        arch_ok = False
        report.fail("arch", f"vocabulary of {shapes[emb[0]][0][0]} tokens in the seed ({emb[0]}) but {source} has "
                            f"vocab_size={vocab}: the critic uses another tokenizer than the PPO model; train it "
                            "with the PPO model's tokenizer")
    layers = getattr(text, "num_hidden_layers", None)
    seed_layers = _num_layers(shapes)
    if layers is not None and seed_layers and seed_layers != layers:
        arch_ok = False
        report.fail("arch", f"{seed_layers} layers in the seed but {source} has num_hidden_layers={layers}: the "
                            "critic was trained on another backbone; use the seed's backbone as the PPO value model "
                            "or retrain the critic")
    if not arch_ok:
        return  # every tensor would differ: the lines above say why
    head_keys = {k for k in set(shapes) | set(expected) if k.split(".")[0] in (HEAD, _head_name(report))}
    missing = sorted(set(expected) - set(shapes) - head_keys)
    extra = sorted(set(shapes) - set(expected) - head_keys)
    wrong = sorted(k for k in set(shapes) & set(expected) if k not in head_keys and shapes[k][0] != expected[k])
    if missing:
        report.fail("keys", f"{len(missing)} tensor(s) missing (e.g. {missing[0]}): the strict load fails; the "
                            f"weights are incomplete or belong to another model than {source} describes")
    if extra:
        report.fail("keys", f"{len(extra)} unexpected tensor(s) (e.g. {extra[0]}): NeMo-RL and transformers ignore "
                            "extra keys silently, so these weights would not be used; check that the seed belongs to "
                            "this model, or re-export it with critic-pretrain export")
    if wrong:
        k = wrong[0]
        report.fail("keys", f"{len(wrong)} tensor(s) have other shapes than {source} expects (e.g. {k} "
                            f"{list(shapes[k][0])} vs {list(expected[k])}): the seed was trained on another "
                            "backbone; use that backbone's config or retrain")


def _head_name(report: SeedReport) -> str:
    return report.facts.get("value_head_prefix") or HEAD


def _num_layers(shapes: dict) -> int:
    idx = {int(m.group(1)) for k in shapes for m in [LAYER_RE.search(k)] if m}
    return max(idx) + 1 if idx else 0


def _float_keys(shapes: dict) -> list[str]:
    return [k for k, (_, dt) in shapes.items() if dt.startswith(("F", "BF"))]


def _facts(report: SeedReport, shapes: dict, config, manifest: dict | None) -> None:
    head = _head_name(report)
    w = shapes.get(f"{head}.weight")
    text = config.get_text_config() if config is not None else None
    report.facts.update({
        "parameters": sum(math.prod(s) for s, _ in shapes.values()),
        "tensors": len(shapes),
        "dtypes": sorted({DTYPE_NAMES.get(dt, dt) for _, dt in shapes.values()}),
        "arch": {"model_type": getattr(config, "model_type", None),
                 "hidden_size": w[0][1] if w and len(w[0]) == 2 else getattr(text, "hidden_size", None),
                 "num_layers": _num_layers(shapes) or getattr(text, "num_hidden_layers", None),
                 "vocab_size": getattr(text, "vocab_size", None)},
        "head": {"name": head, "weight_shape": list(w[0]) if w else None},
    })
    if manifest is not None:
        report.facts.setdefault("targets", manifest.get("targets"))


def _read_scalar(files: list[Path], key: str) -> float | None:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            if key in fh.keys():
                return float(fh.get_tensor(key).float().reshape(-1)[0])
    return None


def _check_finite(report: SeedReport, files: list[Path], root: Path) -> None:
    """Read every tensor once (one at a time: memory stays at the largest tensor)."""
    import torch
    from safetensors import safe_open

    bad: list[tuple[str, int, int]] = []
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                t = fh.get_tensor(k)
                if t.is_floating_point():
                    n = int((~torch.isfinite(t)).sum())
                    if n:
                        bad.append((k, n, t.numel()))
    if bad:
        k, n, total = bad[0]
        earlier = _earlier_step(root)
        hint = f", e.g. {earlier}" if earlier else ""
        report.fail("finite", f"{len(bad)} tensor(s) hold NaN/Inf (e.g. {k}: {n} of {total} values): NeMo-RL loads "
                              f"them silently and the first PPO step produces NaN; use an earlier checkpoint{hint} "
                              "and lower the learning rate")


def _earlier_step(root: Path) -> Path | None:
    n = ckpt.step_number(root)
    if n is None:
        return None
    logging.disable(logging.WARNING)
    try:
        found = ckpt.find_checkpoints(root.parent)
    finally:
        logging.disable(logging.NOTSET)
    earlier = [s for s in found if s < n]
    return found[max(earlier)] if earlier else None


# ---------------------------------------------------------------------------------------------
# Optimizer

def _check_optimizer(report: SeedReport, p: ckpt.StepPaths, params: list[str],
                     param_shapes: dict[str, tuple]) -> None:
    opt_root = p.optim_dir.parent
    report.facts["optimizer"] = None
    if not opt_root.exists():
        return
    drop = "drop it (critic-pretrain export STEP --format nemo-rl --drop-optimizer: NeMo-RL since PR #4213 " \
           "rebuilds it on a warm start anyway)"
    if not p.optim_dir.is_dir():
        report.fail("optimizer", f"value/optimizer exists but has no optim/ checkpoint: NeMo-RL before PR #4213 "
                                 f"tries to load it and fails; {drop}")
        return
    try:
        md = dcp_metadata(p.optim_dir)
        state = read_dcp(p.optim_dir, tensors=False)
    except Exception as e:  # DCP raises assorted errors for a broken folder
        report.fail("optimizer", f"value/optimizer/optim is not a readable torch.distributed.checkpoint "
                                 f"({first_line(e)}); {drop}")
        return
    if not {"optim", "sched"} <= state.keys():
        report.fail("optimizer", f"value/optimizer/optim holds {sorted(state)} instead of {{optim, sched}}: "
                                 f"NeMo-RL cannot load it; {drop}")
        return
    moments: dict[str, dict[str, tuple]] = {}
    for key, where in (md.planner_data or {}).items():
        if len(where) == 2 and where[0] == "optim" and where[1].startswith("state."):
            fqn, fieldname = where[1][len("state."):].rsplit(".", 1)
            moments.setdefault(fqn, {})[fieldname] = tuple(md.state_dict_metadata[key].size)
    groups: dict[str, dict[str, Any]] = {}
    for key, value in state["optim"].items():
        if key.startswith("param_groups."):
            fqn, hyper = key[len("param_groups."):].rsplit(".", 1)
            groups.setdefault(fqn, {})[hyper] = value
    covered = {f for f, m in moments.items() if {"exp_avg", "exp_avg_sq"} <= m.keys()}
    missing = [n for n in params if n not in covered]
    extra = sorted(covered - set(params))
    distinct = {tuple(sorted((k, repr(v)) for k, v in g.items())) for g in groups.values()}
    differing = sorted({k for g in groups.values() for k, v in g.items()
                        if len({repr(h.get(k)) for h in groups.values()}) > 1})
    no_initial = [f for f, g in groups.items() if "initial_lr" not in g]
    sched_cls = scheduler_class(state["sched"])
    lrs = sorted({g.get("lr") for g in groups.values() if isinstance(g.get("lr"), float)})
    sched = state["sched"]
    base = sched.get("base_lrs") or next((s.get("base_lrs") for s in sched.get("_schedulers", [])
                                          if isinstance(s, dict)), None)
    report.facts["optimizer"] = {"kind": "AdamW" if covered else "unknown", "parameters": len(covered),
                                 "base_lr": base[0] if base else None,
                                 "param_groups": len(distinct), "initial_lr": not no_initial,
                                 "lr": lrs[0] if len(lrs) == 1 else lrs, "scheduler": sched_cls,
                                 "last_epoch": state["sched"].get("last_epoch")}
    if missing:
        report.fail("optimizer", f"the optimizer state lacks {len(missing)} trainable parameter(s) "
                                 f"(e.g. {missing[0]}): NeMo-RL before PR #4213 fails to load it; {drop}")
    if extra:
        report.fail("optimizer", f"the optimizer state has {len(extra)} parameter(s) the model lacks "
                                 f"(e.g. {extra[0]}): it belongs to another model; {drop}")
    wrong = [f for f in sorted(covered & set(params))
             if f in param_shapes and moments[f]["exp_avg"] != tuple(param_shapes[f])]
    if wrong:
        report.fail("optimizer", f"the optimizer state of {wrong[0]} has shape {list(moments[wrong[0]]['exp_avg'])} "
                                 f"but the parameter is {list(param_shapes[wrong[0]])}: it belongs to another model; "
                                 f"{drop}")
    if len(distinct) > 1:
        report.fail("optimizer", f"the optimizer state has {len(distinct)} parameter groups (they differ in "
                                 f"{', '.join(differing)}): NeMo-RL builds one AdamW group, loads this with the wrong "
                                 f"hyperparameters and its scheduler crashes on the first step; {drop}")
    if no_initial:
        report.fail("optimizer", f"no initial_lr in the optimizer state (saved without an LR scheduler): NeMo-RL's "
                                 f"scheduler cannot resume from it; {drop}")
    if report.target == "nemo-rl" and report.facts.get("legacy_nemo_rl"):
        report.warn(f"the optimizer state carries lr {report.facts['optimizer']['lr']} (scheduler base lr "
                    f"{report.facts['optimizer']['base_lr']}): an older NeMo-RL that loads it continues from these, "
                    "not from value.optimizer.kwargs.lr; re-export with --lr LR to set it, or --drop-optimizer")
    if report.target == "nemo-rl" and report.facts.get("legacy_nemo_rl") and sched_cls == "LambdaLR":
        report.warn("the optimizer's scheduler state is LambdaLR: NeMo-RL since PR #4213 ignores it; an older NeMo-RL "
                    "loads it only when value.scheduler is unset. With value.scheduler set (the PPO example: "
                    "ConstantLR + milestones: []) re-export with --scheduler sequential, or --drop-optimizer")


# ---------------------------------------------------------------------------------------------
# An exported Hugging Face folder (verl, OpenRLHF, TRL)

def _check_hf_folder(report: SeedReport, root: Path, ppo_config, ppo_config_path, finite: bool) -> None:
    from transformers import AutoConfig

    if report.target == "nemo-rl":
        report.fail("path", f"{root} is a Hugging Face folder, not a step_<n> seed: NeMo-RL's warm start needs "
                            "<step>/value/weights; export one with critic-pretrain export STEP --format nemo-rl")
        return
    cfg_json = fileio.read_json(root / "config.json") or {}
    try:
        config = AutoConfig.from_pretrained(str(root))
    except (OSError, ValueError, KeyError) as e:
        report.fail("keys", f"cannot read {root / 'config.json'} ({first_line(e)}); re-export the folder")
        return
    if cfg_json.get("num_labels", len(cfg_json.get("id2label", {})) or 2) != 1:
        report.fail("head", "config.json does not say num_labels: 1 (readers default to 2 labels and build the wrong "
                            "head); re-export with critic-pretrain export")
    if report.target == "verl" and cfg_json.get("classifier_dropout") not in (0, 0.0):
        report.warn("config.json has no classifier_dropout: 0.0 (verl sets it itself; other readers put dropout 0.1 "
                    "in front of the head)")
    layout, head = {"verl": ("token", HEAD), "trl": ("sequence", HEAD),
                    "openrlhf": ("openrlhf", cfg_json.get("value_head_prefix", HEAD))}[report.target]
    if report.target == "openrlhf":
        report.facts["value_head_prefix"] = head
        if "value_head_prefix" not in cfg_json:
            report.warn("config.json has no value_head_prefix: OpenRLHF then uses its --value_head_prefix flag "
                        "(default 'score' in recent versions, 'value_head' in old ones); re-export to pin it")
        report.facts["normalization"] = {"mean": cfg_json.get("mean"), "std": cfg_json.get("std")}
    files = sorted(root.glob("*.safetensors"))
    shapes = _read_shapes(report, files)
    if shapes is None:
        return
    want_bias = report.target in BIASED_TARGETS
    config = ppo_config if ppo_config is not None else config
    source = f"--model-config {ppo_config_path}" if ppo_config is not None else f"{root / 'config.json'}"
    expected, _ = expected_layout(config, layout, bias=want_bias, head=head)
    _check_head(report, shapes, want_bias, bias_area="bias", head=head)
    _check_layout(report, shapes, expected, config, source)
    manifest = fileio.read_json(root / EXPORT_MANIFEST)
    if manifest:
        report.facts["step"] = manifest.get("step")
        report.facts["targets"] = effective_targets(manifest)
        report.facts["rewards"] = (manifest.get("data") or {}).get("rewards")
        report.facts["exported"] = manifest.get("exported")
        report.facts["target_std"] = _target_std(manifest)
    _facts(report, shapes, config, manifest)
    report.facts["head"]["bias"] = _read_scalar(files, f"{head}.bias") if f"{head}.bias" in shapes else None
    report.facts["head"]["dropped_bias"] = cfg_json.get("critic_pretrain_head_bias")
    if finite:
        _check_finite(report, files, root)
    report.facts["tokenizer"] = any((root / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json"))


# ---------------------------------------------------------------------------------------------
# CLI

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="critic-pretrain seed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="check a seed before a PPO run loads it",
                           description="Check that a critic seed loads correctly into the PPO framework (keys, "
                                       "shapes, head, finite weights, optimizer, training info) and print the config "
                                       "lines to paste; optionally score it on the current policy's rollouts.")
    check.add_argument("path", help="the step_<n> folder (or, with --for verl|openrlhf|trl, an exported folder)")
    check.add_argument("--for", dest="target", choices=TARGETS, default="nemo-rl",
                       help="the framework that will load it (default: nemo-rl)")
    check.add_argument("--model-config", help="the PPO model's folder or config.json: its hidden size, vocabulary "
                                              "and layers must match the seed")
    check.add_argument("--rollouts", nargs="+", metavar="PATH",
                       help="fresh rollouts of the PPO run's current policy: fail when the critic is no better there "
                            "than the group-mean baseline (with oracle_values: its lambda-0.95 advantage correlation "
                            "at turn-first tokens against the group mean held as the value; otherwise: its explained "
                            "variance against the leave-one-out group mean's)")
    check.add_argument("--ppo-config", metavar="FILE",
                       help="the PPO run's config: a NeMo-RL or verl YAML, verl key=value overrides, or an OpenRLHF "
                            "command line in a file; fails on a gamma or reward-scale mismatch, warns on lambda, "
                            "reward shaping/normalisation and context length, checks its critic model's architecture")
    check.add_argument("--legacy-nemo-rl", action="store_true",
                       help="also check what NeMo-RL before PR #4213 does with the optimizer state (its lr and "
                            "scheduler class); the current NeMo-RL warm-starts from the weights only")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = check_seed(args.path, args.target, args.model_config, rollouts=args.rollouts,
                        legacy_nemo_rl=args.legacy_nemo_rl, ppo_config=args.ppo_config)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return 0 if report.ok else 1
    return print_report(report)


def print_report(report: SeedReport) -> int:
    """Print a seed check the way the CLI does (problems and warnings to stderr, then the
    summary and the config lines to paste); 0 when the seed is usable, else 1."""
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not report.ok:
        print(report.summary(), file=sys.stderr)
        return 1
    print(report.summary())
    if report.kind == "step" and report.target != "nemo-rl":
        print(f"\n# next: critic-pretrain export {report.path} --format "
              f"{FRAMEWORKS[report.target].export_format} --out <dir>, then check <dir> with --for {report.target}")
        return 0
    opt = report.facts.get("optimizer")
    sched = None if not opt else ("sequential" if opt["scheduler"].startswith("SequentialLR") else "lambda")
    print()
    print("\n".join(config_lines(report.target, report.path, report.facts, scheduler=sched)))
    return 0


if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["seed", *sys.argv[1:]]))
