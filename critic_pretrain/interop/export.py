"""Export a critic checkpoint for NeMo-RL, verl, OpenRLHF, TRL, ROLL or SkyRL: ``critic-pretrain export``.

    critic-pretrain export runs/x/step_370 --format nemo-rl --out seeds/x [--drop-optimizer]
    critic-pretrain export runs/x/step_370 --format hf --out seeds/x-hf          # verl
    critic-pretrain export runs/x/step_370 --format openrlhf --out seeds/x-orlhf
    critic-pretrain export runs/x/step_370 --format trl --out seeds/x-trl
    critic-pretrain export runs/x/step_370 --format roll --out seeds/x-roll
    critic-pretrain export runs/x/step_370 --format skyrl --out seeds/x-skyrl

Formats (docs/export.md has what each consumer's source does with them):

- ``nemo-rl``: ``DIR/step_<n>``, a self-contained copy of the checkpoint (files hard-linked
  where possible; written under a temporary name and renamed). Options: drop the optimizer
  (NeMo-RL since PR #4213 rebuilds it on a warm
  start), cast the weights (``--dtype bfloat16``), add a tokenizer, and for older NeMo-RL
  that loads the optimizer, rewrite the scheduler state as ``SequentialLR([ConstantLR])``
  (the PPO example config) and/or set the learning rate the state carries.
- ``hf``: a ``*ForTokenClassification`` folder (verl's ``critic.model.path``).
- ``openrlhf``: AutoModel backbone + bias-free ``score`` head, ``value_head_prefix`` in
  config.json; a head bias is folded into config.json as ``mean = -bias, std = 1``.
- ``trl``: an ``AutoModelForSequenceClassification`` folder (bias-free ``score``).
- ``roll``: a ``*ForCausalLM`` backbone folder + LLaMA-Factory's ``value_head.safetensors``
  sidecar (``v_head.summary.weight``/``bias``), what ROLL's ``trl`` critic loads.
- ``skyrl``: AutoModel backbone + bias-free ``value_head`` (SkyRL's default
  ``value_head_prefix``).

The value alignment is the same in every framework (value[t] = head(hidden[t-1])), so
export never changes weights other than the head's bias handling and an optional cast.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
from pathlib import Path

import torch

from rollouts import fileio

from .. import checkpoint as ckpt
from ..checkpoint.safe_dcp import read_dcp, scheduler_class, single_process_ok
from ..errors import UserError
from .check import SeedReport, check_seed
from .export_files import (
    HF_WEIGHTS,
    ExportResult,
    add_tokenizer,
    dtype_name,
    load_state,
    place,
    prepare_state,
    rel,
    reprefix,
    save_state,
    write_export_manifest,
)
from .export_heads import export_roll, export_skyrl
from .frameworks import (
    CONSTANT_TOTAL_ITERS,
    FORMAT_ALIASES,
    FORMATS,
    HEAD,
    config_lines,
    framework_of_format,
    trl_bias_snippet,
)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
SCHEDULERS = ("lambda", "sequential")


# ---------------------------------------------------------------------------------------------
# Entry point

def export(step_dir: str | os.PathLike, fmt: str, out: str | os.PathLike, *, dtype: str | None = None,
           drop_optimizer: bool = False, tokenizer: str | None = None, scheduler: str = "lambda",
           lr: float | None = None, total_iters: int = CONSTANT_TOTAL_ITERS, link: bool = True,
           overwrite: bool = False) -> ExportResult:
    """Export ``step_dir`` (a ``step_<n>`` checkpoint) as ``fmt`` into ``out``.

    ``nemo-rl`` writes ``out/step_<n>``; the other formats write ``out`` itself. The source
    is seed-checked first (problems the export repairs are let through). ``scheduler``,
    ``lr``, ``drop_optimizer`` and ``link`` apply to ``nemo-rl`` only.
    """
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}; use one of: {', '.join(FORMATS)} (verl = hf)")
    cast = _dtype(dtype)
    _check_options(fmt, scheduler, lr, drop_optimizer)
    report = _checked_source(step_dir, fmt, drop_optimizer)
    src = report.path
    step = ckpt.step_number(src)
    if step is None:
        raise UserError(f"{src}: export reads a step_<n> folder; rename it to step_<n> (the step it holds)")
    final = Path(out) / f"step_{step}" if fmt == "nemo-rl" else Path(out)
    _check_out(src, final, overwrite)
    # A hidden name: never a run's own tmp_step_<n>, and find_checkpoints ignores it.
    tmp = final.parent / f".{final.name}.export-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"--out {final}: cannot create it ({e.strerror or e}); pass a writable folder") from None
    try:
        if fmt == "nemo-rl":
            result = _export_nemo_rl(report, tmp, cast=cast, drop_optimizer=drop_optimizer, tokenizer=tokenizer,
                                     scheduler=scheduler, lr=lr, total_iters=total_iters, link=link)
        elif fmt == "roll":
            result = export_roll(report, tmp, cast=cast, tokenizer=tokenizer)
        elif fmt == "skyrl":
            result = export_skyrl(report, tmp, cast=cast, tokenizer=tokenizer)
        else:
            result = _export_hf(report, fmt, tmp, cast=cast, tokenizer=tokenizer)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.out = final
    result.notes += [f"source: {w}" for w in report.warnings]  # e.g. not a critic-pretrain step: unverified
    _self_check(final, fmt)
    facts = {**report.facts, "normalization": result.normalization}
    sched = None if fmt != "nemo-rl" or not ckpt.StepPaths(final).optimizer_dir.exists() else scheduler
    result.config_lines = config_lines(framework_of_format(fmt).name, final, facts, scheduler=sched,
                                       total_iters=total_iters)
    if fmt == "trl" and result.head_bias:
        result.config_lines += trl_bias_snippet()
    return result


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise UserError(f"--dtype {name}: use one of float32, bfloat16, float16")
    return DTYPES[name]


def _check_options(fmt: str, scheduler: str, lr: float | None, drop_optimizer: bool) -> None:
    if scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler {scheduler}: use lambda (NeMo-RL without value.scheduler) or sequential "
                        "(value.scheduler set, as in the PPO example config)")
    rewrites = scheduler != "lambda" or lr is not None
    if fmt != "nemo-rl" and (rewrites or drop_optimizer):
        raise UserError(f"--scheduler/--lr/--drop-optimizer apply to --format nemo-rl only: the {fmt} format "
                        "carries no optimizer state")
    if drop_optimizer and rewrites:
        raise UserError("--drop-optimizer removes the optimizer state, so --scheduler sequential / --lr have nothing "
                        "to rewrite; pass one or the other")
    if lr is not None and not (lr > 0 and math.isfinite(lr)):
        raise UserError(f"--lr {lr}: must be a positive learning rate, e.g. the PPO config's value.optimizer.kwargs.lr")


def _checked_source(step_dir, fmt: str, drop_optimizer: bool) -> SeedReport:
    """Seed-check the source; raise on any problem this export does not repair."""
    report = check_seed(step_dir, framework_of_format(fmt).name)
    if report.kind == "hf" and not report.problems:
        raise UserError(f"{report.path} is already an exported Hugging Face folder; export reads the step_<n> "
                        "checkpoint it came from")
    repaired = framework_of_format(fmt).export_repairs | ({"optimizer"} if drop_optimizer else set())
    if report.kind == "hf":
        repaired = set()
    blocking = [p for p in report.problems if p.area not in repaired]
    if blocking:
        more = (f" (and {len(blocking) - 1} more: run critic-pretrain seed check {report.path})"
                if len(blocking) > 1 else "")
        raise UserError(f"cannot export {report.path}: {blocking[0]}{more}")
    return report


def _check_out(src: Path, final: Path, overwrite: bool) -> None:
    src_r, final_r = src.resolve(), final.resolve()
    if final_r == src_r or src_r in final_r.parents:
        raise UserError(f"--out {final} is inside the source checkpoint {src}; pass a folder outside it")
    for d in (final, *final.parents):
        if d.exists() and not d.is_dir():
            raise UserError(f"--out {final}: {d} is a file, not a folder; pass a folder path for the export")
    if final.exists() and any(final.iterdir()):
        if not overwrite:
            raise UserError(f"{final} already exists and is not empty; pass another --out or --overwrite")
        if not _is_export(final):
            raise UserError(f"--overwrite {final}: this folder holds files critic-pretrain export did not write "
                            "(no export manifest); --overwrite only replaces a previous export: pass another --out")


def _is_export(folder: Path) -> bool:
    """A folder a previous ``export`` wrote: its manifest says so."""
    return getattr(ckpt.Manifest.read(folder), "exported", None) is not None  # None: missing or unreadable


def _publish(tmp: Path, final: Path) -> None:
    """Atomic rename; an existing export is swapped out, never deleted first."""
    fileio.replace_dir(tmp, final)


def _self_check(final: Path, fmt: str) -> None:
    """The export must pass the consumer's seed check (structure only: the source's tensors
    were already scanned for NaN/Inf)."""
    report = check_seed(final, framework_of_format(fmt).name, finite=False)
    if not report.ok:
        raise RuntimeError(f"bug: the {fmt} export at {final} fails its own seed check: {report.problems[0]}")


# ---------------------------------------------------------------------------------------------
# nemo-rl: a step_<n> tree

def _export_nemo_rl(report: SeedReport, tmp: Path, *, cast, drop_optimizer: bool, tokenizer: str | None,
                    scheduler: str, lr: float | None, total_iters: int, link: bool) -> ExportResult:
    src, dst = ckpt.StepPaths(report.path), ckpt.StepPaths(tmp)
    bias = report.facts["head"]["bias"]
    add_bias = bias is None
    result = ExportResult("nemo-rl", src.root, tmp, bias, _bias_note("nemo-rl", bias, report.facts.get("target_std")))
    files = sorted(src.weights_dir.glob("*.safetensors"))
    dst.weights_dir.mkdir(parents=True)
    if cast is None and not add_bias:
        for f in files:
            result.files[rel(dst.weights_dir / f.name, tmp)] = place(f, dst.weights_dir / f.name, link)
    else:
        state = prepare_state(load_state(files), cast, add_bias=add_bias)
        save_state(state, dst.weights)
        result.files[rel(dst.weights, tmp)] = "written"
    if cast is None and not add_bias:
        result.files[rel(dst.hf_config, tmp)] = place(src.hf_config, dst.hf_config, link)
    else:
        _write_hf_metadata(src.hf_config, dst.hf_config, cast, add_bias)
        result.files[rel(dst.hf_config, tmp)] = "written"
    for path, target in ((src.training_info, dst.training_info), (src.config_yaml, dst.config_yaml)):
        if path.is_file():
            result.files[rel(target, tmp)] = place(path, target, link)
    add_tokenizer(src.tokenizer_dir, tokenizer, dst.tokenizer_dir, result, link)
    optimizer = _export_optimizer(src, dst, result, drop_optimizer=drop_optimizer, scheduler=scheduler, lr=lr,
                                  total_iters=total_iters, add_bias=add_bias, link=link)
    result.notes.append(optimizer)
    if cast is not None:
        result.notes.append(f"weights cast to {dtype_name(cast)} (NeMo-RL casts to value.precision on load anyway)")
    result.notes.append("resume/ (our data position and RNG) is not exported: the seed is for a PPO run, not for "
                        "resuming this training")
    write_export_manifest(src.root, tmp, "nemo-rl", dtype=cast, add_bias=add_bias, files_list=True, optimizer=optimizer)
    return result


def _export_optimizer(src: ckpt.StepPaths, dst: ckpt.StepPaths, result: ExportResult, *, drop_optimizer: bool,
                      scheduler: str, lr: float | None, total_iters: int, add_bias: bool, link: bool) -> str:
    """Copy, rewrite or drop value/optimizer; return one line saying which and why."""
    if not src.optim_dir.is_dir():
        return "optimizer: none in the source (the PPO run builds a fresh one)"
    if drop_optimizer:
        return ("optimizer: dropped (NeMo-RL since PR #4213 ignores it on a warm start; without value/optimizer "
                "an older version builds a fresh one too)")
    if scheduler == "lambda" and lr is None and not add_bias:
        for f in sorted(src.optim_dir.iterdir()):
            result.files[rel(dst.optim_dir / f.name, dst.root)] = place(f, dst.optim_dir / f.name, link)
        if src.scheduler_json.is_file():
            result.files[rel(dst.scheduler_json, dst.root)] = place(src.scheduler_json, dst.scheduler_json, link)
        return ("optimizer: kept as trained (scheduler LambdaLR: matches an older NeMo-RL run without "
                "value.scheduler; use --scheduler sequential when value.scheduler is set)")
    state = read_dcp(src.optim_dir, tensors=True)
    optim, sched = state["optim"], state["sched"]
    base_lr = _base_lr(sched)
    new_lr = lr if lr is not None else base_lr
    if add_bias:
        _add_bias_moments(optim)
    for key in [k for k in optim if k.startswith("param_groups.")]:
        if key.endswith((".lr", ".initial_lr")):
            optim[key] = new_lr
    step = int(sched.get("last_epoch", 0))
    if scheduler == "sequential":
        sched = sequential_state(new_lr, step, total_iters)
    else:
        sched = {**sched, "base_lrs": [new_lr], "_last_lr": [new_lr]}
    _verify_scheduler(sched, scheduler, new_lr, total_iters)
    import torch.distributed.checkpoint as dcp

    with single_process_ok():
        dcp.save({"optim": optim, "sched": sched}, checkpoint_id=str(dst.optim_dir), no_dist=True)
    for f in sorted(dst.optim_dir.iterdir()):
        result.files[rel(f, dst.root)] = "written"
    meta = json.loads(src.scheduler_json.read_text()) if src.scheduler_json.is_file() else {}
    meta.update({"scheduler_class": scheduler_class(sched), "current_lr": new_lr, "exported_lr": new_lr})
    if scheduler == "sequential":
        meta.update({"schedule": "constant", "lr_decay_style": "constant", "constant_total_iters": total_iters})
    fileio.write_json(dst.scheduler_json, meta)
    result.files[rel(dst.scheduler_json, dst.root)] = "written"
    what = []
    if scheduler == "sequential":
        what.append(f"scheduler rewritten as SequentialLR([ConstantLR(factor=1.0, total_iters={total_iters})], "
                    "milestones=[]) (NeMo-RL's PPO example value.scheduler)")
    what.append(f"learning rate in the state set to {new_lr:g}"
                + (" (the run's peak lr; pass --lr to match value.optimizer.kwargs.lr)" if lr is None else ""))
    if add_bias:
        what.append("zero AdamW moments added for the added score.bias")
    return "optimizer: " + "; ".join(what)


def sequential_state(lr: float, last_epoch: int, total_iters: int = CONSTANT_TOTAL_ITERS) -> dict:
    """The state dict of ``SequentialLR([ConstantLR(factor=1.0, total_iters)], milestones=[])``
    (what NeMo-RL builds from the PPO example's value.scheduler) after ``last_epoch`` steps.

    Built by torch itself on a one-parameter optimizer, then advanced by setting the step
    counters (a factor-1 ConstantLR keeps the lr constant, so no step changes anything else).
    """
    from torch.optim.lr_scheduler import ConstantLR, SequentialLR

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    state = SequentialLR(opt, [ConstantLR(opt, factor=1.0, total_iters=total_iters)], milestones=[]).state_dict()
    state["last_epoch"] = last_epoch
    inner = state["_schedulers"][0]
    inner["last_epoch"], inner["_step_count"] = last_epoch, last_epoch + 1
    return state


def _verify_scheduler(sched: dict, kind: str, lr: float, total_iters: int) -> None:
    """Load the state into a fresh scheduler built the way NeMo-RL builds it and take one
    step: a state of the wrong class fails here instead of in the PPO run."""
    from torch.optim.lr_scheduler import ConstantLR, LambdaLR, SequentialLR

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    if kind == "sequential":
        fresh = SequentialLR(opt, [ConstantLR(opt, factor=1.0, total_iters=total_iters)], milestones=[])
    else:
        fresh = LambdaLR(opt, lambda step: 1)
    fresh.load_state_dict(copy.deepcopy(sched))
    for group in opt.param_groups:  # the loaded optimizer state carries these
        group["lr"] = group["initial_lr"] = lr
    opt.step()
    fresh.step()
    got = fresh.get_last_lr()[0]
    if not math.isclose(got, lr, rel_tol=1e-9):
        raise RuntimeError(f"bug: the rewritten {kind} scheduler state steps to lr {got}, expected {lr}")


def _base_lr(sched: dict) -> float:
    base = sched.get("base_lrs") or next((s.get("base_lrs") for s in sched.get("_schedulers", [])
                                          if isinstance(s, dict)), None)
    if not base:
        raise UserError("the optimizer's scheduler state has no base_lrs: pass --lr, or --drop-optimizer")
    return float(base[0])


def _add_bias_moments(optim: dict) -> None:
    """Zero AdamW state for an added ``score.bias`` (flattened state: ``state.<fqn>.<field>``)."""
    w = f"{HEAD}.weight"
    optim[f"state.{HEAD}.bias.step"] = optim[f"state.{w}.step"].clone()
    optim[f"state.{HEAD}.bias.exp_avg"] = torch.zeros(1, dtype=optim[f"state.{w}.exp_avg"].dtype)
    optim[f"state.{HEAD}.bias.exp_avg_sq"] = torch.zeros(1, dtype=optim[f"state.{w}.exp_avg_sq"].dtype)
    for key in [k for k in optim if k.startswith(f"param_groups.{w}.")]:
        optim[key.replace(f".{w}.", f".{HEAD}.bias.")] = copy.deepcopy(optim[key])


def _write_hf_metadata(src: Path, dst: Path, cast, add_bias: bool) -> None:
    config = json.loads(src.read_text())
    if cast is not None:
        config["dtype"] = dtype_name(cast)
        config.pop("torch_dtype", None)
    if add_bias:
        config["token_classification_bias"] = True
    dst.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_json(dst, config, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# hf (verl), openrlhf, trl: one Hugging Face folder

def _export_hf(report: SeedReport, fmt: str, tmp: Path, *, cast, tokenizer: str | None) -> ExportResult:
    from transformers import AutoConfig, AutoModel
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )

    from ..model import write_value_config

    src = ckpt.StepPaths(report.path)
    config = AutoConfig.from_pretrained(str(src.hf_config.parent))
    bias = report.facts["head"]["bias"]
    target_std = report.facts.get("target_std")
    result = ExportResult(fmt, src.root, tmp, bias, _bias_note(fmt, bias, target_std))
    state = load_state(sorted(src.weights_dir.glob("*.safetensors")))
    if fmt == "hf":
        names = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES
        state = prepare_state(state, cast, add_bias=bias is None)
        config.token_classification_bias = True
    else:
        names = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
        state = prepare_state(state, cast, add_bias=False)
        state.pop(f"{HEAD}.bias", None)
        if fmt == "openrlhf":
            # OpenRLHF loads <AutoModel base_model_prefix>.* + <value_head_prefix>.weight
            prefix = AutoModel._model_mapping[type(config)].base_model_prefix
            state = {reprefix(k, config, prefix): v for k, v in state.items()}
            config.value_head_prefix = HEAD
            if bias:  # (values - mean) / std with mean = -bias, std = 1 adds the bias back exactly
                config.mean, config.std = -bias, 1.0
                result.normalization = {"mean": -bias, "std": 1.0}
        elif bias:
            config.critic_pretrain_head_bias = bias  # for the exact-restore snippet
    arch = names.get(config.model_type)
    if arch is None:
        raise UserError(f"transformers has no {'token' if fmt == 'hf' else 'sequence'}-classification class for "
                        f"model_type {config.model_type!r}: {fmt} cannot load this critic")
    if cast is not None:
        config.dtype = cast
    write_value_config(config, tmp / "config.json", architecture=arch)
    save_state(state, tmp / HF_WEIGHTS)
    result.files = {"config.json": "written", HF_WEIGHTS: "written"}
    add_tokenizer(src.tokenizer_dir, tokenizer, tmp, result, link=False)
    write_export_manifest(src.root, tmp, fmt, dtype=cast, add_bias=fmt == "hf" and bias is None, files_list=False,
                    optimizer="not exported (Hugging Face folders carry weights only)")
    result.files[ckpt.MANIFEST] = "written"
    if cast is not None:
        result.notes.append(f"weights cast to {dtype_name(cast)}")
    return result


def _bias_note(fmt: str, bias: float | None, target_std: float | None) -> str:
    """How the head's bias is handled, and how large it is (said in the output, always)."""
    if bias is None:
        if fmt in ("nemo-rl", "hf"):
            return ("the critic was trained without a head bias (model.head_bias=false); added score.bias = 0 "
                    "because NeMo-RL/verl's AutoModelForTokenClassification has one: values unchanged")
        return "none (trained with model.head_bias=false): exported losslessly"
    size = f"{bias:+.4g}" + (f" ({abs(bias) / target_std:.2f} target std)" if target_std else "")
    if fmt in ("nemo-rl", "hf"):
        return f"score.bias = {size}, kept as score.bias (the {fmt} class has a biased head)"
    if bias == 0:
        return "score.bias = 0: dropped, nothing lost"
    lossless = "for a lossless export, train with model.head_bias=false"
    if fmt == "openrlhf":
        return (f"score.bias = {size}: OpenRLHF's head is a bias-free Linear, so the bias is folded into config.json "
                f"as mean = {-bias:.6g}, std = 1, which OpenRLHF applies as (value - mean) / std only with reward "
                "normalization on (--normalize_reward / --reward.normalize_enable). That flag also normalizes the "
                "reward model's score with the reward model's own config mean/std: harmless when its config.json has "
                "none (or rewards come from --remote_rm_url / a reward function), otherwise it rescales rewards. "
                f"Without the flag every OpenRLHF value is {abs(bias):.4g} {'lower' if bias > 0 else 'higher'} than "
                f"ours; {lossless}")
    return (f"score.bias = {size}: TRL's value head (AutoModelForSequenceClassification.score) has no bias, so it is "
            f"dropped and every TRL value is {abs(bias):.4g} {'lower' if bias > 0 else 'higher'} than ours; restore it "
            f"exactly with the snippet below (kept in config.json as critic_pretrain_head_bias), or {lossless}")


# ---------------------------------------------------------------------------------------------
# CLI


if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["export", *sys.argv[1:]]))
