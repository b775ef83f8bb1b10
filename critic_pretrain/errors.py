"""Errors that reach the user as one line (the CLI prints ``error: <message>``, exit code 2).

One shape for both packages: ``UserError`` lives in the torch-free data layer
(``rollouts.errors``); bad rollout data is its subclass ``RolloutError`` (with the ``Problem``
that names file, row and column).
"""

from rollouts.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    Problem,
    RolloutError,
    UserError,
    cause,
    closest,
    did_you_mean,
    environment_error,
    first_line,
    require,
    yaml_problem,
)

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PREEMPTED", "EXIT_USAGE", "Problem", "RolloutError",
           "UserError", "cause", "closest", "did_you_mean", "environment_error", "first_line", "require",
           "yaml_problem"]
