"""The seed checks of the weights (keys, shapes, head, finiteness) and of the optimizer state."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import checkpoint as ckpt
from ..checkpoint.safe_dcp import dcp_metadata, read_dcp, scheduler_class
from ..errors import first_line
from .frameworks import FRAMEWORKS, HEAD
from .seed_report import SeedReport

log = logging.getLogger(__name__)

LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64", "I64": "int64"}


def read_shapes(report: SeedReport, files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]] | None:
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


def read_hf_config(report: SeedReport, path: Path):
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
    (AutoModelForSequenceClassification: TRL), ``backbone`` (AutoModel backbone under its
    ``base_model_prefix`` + a Linear named ``head``, with a bias when ``bias``: OpenRLHF and SkyRL
    without, ROLL's ``v_head.summary`` with; a causal LM's head, which ROLL ties, is not
    expected). Built on the meta device: no memory, no weights read.
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
    if layout == "backbone":
        prefix = model.base_model_prefix
        shapes = {f"{prefix}.{k}": v for k, v in shapes.items()}
        params = [f"{prefix}.{n}" for n in params]
        hidden = config.get_text_config().hidden_size
        shapes[f"{head}.weight"] = (1, hidden)
        params.append(f"{head}.weight")
        if bias:
            shapes[f"{head}.bias"] = (1,)
            params.append(f"{head}.bias")
    elif layout == "token" and bias and f"{HEAD}.bias" not in shapes:
        # transformers < 5 ignores token_classification_bias and always adds the bias anyway
        shapes[f"{HEAD}.bias"] = (1,)
    return shapes, params


def check_head(report: SeedReport, shapes: dict, want_bias: bool, *, bias_area: str, head: str = HEAD) -> None:
    w = shapes.get(f"{head}.weight")
    if w is None:
        found = next((f.head for f in FRAMEWORKS.values() if f.head != head and f"{f.head}.weight" in shapes), None)
        if found is not None:  # a critic laid out for another framework (an export without our manifest)
            names = " or ".join(f.name for f in FRAMEWORKS.values() if f.head == found)
            report.fail("head", f"no value head ({head}.weight) in the weights, but {found}.weight, the head of a "
                                f"{names} critic: this critic is laid out for another framework, not "
                                f"{report.target}; export its step with critic-pretrain export STEP --format "
                                f"{FRAMEWORKS[report.target].export_format}")
            return
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
        builds = ("TRL's ValueHead with v_head.summary.bias and loads it with strict=False (a missing bias stays "
                  "random)" if report.target == "roll" else
                  "AutoModelForTokenClassification(num_labels=1) with score.bias [1] and loads strictly")
        report.fail(bias_area, f"the value head has no bias (trained with model.head_bias=false) but {report.target} "
                               f"builds {builds}; export it with critic-pretrain export --format "
                               f"{FRAMEWORKS[report.target].export_format} (adds a zero bias, values unchanged)")
    if not want_bias and b is not None and report.kind == "hf":
        report.fail("head", f"{head}.bias is in the weights but {report.target}'s value head is a bias-free Linear: "
                            "transformers drops it without an error and every value shifts by the bias; export with "
                            f"critic-pretrain export --format {report.target}")


def check_layout(report: SeedReport, shapes: dict, expected: dict | None, config, source: str) -> None:
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
    heads = (HEAD, _head_name(report))
    head_keys = {k for k in set(shapes) | set(expected) if any(k.startswith(f"{h}.") for h in heads)}
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


def float_keys(shapes: dict) -> list[str]:
    return [k for k, (_, dt) in shapes.items() if dt.startswith(("F", "BF"))]


def add_weight_facts(report: SeedReport, shapes: dict, config, manifest) -> None:
    """``manifest``: the folder's ``checkpoint.Manifest`` or None."""
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
        report.facts.setdefault("targets", manifest.targets)


def read_scalar(files: list[Path], key: str) -> float | None:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            if key in fh.keys():
                return float(fh.get_tensor(key).float().reshape(-1)[0])
    return None


def check_finite(report: SeedReport, files: list[Path], root: Path) -> None:
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
    found = ckpt.find_checkpoints(root.parent, quiet=True)
    earlier = [s for s in found if s < n]
    return found[max(earlier)] if earlier else None


# ---------------------------------------------------------------------------------------------
# Optimizer

def check_optimizer(report: SeedReport, p: ckpt.StepPaths, params: list[str],
                    param_shapes: dict[str, tuple]) -> None:
    """value/optimizer, when present: a readable DCP checkpoint of {optim, sched} whose AdamW state
    covers every trainable parameter in one group with initial_lr (NeMo-RL before PR #4213 loads it)."""
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
    read = _read_optimizer(report, p, drop)
    if read is None:
        return
    md, state = read
    moments, groups = _optimizer_layout(md, state)
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
                                 "last_epoch": state["sched"].get("last_epoch"),
                                 **{k: _shared(groups, k) for k in ("betas", "eps", "weight_decay")}}
    _optimizer_problems(report, param_shapes, OptimizerFindings(moments, covered, missing, extra, distinct, differing,
                                                                no_initial, sched_cls), params, drop)


def _shared(groups: dict[str, dict[str, Any]], key: str):
    """The value of hyperparameter ``key`` that every parameter group holding it agrees on (betas as a
    list), else None."""
    values = [list(v) if isinstance(v, (tuple, list)) else v for g in groups.values() if (v := g.get(key)) is not None]
    return values[0] if values and all(v == values[0] for v in values) else None


def _read_optimizer(report: SeedReport, p: ckpt.StepPaths, drop: str):
    """(DCP metadata, the non-tensor state) of value/optimizer/optim, or None after a problem."""
    try:
        md = dcp_metadata(p.optim_dir)
        state = read_dcp(p.optim_dir, tensors=False)
    except Exception as e:  # DCP raises assorted errors for a broken folder
        report.fail("optimizer", f"value/optimizer/optim is not a readable torch.distributed.checkpoint "
                                 f"({first_line(e)}); {drop}")
        return None
    if not {"optim", "sched"} <= state.keys():
        report.fail("optimizer", f"value/optimizer/optim holds {sorted(state)} instead of {{optim, sched}}: "
                                 f"NeMo-RL cannot load it; {drop}")
        return None
    return md, state


def _optimizer_layout(md, state) -> tuple[dict[str, dict[str, tuple]], dict[str, dict[str, Any]]]:
    """(moment shapes by parameter and field, hyperparameters by parameter) of a flat AdamW state."""
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
    return moments, groups


@dataclass
class OptimizerFindings:
    """What the optimizer state holds, against the model's trainable parameters."""

    moments: dict[str, dict[str, tuple]]
    """Moment shapes by parameter name and field (exp_avg, exp_avg_sq)."""
    covered: set[str]
    """Parameters with both AdamW moments."""
    missing: list[str]
    extra: list[str]
    distinct: set
    """The distinct parameter groups (their hyperparameters)."""
    differing: list[str]
    """Hyperparameters that differ between groups."""
    no_initial: list[str]
    sched_cls: str


def _optimizer_problems(report: SeedReport, param_shapes: dict[str, tuple], found: OptimizerFindings,
                        params: list[str], drop: str) -> None:
    moments, covered, missing, extra = found.moments, found.covered, found.missing, found.extra
    distinct, differing, no_initial, sched_cls = found.distinct, found.differing, found.no_initial, found.sched_cls
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
        opt = report.facts["optimizer"]
        betas = f", AdamW betas {tuple(opt['betas'])}" if opt.get("betas") else ""
        decay = f", weight decay {opt['weight_decay']}" if opt.get("weight_decay") is not None else ""
        report.warn(f"the optimizer state carries lr {opt['lr']} (scheduler base lr {opt['base_lr']}){betas}{decay}: "
                    "an older NeMo-RL that loads it continues from these, not from value.optimizer.kwargs; "
                    "re-export with --lr LR to set the lr, or --drop-optimizer for the PPO config's own")
    if report.target == "nemo-rl" and report.facts.get("legacy_nemo_rl") and sched_cls == "LambdaLR":
        report.warn("the optimizer's scheduler state is LambdaLR: NeMo-RL since PR #4213 ignores it; an older NeMo-RL "
                    "loads it only when value.scheduler is unset. With value.scheduler set (the PPO example: "
                    "ConstantLR + milestones: []) re-export with --scheduler sequential, or --drop-optimizer")
