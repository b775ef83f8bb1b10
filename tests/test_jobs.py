"""Batch mode: jobs run in order, finished ones are skipped, failures are isolated, and a
preempted batch exits 75 and resumes exactly. The SLURM example is checked with stubs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, tiny_overrides, train_main
from safetensors.torch import load_file

from critic_pretrain import checkpoint as ckpt
from critic_pretrain import errors as exits
from critic_pretrain import jobs as runner
from critic_pretrain.cli import main as cli_main

SBATCH = ROOT / "examples" / "slurm" / "critic_pretrain.sbatch"


def base_overrides(data: Path, **extra) -> list[str]:
    """A seconds-long CPU run minus output_dir (each job sets its own). No TensorBoard: its
    import alone costs seconds per job."""
    extra = {"train.max_steps": 4, "train.tensorboard": False, **extra}
    return [o for o in tiny_overrides(Path("unused"), data, **extra) if not o.startswith("output_dir=")]


def runner_main(argv: list[str]) -> int:
    """``critic-pretrain batch ARGV`` through the router."""
    return cli_main(["batch", *argv])


def write_jobs(path: Path, data: Path, jobs: list[dict], **extra) -> Path:
    path.write_text(yaml.safe_dump({"defaults": {"overrides": base_overrides(data, **extra)}, "jobs": jobs}))
    return path


def job(name: str, out: Path, *overrides: str) -> dict:
    return {"name": name, "overrides": [f"output_dir={out}", *overrides]}


def summary(jobs_file: Path) -> dict[str, dict]:
    doc = json.loads((jobs_file.parent / "batch_summary.json").read_text())
    return {j["name"]: j for j in doc["jobs"]}


def statuses(jobs_file: Path) -> dict[str, str]:
    return {name: j["status"] for name, j in summary(jobs_file).items()}


def weights(step_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.StepPaths(step_dir).weights)


def signal_when_training(metrics: Path, sig: int = signal.SIGUSR1) -> threading.Thread:
    """Send ``sig`` to this process (where the batch runs) once ``metrics`` shows a training step."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.is_file() and "train/loss" in metrics.read_text():
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_preempted_batch_exits_75_then_resumes_exactly_then_skips(toy_data, tmp_path):
    """SIGUSR1 to the batch (what the SLURM script sends) while job a trains: a saves and exits,
    b never starts, the batch exits 75. The re-run resumes a and runs b (same config: b is the
    straight reference for a's weights); a third run has nothing to do."""
    jobs_file = write_jobs(tmp_path / "jobs.yaml", toy_data, [job("a", tmp_path / "a"), job("b", tmp_path / "b")],
                           **{"train.max_steps": 40, "checkpoint.save_every": 0})

    watcher = signal_when_training(tmp_path / "a" / "metrics.jsonl")
    assert runner_main([str(jobs_file)]) == exits.EXIT_PREEMPTED
    watcher.join()
    s = summary(jobs_file)
    assert s["a"]["status"] == "preempted" and s["a"]["exit_code"] == 75  # it saved: re-run to continue
    stopped_at = s["a"]["final_step"]
    assert 1 <= stopped_at < 40
    assert s["b"]["status"] == "not_started" and not (tmp_path / "b").exists()
    assert json.loads((tmp_path / "batch_summary.json").read_text())["exit_code"] == exits.EXIT_PREEMPTED

    assert runner_main([str(jobs_file)]) == exits.EXIT_OK
    s = summary(jobs_file)
    assert (s["a"]["status"], s["a"]["start_step"], s["a"]["final_step"]) == ("done", stopped_at, 40)
    assert (s["b"]["status"], s["b"]["start_step"], s["b"]["final_step"]) == ("done", None, 40)
    for j in s.values():
        assert j["exit_code"] == 0 and j["wall_s"] > 0
        assert j["best_val_loss"] > 0 and -10 < j["final_val_explained_variance"] <= 1
    wa, wb = weights(tmp_path / "a" / "step_40"), weights(tmp_path / "b" / "step_40")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    t0 = time.monotonic()
    assert runner_main([str(jobs_file)]) == exits.EXIT_OK
    assert statuses(jobs_file) == {"a": "skipped", "b": "skipped"}
    assert time.monotonic() - t0 < 20  # nothing was launched


def test_finished_job_skipped_and_failed_job_isolated(toy_data, tmp_path, capsys):
    """`done` was trained beforehand; `bad` passes validation but fails at run time (its data
    does not exist); `after` still runs."""
    assert train_main(tiny_overrides(tmp_path / "done", toy_data, **{"train.max_steps": 4,
                                                                     "train.tensorboard": False})) == 0
    jobs_file = write_jobs(tmp_path / "jobs.yaml", toy_data, [
        job("done", tmp_path / "done"),
        job("bad", tmp_path / "bad", f"data.train=[{tmp_path / 'missing'}]"),
        job("after", tmp_path / "after"),
    ])
    capsys.readouterr()
    assert runner_main([str(jobs_file)]) == exits.EXIT_FAILED
    s = summary(jobs_file)
    assert {n: j["status"] for n, j in s.items()} == {"done": "skipped", "bad": "failed", "after": "done"}
    assert s["bad"]["exit_code"] == 2 and s["bad"]["final_step"] is None
    assert s["after"]["final_step"] == 4 and s["done"]["final_step"] == 4
    assert "missing: no such file or folder" in s["bad"]["reason"] and s["after"]["reason"] is None
    table = capsys.readouterr().out
    assert "skipped (already finished)" in table and "failed (exit 2)" in table
    assert f"bad: {s['bad']['reason']}" in table  # each failed job's own error line under the table


def test_fail_fast_and_clean_exit_without_finishing(toy_data, tmp_path):
    """Launchers that exit at once stand in for jobs: `false` fails (--fail-fast stops there);
    `true` exits 0 without a finished checkpoint, which only a signalled train does (SLURM
    signals every process on preemption): the batch stops as preempted."""
    jobs_file = write_jobs(tmp_path / "jobs.yaml", toy_data, [
        {**job("fails", tmp_path / "fails"), "launcher": ["false"]},
        job("next", tmp_path / "next"),
    ])
    assert runner_main([str(jobs_file), "--fail-fast"]) == exits.EXIT_FAILED
    assert statuses(jobs_file) == {"fails": "failed", "next": "not_started"}

    jobs_file = write_jobs(tmp_path / "jobs.yaml", toy_data, [
        {**job("quits", tmp_path / "quits"), "launcher": ["true"]},
        job("next", tmp_path / "next"),
    ])
    assert runner_main([str(jobs_file)]) == exits.EXIT_PREEMPTED
    assert statuses(jobs_file) == {"quits": "preempted", "next": "not_started"}


def test_two_jobs_files_in_one_folder_do_not_share_a_summary(toy_data, tmp_path, capsys):
    """The default batch_summary.json is one jobs file's record: a second jobs file next to it
    is refused before anything runs (it overwrote the first one's), and --summary separates them."""
    first = write_jobs(tmp_path / "jobs.yaml", toy_data, [{**job("a", tmp_path / "a"), "launcher": ["false"]}])
    second = write_jobs(tmp_path / "ablations.yaml", toy_data, [{**job("b", tmp_path / "b"), "launcher": ["false"]}])
    assert runner_main([str(first)]) == exits.EXIT_FAILED
    before = (tmp_path / "batch_summary.json").read_text()
    capsys.readouterr()
    assert runner_main([str(second)]) == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'batch_summary.json'} holds the summary of another jobs file ({first}); "
                   f"pass --summary PATH for {second}, e.g. --summary {tmp_path / 'ablations_summary.json'}\n")
    assert (tmp_path / "batch_summary.json").read_text() == before
    assert runner_main([str(second), "--summary", str(tmp_path / "ablations_summary.json")]) == exits.EXIT_FAILED
    assert runner_main([str(first)]) == exits.EXIT_FAILED  # its own summary: rewritten as before
    assert statuses(first) == {"a": "failed"}


@pytest.mark.parametrize("jobs, expected", [
    ({"jobs": [{"name": "a", "overides": []}]}, "job 'a': unknown key 'overides'; did you mean 'overrides'?"),
    ({"job": []}, "unknown key 'job'; did you mean 'jobs'?"),
    ({"defaults": {"launcher": []}, "jobs": [{"name": "a"}]}, "defaults: launcher must be a non-empty command"),
    ({"jobs": [{"overrides": ["output_dir=x"]}]}, "jobs[0]: missing key 'name'"),
    ({"jobs": [{"nmae": "a", "overrides": ["output_dir=x"]}]}, "jobs[0]: unknown key 'nmae'; did you mean 'name'?"),
    ({"jobs": [{"name": "a"}]}, "job 'a': no output_dir; set it in the job's config or add output_dir=runs/a"),
    ({"jobs": [{"name": "a", "overrides": ["output_dir=x"]}, {"name": "a", "overrides": ["output_dir=y"]}]},
     "job 'a' appears twice (jobs[0] and jobs[1])"),
    ({"jobs": [{"name": "a", "overrides": ["output_dir=x"]}, {"name": "b", "overrides": ["output_dir=./x"]}]},
     "jobs 'a' and 'b' both write to ./x"),
    ({"jobs": [{"name": "a", "overrides": ["output_dir=x", "optim.lrr=1"]}]},
     "job 'a': unknown config key 'optim.lrr'; did you mean 'optim.lr'?"),
    ({"jobs": [{"name": "a", "config": "nope.yaml", "overrides": ["output_dir=x"]}]},
     "job 'a': config nope.yaml not found"),
    ({"jobs": [{"name": "a", "overrides": ["output_dir=x"], "signal_to": "all"}]},
     "job 'a': signal_to is 'all'; use one of: auto, launcher, workers"),
])
def test_validation_errors_are_one_line(toy_data, tmp_path, capsys, jobs, expected):
    if "defaults" not in jobs and "jobs" in jobs:
        jobs = {"defaults": {"overrides": base_overrides(toy_data)}, **jobs}
    jobs_file = tmp_path / "jobs.yaml"
    jobs_file.write_text(yaml.safe_dump(jobs))
    assert runner_main([str(jobs_file)]) == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {jobs_file}: ") and expected in err, err


def test_cli_dry_run_and_only(toy_data, tmp_path):
    """Through the real router: --dry-run starts nothing; --only checks names (one-line error)."""
    jobs_file = write_jobs(tmp_path / "jobs.yaml", toy_data, [job("a", tmp_path / "a"), job("b", tmp_path / "b")])

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "batch", str(jobs_file), *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)

    res = cli("--dry-run", "--only", "b")
    assert res.returncode == 0, res.stderr
    assert "(1/1) b: start" in res.stdout and "critic_pretrain.cli train" in res.stdout and " a:" not in res.stdout
    assert not (tmp_path / "b").exists() and not (tmp_path / "batch_summary.json").exists()
    res = cli("--only", "c")
    assert res.returncode == 2
    assert res.stderr == f"error: --only c: no such job in {jobs_file} (jobs: a, b)\n"

    # a typo in one job's rollouts shows in the dry run, not when that job starts
    write_jobs(jobs_file, toy_data, [job("a", tmp_path / "a"), job("b", tmp_path / "b", f"data.val=[{tmp_path}/nope]")])
    res = cli("--dry-run")
    assert res.returncode == 2 and "(1/2) a: start" in res.stdout and "(2/2) b: start" in res.stdout
    assert f"  ! data.val: {tmp_path}/nope: no such file or folder" in res.stdout
    assert res.stderr == ("error: job(s) b name rollouts that cannot be found (listed above, marked !): fix their "
                          "paths before the batch runs\n")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_launcher_kinds_and_child_discovery():
    assert runner.spawns_workers(["accelerate", "launch", "--config_file", "x.yaml"])
    assert runner.spawns_workers(["/opt/bin/torchrun", "--nproc_per_node", "8"])
    assert runner.spawns_workers([sys.executable, "-m", "torch.distributed.run"])
    assert not runner.spawns_workers(["srun", "python"]) and not runner.spawns_workers(["python"])
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not (kids := runner.child_pids(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(kids) == 1 and b"sleep" in Path(f"/proc/{kids[0]}/cmdline").read_bytes()
    finally:
        for pid in runner.child_pids(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("batch_exit, requeued", [("preempted", True), ("done", False)])
def test_sbatch_forwards_usr1_and_requeues_on_75(tmp_path, batch_exit, requeued):
    """The SLURM script with stub `critic-pretrain` and `scontrol`: USR1 to the script reaches
    the batch; exit 75 requeues the job, any other exit does not."""
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0
    text = SBATCH.read_text()
    for line in ("#SBATCH --signal=B:USR1@300", "#SBATCH --requeue", "#SBATCH --open-mode=append"):
        assert line in text
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    code = 75 if batch_exit == "preempted" else 0
    (bin_dir / "critic-pretrain").write_text(
        f'#!/bin/bash\necho "critic-pretrain $*" >> {log}\n'
        f'trap \'echo "got USR1" >> {log}; kill $sleeper; exit {code}\' USR1\n'
        'sleep 30 & sleeper=$!\nwait\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "scontrol $*" >> {log}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_SUBMIT_DIR": str(tmp_path), "JOBS": "jobs.yaml"}
    proc = subprocess.Popen(["bash", str(SBATCH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 20
    while not (log.is_file() and "critic-pretrain" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == code, out
    calls = log.read_text().splitlines()
    assert calls[:2] == ["critic-pretrain batch jobs.yaml", "got USR1"], calls
    assert ("scontrol requeue 4242" in calls) == requeued, calls
