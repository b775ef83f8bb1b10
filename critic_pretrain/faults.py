"""Fault injection, for the test suite and ``bench/fault_matrix.py``: one hook, ``hit(point, step)``.

Set by the environment of the process under test (unset: ``hit`` returns after two dict
lookups, so the hook costs nothing in a real run):

- ``CRITIC_PRETRAIN_FAULT=<point>@<step>``: die at that point as kill -9 would (exit 137, no
  cleanup, no ``finally``);
- ``CRITIC_PRETRAIN_FAULT=enospc@<step>``: the save of that step fails on rank 0 (the rank that
  writes the weights) as on a full disk, after its weights are written;
- ``CRITIC_PRETRAIN_SIGNAL_AT_STEP=<step>``: after that optimizer step the process sends itself
  ``CRITIC_PRETRAIN_SIGNAL`` (TERM by default; INT, USR1) through the real handlers.

Points, in the order a step meets them: ``in_step`` (after the optimizer step, before logging
and saving; train.py), ``after_weights``, ``after_optimizer``, ``before_manifest``,
``before_rename`` (a save; checkpoint.py) and ``retention`` (deleting an old step).
"""

from __future__ import annotations

import errno
import os
import signal

FAULT_ENV = "CRITIC_PRETRAIN_FAULT"
SIGNAL_AT_ENV = "CRITIC_PRETRAIN_SIGNAL_AT_STEP"
SIGNAL_ENV = "CRITIC_PRETRAIN_SIGNAL"
POINTS = ("in_step", "after_weights", "after_optimizer", "before_manifest", "before_rename", "retention")


def hit(point: str, step: int) -> None:
    fault, signal_at = os.environ.get(FAULT_ENV), os.environ.get(SIGNAL_AT_ENV)
    if fault is None and signal_at is None:
        return
    if point == "in_step" and signal_at == str(step):
        os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get(SIGNAL_ENV, "TERM")))
    if fault == f"{point}@{step}":
        os._exit(137)
    if fault == f"enospc@{step}" and point == "after_weights" and os.environ.get("RANK", "0") == "0":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
