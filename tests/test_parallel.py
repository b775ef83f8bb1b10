"""FSDP2 end to end on CPU: 2 gloo ranks through `accelerate launch --config_file
configs/accelerate/fsdp2.yaml` (the trainer applies fully_shard where accelerate does not),
NeMo-RL-compatible checkpoints, resume across world sizes and layouts, multi-rank faults."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, free_port, tiny_overrides, train_main
from safetensors.torch import load_file

from critic_pretrain import checkpoint as ckpt


def launch(kind: str, out: Path, data: Path, env: dict | None = None, background: bool = False, **extra):
    """2 CPU ranks: `fsdp2` (the shipped FSDP2 config) or `ddp`."""
    how = ["--config_file", str(ROOT / "configs" / "accelerate" / "fsdp2.yaml")] if kind == "fsdp2" else ["--multi_gpu"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *how, "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           str(ROOT / "critic_pretrain" / "train.py"), *tiny_overrides(out, data, **extra)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", **(env or {})}
    if background:
        log = open(out.parent / f"{out.name}.log", "w")
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, text=True, start_new_session=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in r}


def weights(step_dir: Path) -> dict:
    return load_file(ckpt.StepPaths(step_dir).weights)


def assert_close_weights(a: Path, b: Path, exact: bool = False) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        if exact:
            assert torch.equal(wa[k], wb[k]), k
        else:
            torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6)


STEPS = {"train.max_steps": 6, "checkpoint.save_every": 2, "data.val_fraction": 0.05, "eval.every": 2}


@pytest.fixture(scope="module")
def fsdp(toy_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp") / "run"
    res = launch("fsdp2", out, toy_data, **STEPS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "parallelism: FSDP2 over 2 ranks" in res.stderr
    return out


@pytest.fixture(scope="module")
def one(toy_data, tmp_path_factory) -> Path:
    """The same steps on one process: 2 accumulated micro-batches per step."""
    out = tmp_path_factory.mktemp("one") / "run"
    assert train_main(tiny_overrides(out, toy_data, **STEPS, **{"train.grad_accum": 2})) == 0
    return out


def test_fsdp2_trains_evaluates_saves_and_matches_one_process(fsdp, one):
    from critic_pretrain.interop.check import check_seed
    step = fsdp / "step_6"
    assert sorted(p.name for p in ckpt.StepPaths(step).weights_dir.glob("*.safetensors")) == [ckpt.WEIGHTS_FILE]
    assert sorted(p.name for p in ckpt.StepPaths(step).optim_dir.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert check_seed(step).ok
    records = [json.loads(x) for x in (fsdp / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val/loss" in r] == [0, 2, 4, 6]
    l_fsdp, l_one = losses(fsdp), losses(one)
    assert l_fsdp.keys() == l_one.keys() == set(range(1, 7))
    for k in l_one:
        assert l_fsdp[k] == pytest.approx(l_one[k], rel=1e-4), (k, l_fsdp, l_one)
    assert_close_weights(step, one / "step_6")


def test_fsdp2_optimizer_loads_into_a_single_process_adamw(fsdp, one):
    """The sharded DCP optimizer, resharded into one process, equals one process's own state."""
    from critic_pretrain.config_io import load_config
    from critic_pretrain.model import build_value_model
    from critic_pretrain.optim import build_optimizer, build_scheduler
    cfg = load_config(ckpt.StepPaths(fsdp / "step_6").config_yaml)
    states = []
    for run in (fsdp, one):
        model = build_value_model(cfg.model, init_head=False)
        ckpt.load_weights(model, run / "step_6")
        opt = build_optimizer(model, cfg.optim, torch.device("cpu"))
        sched = build_scheduler(opt, cfg.optim, cfg.train.max_steps)
        ckpt.load_optimizer(model, opt, sched, run / "step_6")
        states.append((dict(model.named_parameters()), opt.state, sched.last_epoch))
    (p_a, s_a, e_a), (p_b, s_b, e_b) = states
    assert e_a == e_b == 6
    for name in p_a:
        a, b = s_a[p_a[name]], s_b[p_b[name]]
        assert float(a["step"]) == float(b["step"]) == 6
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"], rtol=1e-3, atol=1e-7)
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-3, atol=1e-9)


def from_step4(src: Path, dst: Path) -> Path:
    """A copy of a run folder as it was when step_4 was its newest checkpoint."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("step_6", "data_cache"))
    return dst


def test_resume_across_layouts(fsdp, one, toy_data, tmp_path):
    # FSDP2 2 ranks -> FSDP2 2 ranks: bit for bit
    out = from_step4(fsdp, tmp_path / "fsdp_fsdp")
    res = launch("fsdp2", out, toy_data, **STEPS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_close_weights(out / "step_6", fsdp / "step_6", exact=True)
    assert losses(out) == losses(fsdp)
    # FSDP2 2 ranks -> 1 process (grad_accum 2) and -> DDP 2 ranks: the optimizer resharded via DCP
    out = from_step4(fsdp, tmp_path / "fsdp_one")
    assert train_main(tiny_overrides(out, toy_data, **STEPS, **{"train.grad_accum": 2})) == 0
    assert_close_weights(out / "step_6", fsdp / "step_6")
    out = from_step4(fsdp, tmp_path / "fsdp_ddp")
    res = launch("ddp", out, toy_data, **STEPS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "parallelism: DDP over 2 ranks" in res.stderr
    assert_close_weights(out / "step_6", fsdp / "step_6")
    # 1 process -> FSDP2 2 ranks
    out = from_step4(one, tmp_path / "one_fsdp")
    res = launch("fsdp2", out, toy_data, **STEPS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_close_weights(out / "step_6", one / "step_6")


def test_resume_keeps_the_micro_batches_of_a_step(fsdp, toy_data, tmp_path, capsys):
    """2 ranks x grad_accum 1 cannot continue as 1 rank x grad_accum 1: steps would see other data."""
    out = from_step4(fsdp, tmp_path / "run")
    assert train_main(tiny_overrides(out, toy_data, **STEPS)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "set train.grad_accum=2" in err[0]


def test_a_save_failing_on_rank_0_ends_every_rank_in_one_line(fsdp, toy_data, tmp_path):
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = launch("fsdp2", out, toy_data, env={"CRITIC_PRETRAIN_FAULT": "enospc@4"}, **STEPS)
    assert res.returncode != 0 and time.monotonic() - t0 < 300  # no hang
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, res.stderr[-3000:]  # one line per rank
    assert "No space left on device" in errors[0] + errors[1] and "failed on another rank" in errors[0] + errors[1]
    assert "[rank0]: Traceback" not in res.stderr and "[rank1]: Traceback" not in res.stderr
    assert sorted(ckpt.find_checkpoints(out)) == [2] and ckpt.verify(out / "step_2", content=True) is None
    # (another rank may still have written its optimizer shard into tmp_step_4: never a checkpoint)
    res = launch("fsdp2", out, toy_data, **STEPS)  # space is back: the same command resumes and cleans up
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(ckpt.find_checkpoints(out)) == [2, 4, 6] and not list(out.glob("tmp_step_*"))
    assert_close_weights(out / "step_6", fsdp / "step_6", exact=True)


def test_sigterm_to_every_rank_saves_once(toy_data, tmp_path):
    out = tmp_path / "run"
    proc = launch("fsdp2", out, toy_data, background=True, **{"train.max_steps": 100000, "checkpoint.save_every": 0})
    deadline = time.time() + 300
    metrics = out / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count('"train/loss"') >= 3:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)  # the scheduler signals every process of the job
    proc.wait(timeout=300)
    log = (tmp_path / "run.log").read_text()
    saved = sorted(ckpt.find_checkpoints(out))
    assert len(saved) == 1 and ckpt.verify(out / f"step_{saved[0]}", content=True) is None, log[-3000:]
    assert log.count("stopped by a signal: saved step_") == 2  # each rank stopped after the one save
    assert "Traceback" not in log.split("stopped by a signal")[0]


def test_rollouts_per_step_counts_every_rank(toy_data, tmp_path):
    """train.rollouts_per_step on 2 ranks: grad_accum is sized for the world (about half of one
    process's), every rank resolves the same one, and the steps hold the rollouts asked for."""
    want = 24
    out = tmp_path / "ddp"
    res = launch("ddp", out, toy_data, **{"train.max_steps": 3, "checkpoint.save_every": 0,
                                          "train.rollouts_per_step": want})
    assert res.returncode == 0, res.stderr[-3000:]
    import yaml
    two = yaml.safe_load((out / "config.yaml").read_text())["train"]["grad_accum"]
    said = {line.split("train.grad_accum=")[1].split()[0].rstrip(",") for line in res.stderr.splitlines()
            if "train.rollouts_per_step=24: train.grad_accum=" in line}
    assert said == {str(two)}  # one value, however many ranks logged it
    one = tmp_path / "one"
    assert train_main(tiny_overrides(one, toy_data, **{"train.max_steps": 3, "checkpoint.save_every": 0,
                                                       "train.rollouts_per_step": want})) == 0
    single = yaml.safe_load((one / "config.yaml").read_text())["train"]["grad_accum"]
    assert single > two >= single // 2 and two >= 1
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    consumed = max(r.get("train/consumed_samples", 0) for r in rows)
    assert consumed / 3 >= want * 0.8  # the first pass's average, so a step may hold a little less
