"""The README's fault matrix, run: every fault costs at most the steps since the last save,
signals cost none, every resumed run ends bit-identical to an uninterrupted one, and a planted
pickle runs nothing."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import fault_matrix as fm  # noqa: E402


@pytest.mark.slow
def test_fault_matrix(tmp_path):
    outcomes = {o.scenario: o for o in fm.run_matrix(fm.toy_rollouts(tmp_path / "data"), tmp_path)}
    print("\n" + fm.markdown(list(outcomes.values())))
    planted = outcomes.pop("planted pickle in the optimizer metadata, checksums matching")
    assert planted.resumed_from is None and planted.note.startswith("nothing ran")
    assert not (tmp_path / "pickle_ran").exists()
    busy = outcomes.pop("second run started on a busy output_dir")
    assert busy.fault_exit == 2
    for name, o in outcomes.items():
        assert o.exact is True, (name, o)
        assert 0 <= o.lost <= fm.SAVE_EVERY, (name, o)
    for name in ("SIGTERM / SIGUSR1 (preemption) at step 5", "Ctrl-C at step 5",
                 "kill -9 while retention deletes an old step (keep_last=1)"):
        assert outcomes[name].lost == 0, name
    assert outcomes["SIGTERM / SIGUSR1 (preemption) at step 5"].fault_exit == 75
    assert outcomes["Ctrl-C at step 5"].fault_exit == 130
    assert outcomes["kill -9 mid-step (after step 5)"].fault_exit == 137
