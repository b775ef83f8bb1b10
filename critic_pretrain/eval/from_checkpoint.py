"""``critic-pretrain eval``: a checkpoint on its validation split or on any rollouts, as JSON
(targets built with the checkpoint's own settings, so they match what the critic was trained on)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rollouts import fileio

from .. import checkpoint as ckpt
from .. import preflight
from ..data import Layout, RolloutStore
from ..errors import UserError
from .loop import evaluate_detailed

log = logging.getLogger(__name__)


COLD_EVERY = 10
"""``critic-pretrain eval`` scores the step-0 model on every 10th micro-batch: about 10% more model time."""


def checkpoint_model_config(step_dir: Path, cfg, trust_remote_code: bool = False):
    """(ModelConfig, HF config) of ``step_dir``'s value model, from its own config.json (no
    backbone download), with the run's head settings and attention. ``trust_remote_code``
    comes from the caller (the user's command line), never from the checkpoint's config.yaml."""
    from ..model import build_config

    hf_config = json.loads(ckpt.StepPaths(step_dir).hf_config.read_text())
    model_cfg = dataclasses.replace(cfg.model, name_or_path=None, config=hf_config, init_from="backbone",
                                    trust_remote_code=trust_remote_code)
    return model_cfg, build_config(model_cfg, saved=True)


def load_checkpoint_model(step_dir: Path, cfg, device: torch.device, trust_remote_code: bool = False, *,
                          configs=None) -> torch.nn.Module:
    """The value model of ``step_dir``, weights loaded strictly. ``configs``: what
    ``checkpoint_model_config`` returned, when the caller already has it."""
    from ..model import build_value_model

    model_cfg, hf_config = configs or checkpoint_model_config(step_dir, cfg, trust_remote_code)
    model = build_value_model(model_cfg, init_head=False, config=hf_config)
    ckpt.load_weights(model, step_dir)
    return model.to(device).eval()


def cold_critic(step_dir: Path, cfg, device: torch.device, configs, trust_remote_code: bool = False
                ) -> tuple[torch.nn.Module | None, str]:
    """(the run's step-0 model, how it was built) -- the critic PPO would start from without
    pretraining: the same seed, backbone and head init as ``train.setup``. (None, why) when the
    backbone is not available here (``model.name_or_path`` moved or is not cached)."""
    from ..model import build_value_model, set_head_bias_value

    model_cfg, hf_config = configs
    if cfg.model.name_or_path:
        model_cfg = dataclasses.replace(cfg.model, trust_remote_code=trust_remote_code)
    # Training seeds torch (accelerate's set_seed) right before building the model; forking
    # the RNG keeps this process's own streams untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        try:
            model = build_value_model(model_cfg, init_head=True, config=hf_config)
        except UserError as e:
            return None, f"unavailable: {e}"
    how = f"seed {cfg.seed}, {'weights of ' + cfg.model.name_or_path if cfg.model.name_or_path else 'random init'}"
    manifest = ckpt.Manifest.read(step_dir)
    mean_target = manifest.mean_target if manifest else None
    if cfg.model.bias_init == "mean_target" and cfg.model.init_from == "backbone" and mean_target is not None:
        set_head_bias_value(model, mean_target)
        how += f", head bias {mean_target:.4g} (the training data's mean target)"
    return model.to(device).eval(), how


def checked_step_dir(path: str) -> Path:
    """``path`` as a complete ``step_<n>`` checkpoint folder, or a one-line UserError."""

    step_dir = Path(path)
    if not step_dir.exists():
        hint = ckpt.missing_path_hint(step_dir)
        raise UserError(f"{path}: no such checkpoint folder{f' ({hint})' if hint else ''}; pass a step_<n> folder "
                        "of a critic-pretrain run")
    if not step_dir.is_dir():
        raise UserError(f"{path}: not a folder; pass a step_<n> folder of a critic-pretrain run")
    run_folder = ckpt.run_folder_problem(step_dir)
    if run_folder:
        raise UserError(f"{path}: {run_folder}")
    problem = ckpt.verify(step_dir, content=True)
    if problem:
        raise UserError(f"{path}: not a complete critic-pretrain checkpoint ({problem}); "
                        "pass a step_<n> folder written by `critic-pretrain train`")
    if not ckpt.StepPaths(step_dir).config_yaml.is_file():
        raise UserError(f"{path}: has no config.yaml (needed to build targets as in training); "
                        "pass a step_<n> folder written by `critic-pretrain train`")
    return step_dir


def default_out(step_dir: Path, rollouts: list[str] | None, *, max_length: int | None = None,
                token_cap: int | None = None) -> Path:
    """``<run>/eval/step_<n>-val.json`` (the run's validation split, whole, at the run's length: what
    ``report`` and the notebook read as that step's evaluation) or ``-<hash>.json`` (other rollouts;
    hash of the specs), next to the run's checkpoints; ``-maxlen<N>`` / ``-tokens<N>`` mark a cut or
    partial evaluation, which never takes the whole one's name (a report showed a `--max-length 8`
    evaluation as the validation split's)."""
    tag = "val" if not rollouts else hashlib.sha1("\0".join(rollouts).encode()).hexdigest()[:8]
    tag += f"-maxlen{max_length}" if max_length else ""
    tag += f"-tokens{token_cap}" if token_cap else ""
    return step_dir.parent / "eval" / f"{step_dir.name}-{tag}.json"


def evaluate_checkpoint(step_dir: str | Path, rollouts: list[str] | None = None, *, token_cap: int | None = None,
                        batch_tokens: int | None = None, max_length: int | None = None,
                        cache_dir: str | Path | None = None,
                        device: str | torch.device | None = None, trust_remote_code: bool = False,
                        cold_every: int = COLD_EVERY, leave_out_trained: bool = False) -> dict:
    """Evaluate checkpoint ``step_dir`` and return the JSON-ready report.

    Targets are built with the checkpoint's own ``config.yaml`` (gamma, lambda, reward
    transform, values_from), so they match what the critic was trained on. ``rollouts``:
    any rollout specs; None evaluates the run's own validation split (its ``data_cache``
    is reused when still valid). ``cache_dir``: where other rollouts are prepared (default:
    a temporary folder, removed afterwards). ``max_length``: cut rollouts there instead of at the
    run's own length (never above the model's position limit). ``cold_every``: score the step-0 model (``cold``
    advantage estimator) on every n-th micro-batch; 0 skips it. ``leave_out_trained``: evaluate
    only the given rollouts the critic did not train on (by their tokens; ``seed check``).
    """
    from ..config_io import load_config
    from ..data import max_length_of
    from ..model import position_limit

    step_dir = checked_step_dir(str(step_dir))
    cfg = load_config(ckpt.StepPaths(step_dir).config_yaml)
    dev, max_length_given = resolve_device(device), max_length
    configs = checkpoint_model_config(step_dir, cfg, trust_remote_code)
    model_limit, vocab_size = position_limit(configs[1]), configs[1].vocab_size  # configs[1]: the HF config
    max_length = min(max_length, model_limit or max_length) if max_length else max_length_of(cfg.data, model_limit)
    batch_tokens = batch_tokens or max(cfg.data.max_tokens, max_length)
    if batch_tokens < max_length:
        raise UserError(f"--batch-tokens {batch_tokens} is below the max_length {max_length}; "
                        "a rollout must fit into one micro-batch: raise it")
    t0 = time.perf_counter()
    manifest = ckpt.Manifest.read(step_dir) or ckpt.Manifest({})
    with contextlib.ExitStack() as stack:
        held = _rows_to_evaluate(step_dir, cfg, manifest, rollouts, cache_dir, stack, model_limit=model_limit,
                                 vocab_size=vocab_size, leave_out_trained=leave_out_trained)
        store, indices, split = held[0].store, held[0].idx, held[0].split
        model = load_checkpoint_model(step_dir, cfg, dev, configs=configs)
        cold, cold_how = None, "off (--cold-every 0)"
        if cold_every and store.has_oracle:
            cold, cold_how = cold_critic(step_dir, cfg, dev, configs, trust_remote_code)
        results = []
        for part in held:  # the run's val/ and val_response/ sets, or the given rollouts
            with eval_autocast(dev, cfg.train.mixed_precision):
                results.append(evaluate_detailed(model, part.store, part.idx, max_tokens=batch_tokens,
                                                 max_length=max_length, layout=Layout(1, 0, 1), device=dev,
                                                 token_cap=token_cap, prefix=part.prefix, cold_model=cold,
                                                 cold_every=cold_every or 1))
        regimes = [r for part, result in zip(held, results) for r in _regimes(part, result, step_dir, cfg)]
        data_summary = _data_summary(store, indices, rollouts, split, max_length, held[0].left_out, results[0])
    info = ckpt.StepPaths(step_dir).read_training_info() or {}
    return {
        "checkpoint": {"path": str(step_dir.resolve()), "step": info.get("total_steps"),
                       "targets": dataclasses.asdict(cfg.targets)},
        "data": data_summary,
        "settings": {"max_length": max_length_given, "max_tokens": token_cap},  # None: the run's own, all of it
        **results[0].to_json(),
        "regimes": fileio.plain(regimes),
        "cold_critic": {"built": cold_how, "every": cold_every} if store.has_oracle else None,
        "device": str(dev), "seconds": round(time.perf_counter() - t0, 2),
    }


@dataclasses.dataclass
class Held:
    """Rows to evaluate: ``regime`` is `prompt` or `response` for a run's own held-out sets, None
    for given rollouts (their regimes are told apart by prompt after the evaluation)."""

    regime: str | None
    prefix: str
    store: RolloutStore
    idx: np.ndarray
    split: str
    left_out: int = 0
    """Rows of the given rollouts left out because the critic trained on them (``leave_out_trained``)."""


def _regimes(part: Held, result, step_dir: Path, cfg) -> list[dict]:
    """The verdict per regime: a held-out set is one; given rollouts are split by whether the
    critic trained on their prompt (``step_<n>/data/trained.safetensors``): fresh responses to
    trained prompts are PPO's regime, the rest are new prompts. Rollouts the critic trained on
    (the same tokens) are in neither: they would flatter it. ``cfg``: the checkpoint's config (whether
    the critic bootstrapped from its own values picks the verdict's advice, ``Verdict.bootstrapped``)."""
    from ..data import REGIMES
    bootstrapped = cfg.targets.values_from == "critic"
    if result.verdict is None:
        return []
    if part.regime is not None:
        return [{"regime": part.regime, "label": REGIMES[part.regime], "prefix": part.prefix,
                 "rows": len(result.eval_rows), "metrics": result.metrics,  # evaluated (a token cap stops early)
                 "verdict": _verdict_json(result.verdict, REGIMES[part.regime], bootstrapped)}]
    trained = ckpt.StepPaths(step_dir).read_trained()
    if trained is None:
        label = "all rollouts (this step does not record its training prompts)"
        return [{"regime": "unknown", "label": label, "prefix": part.prefix, "rows": int(len(result.eval_rows)),
                 "verdict": _verdict_json(result.verdict, label, bootstrapped)}]
    rows = result.eval_rows
    seen = np.isin(part.store.row_hashes(prompt_only=True)[rows], trained["prompts"])
    known = np.isin(part.store.row_hashes()[rows], trained["rollouts"])
    out = []
    for regime, mask in (("prompt", ~seen & ~known), ("response", seen & ~known)):  # REGIMES' order
        label = REGIMES[regime]
        out.append({"regime": regime, "label": label, "prefix": part.prefix, "rows": int(mask.sum()),
                    "trained_on_left_out": int(known.sum()),
                    "verdict": _verdict_json(result.judge_rows(mask), label, bootstrapped)})
    return out


def _verdict_json(v, label: str, bootstrapped: bool) -> dict:
    v.regime, v.bootstrapped = label, bootstrapped
    return v.to_json()


def held_out_sets(step_dir: Path, cfg, configs) -> list[Held]:
    """The run's own held-out sets (`val` first, then `val_response`), as ``evaluate_checkpoint``
    evaluates them: the run's prepared data reused, the split checked unchanged. ``configs``:
    what ``checkpoint_model_config`` returned. A run without validation is a UserError."""
    from ..model import position_limit

    manifest = ckpt.Manifest.read(step_dir) or ckpt.Manifest({})
    return _rows_to_evaluate(step_dir, cfg, manifest, None, None, None, model_limit=position_limit(configs[1]),
                             vocab_size=configs[1].vocab_size)


def _rows_to_evaluate(step_dir: Path, cfg, manifest: ckpt.Manifest, rollouts: list[str] | None, cache_dir, stack, *,
                      model_limit: int | None, vocab_size: int, leave_out_trained: bool = False) -> list[Held]:
    """What to evaluate: other rollouts (checked for the critic's tokenizer, prepared in
    ``cache_dir`` or a temporary folder), else the run's own held-out sets (`val` first)."""
    from ..data import build_train_data, prepare_store
    if rollouts:
        preflight.check_rollouts_tokenizer(list(rollouts), manifest.tokenizer,
                                           "evaluate on rollouts of the critic's own tokenizer",
                                           synthetic_ok=cfg.data.synthetic_on_pretrained)
        where = cache_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="critic-eval-"))
        store = prepare_store(list(rollouts), where, cfg.data, cfg.targets, name="eval", vocab_size=vocab_size)
        trained = ckpt.StepPaths(step_dir).read_trained() if leave_out_trained else None
        if trained is None:
            return [Held(None, "eval", store, np.arange(len(store)), "all rows")]
        fresh = np.flatnonzero(~np.isin(store.row_hashes(), trained["rollouts"]))
        if not len(fresh):
            raise UserError(f"the critic trained on every one of the {len(store)} rollouts of {', '.join(rollouts)}: "
                            "check it on fresh rollouts of the policy")
        return [Held(None, "eval", store, fresh, f"{len(fresh)} of {len(store)} rows (the critic trained on the rest)",
                     left_out=len(store) - len(fresh))]
    run_cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else step_dir.parent / "data_cache"
    data = build_train_data(cfg.data, cfg.targets, run_cache, main_first=contextlib.nullcontext,
                            progress=False, model_limit=model_limit, vocab_size=vocab_size)
    if not data.val_sets:
        raise UserError(f"{step_dir}: the run has no validation split (data.val_fraction=0, no data.val); "
                        "pass --rollouts PATH to evaluate on other rollouts")
    preflight.check_split_unchanged(step_dir, manifest, cfg, len(data.train_idx), len(data.val_idx),
                                    fix="pass --rollouts PATH with rollouts it never trained on")
    return [Held(v.regime, v.prefix.replace("val", "eval", 1), v.store, v.idx,
                 f"validation split of the run ({v.label})") for v in data.val_sets]


def resolve_device(name: str | torch.device | None) -> torch.device:
    """``name``, or cuda when available, else cpu; an unusable name is a UserError."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: not a torch device; use cpu, cuda or cuda:<index>") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu")
    return dev


def eval_autocast(device: torch.device, mixed_precision: str):
    """Training's numerics: bf16 autocast where training used it (``auto`` on CUDA)."""
    if device.type == "cuda" and mixed_precision in ("auto", "bf16") and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if device.type == "cuda" and mixed_precision == "fp16":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _data_summary(store: RolloutStore, indices: np.ndarray, rollouts: list[str] | None, split: str,
                  max_length: int, trained_on_left_out: int = 0, result=None) -> dict:
    """What was evaluated (rows, tokens: ``result``'s rows, fewer than the split's under
    ``--max-tokens``), the given rows left out because the critic trained on them, and what the
    prepared store read and left out (its stats)."""
    files = [f["path"] if isinstance(f, dict) else str(f) for f in store.meta.get("files", [])]
    split_rows = len(indices)
    indices = indices if getattr(result, "eval_rows", None) is None else result.eval_rows
    return {"rollouts": list(rollouts) if rollouts else None, "files": files, "split": split,
            "rows": int(len(indices)), "split_rows": split_rows, "tokens": int(store.lengths[indices].sum()),
            "max_length": max_length, "longer_than_max_length": int((store.lengths[indices] > max_length).sum()),
            "has_oracle": store.has_oracle, "trained_on_left_out": trained_on_left_out,
            "store": dataclasses.asdict(store.stats)}


def write_json(obj: dict, out: Path) -> None:
    """Write ``obj`` as indented JSON (NaN as null; parents created); an unwritable place is a UserError."""
    try:
        fileio.write_json(out, obj)
    except OSError as e:
        raise UserError(f"cannot write {out} ({e.strerror}); pass --out FILE.json somewhere writable") from None

if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["eval", *sys.argv[1:]]))
