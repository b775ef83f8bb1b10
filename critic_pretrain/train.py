"""Pretrain a value model on collected rollouts.

    accelerate launch critic_pretrain/train.py --config configs/demo.yaml train.max_steps=200
    critic-pretrain train --config configs/demo.yaml output_dir=runs/x

Reads top to bottom: config -> accelerator -> resume point -> data -> model -> optimizer
-> loop. Re-running the same command on the same ``output_dir`` resumes from the newest
complete ``step_<n>``; ``checkpoint.load_step=N`` resumes from exactly step N.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `accelerate launch critic_pretrain/train.py`: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import yaml

from critic_pretrain import checkpoint as ckpt
from critic_pretrain import faults, parallel, preflight, target_network, tracking
from critic_pretrain.checkpoint import resume
from critic_pretrain.config import Config
from critic_pretrain.data import (
    Layout,
    TrainData,
    accum_for_rollouts,
    build_train_data,
    loader,
    log_schedule,
    plan_epoch,
    rank_micro_batches,
)
from critic_pretrain.errors import EXIT_FAILED, EXIT_PREEMPTED, UserError, first_line
from critic_pretrain.eval import evaluate
from critic_pretrain.metrics import (
    N_SUMS,
    CollapseWatch,
    MetricsLog,
    OvertrainWatch,
    StopRule,
    progress,
    summarize,
    value_sums,
)
from critic_pretrain.model import (
    build_config,
    build_value_model,
    count_parameters,
    enable_checkpointing,
    is_head,
    position_limit,
    set_head_bias_value,
    token_values,
)
from critic_pretrain.optim import apply_config, build_optimizer, build_scheduler, init_moments, scheduler_metadata
from critic_pretrain.packed import PackedBatch
from critic_pretrain.preemption import Preemption
from critic_pretrain.targets import bootstrapped_returns
from rollouts import fileio
from rollouts.tokenizer import fingerprint, load_for_model

log = logging.getLogger("critic_pretrain")


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint (``resume/state.json``)."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    consumed_samples: int = 0
    total_valid_tokens: int = 0
    stopped_early: str | None = None
    """Why ``train.stop_when`` ended the run (a re-run then has nothing left to do)."""


@dataclass
class Run:
    """Everything a run shares once it is set up."""

    cfg: Config
    accelerator: Any
    layout: Layout
    data: TrainData
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    tokenizer: Any
    resume_dir: Path | None
    state: TrainState
    metrics: MetricsLog
    stop_rule: StopRule
    collapse: CollapseWatch = field(default_factory=CollapseWatch)
    """Watches the validation values' spread (``train.on_collapse``)."""
    overtrain: OvertrainWatch = field(default_factory=OvertrainWatch)
    """Watches the validation EV fall from its best (one warning)."""
    target: torch.nn.Module | None = None
    """The frozen copy of the critic TD targets bootstrap from (``targets.refresh_every``)."""
    last_val: dict = field(default_factory=dict)
    """The newest evaluation's metrics (``val/...``), measured at step ``last_val_step``."""
    last_val_step: int | None = None
    data_changes: list = field(default_factory=list)
    """Accepted changes of the rollout files across resumes (``data.allow_changes``)."""
    config_changes: list = field(default_factory=list)
    """Accepted changes of run-defining settings across resumes (``train.allow_config_changes``)."""
    lock: Any = None
    """The open ``output_dir/.lock`` (main process): released when the process exits."""
    tokenizer_fingerprint: dict | None = None
    """``interop.tokenizer.fingerprint`` of ``tokenizer``, written into every checkpoint's manifest."""
    metric_names_checked: bool = False
    """``stop_when`` / ``best_metric`` were checked against the metrics this run logs."""
    rewards_logged: Any = None
    """``rollouts.provenance.RewardsLogged``: how the archives' rewards relate to the raw ones; None unknown."""

    @property
    def out(self) -> Path:
        return Path(self.cfg.output_dir)

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(t, "sum")


def setup(cfg: Config, cleanup: contextlib.ExitStack | None = None) -> Run:
    """Everything a run needs, in the order that fails fastest: the accelerator and the output
    folder's lock, the resume point (its checks run before anything in the folder is rewritten),
    the data, the model, its placement and optimizer, then the resumed state."""
    accelerator, trackers, mp = make_accelerator(cfg)
    out = Path(cfg.output_dir)
    layout = Layout(accelerator.num_processes, accelerator.process_index, cfg.train.grad_accum)
    lock = ckpt.lock_output_dir(out) if accelerator.is_main_process else None  # one run per output_dir, until exit
    if lock is not None and cleanup is not None:
        cleanup.callback(lock.close)
    resume_dir, layout, config_changes, data_changes = resume.resume_point(cfg, layout, accelerator.wait_for_everyone)
    if resume_dir is not None:
        resume.warn_precision(resume_dir, mp)
    cfg.data.absolute_paths()  # the config.yaml written next names its rollouts from any folder (eval, report)
    if accelerator.is_main_process:
        write_config(cfg, out)
    from accelerate.utils import set_seed
    set_seed(cfg.seed)

    hf_config = build_config(cfg.model)  # before the data: a model we cannot train fails in seconds
    data, tokenizer, tokenizer_fp, rewards_logged, layout = prepare_data(cfg, accelerator, hf_config, layout,
                                                                         resume_dir)
    model = make_model(cfg, hf_config, data, resume_dir, accelerator.device, mp, layout)
    model, optimizer, scheduler = place_and_optimize(cfg, model, accelerator)
    state = restore(resume_dir, accelerator, model, optimizer, scheduler, layout, cfg) if resume_dir else TrainState()
    target = target_network.target_network(cfg, accelerator.unwrap_model(model), resume_dir, state.step)
    resume_step = state.step if resume_dir else None
    stop_rule, collapse, overtrain = StopRule(cfg.train.stop_when), CollapseWatch(), OvertrainWatch()
    metric_names_checked = False
    if resume_dir is not None:  # the resumed run's own history: its stop rule and its metric names
        for watch in (stop_rule, collapse, overtrain):
            watch.replay(out / "metrics.jsonl", state.step)
        logged = preflight.logged_val_keys(out / "metrics.jsonl")
        if logged:
            preflight.check_metric_names(cfg, logged)
            metric_names_checked = True
    tracking.start(accelerator, trackers, cfg.train.tracker_project, cfg.to_dict(), resume_step, out)
    metrics = MetricsLog(out / "metrics.jsonl", resume_step=resume_step, enabled=accelerator.is_main_process,
                         mirror=accelerator.log if trackers else None)
    return Run(cfg, accelerator, layout, data, model, optimizer, scheduler, tokenizer, resume_dir,
               state, metrics, stop_rule, collapse, data_changes=data_changes, config_changes=config_changes, lock=lock,
               tokenizer_fingerprint=tokenizer_fp, metric_names_checked=metric_names_checked,
               rewards_logged=rewards_logged, target=target, overtrain=overtrain)


def make_accelerator(cfg: Config):
    """(accelerator, tracker instances, resolved mixed precision); logging configured per rank."""
    from accelerate.utils import InitProcessGroupKwargs

    mp = cfg.train.mixed_precision
    if mp == "auto":
        mp = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    # A rank that dies mid-collective must not leave the others waiting forever.
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.train.collective_timeout_s))
    out = Path(cfg.output_dir)
    report_to = [t for t in cfg.train.report_to if cfg.train.tensorboard or t != "tensorboard"]
    trackers = tracking.build(report_to, out, cfg.train.tracker_project)  # start once the resume step is known
    accelerator = parallel.new_accelerator(mp, kwargs_handlers=[timeout], log_with=trackers or None,
                                           project_dir=str(out))
    logging.basicConfig(level=logging.INFO if accelerator.is_main_process else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", force=True)
    return accelerator, trackers, mp


def write_config(cfg: Config, out: Path) -> None:
    try:
        fileio.write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    except OSError as e:
        raise UserError(f"cannot write {out / 'config.yaml'} ({e.strerror or e}); free space or fix the "
                        "folder's permissions, then re-run") from None


def prepare_data(cfg: Config, accelerator, hf_config, layout: Layout, resume_dir: Path | None):
    """(TrainData, tokenizer, its fingerprint, what the archives say of their rewards, the layout
    with ``train.rollouts_per_step`` resolved into grad_accum on a fresh start), with the
    refusals that need the data: another tokenizer, mixed reward scales, no validation for a
    feature that needs it, a moved split, too little data for one step."""
    tokenizer = _load_tokenizer(cfg)
    tokenizer_fp = fingerprint(tokenizer) if tokenizer is not None else None
    train_specs = [p for src in cfg.data.all_sources() for p in src.paths]
    preflight.check_rollouts_tokenizer(train_specs + list(cfg.data.val or []), tokenizer_fp,
                                       "train with that tokenizer's model (model.tokenizer / model.name_or_path) "
                                       "or re-tokenize the rollouts", synthetic_ok=cfg.data.synthetic_on_pretrained)
    rewards_logged = preflight.archive_rewards(train_specs)
    if rewards_logged is not None:
        log.info("rewards in the rollouts: logged as %s of the raw ones (%s)", rewards_logged.formula(),
                 rewards_logged.stated_by)
    data = build_train_data(cfg.data, cfg.targets, Path(cfg.data.cache_dir or Path(cfg.output_dir) / "data_cache"),
                            main_first=accelerator.main_process_first,
                            progress=accelerator.is_main_process and cfg.train.progress,
                            model_limit=position_limit(hf_config), vocab_size=hf_config.vocab_size)
    log.info("data: %s", data.describe())
    log.info("targets: %s (validation against %s)", *cfg.targets.kinds())
    preflight.check_validation_needs(cfg, len(data.val_idx))
    if resume_dir is not None:
        preflight.check_split_unchanged(resume_dir, ckpt.Manifest.read(resume_dir), cfg,
                                        len(data.train_idx), len(data.val_idx))
    if cfg.train.rollouts_per_step and resume_dir is None:
        given = cfg.train.grad_accum
        cfg.train.grad_accum = accum_for_rollouts(*data.epoch(cfg.seed, 0), seed=cfg.seed, data=cfg.data,
                                                  world=layout.world, rollouts=cfg.train.rollouts_per_step)
        layout = Layout(layout.world, layout.rank, cfg.train.grad_accum)
        log.info("train.rollouts_per_step=%d: train.grad_accum=%d%s (the resolved config records it)",
                 cfg.train.rollouts_per_step, cfg.train.grad_accum, f", not the {given} given" if given not in
                 (1, cfg.train.grad_accum) else "")
        if accelerator.is_main_process:
            write_config(cfg, Path(cfg.output_dir))
    first = plan_epoch(*data.epoch(cfg.seed, 0), seed=cfg.seed, epoch=0, data=cfg.data, layout=layout)
    preflight.check_one_step(first, cfg, len(data.train_idx), layout.world)
    log_schedule(first, layout, cfg.train.max_steps, cfg.data, data)
    return data, tokenizer, tokenizer_fp, rewards_logged, layout


def make_model(cfg: Config, hf_config, data: TrainData, resume_dir: Path | None, device, mp: str, layout: Layout):
    """The value model (head initialised only for a fresh start), with the start-up lines."""
    model = build_value_model(cfg.model, init_head=resume_dir is None, config=hf_config)
    if resume_dir is None and cfg.model.bias_init == "mean_target" and cfg.model.init_from == "backbone":
        set_head_bias_value(model, data.train.stats.mean_target)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model)
    n = count_parameters(model)
    compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mp, getattr(torch, cfg.model.dtype))
    log.info("value model %s: %.2fM parameters (%.2fM without embeddings), mixed precision %s, %d process(es)",
             type(model).__name__, n["total"] / 1e6, n["matmul"] / 1e6, mp, layout.world)
    log.info("attention %s: %s", model.config._attn_implementation,
             model.attention_plan.describe(device, compute_dtype))
    return model


def place_and_optimize(cfg: Config, model, accelerator):
    """(model, optimizer, scheduler) placed on the ranks: accelerate's DDP/FSDP, or our FSDP2
    where accelerate does not shard (CPU workers)."""
    own_fsdp2 = parallel.needs_own_fsdp2(accelerator)
    if own_fsdp2:  # before the optimizer: it must see the sharded (DTensor) parameters
        parallel.shard_fsdp2(model.to(accelerator.device))
    optimizer = build_optimizer(model, cfg.optim, accelerator.device)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.train.max_steps)  # stepped by us, once per step
    if cfg.train.freeze_backbone_steps:
        init_moments(optimizer)  # the frozen backbone's state exists from the start (saves cover it)
        log.info("head-only warm-up: steps 1-%d update only the value head", cfg.train.freeze_backbone_steps)
    if own_fsdp2:
        optimizer = accelerator.prepare(optimizer)  # the model stays as sharded: no DDP wrapper
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
    log.info("parallelism: %s", parallel.describe(accelerator, model))
    return model, optimizer, scheduler


def restore(step_dir: Path, accelerator, model, optimizer, scheduler, layout: Layout, cfg: Config) -> TrainState:
    """Weights, optimizer moments, LR schedule, progress and RNG from ``step_dir``; the optimizer's
    hyperparameters from ``cfg`` (an allowed change takes effect)."""
    raw = accelerator.unwrap_model(model)
    try:
        ckpt.load_weights(raw, step_dir, is_main=accelerator.is_main_process,
                          distributed=parallel.accelerate_shards(accelerator))
    except RuntimeError as e:  # missing/unexpected keys or shapes: the model is not the one trained there
        raise UserError(f"{step_dir}: its weights do not fit this model ({first_line(e, 200)}); "
                        "the backbone changed under the same settings? Use a new output_dir") from None
    if not ckpt.StepPaths(step_dir).optim_dir.is_dir():
        raise UserError(f"{step_dir} has no value/optimizer (saved with checkpoint.save_optimizer=false), so it "
                        "cannot be resumed exactly; start a new output_dir with model.name_or_path set to an "
                        "`critic-pretrain export --format hf` of it")
    ckpt.load_optimizer(raw, optimizer.optimizer, scheduler, step_dir)
    apply_config(optimizer.optimizer, scheduler, cfg.optim)
    saved, rng = ckpt.load_resume_state(step_dir, layout.rank)
    if rng is not None:
        ckpt.set_rng_state(rng)
    else:
        log.warning("no RNG state for rank %d in %s (the world size changed): the data order continues exactly, "
                    "random streams do not", layout.rank, step_dir)
    return TrainState(**saved["progress"])


def train_step(model, optimizer, scheduler, micro_batches: list[PackedBatch], accelerator, cfg: Config,
               target: torch.nn.Module | None = None):
    """One optimizer step over this rank's micro-batches; returns (loss sums [6], grad norm,
    valid tokens of the step on all ranks), all on the device. ``target``: the network TD
    targets bootstrap from (``targets.refresh_every``); None: the values being trained.

    Loss normalisation: every token's squared error is divided by the number of valid
    (policy, weight > 0) tokens in the whole step, summed over micro-batches and ranks,
    so packing, accumulation and world size never reweight rollouts. DDP/FSDP average
    gradients over ranks, hence the ``* world`` factor.
    """
    device = accelerator.device
    local_valid = sum(mb.valid_tokens for mb in micro_batches)
    # One collective per step; the count stays on the device (no host sync).
    global_valid = accelerator.reduce(torch.tensor(float(local_valid), device=device), "sum")
    scale = accelerator.num_processes / global_valid.clamp_min(1.0)
    sums = torch.zeros(N_SUMS, dtype=torch.float64, device=device)
    gamma, lam = cfg.targets.gamma, cfg.targets.lam_at(scheduler.last_epoch, cfg.train.max_steps)  # lam_end: per step
    for i, mb in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):  # all-reduce grads once
            values = token_values(model, mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)  # [1, N]
            targets = mb.targets
            if cfg.targets.values_from == "critic":  # TD(lambda) from its own values (2 host syncs)
                boot = values
                if target is not None:  # one more forward, no graph
                    with torch.no_grad(), accelerator.autocast():
                        boot = token_values(target, mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)
                targets = bootstrapped_returns(boot, mb, gamma=gamma, lam=lam, lam_alpha=cfg.targets.lam_alpha)
            sq_err = mb.weights * (values - targets).square()                                        # [1, N]
            accelerator.backward(sq_err.sum() * scale)
        sums += value_sums(values, targets, mb.weights)
    frozen = scheduler.last_epoch < cfg.train.freeze_backbone_steps
    head_lr_ratio = cfg.optim.head_lr / cfg.optim.lr if cfg.optim.head_lr is not None else 1.0
    if frozen:  # head-only warm-up: AdamW skips parameters without a gradient
        for name, p in model.named_parameters():
            if not is_head(name):
                p.grad = None
    clip = cfg.train.grad_clip if cfg.train.grad_clip is not None else math.inf
    params = [p for p in model.parameters() if p.grad is not None] if frozen else model.parameters()
    grad_norm = accelerator.clip_grad_norm_(params, clip)
    head = [p for name, p in model.named_parameters() if is_head(name)] if head_lr_ratio != 1.0 else []
    before = [p.detach().clone() for p in head]
    optimizer.step()
    with torch.no_grad():  # AdamW's step is linear in lr: scaling the head's step is a head lr, one param group
        for p, old in zip(head, before):
            p.add_((p - old) * (head_lr_ratio - 1.0))
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return sums, grad_norm, global_valid


class Window:
    """Counts since the last log: host-side integers and device-side loss sums, all-reduced
    only when logged or saved, so the steps in between never wait on the device."""

    def __init__(self, run: Run):
        self.run = run
        dev = run.accelerator.device
        self.sums = torch.zeros(N_SUMS, dtype=torch.float64, device=dev)
        self.t, self.tokens, self.rows, self.valid = time.perf_counter(), 0, 0, 0
        # [steps that had no valid token on any rank, steps with a non-finite loss or gradient]
        self.faults = torch.zeros(2, dtype=torch.float64, device=dev)
        self.since = run.state.step  # the last step checked

    def add(self, sums: torch.Tensor, micro: list[PackedBatch], grad_norm: torch.Tensor, valid: torch.Tensor) -> None:
        self.sums += sums
        # FSDP2's norm is a DTensor: its local part is enough (check() sums the flags over ranks)
        norm = grad_norm.to_local() if hasattr(grad_norm, "to_local") else grad_norm
        self.faults += torch.stack([(valid == 0).double(), (~torch.isfinite(sums).all()
                                                            | ~torch.isfinite(norm)).double()])
        self.tokens += sum(int(m.seq_lens.sum()) for m in micro)
        self.rows += sum(m.num_rows for m in micro)
        self.valid += sum(m.valid_tokens for m in micro)

    def flush_counts(self) -> None:
        """Fold every rank's consumed rollouts and valid tokens into the global progress."""
        dev = self.run.accelerator.device
        rows, valid = self.run.reduce(torch.tensor([self.rows, self.valid], device=dev)).tolist()
        self.run.state.consumed_samples += int(rows)
        self.run.state.total_valid_tokens += int(valid)
        self.rows = self.valid = 0

    def check(self, step: int) -> None:
        """Stop before logging or saving what a broken step produced: a step with no valid token
        on any rank trained on nothing, a non-finite loss or gradient has spoilt the weights. One
        all-reduce and host sync, at log and save points only (where the loop syncs anyway)."""
        empty, broken = (int(x) for x in self.run.reduce(self.faults).tolist())
        steps, self.since = f"steps {self.since + 1}-{step}", step
        if not (empty or broken):
            return
        saved = sorted(ckpt.find_checkpoints(self.run.out))
        kept = f"step_{saved[-1]} is intact" if saved else "no checkpoint was written"
        if broken:
            raise UserError(f"the training loss or gradient became NaN or inf in {steps}: the run diverged and "
                            f"nothing after it was saved ({kept}); start a new output_dir with a lower optim.lr "
                            f"(now {self.run.cfg.optim.lr:g}) or with train.grad_clip set")
        if empty:
            raise UserError(f"{empty} optimizer step(s) in {steps} had no valid token (a policy token with weight "
                            f"> 0) on any rank: they trained on nothing ({kept}); check data.max_tokens (and "
                            "data.length_warmup_from) against the prompt lengths and the rollouts' sample_weight")

    def metrics(self) -> dict:
        tokens = self.run.reduce(torch.tensor(float(self.tokens), device=self.run.accelerator.device)).item()
        rec = {**summarize(self.run.reduce(self.sums), "train"),
               "train/tokens_per_s": tokens / (time.perf_counter() - self.t)}
        self.sums.zero_()
        self.t, self.tokens = time.perf_counter(), 0
        return rec


def train_loop(run: Run, preempt: Preemption) -> int:
    cfg, state, layout, acc = run.cfg, run.state, run.layout, run.accelerator
    num_workers = cfg.data.num_workers if cfg.data.num_workers is not None else (2 if torch.cuda.is_available() else 0)
    if state.stopped_early and not cfg.train.stop_when.metric:
        state.stopped_early = None  # the rule was removed from the config: continue to max_steps
    if state.stopped_early:
        log.info("nothing to do: this run stopped early at step %d (%s)", state.step, state.stopped_early)
    elif run.resume_dir is None:
        evaluate_and_log(run, 0)
    bar = progress(acc.is_main_process and cfg.train.progress, state.step, cfg.train.max_steps,
                   every_s=cfg.train.progress_every_s)
    window = Window(run)
    run.model.train()
    while state.step < cfg.train.max_steps and not state.stopped_early:
        plan = plan_epoch(*run.data.epoch(cfg.seed, state.epoch), seed=cfg.seed, epoch=state.epoch, data=cfg.data,
                          layout=layout)
        steps_in_epoch = len(plan) // layout.per_step
        mbs, cuts = rank_micro_batches(plan, state.step_in_epoch, state.step, layout, cfg.data, run.data.max_length)
        batches = loader(run.data.train, mbs, cuts, num_workers=num_workers,  # cuts: data.length_warmup_steps
                         pin_memory=torch.cuda.is_available(), with_rewards=cfg.targets.values_from == "critic",
                         by_turn=cfg.data.weighting == "turn")
        while state.step_in_epoch < steps_in_epoch and state.step < cfg.train.max_steps:
            micro = [next(batches).to(acc.device) for _ in range(layout.grad_accum)]
            sums, grad_norm, valid = train_step(run.model, run.optimizer, run.scheduler, micro, acc, cfg, run.target)
            window.add(sums, micro, grad_norm, valid)
            state.step += 1
            target_network.refresh(run.target, acc.unwrap_model(run.model), state.step, cfg.targets.refresh_every)
            state.step_in_epoch += 1
            bar.update(1)
            faults.hit("in_step", state.step)  # tests only (faults.py); a no-op otherwise
            done = state.step == cfg.train.max_steps
            logged = state.step % cfg.train.log_every == 0 or done
            if logged:
                log_train(run, window, grad_norm, bar)
            t_pause = time.perf_counter()  # tokens/s measures training, not evaluation or saving
            if (cfg.eval.every and state.step % cfg.eval.every == 0) or done:
                evaluate_and_log(run, state.step)
            # Preemption is checked where we sync anyway: each log step (each step on one process).
            stop = _agree(preempt.requested, acc) if (logged or layout.world == 1) else False
            done = done or state.stopped_early is not None
            if done or stop or (cfg.checkpoint.save_every and state.step % cfg.checkpoint.save_every == 0):
                window.check(state.step)
                window.flush_counts()
                save(run, state.step)
            window.t += time.perf_counter() - t_pause
            if stop:
                log.warning("stopped by a signal: saved step_%d; re-run the same command to resume", state.step)
                run.metrics.close()
                return preempt.exit_code or EXIT_PREEMPTED  # another rank's signal: this rank got none
            if state.stopped_early:
                log.info("stopping early at step %d: %s", state.step, state.stopped_early)
                break
        if state.stopped_early:
            break
        if state.step_in_epoch >= steps_in_epoch:
            state.epoch, state.step_in_epoch = state.epoch + 1, 0
    bar.close()
    run.metrics.close()
    acc.end_training()
    return 0  # the training result; the train command then checks the seed


def log_train(run: Run, window: Window, grad_norm: torch.Tensor, bar) -> None:
    """A train record (window statistics since the last one) to metrics.jsonl, the trackers
    and the progress line. ``float(grad_norm)``: a host sync, at log steps only."""
    state = run.state
    window.check(state.step)
    window.flush_counts()
    rec = {"step": state.step, **window.metrics(), "train/lr": run.scheduler.get_last_lr()[0],
           "train/grad_norm": float(grad_norm), "train/epoch": state.epoch,
           "train/consumed_samples": state.consumed_samples}
    if run.cfg.targets.lam_end is not None:  # the lambda the last step's targets used
        rec["train/lambda"] = run.cfg.targets.lam_at(state.step - 1, run.cfg.train.max_steps)
    run.metrics.log(rec)
    bar.set_postfix(vs=run.cfg.targets.kinds()[0], loss=f"{rec.get('train/loss', math.nan):.4g}",
                    ev=f"{rec.get('train/explained_variance', math.nan):.3f}", tok_s=f"{rec['train/tokens_per_s']:.3g}")


def evaluate_and_log(run: Run, step: int) -> None:
    """Held-out loss and explained variance; logged and kept for ``training_info.json``."""
    if not run.data.val_sets:
        return
    run.last_val, run.last_val_step = {}, step
    for held in run.data.val_sets:  # `val/` first, then `val_response/` with data.val_split=both
        run.last_val.update(evaluate(run.model, held.store, held.idx, max_tokens=run.cfg.data.max_tokens,
                                     max_length=run.data.max_length, layout=run.layout, device=run.accelerator.device,
                                     reduce=run.reduce, token_cap=run.cfg.eval.max_tokens, prefix=held.prefix))
    run.metrics.log({"step": step, **run.last_val})
    if not run.metric_names_checked:  # step 0 of a fresh run: before step 1
        preflight.check_metric_names(run.cfg, set(run.last_val))
        for warning in preflight.constant_targets(run.cfg, run.last_val, run.data.val_sets):
            log.warning(warning)
        run.metric_names_checked = True
    headline = ("loss", "explained_variance", "oracle_loss", "oracle_explained_variance", "calibration_error",
                "adv_corr_first_lam0.95", "adv_corr_first_lam0.95_group_mean")
    log.info("step %d  val vs %s:  %s", step, run.cfg.targets.kinds()[1],
             "  ".join(f"val/{k}={run.last_val[f'val/{k}']:.4g}" for k in headline if f"val/{k}" in run.last_val))
    reason = run.stop_rule.update(run.last_val)  # same values on every rank: all agree
    if reason and step > 0:
        run.state.stopped_early = reason
    collapsed = run.collapse.update(run.last_val, step)
    if collapsed and run.cfg.train.on_collapse == "warn":
        log.warning("%s; train.on_collapse=warn: going on", collapsed)
    elif collapsed:  # before this step is saved: the newest checkpoint is still the critic that had learned
        saved = sorted(ckpt.find_checkpoints(run.out))
        kept = f"step_{saved[-1]} is intact" if saved else "no checkpoint was written"
        raise UserError(f"{collapsed}: stopped before saving it ({kept}); start a new output_dir with a lower "
                        f"optim.lr (now {run.cfg.optim.lr:g}), Monte-Carlo targets (targets.values_from=none "
                        "targets.lam=1.0), or train.on_collapse=warn to go on", exit_code=EXIT_FAILED)
    overtrained = run.overtrain.update(run.last_val, step)
    if overtrained:  # once; the run goes on (the stop rule, train.stop_when, is the user's to set)
        best = run.overtrain.best_step
        kept = "is on disk" if best in ckpt.find_checkpoints(run.out, quiet=True) else "is not on disk"
        log.warning("%s; step_%d %s. Use the best saved checkpoint (`critic-pretrain report` ranks them; "
                    "checkpoint.keep_best keeps the best by checkpoint.best_metric through retention), and train "
                    "fewer steps (train.max_steps) or on more rollouts", overtrained, best, kept)


def save(run: Run, step: int) -> None:
    """Write ``step_<step>`` (collective) and apply retention."""
    cfg, state, raw = run.cfg, run.state, run.accelerator.unwrap_model(run.model)
    val = run.last_val if run.last_val_step == step else {}  # saved between evaluations: none, not the last one's
    info = {"total_steps": step, "current_step": state.step_in_epoch, "current_epoch": state.epoch,
            "consumed_samples": state.consumed_samples, "total_valid_tokens": state.total_valid_tokens,
            **{k.replace("/", ":", 1): v for k, v in val.items()}}   # val:loss, val_response:loss
    manifest = ckpt.build_manifest(cfg, model=raw, data=run.data, rewards_logged=run.rewards_logged,
                                   data_changes=run.data_changes, config_changes=run.config_changes,
                                   tokenizer=run.tokenizer_fingerprint, world_size=run.layout.world,
                                   mixed_precision=run.accelerator.mixed_precision)
    try:
        _save_checkpoint(run, step, raw, info, manifest)
    except RuntimeError as e:  # a collective broke: another rank failed its part of the save
        if run.layout.world == 1 or isinstance(e, UserError):
            raise
        prev = sorted(ckpt.find_checkpoints(run.out))
        raise UserError(f"saving {run.out / f'step_{step}'} failed on another rank (see its error; here: "
                        f"{first_line(e, 120)}); "
                        + (f"step_{prev[-1]} is intact" if prev else "no earlier checkpoint exists")
                        + "; re-run the same command to resume") from None
    if run.accelerator.is_main_process:
        protect = {ckpt.step_number(run.resume_dir)} if run.resume_dir is not None else set()
        ckpt.apply_retention(run.out, cfg.checkpoint.keep_last, protect, cfg.checkpoint.keep_best,
                             cfg.checkpoint.best_metric)
    log.info("saved %s", run.out / f"step_{step}")


def _save_checkpoint(run: Run, step: int, raw, info: dict, manifest: dict) -> None:
    cfg, state = run.cfg, run.state
    ckpt.save_checkpoint(
        run.out, step, model=run.model,
        optimizer=run.optimizer.optimizer if cfg.checkpoint.save_optimizer else None, scheduler=run.scheduler,
        hf_config=raw.config, training_info=info, manifest=manifest,
        scheduler_meta=scheduler_metadata(cfg.optim, cfg.train.max_steps, step, run.scheduler, state, run.layout,
                                          cfg.data.max_tokens),
        config_yaml=yaml.safe_dump(cfg.to_dict(), sort_keys=False), resume_state={"progress": vars(state)},
        tokenizer=run.tokenizer, target_model=run.target,
        trained_hashes=run.data.trained_hashes if run.accelerator.is_main_process else None,
        is_main=run.accelerator.is_main_process,
        rank=run.layout.rank, barrier=run.accelerator.wait_for_everyone)


def _agree(flag: bool, accelerator) -> bool:
    """Whether any rank was asked to stop (one tiny collective when distributed)."""
    if accelerator.num_processes == 1:
        return flag
    return bool(accelerator.reduce(torch.tensor(float(flag), device=accelerator.device), "sum").item() > 0)


def _load_tokenizer(cfg: Config):
    src = cfg.model.tokenizer or cfg.model.name_or_path
    tokenizer = load_for_model(src, explicit=bool(cfg.model.tokenizer),
                               trust_remote_code=cfg.model.trust_remote_code) if src else None
    if src and tokenizer is None:
        log.info("no tokenizer found at %s: checkpoints will not carry value/tokenizer/", src)
    return tokenizer


if __name__ == "__main__":  # accelerate launch critic_pretrain/train.py ...: the same router and error handler
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["train", *sys.argv[1:]]))
