"""A critic that collapses to a constant is caught: ``CollapseWatch`` on validation records, and the
training loop's stop before the collapsed step is saved (``train.on_collapse``). A critic that
over-trains (its validation EV falls far from its best) is named once: ``OvertrainWatch``."""

from __future__ import annotations

import json

import pytest

from critic_pretrain.metrics import CollapseWatch, OvertrainWatch


def rec(step: int, std: float, spread: float = 0.4, ev: float = 0.3) -> dict:
    return {"step": step, "val/value_std": std, "val/target_std": spread, "val/explained_variance": ev}


def test_a_critic_that_learned_and_lost_its_spread_is_a_collapse():
    watch = CollapseWatch()
    assert watch.update(rec(0, 0.001, ev=0.0), 0) is None        # a fresh head starts flat: not a collapse
    assert watch.update(rec(50, 0.15), 50) is None                 # learned: 37% of the targets' spread
    assert watch.update(rec(100, 0.05), 100) is None               # lower, still 12%
    said = watch.update(rec(150, 0.004, ev=0.001), 150)
    assert said.startswith("the critic collapsed to a near-constant value at step 150")
    assert "1.0% of the targets' spread" in said and "at step 50 it was 37.5%" in said


def test_a_critic_that_never_learned_or_has_no_spread_to_learn_is_not_a_collapse():
    watch = CollapseWatch()
    for step in range(0, 500, 50):  # flat throughout: EV and the docs flag this, the watch does not
        assert watch.update(rec(step, 0.01), step) is None
    watch = CollapseWatch()
    assert watch.update(rec(0, 0.2), 0) is None
    assert watch.update(rec(50, 0.0, spread=0.0), 50) is None      # targets without spread: nothing to say
    assert watch.update({"step": 60, "val/loss": 0.1}, 60) is None  # no spread logged (older runs)


def test_a_random_heads_spread_shrinking_early_is_not_a_collapse():
    """The demo at 60 steps: a random head spreads 29% at step 0 (EV -0.09), then moves to the mean
    return (2.6% at step 30, EV 0.01) before it learns; that is early training, not a collapse."""
    watch = CollapseWatch()
    assert watch.update(rec(0, 0.143, spread=0.4956, ev=-0.095), 0) is None
    assert watch.update(rec(30, 0.0130, spread=0.4956, ev=0.014), 30) is None
    assert watch.update(rec(60, 0.15, spread=0.4956, ev=0.3), 60) is None      # it learned
    assert watch.update(rec(90, 0.005, spread=0.4956, ev=0.0), 90) is not None   # and then collapsed


def test_a_transient_dip_before_the_critic_learned_is_not_a_collapse():
    """A trial's demo run with eval.every=20: 21% of the spread at EV 0.048, then 4.6% at step 40,
    was stopped as collapsed; at EV that low nothing was learned to lose."""
    watch = CollapseWatch()
    assert watch.update(rec(0, 0.143, spread=0.4956, ev=-0.095), 0) is None
    assert watch.update(rec(20, 0.104, spread=0.4956, ev=0.048), 20) is None
    assert watch.update(rec(40, 0.0230, spread=0.4956, ev=0.025), 40) is None


def test_a_resumed_run_remembers_the_peak(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [rec(0, 0.0), rec(50, 0.2), rec(100, 0.01)]))
    watch = CollapseWatch()
    watch.replay(path, upto=50)
    assert watch.peak == pytest.approx(0.5) and watch.peak_step == 50
    assert watch.update(rec(100, 0.01), 100) is not None


def collapsing_evaluate(monkeypatch, at_call: int):
    """The real evaluation, with the values' spread set to 50% of the targets' at the second
    evaluation (the critic learned) and to 0.1% from ``at_call`` on (it collapsed)."""
    import critic_pretrain.train as train

    real, calls = train.evaluate, []

    def evaluate(*args, **kwargs):
        out = dict(real(*args, **kwargs))
        calls.append(len(calls))
        share = 0.001 if len(calls) - 1 >= at_call else 0.5 if len(calls) - 1 >= 1 else 0.0
        out["val/value_std"] = share * out["val/target_std"]
        if share == 0.5:  # the spread of a critic that learned (its EV too: a tiny run's own is near 0)
            out["val/explained_variance"] = 0.5
        return out

    monkeypatch.setattr(train, "evaluate", evaluate)
    return calls


def test_training_stops_before_saving_a_collapsed_critic(tmp_path, toy_data, monkeypatch, capfd):
    from conftest import tiny_overrides, train_main

    from critic_pretrain.checkpoint import find_checkpoints

    collapsing_evaluate(monkeypatch, at_call=2)  # evaluations at steps 0, 4, 8: collapsed at 8
    out = tmp_path / "run"
    code = train_main(tiny_overrides(out, toy_data, **{"eval.every": 4, "train.max_steps": 12}))
    assert code == 1
    assert sorted(find_checkpoints(out)) == [4]  # step 8 was never written
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "collapsed to a near-constant value at step 8" in said[0]
    assert "step_4 is intact" in said[0] and "optim.lr" in said[0]


def test_on_collapse_warn_logs_a_line_per_evaluation_and_finishes(tmp_path, toy_data, monkeypatch, capfd):
    from conftest import tiny_overrides, train_main

    from critic_pretrain.checkpoint import find_checkpoints

    collapsing_evaluate(monkeypatch, at_call=2)
    out = tmp_path / "run"
    code = train_main(tiny_overrides(out, toy_data, **{"eval.every": 4, "train.max_steps": 12,
                                                        "train.on_collapse": "warn"}))
    assert code == 0 and sorted(find_checkpoints(out)) == [4, 8, 12]
    warned = [line for line in capfd.readouterr().err.splitlines() if "WARNING the critic collapsed" in line]
    assert len(warned) == 2 and "at step 8" in warned[0] and "going on" in warned[0]  # steps 8 and 12


def ev(step: int, value: float) -> dict:
    return {"step": step, "val/explained_variance": value, "val/loss": 0.2}


def test_a_critic_that_learned_and_then_lost_it_on_validation_is_over_training_said_once():
    """The short undo of session seventeen: val EV 0.39 at step 250, then below half of it."""
    watch = OvertrainWatch()
    said = [watch.update(ev(s, v), s) for s, v in [(0, -0.09), (50, 0.29), (250, 0.386), (300, 0.30), (450, 0.19),
                                                   (500, 0.11), (550, 0.25), (600, 0.12), (650, 0.10)]]
    assert said[:8] == [None] * 8  # 450, 500 below half (0.193), 550 above: the count starts again
    assert said[8] is None  # 600, 650: two in a row
    assert watch.update(ev(700, 0.083), 700) == (
        "over-training: the critic's val/explained_variance fell from 0.386 at step 250 to "
        "0.083 at step 700, below half its best for 3 evaluations in a row (it memorises its training rollouts)")
    assert watch.update(ev(750, 0.05), 750) is None  # once


def test_noise_below_a_learned_critic_and_an_unlearned_one_are_not_over_training():
    watch = OvertrainWatch()  # a plateau's noise: the best EV is under LEARNED (0.2)
    assert all(watch.update(ev(s, v), s) is None for s, v in enumerate([0.18, 0.0, 0.01, -0.02, 0.0, 0.01], 1))
    watch = OvertrainWatch()  # a random head at step 0 is not a best; a learned critic's noise is not a fall
    assert all(watch.update(ev(s, v), s) is None for s, v in [(0, 0.9), (50, 0.3), (100, 0.26), (150, 0.31),
                                                              (200, 0.27), (250, 0.33), (300, 0.29)])
    assert watch.update({"step": 350, "val/loss": 0.2}, 350) is None  # no EV logged


def test_a_resumed_run_remembers_the_best_ev_and_does_not_repeat_the_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [ev(0, 0.0), ev(50, 0.4), ev(100, 0.1), ev(150, 0.1)]))
    watch = OvertrainWatch()
    watch.replay(path, upto=150)
    assert (watch.best, watch.best_step, watch.below) == (0.4, 50, 2)
    assert watch.update(ev(200, 0.1), 200) is not None
    fired = OvertrainWatch()  # the warning was given before the resume: not again
    path.write_text("".join(json.dumps(r) + "\n" for r in [ev(50, 0.4), ev(100, 0.1), ev(150, 0.1), ev(200, 0.1),
                                                           ev(250, 0.1)]))
    fired.replay(path, upto=200)
    assert fired.fired and fired.update(ev(250, 0.1), 250) is None and fired.update(ev(300, 0.05), 300) is None
    later = OvertrainWatch()  # records after the resumed step are not replayed
    later.replay(path, upto=100)
    assert (later.best, later.below, later.fired) == (0.4, 1, False)
    watch = OvertrainWatch()
    watch.replay(path.parent / "absent.jsonl", upto=150)  # a run without metrics yet
    assert watch.best_step is None


@pytest.mark.parametrize(("save_every", "keep_last", "said"), [(2, 10, "step_2 is on disk"),
                                                               (4, 1, "step_2 is not on disk")])
def test_training_warns_once_when_the_validation_ev_falls_from_its_best(tmp_path, toy_data, monkeypatch, capfd,
                                                                        save_every, keep_last, said):
    """The real evaluation with val EV set to 0.5 at step 2 and 0.1 after it: the warning names the
    best step, says whether it is on disk (saved every 2 steps and kept; or saved every 4, so
    step_2 never was) and the run finishes."""
    from conftest import tiny_overrides, train_main

    import critic_pretrain.train as train

    real, calls = train.evaluate, []

    def evaluate(*args, **kwargs):
        out = dict(real(*args, **kwargs))
        calls.append(len(calls))
        out["val/explained_variance"] = 0.0 if len(calls) == 1 else 0.5 if len(calls) == 2 else 0.1
        return out

    monkeypatch.setattr(train, "evaluate", evaluate)
    out = tmp_path / "run"
    code = train_main(tiny_overrides(out, toy_data, **{"eval.every": 2, "train.max_steps": 12,
                                                        "checkpoint.save_every": save_every,
                                                        "checkpoint.keep_last": keep_last}))
    assert code == 0 and len(calls) == 7  # steps 0, 2, ..., 12
    warned = [line for line in capfd.readouterr().err.splitlines() if "over-training:" in line]
    assert len(warned) == 1, warned
    assert "fell from 0.500 at step 2 to 0.100 at step 8" in warned[0] and said in warned[0]
