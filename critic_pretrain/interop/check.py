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
Exported Hugging Face folders (``critic-pretrain export --format hf|openrlhf|trl|roll|skyrl``)
are checked too when ``--for verl|openrlhf|trl|roll|skyrl`` is given.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from pathlib import Path

from rollouts import fileio
from rollouts.tokenizer import differences, fingerprint_of

from .. import checkpoint as ckpt
from .. import preflight
from ..errors import UserError, first_line
from .frameworks import BIASED_TARGETS, FORMAT_ALIASES, FORMATS, FRAMEWORKS, HEAD, TARGETS, framework_of_format
from .seed_report import SeedReport, left_out_note
from .seed_weights import (
    add_weight_facts,
    check_finite,
    check_head,
    check_layout,
    check_optimizer,
    expected_layout,
    float_keys,
    read_hf_config,
    read_scalar,
    read_shapes,
)

log = logging.getLogger(__name__)

TMP_STEP_RE = re.compile(r"^tmp_step_(\d+)$")


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


def oracle_rule(ev: dict) -> dict | None:
    """With exact values in an eval JSON: the critic's and the group-mean control's GAE(``QUALITY_LAM``)
    advantage correlations with the true advantages at turn-first tokens, how many tokens, and
    whether the critic beats the control (``beats_with_oracle``); None without exact values."""
    from ..eval.verdict import beats_with_oracle
    m, tag = ev["metrics"], f"lam{QUALITY_LAM:g}"
    if f"eval/adv_corr_first_{tag}" not in m or f"eval/adv_corr_first_{tag}_group_mean" not in m:
        return None
    critic, control = m[f"eval/adv_corr_first_{tag}"], m[f"eval/adv_corr_first_{tag}_group_mean"]
    n = next((r["n"] for r in ev.get("advantages", []) if r["estimator"] == "critic" and r["lam"] == QUALITY_LAM
              and r["tokens"] == "first"), None)
    return {"critic": critic, "group_mean": control, "tokens": n, "beats": beats_with_oracle(critic, control, n)}


def _synthetic_ok(step_dir: Path) -> bool:
    """Whether the checkpoint was trained with ``data.synthetic_on_pretrained`` (its config.yaml)."""
    from ..config_io import load_config
    try:
        return load_config(ckpt.StepPaths(step_dir).config_yaml).data.synthetic_on_pretrained
    except UserError:
        return False


def check_quality(report: SeedReport, step_dir: Path, rollouts: list[str]) -> None:
    """Will the critic help PPO on the current policy's rollouts? (``eval.verdict``)

    The rollouts are split by prompt: fresh responses to prompts the critic trained on (PPO's
    regime, which decides) and prompts it never saw; rollouts it trained on are left out. Each
    regime gets a verdict with bootstrap intervals (helps / no better than the group mean /
    harmful); the seed passes when PPO's regime (else the other) says **helps**. With oracle
    values the truth decides instead: its GAE advantages (lambda ``QUALITY_LAM``) must correlate
    better with the true advantages at turn-first tokens than the group-mean-as-value control.
    A stale critic (trained on an older policy) that fails gives PPO nothing a group baseline
    does not give for free, or worse."""
    from ..eval.from_checkpoint import evaluate_checkpoint

    try:  # evaluate_checkpoint refuses them too; here it is a failed check, not an aborted one
        preflight.check_rollouts_tokenizer(rollouts, getattr(ckpt.Manifest.read(step_dir), "tokenizer", None),
                                           "check the seed on rollouts of its own tokenizer, or retrain it with "
                                           "the policy's tokenizer", synthetic_ok=_synthetic_ok(step_dir))
    except UserError as e:
        report.fail("quality", str(e))
        report.facts["quality"] = {"rollouts": list(rollouts), "passed": False}
        return
    ev = evaluate_checkpoint(step_dir, rollouts, cold_every=0, leave_out_trained=True)
    m = ev["metrics"]
    judged = [r for r in ev.get("regimes") or [] if r["rows"]]
    verdicts = [r["verdict"] for r in judged]
    q = {"rollouts": list(rollouts), "rows": ev["data"]["rows"],
         "trained_on_left_out": ev["data"]["trained_on_left_out"],
         "explained_variance": m.get("eval/explained_variance"), "ev_group_mean": m.get("eval/ev_group_mean"),
         "verdicts": [v["line"] for v in verdicts]}
    where = f"on {q['rows']:,} rollouts of {', '.join(rollouts)}{left_out_note(q).replace(';', ',')}"
    # PPO's regime (fresh responses to trained prompts) decides when it has a call; else new prompts
    ranked = sorted(judged, key=lambda r: r["regime"] != "response")
    decisive = next((r["verdict"] for r in ranked if r["verdict"]["call"] != "unknown"), None)
    oracle = oracle_rule(ev)
    if oracle is not None:
        critic, control = oracle["critic"], oracle["group_mean"]
        q.update(measure=f"advantage correlation at turn-first tokens, lambda {QUALITY_LAM:g}", critic=critic,
                 baseline=control, grpo=m.get("eval/adv_corr_first_grpo"), td0=m.get("eval/adv_corr_first_lam0"))
        q.update(ceiling=m.get("eval/ev_oracle_values"), tokens=oracle["tokens"])
        if not oracle["beats"]:
            report.fail("quality", f"{where}: the critic's advantages (lambda {QUALITY_LAM:g}) correlate {critic:.3f} "
                        f"with the true ones at turn-first tokens, no better than the group mean return as a constant "
                        f"value ({control:.3f}, by more than two standard errors over {q['tokens']} tokens; GRPO "
                        f"{q['grpo']:.3f}): the critic is stale for this policy or under-trained; retrain with its "
                        "rollouts in the data or start PPO without it")
    elif decisive is not None:
        q.update(measure=f"verdict on {decisive['regime']}", call=decisive["call"],
                 critic=decisive["ev_vs_group_mean"]["est"], baseline=0.0)
        if decisive["call"] != "helps":
            report.fail("quality", f"{where}, {decisive['line'].replace('**', '')}")
    else:
        report.warn(f"{where}: too few prompts with two or more responses to judge the critic against a group "
                    f"baseline (its explained variance: {q['explained_variance']:.3f}); pass more rollouts with "
                    "group_id")
    q["passed"] = not any(p.area == "quality" for p in report.problems) if "critic" in q else None
    report.facts["quality"] = q


def load_model_config(spec: str | Path):
    """The PPO model's HF config (``--model-config``: a model folder or a config.json), num_labels=1."""
    from transformers import AutoConfig

    p = Path(spec)
    if not p.exists():
        raise UserError(f"--model-config {spec}: no such file or folder; "
                        "pass the PPO model's folder or its config.json")
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
        hint = ckpt.missing_path_hint(p)
        report.fail("path", f"{p} does not exist{f' ({hint})' if hint else ''}; pass an existing step_<n> folder")
        return None
    if not p.is_dir():
        report.fail("path", f"{p} is a file, not a folder; pass the step_<n> folder that contains value/weights")
        return None
    m = TMP_STEP_RE.match(p.name)
    if m:
        newest = ckpt.newest_checkpoint(p.parent)
        hint = f"use the newest complete checkpoint {newest}" if newest else "no complete step_<n> exists beside it yet"
        report.fail("path", f"{p} is an unfinished save (tmp_step_{m.group(1)}: the run crashed or is still "
                            f"writing it); {hint}, or wait for the save to finish")
        return None
    if ckpt.StepPaths(p).value_dir.is_dir():
        report.kind = "step"
        return p
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        report.kind = "hf"
        return p
    run_folder = ckpt.run_folder_problem(p)
    if run_folder:
        report.fail("path", f"{p} {run_folder}")
        return None
    report.fail("path", f"{p} has no value/weights: it is not a critic seed; pass a step_<n> folder written by "
                        "critic-pretrain train or critic-pretrain export --format nemo-rl")
    return None


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
    shapes = read_shapes(report, files)
    if shapes is None:
        return
    seed_config = read_hf_config(report, p.hf_config)
    config = ppo_config if ppo_config is not None else seed_config
    source = f"--model-config {ppo_config_path}" if ppo_config is not None else "the seed's .hf_metadata/config.json"
    has_bias = f"{HEAD}.bias" in shapes
    want_bias = True if report.target in BIASED_TARGETS else has_bias
    expected = None
    if config is not None:
        expected, _ = expected_layout(config, "token", bias=want_bias)
    check_head(report, shapes, want_bias, bias_area="bias" if report.target in BIASED_TARGETS else "head")
    check_layout(report, shapes, expected, config, source)
    add_weight_facts(report, shapes, config, manifest)
    report.facts["head"]["bias"] = read_scalar(files, f"{HEAD}.bias") if has_bias else None
    if finite:
        check_finite(report, files, root)
    # The optimizer must match the weights as they are (a missing bias or another backbone is
    # reported above): its parameters are the seed's own, by its own config.
    own = seed_config if seed_config is not None else config
    own_params = expected_layout(own, "token", bias=has_bias)[1] if own is not None else float_keys(shapes)
    check_optimizer(report, p, own_params, {k: s for k, (s, _) in shapes.items()})
    report.facts["tokenizer"] = p.tokenizer_dir.is_dir()
    report.facts["tokenizer_fingerprint"] = ((manifest.tokenizer if manifest else None)
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


def _check_manifest(report: SeedReport, root: Path) -> ckpt.Manifest | None:
    manifest = ckpt.Manifest.read(root)
    if manifest is None:
        if "targets" in (ckpt.StepPaths(root).read_config() or {}):  # critic-pretrain wrote it: a file is missing
            report.fail("manifest", f"no {ckpt.MANIFEST} in {root}, though its config.yaml says critic-pretrain wrote "
                                    "it: the copy is incomplete or the file was removed, so neither its integrity nor "
                                    "the settings it was trained with can be verified; copy the whole step_<n> folder "
                                    "again from the run")
            return None
        report.warn(f"no {ckpt.MANIFEST}: not a critic-pretrain step, so its integrity is not verified and the reward "
                    "transform, gamma and lambda this critic was trained with are unknown; make sure the PPO run uses "
                    "the ones it was trained on")
        return None
    problem = ckpt.verify(root, content=True)
    if problem:
        report.fail("manifest", f"{problem}: the folder is incomplete or was changed after it was saved; "
                                "copy it again from the run (or re-export it)")
    if manifest.format_version > ckpt.FORMAT_VERSION:
        report.warn(f"{ckpt.MANIFEST} has format_version {manifest.format_version}, newer than this "
                    f"critic-pretrain reads ({ckpt.FORMAT_VERSION}); upgrade critic-pretrain")
    _add_manifest_facts(report, manifest)
    report.facts["model_name_or_path"] = manifest.model_name_or_path
    return manifest


def _add_manifest_facts(report: SeedReport, manifest: ckpt.Manifest) -> None:
    report.facts["targets"] = manifest.effective_targets
    report.facts["rewards"] = manifest.rewards
    report.facts["target_std"] = manifest.target_std
    report.facts["exported"] = manifest.exported


def _check_training_info(report: SeedReport, root: Path) -> None:
    path = ckpt.StepPaths(root).training_info
    if not path.is_file():
        report.fail("info", f"no training_info.json in {root}: NeMo-RL's checkpoint layout needs it; "
                            "copy the whole step_<n> folder or re-export it with critic-pretrain export "
                            "--format nemo-rl")
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


def _check_metrics(report: SeedReport, info: dict, path: Path) -> None:
    """A seed whose validation loss is NaN (null in JSON) was validated on nothing or diverged.
    Other metrics may be undefined for good reasons (an empty bucket, targets without variance)."""
    val = {k: v for k, v in info.items() if k.startswith("val:")}
    if "val:loss" in val and not (isinstance(val["val:loss"], (int, float)) and math.isfinite(val["val:loss"])):
        report.fail("metrics", f"{path}: val:loss is {val['val:loss']!r} (NaN): the critic was validated on no "
                               "policy token or its values are not finite; do not use this seed: check the training "
                               "log (data.max_tokens against the prompt lengths, a diverged loss) and retrain")


# ---------------------------------------------------------------------------------------------
# An exported Hugging Face folder (verl, OpenRLHF, TRL, ROLL, SkyRL)

def _check_hf_folder(report: SeedReport, root: Path, ppo_config, ppo_config_path, finite: bool) -> None:
    from transformers import AutoConfig

    if report.target == "nemo-rl":
        report.fail("path", f"{root} is a Hugging Face folder, not a step_<n> seed: NeMo-RL's warm start needs "
                            "<step>/value/weights; export one with critic-pretrain export STEP --format nemo-rl")
        return
    if _other_export(report, root):
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
                    "openrlhf": ("backbone", cfg_json.get("value_head_prefix", HEAD)),
                    "roll": ("backbone", FRAMEWORKS["roll"].head),
                    "skyrl": ("backbone", FRAMEWORKS["skyrl"].head)}[report.target]
    if layout == "backbone":
        report.facts["value_head_prefix"] = head
    if report.target == "openrlhf":
        if "value_head_prefix" not in cfg_json:
            report.warn("config.json has no value_head_prefix: OpenRLHF then uses its --value_head_prefix flag "
                        "(default 'score' in recent versions, 'value_head' in old ones); re-export to pin it")
        report.facts["normalization"] = {"mean": cfg_json.get("mean"), "std": cfg_json.get("std")}
    if report.target == "roll":
        _check_roll_folder(report, root, cfg_json)
    files = sorted(root.glob("*.safetensors"))
    shapes = read_shapes(report, files)
    if shapes is None:
        return
    want_bias = report.target in BIASED_TARGETS
    config = ppo_config if ppo_config is not None else config
    source = f"--model-config {ppo_config_path}" if ppo_config is not None else f"{root / 'config.json'}"
    expected, _ = expected_layout(config, layout, bias=want_bias, head=head)
    check_head(report, shapes, want_bias, bias_area="bias", head=head)
    check_layout(report, shapes, expected, config, source)
    manifest = ckpt.Manifest.read(root)  # exported HF folders carry a copy of our manifest
    if manifest:
        report.facts["step"] = manifest.step
        _add_manifest_facts(report, manifest)
    add_weight_facts(report, shapes, config, manifest)
    report.facts["head"]["bias"] = read_scalar(files, f"{head}.bias") if f"{head}.bias" in shapes else None
    report.facts["head"]["dropped_bias"] = cfg_json.get("critic_pretrain_head_bias")
    if finite:
        check_finite(report, files, root)
    report.facts["tokenizer"] = any((root / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json"))


def _other_export(report: SeedReport, root: Path) -> bool:
    """An export for another framework (its manifest's ``exported.format``): one line naming both
    and the export to run, instead of the head and key errors its other layout would give."""
    manifest = ckpt.Manifest.read(root)
    fmt = (manifest.exported or {}).get("format") if manifest else None
    fmt, want = FORMAT_ALIASES.get(fmt, fmt), FRAMEWORKS[report.target].export_format
    if fmt == want or fmt not in FORMATS:
        return False
    src = (manifest.exported or {}).get("from") or "STEP"
    name = framework_of_format(fmt).name
    report.fail("path", f"{root} was exported with --format {fmt}{f' (for {name})' if name != fmt else ''}, not "
                        f"for {report.target}, whose layout differs; run critic-pretrain export {src} --format {want} "
                        f"--out <dir> and check <dir> with --for {report.target}")
    return True


def _check_roll_folder(report: SeedReport, root: Path, cfg_json: dict) -> None:
    """ROLL's trl critic: LLaMA-Factory's sidecar holds the head, TRL's ValueHead reads the dropout."""
    if not (root / "value_head.safetensors").is_file():
        report.fail("head", f"no value_head.safetensors in {root}: ROLL's trl critic reads the value head from that "
                            "file (load_valuehead_params) and keeps a random head without it; re-export with "
                            "critic-pretrain export --format roll")
    if cfg_json.get("summary_dropout_prob") not in (0, 0.0):
        report.warn("config.json has no summary_dropout_prob: 0.0, so TRL's ValueHead puts dropout 0.1 in front of "
                    "the head while ROLL trains the critic; re-export with critic-pretrain export --format roll")


# ---------------------------------------------------------------------------------------------
# CLI


if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["seed", *sys.argv[1:]]))
