"""One-line, actionable problems with rollout data."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


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


class RolloutError(ValueError):
    """Bad rollout data. ``str(err)`` is a single line naming file, row and column."""

    def __init__(self, problem: Problem | str):
        self.problem = problem if isinstance(problem, Problem) else None
        super().__init__(problem.line() if isinstance(problem, Problem) else problem)
