"""Preemption and Ctrl-C: a signal asks the training loop to save at the next step boundary."""

from __future__ import annotations

import logging
import signal

from critic_pretrain.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED

log = logging.getLogger("critic_pretrain")


class Preemption:
    """SIGTERM / SIGUSR1 (cluster preemption) and Ctrl-C -> save at the next step boundary and
    exit with ``exit_code``. A second Ctrl-C aborts at once (KeyboardInterrupt).

    A context manager: the previous handlers come back when training ends.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.exit_code = 0

    def __enter__(self) -> "Preemption":
        self._old = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.exit_code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, no save
        self.requested = True
        self.exit_code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED
        log.warning("received %s: will save at the end of this step and exit%s", signal.Signals(signum).name,
                    " (Ctrl-C again to abort without saving)" if signum == signal.SIGINT else "")
