"""``critic-pretrain batch JOBS.yaml``: argparse and printing over ``critic_pretrain.jobs``."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, UserError
from ..jobs import (
    Job,
    job_state,
    load_jobs,
    run_jobs,
    say,
)
from ..jobs import __doc__ as JOBS_DOC


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="critic-pretrain batch", description=JOBS_DOC, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"exit codes: {EXIT_OK} all jobs done or skipped; {EXIT_FAILED} a job failed; {EXIT_USAGE} invalid "
               f"JOBS.yaml or arguments; {EXIT_PREEMPTED} preempted (SIGTERM/SIGUSR1): re-run the same command; "
               f"{EXIT_INTERRUPTED} interrupted (SIGINT)")
    p.add_argument("jobs", metavar="JOBS.yaml", help="jobs file: defaults + jobs (docs/batch.md)")
    p.add_argument("--dry-run", action="store_true", help="validate and show what would run, skip or resume")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these jobs (in the file's order)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed job")
    p.add_argument("--summary", metavar="PATH",
                   help="where to write the JSON summary (default: batch_summary.json next to JOBS.yaml)")
    return p.parse_args(argv)


def select(jobs: list[Job], only: list[str] | None, jobs_file: str) -> list[Job]:
    if not only:
        return jobs
    names = [j.name for j in jobs]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise UserError(f"--only {' '.join(unknown)}: no such job in {jobs_file} (jobs: {', '.join(names)})")
    return [j for j in jobs if j.name in only]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = select(load_jobs(args.jobs), args.only, args.jobs)  # a UserError exits EXIT_USAGE (2)
    if args.dry_run:
        dry_run(jobs)
        return EXIT_OK
    summary = Path(args.summary) if args.summary else default_summary(args.jobs)
    say(f"{len(jobs)} job(s) from {args.jobs}: {', '.join(j.name for j in jobs)}")
    return run_jobs(jobs, fail_fast=args.fail_fast, summary_path=summary, jobs_file=args.jobs)


def default_summary(jobs_file: str) -> Path:
    """``batch_summary.json`` next to the jobs file, unless it holds another jobs file's summary:
    two JOBS files in one folder would overwrite each other's record, so that is refused."""
    path = Path(jobs_file).resolve().parent / "batch_summary.json"
    try:
        other = json.loads(path.read_text()).get("jobs_file")
    except (OSError, ValueError, AttributeError):
        return path  # none yet, or not ours to read: written afresh
    if other and Path(other) != Path(jobs_file).resolve():
        raise UserError(f"{path} holds the summary of another jobs file ({other}); pass --summary PATH for "
                        f"{jobs_file}, e.g. --summary {path.with_name(Path(jobs_file).stem + '_summary.json')}")
    return path


def dry_run(jobs: list[Job]) -> None:
    """What a real run would do, without running anything; rollouts a job names that cannot be
    found are listed under it and end the dry run with an error (else a typo in one job's
    data.train shows only when that job starts, maybe hours into the batch)."""
    missing = []
    for i, job in enumerate(jobs):
        state = job_state(job)
        action = (f"skip (finished at step_{state.step})" if state.finished else
                  f"resume from step_{state.step}" if state.step is not None else "start")
        print(f"({i + 1}/{len(jobs)}) {job.name}: {action} -> {job.output_dir}  "
              f"[max_steps {job.cfg.train.max_steps}, signal to {job.signal_to}]\n  $ {shlex.join(job.command())}")
        for problem in unreadable_rollouts(job) if not state.finished else []:
            print(f"  ! {problem}")
            missing.append(job.name)
    if missing:
        raise UserError(f"job(s) {', '.join(dict.fromkeys(missing))} name rollouts that cannot be found (listed above, "
                        "marked !): fix their paths before the batch runs")


def unreadable_rollouts(job: Job) -> list[str]:
    """One line per rollout spec of the job's data.train / data.sources / data.val that names no
    file (the check training does first; torch-free). ``builtin:`` specs resolve inside the package."""
    from rollouts.errors import RolloutError
    from rollouts.paths import resolve

    data = job.cfg.data
    specs = [(f"data.{src.name or 'sources'}", p) for src in data.all_sources() for p in src.paths]
    specs += [("data.val", p) for p in data.val or []]
    out = []
    for key, spec in specs:
        try:
            resolve([spec])
        except RolloutError as e:
            out.append(f"{key}: {e}")
    return out
