"""End-to-end training on CPU: learning, checkpoints, exact resume, faults, 2 processes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, free_port, tiny_overrides, train_main
from safetensors.torch import load_file

from critic_pretrain import checkpoint as ckpt
from critic_pretrain.metrics import read_metrics


def train(out: Path, data: Path, **extra) -> int:
    return train_main(tiny_overrides(out, data, **extra))


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r}


def weights(step_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.StepPaths(step_dir).weights)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.fixture(scope="module")
def straight(toy_data, tmp_path_factory) -> Path:
    """The reference: 12 uninterrupted steps (crosses an epoch boundary at max_tokens=512)."""
    out = tmp_path_factory.mktemp("straight")
    assert train(out, toy_data, **{"data.max_tokens": 512, "eval.every": 4}) == 0
    return out


def test_loss_falls_and_every_parameter_changes(toy_data, tmp_path):
    out = tmp_path / "run"
    assert train(out, toy_data, **{"train.max_steps": 30, "checkpoint.save_every": 0, "optim.lr": 1e-2}) == 0
    steps = losses(out)
    first, last = sum(list(steps.values())[:5]) / 5, sum(list(steps.values())[-5:]) / 5
    assert last < 0.7 * first, steps
    init_dir = tmp_path / "init"
    assert train(init_dir, toy_data, **{"train.max_steps": 1, "optim.lr": 1e-12, "checkpoint.save_every": 0}) == 0
    before, after = weights(init_dir / "step_1"), weights(out / "step_30")
    unchanged = [k for k in before if torch.allclose(before[k], after[k], atol=1e-6)]
    assert not unchanged, unchanged
    records = read_metrics(out / "metrics.jsonl")
    train_rec = [r for r in records if "train/loss" in r]
    assert {"step", "train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"} <= train_rec[0].keys()
    val_rec = [r for r in records if "val/loss" in r]
    assert val_rec[0]["step"] == 0 and val_rec[-1]["step"] == 30
    assert "val/explained_variance" in val_rec[-1]


def test_checkpoint_tree(straight):
    step = straight / "step_12"
    p = ckpt.StepPaths(step)
    assert p.weights.is_file() and p.weights.name == "shard-00001-model-00001-of-00001.safetensors"
    assert p.hf_config.is_file()
    assert (p.optim_dir / ".metadata").is_file() and list(p.optim_dir.glob("*.distcp"))
    assert not list(p.weights_dir.glob("*.distcp")) and not [f for f in p.weights_dir.iterdir() if "adapter" in f.name]
    info = json.loads(p.training_info.read_text())
    assert info["total_steps"] == 12
    assert {"current_step", "current_epoch", "consumed_samples", "total_valid_tokens", "val:loss",
            "val:explained_variance"} <= info.keys()
    assert info["current_epoch"] >= 1  # crossed an epoch
    sched = json.loads(p.scheduler_json.read_text())
    for key in ("lr", "min_lr", "lr_warmup_iters", "lr_decay_iters", "lr_decay_style", "start_weight_decay",
                "end_weight_decay", "weight_decay_incr_style", "train_global_batch_size", "train_iters",
                "current_step", "current_lr"):
        assert key in sched, key
    assert sched["current_step"] == 12 and sched["train_iters"] == 12
    manifest = json.loads(p.manifest.read_text())
    assert manifest["targets"]["gamma"] == 1.0 and manifest["format_version"] == ckpt.FORMAT_VERSION
    assert "torch" in manifest["versions"]
    assert (step / "config.yaml").is_file() and (step / "resume" / "rng_rank0.safetensors").is_file()
    config = json.loads(p.hf_config.read_text())
    assert config["num_labels"] == 1 and config["classifier_dropout"] == 0.0
    assert config["architectures"] == ["Qwen2ForTokenClassification"]


def test_weights_load_strictly_into_fresh_model_and_reproduce_values(straight, toy_data):
    from transformers import AutoConfig, AutoModelForTokenClassification

    from critic_pretrain.config_io import load_config
    from critic_pretrain.data import RolloutStore, collate_packed
    from critic_pretrain.model import build_value_model, token_values

    step = straight / "step_12"
    config = AutoConfig.from_pretrained(ckpt.StepPaths(step).hf_config.parent)
    fresh = AutoModelForTokenClassification.from_config(config, attn_implementation="eager")
    missing, unexpected = fresh.load_state_dict(weights(step), strict=True)
    assert not missing and not unexpected
    # Our own model class built from the run config, loaded through our resume path.
    cfg = load_config(None, tiny_overrides(straight, toy_data))
    ours = build_value_model(cfg.model, init_head=False)
    ckpt.load_weights(ours, step)
    store = RolloutStore(straight / "data_cache" / "train")
    mb = collate_packed(store, list(range(8)), 512)
    with torch.no_grad():
        v_ours = token_values(ours.eval(), mb.input_ids, mb.position_ids, seq_lens=mb.seq_lens)
        v_fresh = token_values(fresh.eval(), mb.input_ids, mb.position_ids)  # transformers' eager masking
    torch.testing.assert_close(v_ours, v_fresh, rtol=1e-5, atol=1e-6)


def test_optimizer_loads_into_fresh_adamw_and_scheduler(straight, toy_data):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from critic_pretrain.config_io import load_config
    from critic_pretrain.model import build_value_model
    from critic_pretrain.optim import build_optimizer, build_scheduler

    cfg = load_config(None, tiny_overrides(straight, toy_data))
    model = build_value_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    sched = build_scheduler(opt, cfg.optim, cfg.train.max_steps)
    state = {"optim": get_optimizer_state_dict(model, opt, options=ckpt.OPTIM_OPTIONS), "sched": sched.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt.StepPaths(straight / "step_12").optim_dir))
    set_optimizer_state_dict(model, opt, state["optim"], options=ckpt.OPTIM_OPTIONS)
    sched.load_state_dict(state["sched"])
    assert sched.last_epoch == 12
    assert len(opt.param_groups) == 1 and "initial_lr" in opt.param_groups[0]
    for p in model.parameters():
        s = opt.state[p]
        assert int(s["step"]) == 12 and s["exp_avg_sq"].abs().sum() > 0
    # ...and our own builder, for the scheduler the run used.
    opt2 = build_optimizer(model, cfg.optim, torch.device("cpu"))
    ckpt.load_optimizer(model, opt2, build_scheduler(opt2, cfg.optim, 12), straight / "step_12")


def test_resume_is_exact_after_two_preemptions(straight, toy_data, tmp_path, monkeypatch):
    """Stop mid-epoch at step 5 (SIGTERM), resume, stop at 10 in the next epoch, resume to 12."""
    out = tmp_path / "interrupted"
    extra = {"data.max_tokens": 512, "eval.every": 4}
    for stop in ("5", "10", None):
        if stop:
            monkeypatch.setenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP", stop)
        else:
            monkeypatch.delenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP")
        assert train(out, toy_data, **extra) == (75 if stop else 0)  # 75: saved, re-run to continue
        if stop:
            assert sorted(ckpt.find_checkpoints(out))[-1] == int(stop)
    assert losses(out) == losses(straight)  # bit-identical per-step losses
    assert_same_weights(out / "step_12", straight / "step_12")
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, 13))  # appended without duplicates
    info = json.loads((out / "step_12" / "training_info.json").read_text())
    ref = json.loads((straight / "step_12" / "training_info.json").read_text())
    assert info == ref


def test_explicit_load_step(straight, toy_data, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(straight, out)
    assert train(out, toy_data, **{"checkpoint.load_step": 7, "data.max_tokens": 512}) == 2
    err = capsys.readouterr().err
    assert "checkpoint.load_step=7" in err and "does not exist" in err and "available steps: [4, 8, 12]" in err
    # Resuming from step 8 and re-running to 12 reproduces step 12 exactly.
    shutil.rmtree(out / "step_12")
    assert train(out, toy_data, **{"checkpoint.load_step": 8, "data.max_tokens": 512, "eval.every": 4}) == 0
    assert_same_weights(out / "step_12", straight / "step_12")


def test_going_back_to_a_step_sets_the_newer_ones_aside_and_the_same_command_continues(straight, toy_data, tmp_path,
                                                                                       monkeypatch):
    """A new user's trial: load_step=200 in a folder holding step_300/307, Ctrl-C, then the same
    command again. It went back to 200 a second time, retention deleted the step the Ctrl-C had
    just saved (the old 300/307 counted as newest), and a plain re-run resumed the old trajectory
    over the new one's metrics. Now the newer steps move to superseded/ (nothing deleted), the
    re-run continues the branch, and the branch ends bit-identical to the straight run."""
    out = tmp_path / "branch"
    shutil.copytree(straight, out)  # steps 4, 8, 12
    extra = {"data.max_tokens": 512, "eval.every": 4, "checkpoint.load_step": 4, "checkpoint.keep_last": 2}
    monkeypatch.setenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP", "6")
    assert train(out, toy_data, **extra) == 75
    (aside,) = (out / "superseded").iterdir()
    assert aside.name.startswith("from_step_4_") and sorted(p.name for p in aside.iterdir()) == \
        ["metrics.jsonl", "step_12", "step_8"]
    assert sorted(ckpt.find_checkpoints(out)) == [4, 6]  # the step just saved is kept
    monkeypatch.delenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP")
    assert train(out, toy_data, **extra) == 0  # the same command: continues from step_6, not from 4 again
    assert len(list((out / "superseded").iterdir())) == 1
    assert losses(out) == losses(straight)
    assert_same_weights(out / "step_12", straight / "step_12")
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, 13))


def test_checkpoint_files_are_readable_as_the_umask_allows(straight):
    """safetensors 0.8 writes 0600 files: the weights were private while the JSON beside them was
    0644, so a PPO job of a teammate could read the manifest and not the critic. Every file of a
    published step (and of an export: the same replace_dir) now has the mode open() would give."""
    mask = os.umask(0)
    os.umask(mask)
    modes = {str(f.relative_to(straight)): f.stat().st_mode & 0o777 for f in (straight / "step_12").rglob("*")
             if f.is_file()}
    assert any(name.endswith(".safetensors") for name in modes)
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_incomplete_and_tmp_folders_are_ignored(straight, toy_data, tmp_path):
    out = tmp_path / "planted"
    shutil.copytree(straight, out)
    shutil.rmtree(out / "step_12")
    shutil.copytree(out / "step_8", out / "tmp_step_11")           # an unfinished save
    shutil.copytree(out / "step_8", out / "step_10")
    (out / "step_10" / ckpt.MANIFEST).unlink()                       # incomplete: no manifest
    shutil.copytree(out / "step_8", out / "step_9")
    with open(ckpt.StepPaths(out / "step_9").weights, "r+b") as f:  # truncated weights
        f.truncate(100)
    assert sorted(ckpt.find_checkpoints(out)) == [4, 8]
    assert ckpt.resolve_resume(out, None) == out / "step_8"
    assert train(out, toy_data, **{"data.max_tokens": 512, "eval.every": 4}) == 0
    assert_same_weights(out / "step_12", straight / "step_12")
    assert not (out / "tmp_step_11").exists()  # cleaned by retention after a newer save


def test_keep_last_never_deletes_newest_or_resume_point(straight, toy_data, tmp_path):
    out = tmp_path / "keep"
    shutil.copytree(straight, out)
    shutil.rmtree(out / "step_12")
    assert train(out, toy_data, **{"data.max_tokens": 512, "checkpoint.load_step": 4, "checkpoint.keep_last": 1,
                                   "checkpoint.save_every": 2, "train.max_steps": 12}) == 0
    assert sorted(ckpt.find_checkpoints(out)) == [4, 12]  # 4 was resumed from: protected
    assert ckpt.apply_retention(out, 1, protect=set()) == [4]
    assert sorted(ckpt.find_checkpoints(out)) == [12]


def _cli_train(out: Path, data: Path, env_extra: dict | None = None, **extra) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train", *tiny_overrides(out, data, **extra)],
                          capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("point", ["after_weights", "after_optimizer", "before_rename"])
def test_kill_during_save_keeps_previous_checkpoint(straight, toy_data, tmp_path, point):
    out = tmp_path / "killed"
    extra = {"data.max_tokens": 512, "eval.every": 4}
    res = _cli_train(out, toy_data, {"CRITIC_PRETRAIN_FAULT": f"{point}@8"}, **extra)
    assert res.returncode == 137, res.stderr[-2000:]
    assert (out / "tmp_step_8").is_dir() and not (out / "step_8").exists()
    assert sorted(ckpt.find_checkpoints(out)) == [4]
    res = _cli_train(out, toy_data, **extra)  # the same command resumes from step_4
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resuming from" in res.stderr and "step_4" in res.stderr
    assert_same_weights(out / "step_12", straight / "step_12")


def test_bad_config_is_one_line(toy_data, tmp_path):
    res = _cli_train(tmp_path / "x", toy_data, **{"optim.lrr": 1})
    assert res.returncode == 2
    assert res.stderr.strip() == "error: unknown config key 'optim.lrr'; did you mean 'optim.lr'?"


def test_two_process_cpu_run_matches_grad_accum(toy_data, tmp_path):
    """2 ranks x 1 micro-batch see exactly the micro-batches 1 rank x 2 accumulated sees:
    with global token normalisation the losses agree. The validation split is one micro-batch,
    fewer than ranks: evaluation must not hang."""
    out2 = tmp_path / "ddp"
    # accelerate's `--cpu` with several processes needs MPI; torchrun-style workers on CPU need
    # ACCELERATE_USE_CPU=1 with --multi_gpu (gloo backend). docs/distributed.md says the same.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(ROOT / "critic_pretrain" / "train.py"),
           *tiny_overrides(out2, toy_data, **{"train.max_steps": 6, "data.val_fraction": 0.05})]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "ACCELERATE_USE_CPU": "1"})
    assert "2 process(es)" in res.stderr
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out2 / "step_6" / "resume" / "rng_rank1.safetensors").is_file()
    out1 = tmp_path / "accum"
    assert train(out1, toy_data, **{"train.max_steps": 6, "train.grad_accum": 2, "data.val_fraction": 0.05}) == 0
    l1, l2 = losses(out1), losses(out2)
    assert l1.keys() == l2.keys()
    for k in l1:
        assert l1[k] == pytest.approx(l2[k], rel=1e-4), (k, l1, l2)
    w1, w2 = weights(out1 / "step_6"), weights(out2 / "step_6")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-3, atol=1e-5)


def test_sigterm_to_the_whole_process_group_saves(toy_data, tmp_path):
    """SLURM preemption signals every process, DataLoader workers included: still a clean save."""
    import signal
    import time
    out = tmp_path / "pg"
    cmd = [sys.executable, "-m", "critic_pretrain.cli", "train",
           *tiny_overrides(out, toy_data, **{"train.max_steps": 2000, "data.num_workers": 1,
                                             "checkpoint.save_every": 3})]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ckpt.find_checkpoints(out) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    assert "stopped by a signal: saved step_" in err
    newest = sorted(ckpt.find_checkpoints(out))[-1]
    assert 3 <= newest < 2000 and ckpt.verify(out / f"step_{newest}") is None


# --- head-only warm-up and the head's learning rate -----------------------------------------

def test_head_only_warm_up_freezes_the_backbone_then_trains_it(toy_data, tmp_path):
    from critic_pretrain.interop.check import check_seed
    out = tmp_path / "warm"
    assert train(out, toy_data, **{"train.max_steps": 5, "checkpoint.save_every": 1,
                                   "train.freeze_backbone_steps": 3}) == 0
    w = {n: weights(out / f"step_{n}") for n in (1, 3, 4)}
    backbone = [k for k in w[1] if not k.startswith("score.")]
    assert all(torch.equal(w[1][k], w[3][k]) for k in backbone)            # frozen for steps 1-3
    assert not torch.equal(w[1]["score.weight"], w[3]["score.weight"])    # the head learns meanwhile
    assert sum(not torch.equal(w[3][k], w[4][k]) for k in backbone) == len(backbone)  # step 4: all of it
    assert check_seed(out / "step_2").ok  # a warm-up checkpoint covers every parameter's optimizer state
    # resuming inside the warm-up continues exactly
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed, ignore=shutil.ignore_patterns("step_3", "step_4", "step_5", "data_cache"))
    assert train(resumed, toy_data, **{"train.max_steps": 5, "checkpoint.save_every": 1,
                                       "train.freeze_backbone_steps": 3}) == 0
    assert_same_weights(resumed / "step_5", out / "step_5")
    assert losses(resumed) == losses(out)


def test_head_lr_scales_the_head_step_and_keeps_one_param_group(toy_data, tmp_path):
    """One optimizer step on identical copies: the head moves head_lr / lr times as far, the
    backbone exactly as far, and the optimizer keeps one parameter group (NeMo-RL builds one)."""
    import copy

    import numpy as np
    from accelerate import Accelerator

    from critic_pretrain.config_io import load_config
    from critic_pretrain.data import RolloutStore, collate_packed, prepare_store
    from critic_pretrain.model import build_value_model
    from critic_pretrain.optim import build_optimizer, build_scheduler
    from critic_pretrain.train import train_step
    store: RolloutStore = prepare_store([str(toy_data)], tmp_path / "cache", load_config(
        None, tiny_overrides(tmp_path, toy_data)).data, load_config(None, tiny_overrides(tmp_path, toy_data)).targets)
    batch = collate_packed(store, np.arange(8), 256)
    model = build_value_model(load_config(None, tiny_overrides(tmp_path, toy_data)).model)
    moved = {}
    for name, head_lr in (("base", None), ("fast", 6e-3)):  # tiny_overrides: lr 3e-3
        cfg = load_config(None, tiny_overrides(tmp_path, toy_data, **{"optim.warmup_steps": 0}))
        cfg.optim.head_lr = head_lr
        m = copy.deepcopy(model)
        before = {k: v.detach().clone() for k, v in m.named_parameters()}
        opt = build_optimizer(m, cfg.optim, torch.device("cpu"))
        train_step(m, opt, build_scheduler(opt, cfg.optim, 10), [batch], Accelerator(cpu=True), cfg)
        moved[name] = {k: v.detach() - before[k] for k, v in m.named_parameters()}
        assert len(opt.param_groups) == 1
    for k, base in moved["base"].items():
        if k.startswith("score."):
            torch.testing.assert_close(moved["fast"][k], 2 * base, rtol=1e-5, atol=1e-9)
            assert base.abs().max() > 0
        else:
            torch.testing.assert_close(moved["fast"][k], base, rtol=0, atol=0)


def test_td_lambda_from_the_critic_trains_on_its_own_bootstrapped_targets(toy_data, tmp_path):
    """targets.values_from=critic: the step's loss is against the GAE(lam) returns of the
    critic's own detached values, computed per rollout by the per-timestep reference loop;
    the store (validation) keeps Monte-Carlo returns; a short run trains and evaluates."""
    import numpy as np
    from accelerate import Accelerator
    from conftest import train_main
    from reference_gae import reference_gae

    from critic_pretrain.config_io import load_config
    from critic_pretrain.data import collate_packed, prepare_store
    from critic_pretrain.metrics import read_metrics
    from critic_pretrain.model import build_value_model, token_values
    from critic_pretrain.optim import build_optimizer, build_scheduler
    from critic_pretrain.train import train_step

    over = tiny_overrides(tmp_path / "run", toy_data, **{"targets.lam": 0.8, "targets.values_from": "critic",
                                                          "targets.gamma": 0.97})
    cfg = load_config(None, over)
    store = prepare_store([str(toy_data)], tmp_path / "cache", cfg.data, cfg.targets)
    mc = load_config(None, tiny_overrides(tmp_path, toy_data, **{"targets.gamma": 0.97}))
    plain = prepare_store([str(toy_data)], tmp_path / "cache-mc", mc.data, mc.targets)
    assert store.table.column("returns").equals(plain.table.column("returns"))  # validation: Monte-Carlo

    batch = collate_packed(store, np.arange(6), 256, with_rewards=True)
    torch.manual_seed(0)
    model = build_value_model(cfg.model)
    with torch.no_grad():
        values = token_values(model, batch.input_ids, batch.position_ids, seq_lens=batch.seq_lens)
    want, start = [], 0
    for n in batch.seq_lens.tolist():
        part = slice(start, start + n)
        mask = (batch.weights[:, part] > 0).float()
        want.append(reference_gae(batch.rewards[:, part], mask, gamma=0.97, lam=0.8,
                                  values=values[:, part])[1][0])
        start += n
    want = torch.cat(want)[None]
    expected_sq = float((batch.weights * (values - want).square()).sum())
    opt = build_optimizer(model, cfg.optim, torch.device("cpu"))
    sums, _, _ = train_step(model, opt, build_scheduler(opt, cfg.optim, 10), [batch], Accelerator(cpu=True), cfg)
    assert float(sums[1]) == pytest.approx(expected_sq, rel=1e-5)

    assert train_main(over + ["eval.every=6"]) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(math.isfinite(r["train/loss"]) for r in records if "train/loss" in r)
    assert any("val/explained_variance" in r for r in records)


def test_lam_end_moves_lambda_with_the_optimizer_step(toy_data, tmp_path):
    """targets.lam_end: at optimizer step 5 of 10 the step's targets are the reference loop's
    GAE at lambda halfway from `lam` to `lam_end`, not at either end."""
    import numpy as np
    from accelerate import Accelerator
    from reference_gae import reference_gae

    from critic_pretrain.config_io import load_config
    from critic_pretrain.data import collate_packed, prepare_store
    from critic_pretrain.model import build_value_model, token_values
    from critic_pretrain.optim import build_optimizer, build_scheduler
    from critic_pretrain.train import train_step

    cfg = load_config(None, tiny_overrides(tmp_path / "run", toy_data, **{
        "targets.lam": 0.9, "targets.lam_end": 0.5, "targets.values_from": "critic", "train.max_steps": 10}))
    assert [cfg.targets.lam_at(s, 10) for s in (0, 5, 10, 12)] == pytest.approx([0.9, 0.7, 0.5, 0.5])
    store = prepare_store([str(toy_data)], tmp_path / "cache", cfg.data, cfg.targets)
    batch = collate_packed(store, np.arange(6), 256, with_rewards=True)
    torch.manual_seed(0)
    model = build_value_model(cfg.model)
    with torch.no_grad():
        values = token_values(model, batch.input_ids, batch.position_ids, seq_lens=batch.seq_lens)

    def expected_sq(lam: float) -> float:
        want, start = [], 0
        for n in batch.seq_lens.tolist():
            part = slice(start, start + n)
            mask = (batch.weights[:, part] > 0).float()
            want.append(reference_gae(batch.rewards[:, part], mask, gamma=1.0, lam=lam, values=values[:, part])[1][0])
            start += n
        return float((batch.weights * (values - torch.cat(want)[None]).square()).sum())

    opt = build_optimizer(model, cfg.optim, torch.device("cpu"))
    scheduler = build_scheduler(opt, cfg.optim, 10)
    for _ in range(5):
        scheduler.step()
    sums, _, _ = train_step(model, opt, scheduler, [batch], Accelerator(cpu=True), cfg)
    assert float(sums[1]) == pytest.approx(expected_sq(0.7), rel=1e-5)
    assert float(sums[1]) != pytest.approx(expected_sq(0.9), rel=1e-3)
    assert float(sums[1]) != pytest.approx(expected_sq(0.5), rel=1e-3)


def test_lam_end_is_logged_reported_and_a_finished_rerun_says_so(toy_data, tmp_path):
    """train/lambda is each step's lambda; the seed check hands PPO the last step's and names the
    schedule; re-running the finished command trains nothing and says so."""
    from critic_pretrain.interop.check import check_seed
    from critic_pretrain.interop.frameworks import describe_targets

    out, extra = tmp_path / "sched", {"targets.lam": 0.9, "targets.lam_end": 0.5, "targets.values_from": "critic",
                                      "train.max_steps": 4}
    assert train(out, toy_data, **extra) == 0
    lams = [r["train/lambda"] for r in read_metrics(out / "metrics.jsonl") if "train/lambda" in r]
    assert lams == pytest.approx([0.9, 0.8, 0.7, 0.6])
    targets = check_seed(out / "step_4").facts["targets"]
    assert targets["lam"] == pytest.approx(0.5)
    assert "critic lambda 0.5 (TD(lambda) bootstrapped from its own values), this step's on a schedule from 0.9 " \
           "to 0.5" in describe_targets(targets)
    res = _cli_train(out, toy_data, **extra)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step 4 is train.max_steps: nothing left to train" in res.stderr
    assert "targets: TD(0.9 -> 0.5) of its own values (validation against Monte-Carlo returns)" in res.stderr
    assert len(lams) == len([r for r in read_metrics(out / "metrics.jsonl") if "train/lambda" in r])


def test_lam_end_needs_the_critics_own_targets(toy_data, tmp_path, capsys):
    assert train(tmp_path / "mc", toy_data, **{"targets.lam_end": 0.8}) == 2
    assert "targets.lam_end=0.8 needs targets.values_from=critic" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# targets.refresh_every: TD targets from a target network

TD = {"targets.lam": 0.8, "targets.values_from": "critic", "train.max_steps": 8, "checkpoint.save_every": 0}


def test_a_target_network_refreshed_every_step_is_semi_gradient_td(toy_data, tmp_path):
    """refresh_every=1 bootstraps from the weights before each step: what the online critic does."""
    assert train(tmp_path / "online", toy_data, **TD) == 0
    assert train(tmp_path / "every1", toy_data, **TD, **{"targets.refresh_every": 1}) == 0
    wa, wb = weights(tmp_path / "online" / "step_8"), weights(tmp_path / "every1" / "step_8")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert train(tmp_path / "every4", toy_data, **TD, **{"targets.refresh_every": 4}) == 0
    wc = weights(tmp_path / "every4" / "step_8")
    assert any(not torch.allclose(wa[k], wc[k], atol=1e-4) for k in wa)  # a stale target changes training


def test_resume_between_refreshes_is_exact(toy_data, tmp_path, monkeypatch):
    """Stopped at step 6 (the target dates from step 4) and resumed: the same weights as straight."""
    every4 = {**TD, "targets.refresh_every": 4, "checkpoint.save_every": 4}
    assert train(tmp_path / "straight", toy_data, **every4) == 0
    out = tmp_path / "stopped"
    monkeypatch.setenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP", "6")
    assert train(out, toy_data, **every4) == 75
    assert ckpt.StepPaths(out / "step_6").target_weights.is_file()
    monkeypatch.delenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP")
    assert train(out, toy_data, **every4) == 0
    assert_same_weights(out / "step_8", tmp_path / "straight" / "step_8")
    # Without the saved target a resume at step 6 would bootstrap from step 6's weights: refused.
    from critic_pretrain.config_io import load_config
    from critic_pretrain.errors import UserError
    from critic_pretrain.model import build_value_model
    from critic_pretrain.target_network import target_network

    cfg = load_config(None, tiny_overrides(out, toy_data, **every4))
    raw, bare = build_value_model(cfg.model), tmp_path / "step_6_without_target"
    (bare / "resume").mkdir(parents=True)
    with pytest.raises(UserError, match="not a refresh step"):
        target_network(cfg, raw, bare, 6)
    assert target_network(cfg, raw, bare, 8) is not None  # at a refresh step the weights are the target
    saved = target_network(cfg, raw, out / "step_6", 6)
    assert all(torch.equal(saved.state_dict()[k], v) for k, v in weights(out / "step_4").items())


def test_refresh_every_needs_bootstrapped_targets(toy_data, tmp_path, capsys):
    assert train(tmp_path / "mc", toy_data, **{"targets.refresh_every": 4}) == 2
    assert "targets.refresh_every=4 needs targets.values_from=critic" in capsys.readouterr().err


def test_start_up_says_the_schedule_in_passes(toy_data, tmp_path, capsys):
    """The start-up line's steps per pass is where train/epoch turns over, and max_steps / it the passes."""
    import re

    assert train(tmp_path / "run", toy_data, **{"data.max_tokens": 512, "checkpoint.save_every": 0}) == 0
    per_pass, per_step, steps, passes = re.search(
        r"schedule: a pass over the training rollouts is (\d+) steps? of about ([\d.]+) rollouts; "
        r"train.max_steps=(\d+) is ([\d.]+) passes", capsys.readouterr().err).groups()
    epochs = {r["step"]: r["train/epoch"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
              if "train/epoch" in r}
    assert int(per_pass) == max(s for s, e in epochs.items() if e == 0) < int(steps) == max(epochs)
    assert float(passes) == pytest.approx(int(steps) / int(per_pass), abs=0.05)
    assert 1.0 < float(per_step) * int(per_pass) <= 240  # rollouts of a pass: at most the toy set's 240


def test_rollouts_per_step_sizes_grad_accum_and_a_resume_keeps_it(toy_data, tmp_path):
    """train.rollouts_per_step: the fewest micro-batches per step that average at least N rollouts
    (checked against the rollouts the run consumed, and one micro-batch fewer falls short); the
    resolved value is in the checkpoint's config, and a resume keeps the checkpoint's value."""
    import yaml

    out, n = tmp_path / "run", 30
    extra = {"data.max_tokens": 256, "train.rollouts_per_step": n, "train.max_steps": 6, "checkpoint.save_every": 2,
             "checkpoint.keep_last": 3}
    assert train(out, toy_data, **extra) == 0
    accum = yaml.safe_load((out / "step_6" / "config.yaml").read_text())["train"]["grad_accum"]
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["grad_accum"] == accum > 1
    per_step = max(r["train/consumed_samples"] for r in read_metrics(out / "metrics.jsonl")
                   if "train/consumed_samples" in r) / 6
    per_micro = per_step / accum
    assert per_micro * accum >= n - 2 and per_micro * (accum - 1) < n  # within one pass's spread of the mean
    # a resume keeps the checkpoint's micro-batches per step, whatever a fresh resolution would give:
    # step_4 is edited to say it began with one more (its manifest entry rewritten as save writes it)
    shutil.rmtree(out / "step_6")
    cfg_file, manifest_file = out / "step_4" / "config.yaml", out / "step_4" / ckpt.MANIFEST
    saved = yaml.safe_load(cfg_file.read_text())
    saved["train"]["grad_accum"] = accum + 1
    cfg_file.write_text(yaml.safe_dump(saved, sort_keys=False))
    manifest = json.loads(manifest_file.read_text())
    manifest["files"]["config.yaml"] = {"size": cfg_file.stat().st_size, ckpt.CHECKSUM: ckpt.file_checksum(cfg_file)}
    manifest_file.write_text(json.dumps(manifest))
    assert train(out, toy_data, **extra) == 0
    assert yaml.safe_load((out / "step_6" / "config.yaml").read_text())["train"]["grad_accum"] == accum + 1
    consumed = {r["step"]: r["train/consumed_samples"] for r in read_metrics(out / "metrics.jsonl")
                if "train/consumed_samples" in r}
    assert consumed[6] - consumed[4] > 2 * per_step  # two steps of accum + 1 micro-batches each


def test_steps_of_few_rollouts_are_warned_about(toy_data, tmp_path, capsys):
    """One tiny micro-batch per step (a rollout or two): the start-up warns and names the fix;
    train.rollouts_per_step silences it by accumulating."""
    import re

    small = {"data.max_tokens": 48, "train.max_steps": 1, "checkpoint.save_every": 0}
    assert train(tmp_path / "a", toy_data, **small) == 0
    err = capsys.readouterr().err
    per_step = float(re.search(r"steps of about ([\d.]+) rollouts;", err).group(1))
    assert per_step < 4 and f"steps of about {per_step:.1f} rollouts: on the synthetic" in err
    assert "set train.rollouts_per_step" in err
    assert train(tmp_path / "b", toy_data, **small, **{"train.rollouts_per_step": 8}) == 0
    err = capsys.readouterr().err
    assert "rollouts: on the synthetic" not in err and float(re.search(r"steps of about ([\d.]+) rollouts;",
                                                                       err).group(1)) >= 4


def test_length_warmup_cuts_each_step_by_the_schedule_and_resumes_exactly(toy_data, tmp_path, monkeypatch,
                                                                           capsys):
    """data.length_warmup_*: the micro-batches of step s are cut at `from` for `hold` steps, then at
    from + (max - from) * (s - hold) // (n - hold) (read off what the loader hands train_step), the
    full length after; a run stopped mid-warm-up
    resumes to the same cuts and weights as the uninterrupted one."""
    import critic_pretrain.train as tr

    real, seen = tr.loader, {}

    def spy(store, mbs, cuts, **kw):
        for rows, cut, batch in zip(mbs, cuts, real(store, mbs, cuts, **kw)):
            seen[run].append((cut, int(batch.seq_lens.max()), int(store.lengths[rows].max())))
            yield batch

    monkeypatch.setattr(tr, "loader", spy)
    warm = {**TD, "data.length_warmup_steps": 6, "data.length_warmup_from": 12, "data.length_warmup_hold": 2,
            "checkpoint.save_every": 4}
    run = "straight"
    seen[run] = []
    assert train(tmp_path / run, toy_data, **warm) == 0
    assert ("length warm-up: rollouts are cut at 12 tokens until step 2, growing to max_length=256 by step 6"
            in capsys.readouterr().err)
    cuts = [cut for cut, _, _ in seen[run]]
    assert cuts == [12, 12] + [12 + (256 - 12) * s // 4 for s in range(4)] + [256, 256]  # 1 micro-batch per step
    assert all(longest <= cut for cut, longest, _ in seen[run])
    assert seen[run][0][1] == 12 < seen[run][0][2]  # step 0's rollouts were cut at 12 tokens
    run = "stopped"
    seen[run] = []
    monkeypatch.setenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP", "3")
    assert train(tmp_path / run, toy_data, **warm) == 75
    monkeypatch.delenv("CRITIC_PRETRAIN_SIGNAL_AT_STEP")
    assert train(tmp_path / run, toy_data, **warm) == 0
    assert [cut for cut, _, _ in seen[run]] == cuts
    assert_same_weights(tmp_path / "stopped" / "step_8", tmp_path / "straight" / "step_8")
    assert train(tmp_path / "plain", toy_data, **TD) == 0  # the warm-up changed what was trained
    assert losses(tmp_path / "plain")[1] != losses(tmp_path / "straight")[1]


def test_length_warmup_start_up_counts_the_rollouts_its_first_cut_empties(toy_data, tmp_path, capsys):
    """The start-up line says how many training rollouts hold no policy token within the first cut
    (counted here from the parquet files: every rollout trains, val_fraction 0)."""
    import re

    import pyarrow.parquet as pq

    masks = pq.read_table(sorted(toy_data.glob("*.parquet")), columns=["loss_mask"]).column("loss_mask").to_pylist()
    assert train(tmp_path / "run", toy_data, **{"data.length_warmup_steps": 4, "data.length_warmup_from": 6,
                                                "data.val_fraction": 0, "train.max_steps": 1,
                                                "checkpoint.save_every": 0}) == 0
    empty, rows = map(int, re.search(r"; (\d+) of (\d+) training rollouts have no policy token in the first 6 ",
                                     capsys.readouterr().err).groups())
    assert (empty, rows) == (sum(sum(m[:6]) == 0 for m in masks), len(masks)) and 0 < empty < rows


def test_demo_help_says_it_is_train_on_the_bundled_config(capsys):
    """`critic-pretrain demo --help` answered with train's usage alone, as if the user had typed train."""
    from critic_pretrain import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("critic-pretrain demo [key=value ...] runs `critic-pretrain train --config demo")
    assert "usage: critic-pretrain train" in out and "--help-config" in out
