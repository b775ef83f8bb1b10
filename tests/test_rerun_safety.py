"""Re-running the same command is always safe: a changed run is refused, Ctrl-C saves, two
runs never share an output_dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_MODEL, tiny_overrides, train_main

from critic_pretrain import checkpoint as ckpt


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under out, the lock file aside."""
    return {str(f.relative_to(out)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in sorted(out.rglob("*")) if f.is_file() and f.name != ckpt.LOCK}


@pytest.fixture(scope="module")
def run4(toy_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rerun") / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 4})) == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("change, shown", [
    ({"targets.gamma": 0.9}, "targets.gamma 1.0 -> 0.9"),
    ({"targets.reward_scale": 2.0, "targets.reward_shift": -1.0}, "targets.reward_scale 1.0 -> 2.0"),
    ({"targets.reward_clip": "[0,1]"}, "targets.reward_clip null -> [0.0, 1.0]"),
    ({"model.config": json.dumps({**TINY_MODEL, "hidden_size": 48})},  # the field, not a cut dict
     f"model.config.hidden_size {TINY_MODEL['hidden_size']} -> 48"),
    ({"train.max_steps": 8}, "train.max_steps 4 -> 8"),           # the cosine horizon moves
    ({"data.val_fraction": 0.2}, "data.val_fraction 0.1 -> 0.2"),  # the split moves
])
def test_resume_refuses_a_changed_run(run4, toy_data, tmp_path, capsys, change, shown):
    out = copy_run(run4, tmp_path / "run")
    before = snapshot(out)
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 4, **change})) == 2
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and shown in err[0] and "train.allow_config_changes=[" in err[0], err
    assert "new output_dir" in err[0]
    assert "resuming from" not in stderr  # said once the resume point passed its checks
    assert snapshot(out) == before  # no checkpoint touched, config.yaml not overwritten


def test_allowed_change_resumes_and_is_recorded(run4, toy_data, tmp_path):
    out = copy_run(run4, tmp_path / "run")
    over = tiny_overrides(out, toy_data, **{"train.max_steps": 6, "checkpoint.save_every": 2,
                                           "train.allow_config_changes": "[train.max_steps]"})
    assert train_main(over) == 0
    manifest = json.loads(ckpt.StepPaths(out / "step_6").manifest.read_text())
    assert manifest["config_changes"] == [{"at_step": 4, "changes": [{"key": "train.max_steps", "old": 4, "new": 6}]}]


def test_operational_changes_resume_freely(run4, toy_data, tmp_path):
    """Logging, evaluation and retention settings do not define the run."""
    out = copy_run(run4, tmp_path / "run")
    over = tiny_overrides(out, toy_data, **{"train.max_steps": 4, "train.log_every": 3, "eval.every": 2,
                                           "checkpoint.keep_last": 1, "data.num_workers": 0})
    assert train_main(over) == 0


def test_constant_schedule_may_extend_max_steps(toy_data, tmp_path):
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2, "optim.schedule": "constant"})) == 0
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 4, "optim.schedule": "constant"})) == 0
    assert sorted(ckpt.find_checkpoints(out))[-1] == 4


def _start(out: Path, data: Path, **extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "critic_pretrain.cli", "train",
           *tiny_overrides(out, data, **{"train.max_steps": 100000, "checkpoint.save_every": 0, **extra})]
    log = open(out.parent / f"{out.name}.log", "w")  # a file, not a pipe: a full pipe would block the run
    return subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=log, stderr=log, text=True)


def _log(out: Path) -> str:
    return (out.parent / f"{out.name}.log").read_text()


def _wait_for_training(proc: subprocess.Popen, out: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    metrics = out / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and '"train/loss"' in metrics.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"training did not start: {proc.poll()} {_log(out)[-2000:]}")


def test_ctrl_c_saves_and_exits_130(toy_data, tmp_path):
    """With save_every=0 a Ctrl-C used to lose the whole run; now it saves at the step boundary."""
    out = tmp_path / "run"
    proc = _start(out, toy_data, **{"data.num_workers": 1})
    _wait_for_training(proc, out)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
    proc.wait(timeout=300)
    err = _log(out)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    saved = sorted(ckpt.find_checkpoints(out))
    assert saved and ckpt.verify(out / f"step_{saved[-1]}") is None
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if "train/loss" in x]
    assert saved[-1] == steps[-1]  # nothing trained was lost


def test_second_ctrl_c_aborts_at_once():
    from critic_pretrain.errors import EXIT_INTERRUPTED
    from critic_pretrain.preemption import Preemption
    with Preemption() as p:
        os.kill(os.getpid(), signal.SIGINT)
        assert p.requested and p.exit_code == EXIT_INTERRUPTED
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)


def test_one_run_per_output_dir(toy_data, tmp_path):
    out = tmp_path / "run"
    first = _start(out, toy_data)
    try:
        _wait_for_training(first, out)
        before = (out / "metrics.jsonl").read_text().count("\n")
        second = subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train",
                                 *tiny_overrides(out, toy_data, **{"train.max_steps": 3})],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"pid {first.pid}" in errors[0] and "in use" in errors[0]
        assert first.poll() is None  # the first run is untouched and still training
        assert (out / "metrics.jsonl").read_text().count("\n") >= before
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # kill -9: the OS drops the lock
        first.wait()
    # the lock died with the process: the same command resumes (or starts) at once
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 2})) == 0


def test_output_dir_that_is_a_file_is_one_line(toy_data, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert train_main(tiny_overrides(blocker / "run", toy_data)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "output_dir=" in err[0] and "writable" in err[0]


def test_full_disk_at_start_up_is_one_line(toy_data, tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: writes past 256 bytes fail (EFBIG)."""
    import resource

    def no_space():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))  # room for the lock line, not for config.yaml

    res = subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train",
                          *tiny_overrides(tmp_path / "run", toy_data)],
                         cwd=ROOT, capture_output=True, text=True, preexec_fn=no_space, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr and "free space" in errors[0]


def test_start_up_input_errors_are_one_line(toy_data, tmp_path, capsys):
    from critic_pretrain.cli import main as cli_main
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe output_dir: x\n")
    cases = [
        (["train", "--config", str(bad)], "not UTF-8"),
        (["train"], "critic-pretrain demo"),
    ]
    for argv, want in cases:
        assert cli_main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and want in err[0], (argv, err)


def test_export_out_and_overwrite_guards(run4, tmp_path, capsys):
    from critic_pretrain.cli import main as cli_main
    step = str(run4 / "step_4")

    def export(*args) -> list[str]:
        rc = cli_main(["export", step, "--format", "hf", *args])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        return rc, err

    (tmp_path / "afile").write_text("x")
    rc, err = export("--out", str(tmp_path / "afile"))
    assert rc == 2 and len(err) == 1 and "is a file" in err[0]
    rc, err = export("--out", str(tmp_path / "afile" / "sub"))
    assert rc == 2 and len(err) == 1 and "is a file" in err[0]
    mine = tmp_path / "precious"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    rc, err = export("--out", str(mine), "--overwrite")
    assert rc == 2 and "did not write" in err[0] and (mine / "notes.txt").read_text() == "keep me"
    assert export("--out", str(tmp_path / "hf"))[0] == 0
    assert export("--out", str(tmp_path / "hf"), "--overwrite")[0] == 0  # a previous export: replaced


def test_an_allowed_optimizer_change_takes_effect(run4, toy_data, tmp_path):
    """Allowed with train.allow_config_changes, a new optim.lr, betas and weight decay apply from the
    resumed step on: the lr follows the new schedule exactly as a fresh run with the new settings
    logs it, and the next checkpoint's optimizer state holds the new values. Before, the saved
    state's peak lr (3e-3), betas and weight decay stayed while config.yaml, scheduler.json and the
    manifest recorded the new ones."""
    from critic_pretrain.checkpoint.safe_dcp import read_dcp
    from critic_pretrain.metrics import read_metrics
    new = {"train.max_steps": 8, "optim.lr": 1e-3, "optim.min_lr": 1e-4, "optim.weight_decay": 0.1,
           "optim.betas": "[0.5,0.9]", "checkpoint.save_every": 8}
    out = copy_run(run4, tmp_path / "run")
    allow = "[train.max_steps,optim.lr,optim.min_lr,optim.weight_decay,optim.betas]"
    assert train_main(tiny_overrides(out, toy_data, **new, **{"train.allow_config_changes": allow})) == 0
    fresh = tmp_path / "fresh"
    assert train_main(tiny_overrides(fresh, toy_data, **new)) == 0
    lr = {p: {r["step"]: r["train/lr"] for r in read_metrics(p / "metrics.jsonl") if "train/lr" in r}
          for p in (out, fresh)}
    assert [lr[out][s] for s in range(5, 9)] == [lr[fresh][s] for s in range(5, 9)]
    assert lr[out][4] != lr[fresh][4]  # steps 1-4 are the first run's (peak 3e-3)
    saved = read_dcp(ckpt.StepPaths(out / "step_8").optim_dir, tensors=False)["optim"]
    group = {k.rsplit(".", 1)[1]: v for k, v in saved.items() if k.startswith("param_groups.model.embed_tokens.")}
    assert (group["initial_lr"], tuple(group["betas"]), group["weight_decay"]) == (1e-3, (0.5, 0.9), 0.1)


def test_a_resume_in_another_precision_says_so(run4, toy_data, tmp_path):
    """train.mixed_precision changed on resume (or `auto` on other hardware) continues, with one
    warning: before, nothing said the steps were no longer those of a run in one precision."""
    from test_faults import train_cli
    out = copy_run(run4, tmp_path / "run")
    assert json.loads((out / "step_4" / ckpt.MANIFEST).read_text())["model"]["mixed_precision"] == "no"
    over = {"train.max_steps": 6, "train.allow_config_changes": "[train.max_steps]", "checkpoint.save_every": 2,
            "train.mixed_precision": "bf16"}
    res = train_cli(out, toy_data, **over)
    assert res.returncode == 0, res.stderr[-1500:]
    assert "step_4 was trained in mixed precision no and the run continues in bf16" in res.stderr
    assert json.loads((out / "step_6" / ckpt.MANIFEST).read_text())["model"]["mixed_precision"] == "bf16"
    res = train_cli(out, toy_data, **{**over, "train.max_steps": 8})
    assert res.returncode == 0 and "was trained in mixed precision" not in res.stderr


def test_a_damaged_step_is_reported_once_per_run(run4, tmp_path, caplog):
    """Retention looks for checkpoints at every save: a damaged step_<n> was warned about at each
    (18 times in one 100-step run); now once per process."""
    out = copy_run(run4, tmp_path / "run")
    (out / "step_4" / ckpt.MANIFEST).unlink()
    with caplog.at_level("WARNING", logger="critic_pretrain.checkpoint.layout"):
        for _ in range(3):
            assert ckpt.find_checkpoints(out) == {}
    assert [r.getMessage() for r in caplog.records].count(
        f"ignoring {out / 'step_4'}: {ckpt.verify(out / 'step_4')}") == 1


def test_a_second_run_in_one_process_with_another_precision_is_one_line(toy_data, tmp_path, capsys):
    """A notebook runs train again in the same kernel with train.mixed_precision=bf16: accelerate keeps
    one state per process and raised a ValueError traceback; now one line saying what to do."""
    assert train_main(tiny_overrides(tmp_path / "a", toy_data, **{"train.max_steps": 1})) == 0
    capsys.readouterr()
    assert train_main(tiny_overrides(tmp_path / "b", toy_data, **{"train.max_steps": 1,
                                                                  "train.mixed_precision": "bf16"})) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "already trained with mixed precision no" in line and "restart the kernel" in line


def test_a_run_object_still_holding_its_folder_is_named_as_this_process(toy_data, tmp_path, capsys):
    """From a notebook, `setup(cfg)` without an ExitStack keeps output_dir locked while its Run lives:
    a re-run in the same kernel was told the folder "is in use by pid N ...; wait for it to finish",
    N being the notebook itself. It now says this process holds it and how to release it."""
    from critic_pretrain.config_io import load_config
    from critic_pretrain.train import setup
    over = tiny_overrides(tmp_path / "run", toy_data, **{"train.max_steps": 1})
    run = setup(load_config(None, over))
    assert train_main(over) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "is held by this Python process" in line and "run.lock.close()" in line
    run.lock.close()
    assert train_main(over) == 0
