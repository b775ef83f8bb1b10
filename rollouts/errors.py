"""Errors a user sees: one line that says what is wrong and what to do. Shared by the data
layer and the trainer (``critic_pretrain.errors`` re-exports them), and printed the same way
by the one command-line error handler (``error: <message>``, exit code 2).
"""

from __future__ import annotations

import difflib
import errno
import importlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

# The exit codes of every command of both packages (docs/batch.md). 75 is EX_TEMPFAIL from
# sysexits.h, "try again later": what SLURM requeue scripts look for.
EXIT_OK = 0
EXIT_FAILED = 1          # batch: at least one job failed (the others ran, unless --fail-fast)
EXIT_USAGE = 2           # bad input, configuration or arguments (a UserError): nothing ran or was lost
EXIT_PREEMPTED = 75      # saved and stopped on SIGTERM/SIGUSR1: re-run (requeue) the same command
EXIT_INTERRUPTED = 130   # stopped by Ctrl-C (128 + SIGINT); a run saved first unless Ctrl-C came twice


class UserError(Exception):
    """Bad input, configuration or checkpoint: the message says what is wrong and what to do.
    ``exit_code``: what the command exits with (``EXIT_USAGE``; ``EXIT_INTERRUPTED`` for an
    interrupted run)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def first_line(e: BaseException, limit: int = 240) -> str:
    """The message of ``e`` on one line, for a one-line error (a heading ending in ':' keeps
    its first detail)."""
    text = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not text:
        return type(e).__name__
    line = f"{text[0]} {text[1]}" if text[0].endswith(":") and len(text) > 1 else text[0]
    return line[:limit]


ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
"""Full disk, quota, read-only file system: the machine's state, not a bug; one line, never a
traceback, from whichever library met it."""


def cause(e: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The exception of ``kind`` behind ``e``: ``e`` itself, its cause or context, the failures a
    torch DCP ``CheckpointException`` gathers (a second Ctrl-C inside ``dcp.save``), or, for an
    OSError, safetensors' "(os error N)" text (its Rust writer raises SafetensorError)."""
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if not isinstance(x, BaseException) or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, kind):
            return x
        code = re.search(r"os error (\d+)", str(x)) if kind is OSError else None
        if code:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        stack += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            for failure in failures.values():
                stack += list(failure) if isinstance(failure, tuple) else [failure]
    return None


def environment_error(e: BaseException) -> OSError | None:
    """The full-disk, quota or read-only OSError behind ``e`` (``ENVIRONMENT_ERRNOS``), or None."""
    err = cause(e, OSError)
    return err if err is not None and err.errno in ENVIRONMENT_ERRNOS else None


def yaml_problem(e: BaseException) -> str:
    """Where and what a YAML parse error is, on one line: ``line 3, column 7: mapping values are
    not allowed here`` (PyYAML's marks count from 0; editors count lines from 1)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or first_line(e)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def require(module: str, needed_for: str, install: str | None = None):
    """``import module`` for a lazily imported package, or a one-line ``UserError`` that names
    what needs it and the ``pip install`` that brings it (docs/install.md lists them all)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{needed_for} needs the {module.partition('.')[0]} package, which is not importable "
                        f"({first_line(e)}): pip install {install or module.partition('.')[0]}") from None


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice most like ``word`` (a likely typo of it), or None."""
    close = difflib.get_close_matches(str(word), sorted({str(c) for c in choices}), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str], *, list_known: bool = True) -> str:
    """"did you mean 'x'?" for the closest choice, else "known: a, b, ..." ('' with
    ``list_known=False``)."""
    choices = sorted({str(c) for c in choices})
    close = closest(word, choices)
    if close:
        return f"did you mean '{close}'?"
    return f"known: {', '.join(choices)}" if list_known and choices else ""


@dataclass(frozen=True)
class Problem:
    """What is wrong with a file or a row, and what to do about it."""

    file: str
    row: int | None
    """0-based row within ``file``; ``None`` when the whole file is affected."""
    column: str | None
    reason: str
    fix: str
    sample_id: str | None = None
    kind: str = "invalid"
    """Short machine-readable category (``missing_column``, ``nan``, ...), used for counts."""

    def line(self) -> str:
        where = self.file
        if self.row is not None:
            where += f": row {self.row}"
            if self.sample_id is not None:
                where += f" (sample_id {self.sample_id!r})"
        if self.column is not None:
            where += f", column '{self.column}'"
        return f"{where}: {self.reason}; {self.fix}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class RolloutError(UserError, ValueError):
    """Bad rollout data. ``str(err)`` is a single line naming file, row and column."""

    def __init__(self, problem: Problem | str):
        self.problem = problem if isinstance(problem, Problem) else None
        super().__init__(problem.line() if isinstance(problem, Problem) else problem)


class Quarantine:
    """The one quarantine writer: a JSONL report, one ``Problem`` per line (``rollouts check
    --quarantine``, ``convert``, and each prepared store's ``quarantine.jsonl``). A context
    manager; with ``path=None`` it writes nothing."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self._f = None

    def __enter__(self) -> "Quarantine":
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w")
        return self

    def add(self, problem: Problem) -> None:
        if self._f is not None:
            self._f.write(problem.to_json() + "\n")

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
