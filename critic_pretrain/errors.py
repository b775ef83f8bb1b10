"""Errors that reach the user as one line (the CLI prints ``error: <message>``, exit code 2)."""

from rollouts.errors import RolloutError


class UserError(Exception):
    """Bad input, configuration or checkpoint: the message says what is wrong and what to do."""


USER_ERRORS = (UserError, RolloutError)
