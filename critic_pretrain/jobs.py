"""Batch mode: several pretraining jobs from one JOBS.yaml, one after another.

    critic-pretrain batch jobs.yaml [--dry-run] [--only NAME ...] [--fail-fast] [--summary PATH]

Each job is the ordinary ``critic-pretrain train`` command (or a launcher such as
``accelerate launch`` in front of ``critic_pretrain/train.py``) run as its own subprocess:
a fresh process per job for accelerate/torch state, and a failing job does not stop the
others. Because a job is just the train command, re-running the batch resumes it from its
newest complete checkpoint, and jobs already finished are skipped.

Preemption: SIGTERM or SIGUSR1 to the batch is passed on to the running job as SIGTERM
(it saves at the next step boundary and exits), no further job starts, the summary is
written and the batch exits with ``EXIT_PREEMPTED`` (75) so a SLURM script can requeue
itself; the same command then continues where it stopped. docs/batch.md is the reference.

This module stays torch-free at import time: validation and ``--dry-run`` start fast, and
the batch process itself never holds a CUDA context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rollouts import fileio

from .config import Config
from .config_io import bundled_config_names, find_config, load_config, read_yaml_mapping
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, UserError, did_you_mean
from .selection import best

if TYPE_CHECKING:
    from .checkpoint import StepPaths

# Job statuses as written to batch_summary.json; STATUS_TEXT is the table's wording.
DONE, SKIPPED, FAILED, PREEMPTED, INTERRUPTED, NOT_STARTED = (
    "done", "skipped", "failed", "preempted", "interrupted", "not_started")
STATUS_TEXT = {DONE: "done", SKIPPED: "skipped (already finished)", FAILED: "failed", PREEMPTED: "preempted",
               INTERRUPTED: "interrupted", NOT_STARTED: "not started"}

TOP_KEYS = ("defaults", "jobs")
DEFAULT_KEYS = ("config", "overrides", "launcher", "signal_to")
JOB_KEYS = ("name", *DEFAULT_KEYS)
SIGNAL_TO = ("auto", "launcher", "workers")

TRAIN_SCRIPT = Path(__file__).resolve().with_name("train.py")
# Launchers that run the ranks as child processes of an agent that must not be signalled
# itself: torchrun's agent turns SIGTERM into "SIGTERM the workers, SIGKILL them after 30 s"
# and dies on SIGUSR1, so the batch signals the workers (its direct children) instead.
AGENT_PROGRAMS = {"accelerate", "accelerate-launch", "torchrun"}
AGENT_MODULES = {"accelerate.commands.launch", "torch.distributed.run", "torch.distributed.launch"}

POLL_S = 0.5  # how often a waiting batch looks for workers that appeared after a signal


# ---------------------------------------------------------------------------------------------
# JOBS.yaml

@dataclass(frozen=True)
class Job:
    """One validated job: what to run and the resolved run config it trains with."""

    name: str
    config: str | None
    overrides: list[str]
    launcher: list[str] | None
    signal_to: str
    """``launcher``: signal the process the batch started; ``workers``: signal its children."""
    cfg: Config

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    def command(self) -> list[str]:
        """The train command line; re-running it resumes the job."""
        head = self.launcher + [str(TRAIN_SCRIPT)] if self.launcher else \
            [sys.executable, "-m", "critic_pretrain.cli", "train"]
        return [*head, *(["--config", self.config] if self.config else []), *self.overrides]


def load_jobs(path: str | os.PathLike) -> list[Job]:
    """Read and validate JOBS.yaml; every problem is a one-line ``UserError`` naming the job and key."""
    doc = _read_yaml(path)
    where = str(path)
    _check_keys(doc, TOP_KEYS, where)
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"{where}: defaults must be a mapping of {', '.join(DEFAULT_KEYS)}")
    _check_defaults(defaults, f"{where}: defaults")
    raw_jobs = doc.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise UserError(f"{where}: jobs must be a non-empty list of {{name, config, overrides, launcher}} mappings")
    jobs: list[Job] = []
    first_index: dict[str, int] = {}
    for i, raw in enumerate(raw_jobs):
        job = _load_job(raw, defaults, f"{where}: jobs[{i}]", where)
        if job.name in first_index:
            raise UserError(f"{where}: job '{job.name}' appears twice (jobs[{first_index[job.name]}] and jobs[{i}]); "
                            "give each job its own name")
        first_index[job.name] = i
        jobs.append(job)
    _check_distinct_outputs(jobs, where)
    return jobs


def _read_yaml(path: str | os.PathLike) -> dict:
    return read_yaml_mapping(path, missing="jobs file not found",
                             expected="a mapping with `jobs:` (and optional `defaults:`)")


def _check_keys(mapping: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise UserError(f"{where}: unknown key '{key}'; {did_you_mean(key, allowed)}")


def _check_defaults(defaults: dict, where: str) -> None:
    """Problems in `defaults` are reported as such, not as the first job's."""
    _check_keys(defaults, DEFAULT_KEYS, where)
    _config_path(defaults.get("config"), where)
    _overrides(defaults.get("overrides"), where)
    _launcher(defaults.get("launcher"), where)
    _signal_to(defaults.get("signal_to", "auto"), where)


def _load_job(raw: Any, defaults: dict, where: str, jobs_file: str) -> Job:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with name and optional config, overrides, launcher; got {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        if "name" not in raw:  # a misspelt `name:` is the likelier cause than a missing one
            _check_keys(raw, JOB_KEYS, where)
        raise UserError(f"{where}: missing key 'name' (a non-empty string naming the job)")
    where = f"{jobs_file}: job '{name}'"
    _check_keys(raw, JOB_KEYS, where)

    # A job's config, launcher and signal_to replace the defaults'; overrides add to them.
    config = _config_path(raw["config"] if "config" in raw else defaults.get("config"), where)
    overrides = [*_overrides(defaults.get("overrides"), where), *_overrides(raw.get("overrides"), where)]
    launcher = _launcher(raw["launcher"] if "launcher" in raw else defaults.get("launcher"), where)
    signal_to = _signal_to(raw["signal_to"] if "signal_to" in raw else defaults.get("signal_to", "auto"), where)
    if signal_to == "auto":
        signal_to = "workers" if launcher and spawns_workers(launcher) else "launcher"
    try:
        cfg = load_config(config, overrides)  # resolves and checks the config without running anything
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    if not _sets_output_dir(config, overrides):
        raise UserError(f"{where}: no output_dir; set it in the job's config or add "
                        f"output_dir=runs/{name} to its overrides (each job needs its own folder)")
    return Job(name=name, config=config, overrides=overrides, launcher=launcher, signal_to=signal_to, cfg=cfg)


def _config_path(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UserError(f"{where}: config must be a path to a run config YAML, got {value!r}")
    try:
        return str(find_config(value))  # a file, or a bundled config's name (`demo`)
    except UserError:
        raise UserError(f"{where}: config {value} not found (paths are relative to the current directory; "
                        f"bundled configs: {', '.join(bundled_config_names())})") from None


def _signal_to(value: Any, where: str) -> str:
    if value not in SIGNAL_TO:
        raise UserError(f"{where}: signal_to is {value!r}; use one of: {', '.join(SIGNAL_TO)}")
    return value


def _overrides(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: overrides must be a list of key=value strings, e.g. [train.max_steps=100]")
    return value


def _launcher(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = shlex.split(value)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise UserError(f"{where}: launcher must be a non-empty command prefix, e.g. "
                        "[accelerate, launch, --config_file, configs/accelerate/ddp.yaml]")
    return value


def _sets_output_dir(config: str | None, overrides: list[str]) -> bool:
    """Whether output_dir is given explicitly (Config's default `runs/default` would make jobs collide)."""
    if any(o.partition("=")[0].strip() == "output_dir" for o in overrides):
        return True
    if config is None:
        return False
    raw = yaml.safe_load(Path(config).read_text()) or {}  # load_config already proved it a valid mapping
    return bool(raw.get("output_dir"))


def _check_distinct_outputs(jobs: list[Job], where: str) -> None:
    owner: dict[Path, str] = {}
    for job in jobs:
        key = job.output_dir.resolve()
        if key in owner:
            raise UserError(f"{where}: jobs '{owner[key]}' and '{job.name}' both write to {job.cfg.output_dir}; "
                            "give each job its own output_dir")
        owner[key] = job.name


def spawns_workers(launcher: list[str]) -> bool:
    """Whether ``launcher`` is a torchrun-style agent whose children are the training ranks."""
    if Path(launcher[0]).name in AGENT_PROGRAMS:
        return True
    return any(a == "-m" and b in AGENT_MODULES for a, b in zip(launcher, launcher[1:]))


# ---------------------------------------------------------------------------------------------
# What a job's output_dir holds

@dataclass(frozen=True)
class JobState:
    """A job's newest complete checkpoint, and whether re-running it would have nothing to do."""

    step: int | None
    finished: bool
    stopped_early: str | None


def job_state(job: Job) -> JobState:
    """Finished: a complete ``step_<n>`` with n >= ``train.max_steps``, or an early stop by
    ``train.stop_when`` recorded in the newest checkpoint while the job still has the rule
    (train.py continues to max_steps when the rule is removed)."""
    if not job.output_dir.is_dir():  # nothing to inspect: spare --dry-run and fresh batches the torch import
        return JobState(None, False, None)
    from . import checkpoint as ckpt

    found = ckpt.find_checkpoints(job.output_dir)
    if not found:
        return JobState(None, False, None)
    step = max(found)
    stopped = _stopped_early(ckpt.StepPaths(found[step]))
    finished = step >= job.cfg.train.max_steps or (stopped is not None and job.cfg.train.stop_when.metric is not None)
    return JobState(step, finished, stopped)


def _stopped_early(paths: StepPaths) -> str | None:
    try:
        return (paths.read_resume_state() or {}).get("progress", {}).get("stopped_early")
    except AttributeError:  # a foreign state.json of another shape
        return None


def val_results(job: Job, step: int | None) -> tuple[float | None, float | None]:
    """(best val loss, final val explained variance) up to the checkpoint at ``step``.

    From metrics.jsonl (every evaluation; records a crashed run wrote after its last save are
    ignored, as a resume drops them), else from the checkpoint's training_info.json.
    """
    if step is None:
        return None, None
    from . import checkpoint as ckpt
    from .metrics import read_metrics

    path = job.output_dir / "metrics.jsonl"
    vals = [r for r in read_metrics(path) if "val/loss" in r and r.get("step", 0) <= step] if path.is_file() else []
    if vals:
        top = best(((r["step"], r.get("val/loss")) for r in vals), "val/loss")
        ev = vals[-1].get("val/explained_variance")
        return (top[1] if top else None), (ev if _finite(ev) else None)
    try:
        info = json.loads(ckpt.StepPaths(job.output_dir / f"step_{step}").training_info.read_text())
    except (OSError, ValueError):
        return None, None
    loss, ev = info.get("val:loss"), info.get("val:explained_variance")
    return (loss if _finite(loss) else None), (ev if _finite(ev) else None)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------------------------------------
# Signals

class SignalForwarder:
    """SIGTERM / SIGUSR1 / SIGINT to the batch: remember it and pass SIGTERM to the running job.

    SIGTERM whatever arrived: train.py treats SIGTERM and SIGUSR1 alike, and torchrun-style
    agents handle SIGTERM but die on SIGUSR1. The handler only records the signal and sends
    ``os.kill``; printing happens in the main loop (a handler that prints can hit a reentrant
    write on stdout). A second SIGINT gives up waiting (KeyboardInterrupt).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._proc: subprocess.Popen | None = None
        self._mode = "launcher"
        self._sent: set[int] = set()

    def __enter__(self) -> "SignalForwarder":
        self._old = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signum
        self.forward()

    def watch(self, proc: subprocess.Popen | None, mode: str = "launcher") -> None:
        """The job the next signal goes to (None between jobs)."""
        self._proc, self._mode, self._sent = proc, mode, set()
        self.forward()  # a signal that arrived while the job was being started

    def forward(self) -> None:
        """SIGTERM to the job's target processes not yet signalled (workers may appear late)."""
        proc = self._proc
        if self.received is None or proc is None or proc.returncode is not None:
            return
        targets = [proc.pid] if self._mode == "launcher" else child_pids(proc.pid)
        for pid in targets:
            if pid not in self._sent:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                self._sent.add(pid)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended while we looked
            continue
        if len(fields) > 1 and int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


# ---------------------------------------------------------------------------------------------
# Running

@dataclass
class JobResult:
    """One row of the summary (batch_summary.json and the table)."""

    name: str
    output_dir: str
    status: str = NOT_STARTED
    exit_code: int | None = None
    start_step: int | None = None
    final_step: int | None = None
    max_steps: int = 0
    stopped_early: str | None = None
    best_val_loss: float | None = None
    final_val_explained_variance: float | None = None
    wall_s: float = 0.0
    command: list[str] = field(default_factory=list)
    reason: str | None = None
    """A failed job's own one-line error (the last ``error: ...`` line it printed)."""

    @property
    def status_text(self) -> str:
        text = STATUS_TEXT[self.status]
        if self.exit_code not in (None, 0) and self.status in (FAILED, DONE):
            text += f" ({_describe_exit(self.exit_code)})"
        return text


def run_jobs(jobs: list[Job], *, fail_fast: bool, summary_path: Path, jobs_file: str) -> int:
    """Run ``jobs`` in order; write the summary after each job and at the end; return the exit code."""
    results = [JobResult(j.name, str(j.output_dir.resolve()), max_steps=j.cfg.train.max_steps, command=j.command())
               for j in jobs]
    started_at = _now()
    with SignalForwarder() as fwd:
        for i, (job, res) in enumerate(zip(jobs, results)):
            if fwd.received is not None:
                break
            state = job_state(job)
            if state.finished:
                res.status = SKIPPED
                say(f"({i + 1}/{len(jobs)}) {job.name}: skipped, already finished at step_{state.step}"
                     + (f" (stopped early: {state.stopped_early})" if state.stopped_early else ""))
                continue
            res.start_step = state.step
            say(f"({i + 1}/{len(jobs)}) {job.name}: "
                 + (f"resuming from step_{state.step}" if state.step is not None else "starting")
                 + f" -> {job.output_dir}\n  $ {shlex.join(res.command)}")
            res.status, res.exit_code, res.wall_s, res.reason = run_one(job, fwd)
            say(f"{job.name}: {res.status_text} after {_duration(res.wall_s)}" + (
                " (it exited 0 without finishing, as train does when signalled itself)"
                if res.status == PREEMPTED and fwd.received is None else ""))
            _fill_results(jobs, results)
            write_summary(summary_path, jobs_file, results, started_at, exit_code=None)
            if res.status in (PREEMPTED, INTERRUPTED):
                break
            if res.status == FAILED and fail_fast:
                say("--fail-fast: not starting the remaining jobs")
                break
        if fwd.received is not None:
            say(f"received {fwd.name}: no further job starts")
    _fill_results(jobs, results)
    code = exit_code(results, fwd.received)
    write_summary(summary_path, jobs_file, results, started_at, exit_code=code)
    print(format_table(results), flush=True)
    for r in results:
        if r.reason:
            print(f"{r.name}: {r.reason}", flush=True)
    say(f"summary: {summary_path}; exit code {code}" + (
        " (preempted: re-run the same command to continue)" if code == EXIT_PREEMPTED else ""))
    return code


def run_one(job: Job, fwd: SignalForwarder) -> tuple[str, int, float, str | None]:
    """Run one job to its exit; (status, exit code, seconds, its last ``error:`` line if it failed)."""
    t0 = time.monotonic()
    try:  # stdout is inherited; stderr passes through a tee that keeps the job's error line
        proc = subprocess.Popen(job.command(), stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    except OSError as e:  # e.g. the launcher's program is not installed
        reason = f"cannot start {job.command()[0]}: {e.strerror or e}"
        say(f"{job.name}: {reason}")
        return FAILED, 127, time.monotonic() - t0, reason
    errors: list[str] = []
    tee = threading.Thread(target=_tee, args=(proc.stderr, errors), daemon=True)
    tee.start()
    fwd.watch(proc, job.signal_to)
    try:
        while True:
            try:
                rc = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                fwd.forward()  # after a signal: workers a launcher started since then
    finally:
        fwd.watch(None)
    tee.join(timeout=10)
    status = classify(job, rc, fwd.received)
    return status, rc, time.monotonic() - t0, (errors[-1] if errors else None) if status == FAILED else None


def _tee(stream, errors: list[str]) -> None:
    """Copy a job's stderr to ours line by line; remember its ``error: ...`` lines."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.startswith("error: "):
            errors.append(line[len("error: "):].strip())


def classify(job: Job, rc: int, received: int | None) -> str:
    """A job's status from its output_dir after it exited, not from the exit code alone: a job
    that finished is done even if a signal came during its last save, and a launcher may exit
    non-zero after its workers saved on a forwarded signal."""
    if job_state(job).finished:
        return DONE
    if received is not None:
        return INTERRUPTED if received == signal.SIGINT else PREEMPTED
    if rc in (0, EXIT_PREEMPTED):
        # Unfinished and saved: train.py exits 75 when it was signalled itself (SLURM signals
        # every process of a job on preemption), a launcher may report 0. Stop like a preempted batch.
        return PREEMPTED
    if rc == 130:  # Ctrl-C reached the job (the terminal signals the whole process group)
        return INTERRUPTED
    return FAILED


def exit_code(results: list[JobResult], received: int | None) -> int:
    """75 (or 130 for SIGINT) when a signal left jobs unfinished, else 1 if any job failed, else 0."""
    statuses = {r.status for r in results}
    stopped = received is not None or PREEMPTED in statuses or INTERRUPTED in statuses
    if stopped and statuses & {PREEMPTED, INTERRUPTED, NOT_STARTED}:
        return EXIT_INTERRUPTED if received == signal.SIGINT or INTERRUPTED in statuses else EXIT_PREEMPTED
    return EXIT_FAILED if FAILED in statuses else EXIT_OK


def _fill_results(jobs: list[Job], results: list[JobResult]) -> None:
    """Final step and validation numbers of every job, run or not, from its output_dir."""
    for job, res in zip(jobs, results):
        state = job_state(job)
        res.final_step, res.stopped_early = state.step, state.stopped_early
        res.best_val_loss, res.final_val_explained_variance = val_results(job, state.step)


# ---------------------------------------------------------------------------------------------
# Reporting

def write_summary(path: Path, jobs_file: str, results: list[JobResult], started_at: str,
                  exit_code: int | None) -> None:
    """batch_summary.json, replaced atomically (a reader never sees half a file)."""
    doc = {"jobs_file": str(Path(jobs_file).resolve()), "started_at": started_at,
           "finished_at": _now() if exit_code is not None else None, "exit_code": exit_code,
           "jobs": [{**dataclasses.asdict(r), "status_text": r.status_text} for r in results]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_json(path, doc)


def format_table(results: list[JobResult]) -> str:
    head = ("job", "status", "step", "best val loss", "final val EV", "wall")
    rows = [(r.name, r.status_text, f"{r.final_step if r.final_step is not None else '-'}/{r.max_steps}",
             _num(r.best_val_loss), _num(r.final_val_explained_variance),
             _duration(r.wall_s) if r.status not in (SKIPPED, NOT_STARTED) else "-") for r in results]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return f"{v:.4g}" if v is not None else "-"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(round(s)), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m{s:02d}s"


def _describe_exit(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-rc).name}"
    return f"exit {rc}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def say(msg: str) -> None:
    print(f"[batch] {msg}", flush=True)


if __name__ == "__main__":
    from critic_pretrain.cli import main as cli_main
    sys.exit(cli_main(["batch", *sys.argv[1:]]))
