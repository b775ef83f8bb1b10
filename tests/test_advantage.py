"""Advantage quality (critic_pretrain/eval/advantage.py) against an independent per-rollout computation:
unpacked forwards of plain transformers, the per-timestep GAE loop, python group statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TINY_MODEL, tiny_overrides, train_main
from reference_gae import reference_gae

from critic_pretrain.config import DataConfig, ModelConfig, TargetsConfig
from critic_pretrain.data import Layout, prepare_store
from critic_pretrain.eval import advantage, evaluate_detailed
from critic_pretrain.model import build_value_model
from rollouts import synth

SYNTH_MODEL = {**TINY_MODEL, "vocab_size": synth.VOCAB_SIZE}
GAMMA = 0.97
ENV = dict(group_size=4, max_length=256, median_length=48, token_penalty=0.01, gamma=GAMMA)


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("synth-adv")
    table = synth.generate(48, seed=3, **ENV)
    pq.write_table(table, d / "part-0.parquet")
    return d / "part-0.parquet"


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_value_model(ModelConfig(config=SYNTH_MODEL, head_std=0.5), init_head=True).eval()


def store_of(synth_file: Path, tmp_path: Path, drop: tuple[str, ...] = (), **targets):
    """(prepared store, its parquet file) of the synthetic rollouts, without the ``drop`` columns."""
    path = synth_file
    if drop:
        path = tmp_path / "variant" / "part-0.parquet"
        path.parent.mkdir()
        pq.write_table(pq.read_table(synth_file).drop(list(drop)), path)
    store = prepare_store([str(path)], tmp_path / "cache", DataConfig(), TargetsConfig(gamma=GAMMA, **targets),
                          vocab_size=synth.VOCAB_SIZE)
    return store, path


def evaluate(critic: torch.nn.Module, store, **kw):
    return evaluate_detailed(critic, store, np.arange(len(store)), max_tokens=1024, max_length=256,
                             layout=Layout(1, 0, 1), device=torch.device("cpu"), **kw)


def unpacked_values(m: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """value[t] = head(hidden[t-1]), value[0] = 0 (docs/design.md), from one unpacked forward."""
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([ids])).logits[0, :, 0].double().numpy()
    return np.concatenate([[0.0], logits[:-1]])


def gae(r, mask, lam, values) -> np.ndarray:
    t = lambda x: torch.tensor(np.asarray(x, np.float64))[None]  # noqa: E731
    return reference_gae(t(r), t(mask), gamma=GAMMA, lam=lam,
                         values=None if values is None else t(values))[0][0].numpy()


def reference(path: Path, critic, cold, scale: float, shift: float, oracle: bool = True):
    """Per-rollout loops: {(estimator, lam, where): (x, y)}, turn-change pairs, group-mean EV."""
    rows = pq.read_table(path).to_pylist()
    outcome, mask_of, r_of = [], [], []
    for row in rows:
        mask = np.array(row["loss_mask"], np.float64)
        r = -ENV["token_penalty"] * mask * scale                           # scaled per-token rewards
        r[np.flatnonzero(mask)[-1]] += scale * row["reward"] + shift         # transformed outcome, placed
        mask_of.append(mask), r_of.append(r)
        returns = gae(r, mask, 1.0, None)
        outcome.append(returns[np.flatnonzero(mask)[0]])
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row["group_id"], []).append(i)
    pairs: dict = {}
    turn_pairs: dict = {"critic": ([], []), "cold": ([], []), "oracle_values": ([], [])}
    ev_x, ev_y = [], []
    for i, row in enumerate(rows):
        mates = [j for j in groups[row["group_id"]] if j != i]
        loo = np.mean([outcome[j] for j in mates])
        gmean = np.mean([outcome[j] for j in groups[row["group_id"]]])
        mask, r = mask_of[i], r_of[i]
        last = np.flatnonzero(mask)[-1]
        o = np.array(row.get("oracle_values") or np.zeros(len(mask))) * scale + shift * (np.arange(len(mask)) <= last)
        vals = {"critic": unpacked_values(critic, row["input_ids"]), "cold": unpacked_values(cold, row["input_ids"]),
                "group_mean": np.full(len(mask), loo), "oracle_values": o}
        policy = np.flatnonzero(mask)
        firsts = [t for t in policy if t == 0 or mask[t - 1] == 0]
        targets = gae(r, mask, 1.0, None)
        ev_x += [loo] * len(policy)
        ev_y += list(targets[policy])
        for e in turn_pairs:
            for a, b in zip(firsts[:-1], firsts[1:]):
                turn_pairs[e][0].append(vals[e][b] - vals[e][a])
                turn_pairs[e][1].append(outcome[i] - loo)
        if not oracle:
            continue
        truth = gae(r, mask, 0.0, o)
        est = {(e, lam): gae(r, mask, lam, v) for e, v in vals.items() for lam in advantage.LAMS}
        est[("grpo", None)] = np.full(len(mask), outcome[i] - gmean)
        est[("reinforce", None)] = gae(r, mask, 1.0, None)
        for key, a in est.items():
            for where, at in (("first", firsts), ("all", policy)):
                x, y = pairs.setdefault((*key, where), ([], []))
                x += list(a[at])
                y += list(truth[at])
    return pairs, turn_pairs, (np.array(ev_x), np.array(ev_y))


def corr(x, y) -> float:
    x, y = np.asarray(x), np.asarray(y)
    return float(np.corrcoef(x, y)[0, 1]) if x.std() > 1e-9 and y.std() > 1e-9 else float("nan")


@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (2.0, -1.0)])
def test_advantage_table_matches_per_rollout_reference(synth_file: Path, tmp_path: Path, scale, shift) -> None:
    store, _ = store_of(synth_file, tmp_path, reward_scale=scale, reward_shift=shift)
    critic, cold = model(0), model(1)
    result = evaluate(critic, store, cold_model=cold, cold_every=1)
    pairs, turn_pairs, (ev_x, ev_y) = reference(synth_file, critic, cold, scale, shift)
    got = {(r["estimator"], r["lam"], r["tokens"]): r for r in result.advantages}
    assert set(got) == set(pairs)
    for key, (x, y) in pairs.items():
        row = got[key]
        assert row["n"] == len(x), key
        assert row["mse"] == pytest.approx(np.mean((np.array(x) - np.array(y)) ** 2), rel=1e-4, abs=1e-7), key
        want = corr(x, y)
        assert (np.isnan(row["corr"]) and np.isnan(want)) or row["corr"] == pytest.approx(want, abs=1e-4), key
    assert got[("oracle_values", 0.0, "first")]["corr"] == pytest.approx(1.0)  # lam 0 with true values is exact
    m = result.metrics
    for e, (x, y) in turn_pairs.items():
        key = "val/turn_change_corr" + ("" if e == "critic" else f"_{e}")
        assert m[key] == pytest.approx(corr(x, y), abs=1e-4), e
    assert m["val/ev_group_mean"] == pytest.approx(1 - np.var(ev_y - ev_x) / np.var(ev_y), abs=1e-5)
    assert m["val/adv_corr_first_lam0.95"] == got[("critic", 0.95, "first")]["corr"]


def test_without_oracle_reports_what_needs_none(synth_file: Path, tmp_path: Path) -> None:
    store, path = store_of(synth_file, tmp_path, drop=("oracle_values",))
    critic = model(0)
    result = evaluate(critic, store)
    assert result.advantages == [] and not any("adv_corr" in k for k in result.metrics)
    _, turn_pairs, (ev_x, ev_y) = reference(path, critic, critic, 1.0, 0.0, oracle=False)
    assert result.metrics["val/turn_change_corr"] == pytest.approx(corr(*turn_pairs["critic"]), abs=1e-4)
    assert result.metrics["val/ev_group_mean"] == pytest.approx(1 - np.var(ev_y - ev_x) / np.var(ev_y), abs=1e-5)


def test_rollouts_without_groups_use_the_mean_over_all(synth_file: Path, tmp_path: Path) -> None:
    """No group_id: no group baseline to compare with; the outcome baseline is the mean of all rollouts."""
    store, _ = store_of(synth_file, tmp_path, drop=("group_id",))
    stats = advantage.GroupStats.of(store, np.arange(len(store)))
    assert not stats.grouped
    outcome = store.table.column("outcome").to_numpy()
    assert list(stats.loo_mean.values()) == pytest.approx([float(outcome.mean())] * len(store))
    result = evaluate(model(0), store)
    assert "val/ev_group_mean" not in result.metrics and result.advantages


def test_cold_critic_is_the_step_0_model(synth_file: Path, tmp_path: Path, capsys) -> None:
    """`eval` rebuilds the run's step-0 model; a 1-step run whose update changes nothing
    (backbone frozen, head learning rate 1e-30) saves exactly that model."""
    from critic_pretrain import checkpoint as ckpt
    from critic_pretrain import cli
    from critic_pretrain.config_io import load_config
    from critic_pretrain.eval import checkpoint_model_config, cold_critic

    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, synth_file.parent, **{
        "model.config": json.dumps(SYNTH_MODEL), "train.max_steps": 1, "train.freeze_backbone_steps": 1,
        "optim.head_lr": 1e-30, "checkpoint.save_every": 1, "targets.gamma": GAMMA, "data.max_tokens": 1024,
        "data.val_fraction": 0.3})) == 0
    step = out / "step_1"
    cfg = load_config(ckpt.StepPaths(step).config_yaml)
    cold, how = cold_critic(step, cfg, torch.device("cpu"), checkpoint_model_config(step, cfg))
    assert cold is not None and "seed 0" in how
    saved = dict(ckpt_model(step, cfg).named_parameters())
    for name, p in cold.named_parameters():
        assert torch.equal(p, saved[name]), name

    capsys.readouterr()
    assert cli.main(["eval", str(step), "--out", str(tmp_path / "e.json"), "--cold-every", "1"]) == 0
    printed = capsys.readouterr().out
    assert "advantage quality" in printed and "cold" in printed
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["cold_critic"]["every"] == 1
    cold_rows = {(r["lam"], r["tokens"]): r for r in report["advantages"] if r["estimator"] == "cold"}
    critic_rows = {(r["lam"], r["tokens"]): r for r in report["advantages"] if r["estimator"] == "critic"}
    # Scored on every micro-batch, the step-0 model is the trained one here: identical numbers.
    assert cold_rows.keys() == critic_rows.keys() and all(
        cold_rows[k]["corr"] == pytest.approx(critic_rows[k]["corr"], abs=1e-6) for k in cold_rows)


def ckpt_model(step: Path, cfg) -> torch.nn.Module:
    from critic_pretrain.eval import load_checkpoint_model
    return load_checkpoint_model(step, cfg, torch.device("cpu"))


def test_store_keeps_rewards_and_outcome(synth_file: Path, tmp_path: Path) -> None:
    store, _ = store_of(synth_file, tmp_path)
    rows = pq.read_table(synth_file).to_pylist()
    for i in (0, 7):
        mask = np.array(rows[i]["loss_mask"], np.float64)
        r = np.asarray(store.table.column("rewards")[i].as_py())
        assert r[mask == 1].sum() == pytest.approx(rows[i]["reward"] - 0.01 * mask.sum(), abs=1e-4)
        assert store.table.column("outcome")[i].as_py() == pytest.approx(
            store.table.column("returns")[i].as_py()[int(np.flatnonzero(mask)[0])], abs=1e-6)
    assert pa.types.is_float32(store.table.schema.field("outcome").type)


def test_ev_ceiling_is_the_true_values_explained_variance(synth_file: Path, tmp_path: Path) -> None:
    store, _ = store_of(synth_file, tmp_path)
    result = evaluate(model(0), store)
    y, x = [], []
    for i in range(len(store)):
        mask = np.array(store.table.column("loss_mask")[i].as_py()) == 1
        y += list(np.array(store.table.column("returns")[i].as_py())[mask])
        x += list(np.array(store.table.column("oracle_values")[i].as_py())[mask])
    y, x = np.array(y), np.array(x)
    assert result.metrics["val/ev_oracle_values"] == pytest.approx(1 - np.var(y - x) / np.var(y), abs=1e-5)
