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
    return model_cfg, build_config(model_cfg)


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
        raise UserError(f"{path}: no such checkpoint folder; pass a step_<n> folder of a critic-pretrain run")
    if not step_dir.is_dir():
        raise UserError(f"{path}: not a folder; pass a step_<n> folder of a critic-pretrain run")
    problem = ckpt.verify(step_dir, content=True)
    if problem:
        raise UserError(f"{path}: not a complete critic-pretrain checkpoint ({problem}); "
                        "pass a step_<n> folder written by `critic-pretrain train`")
    if not ckpt.StepPaths(step_dir).config_yaml.is_file():
        raise UserError(f"{path}: has no config.yaml (needed to build targets as in training); "
                        "pass a step_<n> folder written by `critic-pretrain train`")
    return step_dir


def default_out(step_dir: Path, rollouts: list[str] | None) -> Path:
    """``<run>/eval/step_<n>-val.json`` (the run's validation split) or ``-<hash>.json``
    (other rollouts; hash of the specs), next to the run's checkpoints."""
    tag = "val" if not rollouts else hashlib.sha1("\0".join(rollouts).encode()).hexdigest()[:8]
    return step_dir.parent / "eval" / f"{step_dir.name}-{tag}.json"


def evaluate_checkpoint(step_dir: str | Path, rollouts: list[str] | None = None, *, token_cap: int | None = None,
                        batch_tokens: int | None = None, cache_dir: str | Path | None = None,
                        device: str | torch.device | None = None, trust_remote_code: bool = False,
                        cold_every: int = COLD_EVERY) -> dict:
    """Evaluate checkpoint ``step_dir`` and return the JSON-ready report.

    Targets are built with the checkpoint's own ``config.yaml`` (gamma, lambda, reward
    transform, values_from), so they match what the critic was trained on. ``rollouts``:
    any rollout specs; None evaluates the run's own validation split (its ``data_cache``
    is reused when still valid). ``cache_dir``: where other rollouts are prepared (default:
    a temporary folder, removed afterwards). ``cold_every``: score the step-0 model (``cold``
    advantage estimator) on every n-th micro-batch; 0 skips it.
    """
    from ..config_io import load_config
    from ..data import max_length_of
    from ..model import position_limit

    step_dir = checked_step_dir(str(step_dir))
    cfg = load_config(ckpt.StepPaths(step_dir).config_yaml)
    dev = resolve_device(device)
    configs = checkpoint_model_config(step_dir, cfg, trust_remote_code)
    hf_config = configs[1]
    model_limit, vocab_size = position_limit(hf_config), hf_config.vocab_size
    max_length = max_length_of(cfg.data, model_limit)  # as in training
    batch_tokens = batch_tokens or cfg.data.max_tokens
    if batch_tokens < max_length:
        raise UserError(f"--batch-tokens {batch_tokens} is below the run's max_length {max_length}; "
                        "a rollout must fit into one micro-batch: raise it")
    t0 = time.perf_counter()
    manifest = ckpt.Manifest.read(step_dir) or ckpt.Manifest({})
    with contextlib.ExitStack() as stack:
        store, indices, split = _rows_to_evaluate(step_dir, cfg, manifest, rollouts, cache_dir, stack,
                                                  model_limit=model_limit, vocab_size=vocab_size)
        model = load_checkpoint_model(step_dir, cfg, dev, configs=configs)
        cold, cold_how = None, "off (--cold-every 0)"
        if cold_every and store.has_oracle:
            cold, cold_how = cold_critic(step_dir, cfg, dev, configs, trust_remote_code)
        with _autocast(dev, cfg.train.mixed_precision):
            result = evaluate_detailed(model, store, indices, max_tokens=batch_tokens, max_length=max_length,
                                       layout=Layout(1, 0, 1), device=dev, token_cap=token_cap, prefix="eval",
                                       cold_model=cold, cold_every=cold_every or 1)
        data_summary = _data_summary(store, indices, rollouts, split, max_length)
    info = ckpt.StepPaths(step_dir).read_training_info() or {}
    return {
        "checkpoint": {"path": str(step_dir.resolve()), "step": info.get("total_steps"),
                       "targets": dataclasses.asdict(cfg.targets)},
        "data": data_summary,
        **result.to_json(),
        "cold_critic": {"built": cold_how, "every": cold_every} if store.has_oracle else None,
        "device": str(dev), "seconds": round(time.perf_counter() - t0, 2),
    }


def _rows_to_evaluate(step_dir: Path, cfg, manifest: ckpt.Manifest, rollouts: list[str] | None, cache_dir, stack, *,
                      model_limit: int | None, vocab_size: int):
    """(store, row indices, what they are): other rollouts (checked for the critic's tokenizer,
    prepared in ``cache_dir`` or a temporary folder), else the run's own validation split."""
    from ..data import build_train_data, prepare_store
    if rollouts:
        preflight.check_rollouts_tokenizer(list(rollouts), manifest.tokenizer,
                                           "evaluate on rollouts of the critic's own tokenizer")
        where = cache_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="critic-eval-"))
        store = prepare_store(list(rollouts), where, cfg.data, cfg.targets, name="eval", vocab_size=vocab_size)
        return store, np.arange(len(store)), "all rows"
    run_cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else step_dir.parent / "data_cache"
    data = build_train_data(cfg.data, cfg.targets, run_cache, main_first=contextlib.nullcontext,
                            progress=False, model_limit=model_limit, vocab_size=vocab_size)
    if len(data.val_idx) == 0:
        raise UserError(f"{step_dir}: the run has no validation split (data.val_fraction=0, no data.val); "
                        "pass --rollouts PATH to evaluate on other rollouts")
    preflight.check_split_unchanged(step_dir, manifest, cfg, len(data.train_idx), len(data.val_idx),
                                    fix="pass --rollouts PATH with rollouts it never trained on")
    return data.val, data.val_idx, "validation split of the run"


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


def _autocast(device: torch.device, mixed_precision: str):
    """Training's numerics: bf16 autocast where training used it (``auto`` on CUDA)."""
    if device.type == "cuda" and mixed_precision in ("auto", "bf16") and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if device.type == "cuda" and mixed_precision == "fp16":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _data_summary(store: RolloutStore, indices: np.ndarray, rollouts: list[str] | None, split: str,
                  max_length: int) -> dict:
    """What was evaluated (rows, tokens) and what the prepared store read and left out (its stats)."""
    files = [f["path"] if isinstance(f, dict) else str(f) for f in store.meta.get("files", [])]
    return {"rollouts": list(rollouts) if rollouts else None, "files": files, "split": split,
            "rows": int(len(indices)), "tokens": int(store.lengths[indices].sum()),
            "longer_than_max_length": int((store.lengths[indices] > max_length).sum()),
            "has_oracle": store.has_oracle, "store": dataclasses.asdict(store.stats)}


def write_json(obj: dict, out: Path) -> None:
    """Write ``obj`` as indented JSON (NaN as null; parents created); an unwritable place is a UserError."""
    try:
        fileio.write_json(out, obj)
    except OSError as e:
        raise UserError(f"cannot write {out} ({e.strerror}); pass --out FILE.json somewhere writable") from None

if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["eval", *sys.argv[1:]]))
