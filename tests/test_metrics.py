"""metrics.py: progress without a terminal is log lines (no carriage-return redraws)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

from conftest import ROOT, tiny_overrides

from critic_pretrain.metrics import LogProgress, progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_log_progress_writes_a_line_every_interval_with_eta(caplog):
    clock = Clock()
    bar = LogProgress(start=100, total=600, every_s=30, clock=clock)
    with caplog.at_level(logging.INFO, logger="critic_pretrain.progress"):
        for _ in range(50):  # 50 steps in 25 s: no line yet
            clock.t += 0.5
            bar.update(1)
        assert caplog.messages == []
        bar.set_postfix(loss="0.12", ev="0.500")
        for _ in range(20):  # crosses 30 s: one line
            clock.t += 0.5
            bar.update(1)
        # the numbers are the last train record's, from step 150: a line between log steps says so
        assert caplog.messages == ["step 160/600 (27%)  loss=0.12  ev=0.500  (logged at step 150)  2 steps/s  "
                                   "ETA 3m40s"]
        for _ in range(10):
            clock.t += 0.5
            bar.update(1)
        bar.set_postfix(loss="0.11", ev="0.520")
        bar.close()
        assert caplog.messages[-1].startswith("step 180/600 (30%)  loss=0.11  ev=0.520  2 steps/s")
        bar.close()  # nothing new: no repeated line
        assert len(caplog.messages) == 2


def test_progress_is_a_bar_only_in_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(progress(True, 0, 10, stream=io.StringIO()), LogProgress)
    assert not isinstance(progress(True, 0, 10, stream=Tty()), LogProgress)
    assert not isinstance(progress(False, 0, 10, stream=io.StringIO()), LogProgress)


def test_a_run_logged_to_a_file_has_no_redraws(toy_data, tmp_path):
    """`critic-pretrain train ... > log`: progress lines, no carriage returns."""
    log_file = tmp_path / "log.txt"
    with log_file.open("w") as f:
        rc = subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "train",
                             *tiny_overrides(tmp_path / "run", toy_data, **{"train.progress": True,
                                                                            "train.progress_every_s": 0})],
                            stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    text = log_file.read_text()
    assert rc == 0, text[-2000:]
    assert "\r" not in text
    assert "step 12/12 (100%)" in text and "done" in text


def test_no_hub_progress_bars_in_a_log_file(monkeypatch, capsys):
    """transformers' "Loading weights" bar wrote its redraws into non-terminal logs (a new user's
    SLURM-style log): the CLI turns the hub's bars off when stderr is not a terminal, and only then."""
    from critic_pretrain.cli import main

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stderr, off in ((io.StringIO(), True), (Tty(), False)):
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
        monkeypatch.setattr(sys, "stderr", stderr)
        assert main(["rollouts", "schema"]) == 0
        assert (os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1") is off
