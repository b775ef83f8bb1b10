"""Held-out evaluation: hand-computed metrics, buckets, calibration, and `critic-pretrain eval`."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_overrides

from critic_pretrain import cli
from critic_pretrain.eval import (
    POSITION_BUCKETS,
    TURN_BUCKETS,
    CalibrationGrid,
    calibration_table,
    eval_batches,
    finish,
    group_sums,
    merge_cells,
    n_groups,
    token_buckets,
)
from critic_pretrain.metrics import read_metrics, value_sums
from critic_pretrain.packed import PackedBatch

TINY_RUN_STEPS = 8


def tiny_run(tmp_path_factory, toy_data: Path) -> Path:
    """One tiny CPU run per test session (8 steps, evaluations at 0, 4, 8, step_4 and step_8),
    shared by the evaluate, report and notebook tests."""
    from conftest import train_main

    out = tmp_path_factory.getbasetemp() / "tiny-run"
    if not (out / f"step_{TINY_RUN_STEPS}").is_dir():
        shutil.rmtree(out, ignore_errors=True)
        overrides = tiny_overrides(out, toy_data, **{"train.max_steps": TINY_RUN_STEPS, "eval.every": 4,
                                                     "checkpoint.save_every": 4})
        assert train_main(overrides) == 0
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, toy_data) -> Path:
    return tiny_run(tmp_path_factory, toy_data)


def packed(masks: list[list[int]], targets: list[float] | None = None, values: list[float] | None = None,
           oracle: list[float] | None = None) -> tuple[PackedBatch, torch.Tensor]:
    """A hand-built packed micro-batch (one row, rollouts given by their loss masks) and values."""
    flat = [m for mask in masks for m in mask]
    n = len(flat)
    batch = PackedBatch(input_ids=torch.zeros(1, n, dtype=torch.long),
                        position_ids=torch.cat([torch.arange(len(m)) for m in masks])[None],
                        targets=torch.tensor(targets if targets is not None else [0.0] * n)[None],
                        weights=torch.tensor(flat, dtype=torch.float32)[None],
                        seq_lens=torch.tensor([len(m) for m in masks], dtype=torch.int32),
                        valid_tokens=int(sum(flat)), num_rows=len(masks),
                        oracle=torch.tensor(oracle)[None] if oracle is not None else None)
    return batch, torch.tensor(values if values is not None else [0.0] * n)[None]


def metrics_of(batch: PackedBatch, values: torch.Tensor, grid=CalibrationGrid(0.0, 1.0, cells=10)):
    return finish(group_sums(values, batch, grid.edges()), grid, has_oracle=batch.oracle is not None)


def test_loss_and_explained_variance_hand_computed():
    # Policy tokens: R = [1, 0, 1, 0], V = [0.5, 0.5, 1, 0] -> R - V = [.5, -.5, 0, 0]
    # loss = mean (R-V)^2 = 0.125; Var(R) = 0.25, Var(R-V) = 0.125 -> EV = 0.5.
    # Oracle O = [1, 0, 0.5] on the first three (NaN: unknown): O - V = [.5, -.5, -.5]
    # loss = 0.25; Var(O) = 5/12 - 1/4 = 1/6; Var(O-V) = 1/4 - 1/36 = 2/9 -> EV = 1 - 4/3 = -1/3.
    batch, values = packed([[0, 1, 1, 1, 1]], targets=[9.0, 1, 0, 1, 0], values=[7.0, 0.5, 0.5, 1, 0],
                           oracle=[math.nan, 1, 0, 0.5, math.nan])
    m = metrics_of(batch, values).metrics
    assert m["val/loss"] == pytest.approx(0.125)
    assert m["val/explained_variance"] == pytest.approx(0.5)
    assert m["val/valid_tokens"] == 4
    assert m["val/target_mean"] == pytest.approx(0.5) and m["val/value_mean"] == pytest.approx(0.5)
    assert m["val/oracle_loss"] == pytest.approx(0.25)
    assert m["val/oracle_explained_variance"] == pytest.approx(-1 / 3)


def test_group_sums_add_up_to_value_sums():
    """Row 0 of the per-group sums is exactly metrics.value_sums (same layout, also with
    sample weights), and every bucket family partitions the policy tokens."""
    g = torch.Generator().manual_seed(0)
    masks = [[0, 0, 1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1]]
    n = sum(map(len, masks))
    batch, values = packed(masks, targets=torch.rand(n, generator=g).tolist(),
                           values=torch.rand(n, generator=g).tolist())
    batch.weights = batch.weights * 2.0
    grid = CalibrationGrid(0.2, 0.8, cells=7)
    sums = group_sums(values, batch, grid.edges())
    assert sums.shape == (2, n_groups(7), 6)
    expected = value_sums(values, batch.targets, batch.weights)
    torch.testing.assert_close(sums[0, 0], expected)
    for rows in (slice(1, 5), slice(5, 9), slice(9, None)):  # position, turn, calibration cells
        torch.testing.assert_close(sums[0, rows].sum(0), expected)
    assert not sums[1].any()  # no oracle in the batch


def test_position_and_turn_buckets_hand_built():
    masks = [
        [0, 0, 1, 1, 1, 1, 0, 0, 1, 1],   # 6 policy tokens in 2 turns
        [0, 1, 0, 1, 0, 1, 1],            # 4 policy tokens in 3 turns; ends on a policy token
        [1, 1, 0, 1, 0, 1, 0, 1, 0, 1],   # starts on a policy token: a new turn, not the last one's
    ]
    batch, _ = packed(masks)
    quartile, turn = token_buckets(batch.weights, batch.position_ids, len(masks))
    policy = batch.weights[0] > 0
    # token i of P policy tokens -> quartile floor(4i/P); turns 1, 2, 3, 4+ -> 0..3
    assert quartile[policy].tolist() == [0, 0, 1, 2, 2, 3] + [0, 1, 2, 3] + [0, 0, 1, 2, 2, 3]
    assert turn[policy].tolist() == [0, 0, 0, 0, 1, 1] + [0, 1, 2, 2] + [0, 0, 1, 2, 3, 3]


def test_bucket_metrics_hand_built():
    """Target = bucket number, prediction 0: each bucket's loss is its number squared."""
    masks = [[0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1]]  # 10 policy tokens, turns of 4, 1, 1, 4 tokens
    batch, values = packed(masks)
    quartile, turn = token_buckets(batch.weights, batch.position_ids, 1)
    policy = batch.weights[0] > 0
    for family, buckets, names in (("pos", quartile, POSITION_BUCKETS), ("turn", turn, TURN_BUCKETS)):
        batch.targets = torch.where(policy, buckets + 1.0, 0.0)[None]
        ev = metrics_of(batch, values)
        for i, name in enumerate(names):
            assert ev.metrics[f"val/loss_{family}_{name}"] == pytest.approx((i + 1) ** 2), (family, name)
    rows = ev.buckets["turn"]
    assert [r["tokens"] for r in rows] == [4, 1, 1, 4]
    assert [r["target_mean"] for r in rows] == [1, 2, 3, 4]


def test_merge_cells_equal_counts_never_split():
    assert merge_cells(np.ones(20)).tolist() == np.repeat(np.arange(10), 2).tolist()
    # empty cells ride along; a heavy cell takes several deciles' worth of tokens alone
    assert merge_cells(np.array([4, 0, 4, 2, 10])).tolist() == [1, 2, 3, 4, 7]
    assert merge_cells(np.zeros(5)).tolist() == [0] * 5


def test_calibration_hand_computed():
    # Ten predictions, one per grid cell of width 0.1 -> ten deciles of one token each.
    v = [0.05 + 0.1 * i for i in range(10)]
    r = [0, 0, 0, 1, 0, 1, 1, 1, 1, 1]
    batch, values = packed([[1] * 10], targets=r, values=v)
    ev = metrics_of(batch, values)
    assert [row["tokens"] for row in ev.calibration] == [1] * 10
    assert [row["value_mean"] for row in ev.calibration] == pytest.approx(v)
    assert [row["target_mean"] for row in ev.calibration] == r
    assert [row["lo"] for row in ev.calibration] == pytest.approx([0.1 * i for i in range(10)])
    # mean |target - prediction| = (.05+.15+.25+.65+.45+.45+.35+.25+.15+.05) / 10
    assert ev.metrics["val/calibration_error"] == pytest.approx(0.28)

    # Twenty predictions in twenty cells: each decile merges two neighbours.
    v = [0.025 + 0.05 * i for i in range(20)]
    batch, values = packed([[1] * 20], targets=[float(i % 2) for i in range(20)], values=v)
    table = metrics_of(batch, values, CalibrationGrid(0.0, 1.0, cells=20)).calibration
    assert [row["value_mean"] for row in table] == pytest.approx([0.05 + 0.1 * d for d in range(10)])
    assert [row["target_mean"] for row in table] == [0.5] * 10
    assert [row["lo"] for row in table] == pytest.approx([0.1 * d for d in range(10)])
    assert [row["hi"] for row in table] == pytest.approx([0.1 * (d + 1) for d in range(10)])


def test_calibration_overflow_cells_and_oracle_column():
    batch, values = packed([[1, 1, 1]], targets=[0.0, 1.0, 1.0], values=[-3.0, 0.55, 3.0], oracle=[0.0, 0.25, 1.0])
    ev = metrics_of(batch, values)
    bounds = [(row["lo"], row["hi"]) for row in ev.calibration]
    assert bounds[0] == (-math.inf, 0.0) and bounds[2] == (1.0, math.inf)
    assert bounds[1] == pytest.approx((0.5, 0.6))
    assert [row["oracle_mean"] for row in ev.calibration] == [0.0, 0.25, 1.0]
    assert ev.metrics["val/oracle_calibration_error"] == pytest.approx((3.0 + 0.3 + 2.0) / 3)
    out = ev.to_json()
    assert out["calibration"][0]["lo"] is None and out["calibration"][-1]["hi"] is None
    json.dumps(out, allow_nan=False)  # strict JSON


def test_calibration_grid_from_store_stats():
    class Stats:
        mean_target, target_var = 0.5, 0.04

    class Store:
        stats = Stats()

    grid = CalibrationGrid.for_store(Store())
    assert (grid.lo, grid.hi) == pytest.approx((0.5 - 0.8, 0.5 + 0.8))
    Stats.target_var = 0.0  # all targets equal: a unit half-width instead of an empty grid
    assert (CalibrationGrid.for_store(Store()).lo, CalibrationGrid.for_store(Store()).hi) == (-0.5, 1.5)


def test_empty_sums_give_no_metrics():
    grid = CalibrationGrid(0.0, 1.0, cells=4)
    ev = finish(torch.zeros(2, n_groups(4), 6, dtype=torch.float64), grid, has_oracle=False)
    assert ev.metrics == {} and ev.calibration == []
    assert calibration_table(torch.zeros(2, n_groups(4), 6, dtype=torch.float64), grid, False) == []


def test_token_cap_takes_a_fixed_random_subset():
    class Store:
        lengths = np.arange(1, 101)

    idx = np.arange(100)
    everything = np.concatenate(eval_batches(Store, idx, 400, 100, None))
    assert sorted(everything) == list(idx)
    capped = [np.concatenate(eval_batches(Store, idx, 400, 100, 500)) for _ in range(2)]
    np.testing.assert_array_equal(capped[0], capped[1])        # the same rollouts every evaluation
    tokens = Store.lengths[capped[0]].sum()
    assert 300 < tokens <= 500
    assert sorted(capped[0]) != list(range(len(capped[0])))     # not just the shortest rollouts


# ---------------------------------------------------------------------------------------------
# The tiny run: what training logged, and `critic-pretrain eval`

def test_training_logs_bucket_and_calibration_metrics(run_dir):
    val = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val/loss" in r]
    assert [r["step"] for r in val] == [0, 4, 8]
    for key in ("val/explained_variance", "val/loss_pos_q1", "val/loss_pos_q4", "val/loss_turn_1",
                "val/loss_turn_4plus", "val/calibration_error"):
        assert key in val[-1], key
    assert not any("oracle" in k for k in val[-1])  # the toy rollouts carry no oracle values


def test_eval_cli_on_validation_split_matches_training(run_dir, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert cli.main(["eval", str(run_dir / "step_8"), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    ev = json.loads(out.read_text())
    assert {"checkpoint", "data", "metrics", "buckets", "calibration", "calibration_grid", "device"} <= ev.keys()
    assert ev["checkpoint"]["step"] == 8 and ev["checkpoint"]["targets"]["gamma"] == 1.0
    assert ev["data"]["split"] == "validation split of the run (prompts it never trained on)" and ev["data"]["rows"] > 0
    assert [b["bucket"] for b in ev["buckets"]["position"]] == ["q1", "q2", "q3", "q4"]
    assert [b["bucket"] for b in ev["buckets"]["turn"]] == ["1", "2", "3", "4plus"]
    assert 1 <= len(ev["calibration"]) <= 10
    assert sum(row["tokens"] for row in ev["calibration"]) == ev["metrics"]["eval/valid_tokens"]
    logged = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == 8 and "val/loss" in r][0]
    for key in ("loss", "explained_variance", "loss_pos_q2", "loss_turn_1", "calibration_error"):
        assert ev["metrics"][f"eval/{key}"] == pytest.approx(logged[f"val/{key}"], rel=1e-5), key


@pytest.mark.parametrize("given", ["train", "sources"])
def test_a_run_started_with_relative_data_paths_evaluates_from_any_folder(given, toy_data, tmp_path, monkeypatch,
                                                                          capsys):
    """A new user trained from the repository root with data.train=[examples/...] and ran `eval
    STEP` from another folder: "examples/smollm2/rollouts: no such file or folder", a path they
    never typed (the run's config.yaml kept it relative). The written config names it absolute,
    in `data.sources` too; a resume compares sources with absolute paths on both sides, so a step
    written with relative ones (before this change) still resumes."""
    import yaml
    from conftest import train_main
    shutil.copytree(toy_data, tmp_path / "start" / "data")
    monkeypatch.chdir(tmp_path / "start")
    extra = {"train.max_steps": 2, "checkpoint.save_every": 2}
    if given == "sources":
        extra.update({"data.train": "[]", "data.sources": "[{paths: [data], weight: 2}]"})
    assert train_main(tiny_overrides(Path("run"), Path("data"), **extra)) == 0
    step = tmp_path / "start" / "run" / "step_2"
    written = yaml.safe_load((step / "config.yaml").read_text())
    data = written["data"]
    assert (data["train"] if given == "train" else data["sources"][0]["paths"]) == [str(tmp_path / "start" / "data")]
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli.main(["eval", "start/run/step_2", "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["data"]["rows"] > 0
    monkeypatch.chdir(tmp_path / "start")  # and the same command resumes where it began
    assert train_main(tiny_overrides(Path("run"), Path("data"), **extra)) == 0
    if given == "sources":  # a step written before sources were made absolute
        data["sources"][0]["paths"] = ["data"]
        (step / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
        from critic_pretrain import checkpoint as ckpt
        manifest = json.loads((step / ckpt.MANIFEST).read_text())
        manifest["files"] = ckpt.files_manifest(step)
        (step / ckpt.MANIFEST).write_text(json.dumps(manifest))
        capsys.readouterr()
        assert train_main(tiny_overrides(Path("run"), Path("data"), **extra)) == 0
        err = capsys.readouterr().err
        assert "resuming from" in err and "not resuming" not in err, err
        extra["data.sources"] = "[{paths: [data], weight: 3}]"  # a changed weight is still a change
        assert train_main(tiny_overrides(Path("run"), Path("data"), **extra)) == 2
        assert "data.sources" in capsys.readouterr().err


def test_eval_cli_on_other_rollouts_default_out(run_dir, toy_data, capsys):
    assert cli.main(["eval", str(run_dir / "step_4"), "--rollouts", str(toy_data), "--max-tokens", "600"]) == 0
    written = Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("wrote "))
    assert written.parent == run_dir / "eval" and written.name.startswith("step_4-")
    ev = json.loads(written.read_text())
    assert ev["data"]["rollouts"] == [str(toy_data)] and ev["data"]["split"] == "all rows"
    assert 0 < ev["metrics"]["eval/valid_tokens"] and ev["data"]["rows"] < ev["data"]["split_rows"]  # capped


def test_eval_max_length_scores_rollouts_cut_there(run_dir, toy_data, tmp_path):
    """--max-length: every rollout is cut at N tokens, so the scored tokens are the policy tokens
    among each rollout's first N (counted here from the parquet files); the default is the run's."""
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted(toy_data.glob("*.parquet")), columns=["loss_mask"]).column("loss_mask").to_pylist()
    for flag, n in (([], 256), (["--max-length", "12"], 12)):
        out = tmp_path / f"e{n}.json"
        assert cli.main(["eval", str(run_dir / "step_4"), "--rollouts", str(toy_data), "--out", str(out),
                         "--cold-every", "0", *flag]) == 0
        ev = json.loads(out.read_text())
        assert ev["data"]["max_length"] == n
        assert ev["data"]["longer_than_max_length"] == sum(len(m) > n for m in rows)
        assert ev["metrics"]["eval/valid_tokens"] == sum(sum(m[:n]) for m in rows)


@pytest.mark.parametrize("case", ["missing", "missing_step", "file", "not_checkpoint", "run_folder",
                                  "incomplete_run", "bad_rollouts", "bad_flag", "bad_device"])
def test_eval_cli_errors_are_one_line(run_dir, tmp_path, capsys, case):
    step = run_dir / "step_8"
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "step_3").mkdir()
    argv = {"missing": [str(tmp_path / "nope")], "missing_step": [str(run_dir / "step_999")],
            "file": [str(tmp_path / "f.txt")],
            "not_checkpoint": [str(tmp_path / "step_3")],
            "run_folder": [str(run_dir)], "incomplete_run": [str(tmp_path)],
            "bad_rollouts": [str(step), "--rollouts", str(tmp_path / "none.parquet")],
            "bad_flag": [str(step), "--max-tokens", "0"], "bad_device": [str(step), "--device", "gpu0"]}[case]
    assert cli.main(["eval", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    saved = ", ".join(sorted((d.name for d in run_dir.glob("step_*")), key=lambda n: int(n[5:])))
    assert {"missing": "no such checkpoint folder", "missing_step": f"has no 'step_999'; its checkpoints: {saved})",
            "file": "not a folder",
            "not_checkpoint": "not a complete critic-pretrain checkpoint",
            "run_folder": f"is a run folder, not a checkpoint; pass one of its step_<n> folders, e.g. the newest "
                          f"complete one: {step}",
            "incomplete_run": "is a run folder whose step_<n> folders are all incomplete (step_3)",
            "bad_rollouts": "no such file",
            "bad_flag": "--max-tokens 0 must be > 0", "bad_device": "not a torch device"}[case] in err


def test_a_cut_or_partial_eval_never_stands_for_the_whole_split(tmp_path_factory, toy_data, capsys):
    """`eval --max-length 8` and `--max-tokens N` wrote step_<n>-val.json, the file `report` and the
    notebook read as that step's evaluation of the validation split: report.md then showed the cut
    evaluation (calibration error 0.28 for 0.11) without a word. They now write -maxlen8 / -tokens<N>
    files, the report takes a cached file only when it was whole, and the verdict line counts the
    rollouts evaluated (it said "(200 rollouts)" over 8)."""
    from critic_pretrain import checkpoint as ckpt
    from critic_pretrain import report
    run = tiny_run(tmp_path_factory, toy_data)
    step = max(ckpt.find_checkpoints(run).values(), key=lambda d: ckpt.step_number(d))
    whole = report.run_calibration(run)
    assert whole["settings"] == {"max_length": None, "max_tokens": None}
    assert cli.main(["eval", str(step), "--max-length", "8"]) == 0
    assert f"wrote {run / 'eval' / f'{step.name}-val-maxlen8.json'}" in capsys.readouterr().out
    assert cli.main(["eval", str(step), "--max-tokens", "300"]) == 0
    out = capsys.readouterr().out
    cut = json.loads((run / "eval" / f"{step.name}-val-tokens300.json").read_text())
    (line,) = [x for x in out.splitlines() if x.startswith("verdict (")]
    assert line.startswith(f"verdict ({cut['regimes'][0]['rows']} rollouts)")
    assert cut["regimes"][0]["rows"] == cut["data"]["rows"] < cut["data"]["split_rows"]
    again = report.run_calibration(run)
    assert again["data"]["max_length"] == whole["data"]["max_length"] and again["metrics"] == whole["metrics"]
    (run / "eval" / f"{step.name}-val.json").write_text(json.dumps({**cut, "settings": {"max_length": None,
                                                                                          "max_tokens": 300}}))
    assert report.run_calibration(run)["settings"] == {"max_length": None, "max_tokens": None}  # evaluated again
