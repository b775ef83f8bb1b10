"""Faults: a changed archive, bad shards, too much bad data, many shards, full disk, kill -9 in a step,
in a save and in retention, a corrupt newest checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from conftest import ROOT, tiny_overrides, toy_rows, train_main
from safetensors.torch import load_file

from critic_pretrain import checkpoint as ckpt
from rollouts import write_rows


def train_cli(out: Path, data, env_extra: dict | None = None, **extra) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train", *tiny_overrides(out, data, **extra)],
                          capture_output=True, text=True, env=env, cwd=ROOT)


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(ckpt.StepPaths(a).weights), load_file(ckpt.StepPaths(b).weights)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# --- the archive changes under a resumed job -------------------------------------------------

def test_changed_archive_stops_resume_unless_allowed(tmp_path, capsys):
    data = tmp_path / "data"
    write_rows(data, toy_rows(120), shard_rows=60)
    out = tmp_path / "run"
    steps = {"checkpoint.save_every": 2, "optim.schedule": "constant"}  # max_steps may grow on resume
    assert train_main(tiny_overrides(out, data, **{"train.max_steps": 4, **steps})) == 0
    shard = sorted(data.glob("*.parquet"))[1]
    pq.write_table(pq.read_table(shard).slice(0, 50), shard)  # rewritten with fewer rows
    write_rows(data / "more", toy_rows(20, seed=9))             # and a new shard
    assert train_main(tiny_overrides(out, data, **{"train.max_steps": 6, **steps})) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "changed since step_4" in err and "1 added" in err and "1 modified" in err
    assert "data.allow_changes=true" in err
    assert train_main(tiny_overrides(out, data, **{"train.max_steps": 6, **steps, "data.allow_changes": True})) == 0
    changes = json.loads((out / "step_6" / ckpt.MANIFEST).read_text())["data"]["changes"]
    assert changes[0]["at_step"] == 4 and len(changes[0]["added"]) == 1 and len(changes[0]["modified"]) == 1
    (data / "moved").mkdir()  # a shard moved: added and removed share a name, so the line gives paths
    first = sorted(data.glob("*.parquet"))[0]
    first.rename(data / "moved" / first.name)
    capsys.readouterr()
    assert train_main(tiny_overrides(out, data, **{"train.max_steps": 8, **steps})) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"1 added ({data / 'moved' / first.name}); 1 removed ({first})" in err, err


# --- bad data at scale ---------------------------------------------------------------------

def test_bad_shards_are_quarantined_and_counted(tmp_path):
    data = tmp_path / "data"
    write_rows(data, toy_rows(200), shard_rows=20)  # 10 shards
    (data / "part-00003.parquet").write_bytes(b"PAR1 not really")   # corrupt shard
    rows = toy_rows(20, seed=5)
    rows[4]["reward"] = float("nan")
    write_rows(data / "x", rows)
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, data, **{"data.on_bad": "skip", "data.max_bad_fraction": 0.2,
                                                   "train.max_steps": 2})) == 0
    stats = json.loads((out / "step_2" / ckpt.MANIFEST).read_text())["data"]["stats"]
    assert stats["bad_files"] == 1 and stats["bad_rows"] == 1
    assert stats["problems"] == {"corrupt_file": 1, "nan": 1}
    lines = [json.loads(l) for l in (out / "data_cache" / "train" / "quarantine.jsonl").read_text().splitlines()]
    assert {Path(l["file"]).name for l in lines} == {"part-00003.parquet", "part-00000.parquet"}
    bad_file = next(f for f in json.loads((out / "step_2" / ckpt.MANIFEST).read_text())["data"]["files"]
                    if f["path"].endswith("part-00003.parquet"))
    assert bad_file["bad"] is True and bad_file["rows"] == 0


def test_too_much_bad_data_stops(tmp_path, capsys):
    data = tmp_path / "data"
    write_rows(data, toy_rows(60), shard_rows=20)
    for name in ("part-00000.parquet", "part-00001.parquet"):
        (data / name).write_bytes(b"")
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, data, **{"data.on_bad": "skip", "train.max_steps": 2})) == 2
    err = capsys.readouterr().err
    assert "2 bad files of 3" in err and "above data.max_bad_fraction=0.05" in err
    assert "quarantine.jsonl" in err


def test_thousands_of_shards_with_few_file_handles(tmp_path):
    data = tmp_path / "data"
    write_rows(data, toy_rows(1500), shard_rows=1)  # 1,500 one-row shards
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); "
            "from critic_pretrain.cli import main; sys.exit(main(['rollouts', 'check', sys.argv[1]]))")
    res = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "files          1500" in res.stdout and "rows           1,500" in res.stdout


# --- faults --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference(toy_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    assert train_main(tiny_overrides(out, toy_data, **{"checkpoint.keep_last": 1})) == 0
    return out


def test_full_disk_during_save_keeps_previous(reference, toy_data, tmp_path):
    out = tmp_path / "run"
    res = train_cli(out, toy_data, {"CRITIC_PRETRAIN_FAULT": "enospc@8"}, **{"checkpoint.keep_last": 1})
    assert res.returncode == 2
    err_lines = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(err_lines) == 1 and "No space left on device" in err_lines[0] and "step_4 is intact" in err_lines[0]
    assert "Traceback" not in res.stderr
    assert sorted(ckpt.find_checkpoints(out)) == [4] and not (out / "tmp_step_8").exists()
    assert train_cli(out, toy_data, **{"checkpoint.keep_last": 1}).returncode == 0
    assert same_weights(out / "step_12", reference / "step_12")


def test_kill_during_retention(reference, toy_data, tmp_path):
    out = tmp_path / "run"
    res = train_cli(out, toy_data, {"CRITIC_PRETRAIN_FAULT": "retention@8"}, **{"checkpoint.keep_last": 1})
    assert res.returncode == 137
    assert (out / "deleting_step_4").is_dir() and sorted(ckpt.find_checkpoints(out)) == [8]
    assert train_cli(out, toy_data, **{"checkpoint.keep_last": 1}).returncode == 0
    assert not (out / "deleting_step_4").exists()
    assert sorted(ckpt.find_checkpoints(out)) == [8, 12]  # 8: the resume point, protected
    assert same_weights(out / "step_12", reference / "step_12")


def test_kill_9_during_a_step(toy_data, tmp_path):
    """SIGKILL at an arbitrary moment between saves: the same command resumes and ends identical."""
    extra = {"checkpoint.keep_last": 1, "train.max_steps": 40}
    straight = tmp_path / "straight"
    assert train_main(tiny_overrides(straight, toy_data, **extra)) == 0
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "critic_pretrain.cli", "train", *tiny_overrides(out, toy_data, **extra)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not ckpt.find_checkpoints(out) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # somewhere in the next steps
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = sorted(ckpt.find_checkpoints(out))
    assert killed_at and killed_at[-1] < 40, "the run finished before the kill; make it longer"
    assert train_cli(out, toy_data, **extra).returncode == 0
    assert same_weights(out / "step_40", straight / "step_40")


def test_corrupt_newest_falls_back_but_explicit_step_errors(reference, toy_data, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.copytree(out / "step_12", out / "step_13")
    manifest = json.loads((out / "step_13" / ckpt.MANIFEST).read_text())
    manifest["step"] = 13
    (out / "step_13" / ckpt.MANIFEST).write_text(json.dumps(manifest))
    weights = ckpt.StepPaths(out / "step_13").weights
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    assert ckpt.resolve_resume(out, None) == out / "step_12"  # falls back, with a warning in the log
    assert train_main(tiny_overrides(out, toy_data, **{"checkpoint.load_step": 13})) == 2
    err = capsys.readouterr().err
    assert "load_step=13" in err and "not a complete checkpoint" in err and "truncated" in err


def _wrapped(kind: str, error: BaseException) -> BaseException:
    """``error`` the way a library hands it over: safetensors' SafetensorError (text only, "os error
    N"), torch DCP's CheckpointException (a BaseException holding each rank's exception)."""
    import traceback

    from safetensors import SafetensorError
    from torch.distributed.checkpoint.api import CheckpointException
    if kind == "safetensors":
        return SafetensorError(f"Error while serializing: I/O error: {error.strerror} (os error {error.errno})")
    return CheckpointException("CheckpointException ranks:dict_keys([0])", {0: (error, traceback.StackSummary())})


@pytest.mark.parametrize("where", ["weights", "optimizer"])
def test_a_full_disk_met_inside_a_library_is_one_line(where, reference, toy_data, tmp_path, capsys, monkeypatch):
    """A real full disk reaches the save wrapped by the library that wrote: safetensors (the weights)
    or torch DCP (the optimizer state). Both: one line, exit 2, step_4 intact, the partial save
    removed, and the same command resumes to the same weights. Before: a traceback and exit 1 (the
    fault matrix's enospc raised a bare OSError, which was caught)."""
    import critic_pretrain.checkpoint.save as save_mod
    full = OSError(28, "No space left on device")
    if where == "weights":
        real = save_mod.save_file

        def fail(tensors, path, *a, **k):
            if "tmp_step_8" in str(path):
                raise _wrapped("safetensors", full)
            return real(tensors, path, *a, **k)
        monkeypatch.setattr(save_mod, "save_file", fail)
    else:
        real = save_mod.dcp.save

        def fail(state, *a, checkpoint_id, **k):
            if "tmp_step_8" in str(checkpoint_id):
                raise _wrapped("dcp", full)
            return real(state, *a, checkpoint_id=checkpoint_id, **k)
        monkeypatch.setattr(save_mod.dcp, "save", fail)
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"checkpoint.keep_last": 1})) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "No space left on device" in err[0] and "step_4 is intact" in err[0], err
    assert sorted(ckpt.find_checkpoints(out)) == [4] and not (out / "tmp_step_8").exists()
    monkeypatch.undo()
    assert train_main(tiny_overrides(out, toy_data, **{"checkpoint.keep_last": 1})) == 0
    assert same_weights(out / "step_12", reference / "step_12")


def test_wrapped_interrupts_and_full_disks_are_one_line(capsys):
    """The one error handler looks inside a library's wrapper: a second Ctrl-C inside dcp.save exits
    130 and a full disk met anywhere (data preparation, an eval file) exits 2, each in one line."""
    from rollouts.cli import run_command
    from rollouts.errors import cause

    def raising(e):
        def fn():
            raise e
        return fn
    assert run_command(raising(_wrapped("dcp", KeyboardInterrupt()))) == 130
    assert capsys.readouterr().err.strip() == "error: interrupted"
    assert run_command(raising(_wrapped("safetensors", OSError(28, "No space left on device")))) == 2
    assert capsys.readouterr().err.startswith("error: No space left on device: free space or fix the folder")
    assert run_command(raising(OSError(30, "Read-only file system", "/x/eval.json"))) == 2
    assert "error: Read-only file system (/x/eval.json): " in capsys.readouterr().err
    with pytest.raises(ValueError):  # a bug stays a traceback
        run_command(raising(ValueError("a bug")))
    assert cause(RuntimeError("x"), OSError) is None
