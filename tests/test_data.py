"""Training data: store with targets, split, packing, sharding, collation, loss normalisation,
sources with weights, filters and de-duplication."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL, tiny_overrides, toy_rows, train_main

from critic_pretrain import checkpoint as ckpt
from critic_pretrain.config import DataConfig, ModelConfig, SourceConfig, TargetsConfig
from critic_pretrain.config_io import load_config
from critic_pretrain.data import (
    Layout,
    RolloutStore,
    collate_packed,
    effective_lengths,
    max_length_of,
    pack,
    plan_epoch,
    prepare_store,
    split_by_group,
    step_batches,
    weighted_rows,
)
from rollouts import RolloutError, write_rows


@pytest.fixture
def rows_dir(tmp_path):
    rows = toy_rows(60)
    rows[3]["sample_weight"] = 0.0
    rows[4]["sample_weight"] = 0.5
    write_rows(tmp_path / "data", rows, shard_rows=25)
    return tmp_path / "data", rows


def store_for(rows_dir, tmp_path, **targets) -> RolloutStore:
    return prepare_store([str(rows_dir)], tmp_path / "cache", DataConfig(train=[str(rows_dir)]),
                         TargetsConfig(**targets))


def test_store_holds_monte_carlo_targets(rows_dir, tmp_path):
    path, rows = rows_dir
    store = store_for(path, tmp_path)
    kept = [r for r in rows if r.get("sample_weight", 1.0) > 0]
    assert len(store) == len(kept) and store.stats.zero_weight_rows == 1
    for i in (0, 7, len(kept) - 1):
        returns = store.table.column("returns")[i].as_py()
        mask = kept[i]["loss_mask"]
        assert [r for r, m in zip(returns, mask) if m] == [kept[i]["reward"]] * sum(mask)  # gamma = lam = 1
        assert all(r == 0 for r, m in zip(returns, mask) if not m)
    assert store.table.column("weight")[4 - 1].as_py() == 0.5  # row 4 moved up one (row 3 had weight 0)
    assert store.stats.filtered["zero_weight"] == 1 and store.stats.rows == len(kept)
    assert store.stats.tokens == sum(len(r["input_ids"]) for r in kept)
    assert store.stats.policy_tokens == sum(sum(r["loss_mask"]) for r in kept)


def test_store_applies_reward_transform_and_gamma(rows_dir, tmp_path):
    path, rows = rows_dir
    store = store_for(path, tmp_path, reward_scale=2.0, reward_shift=-1.0, gamma=0.5)
    returns, mask = store.table.column("returns")[0].as_py(), rows[0]["loss_mask"]
    r = 2.0 * rows[0]["reward"] - 1.0
    policy = [x for x, m in zip(returns, mask) if m]
    n = len(policy)
    assert policy == pytest.approx([r * 0.5 ** (n - 1 - k) for k in range(n)])


def test_store_is_reused_until_inputs_change(rows_dir, tmp_path):
    path, _ = rows_dir
    first = store_for(path, tmp_path)
    stamp = (first.path / "rollouts.arrow").stat().st_mtime_ns
    assert (store_for(path, tmp_path).path / "rollouts.arrow").stat().st_mtime_ns == stamp
    store_for(path, tmp_path, gamma=0.9)  # other targets: rebuilt
    assert (first.path / "rollouts.arrow").stat().st_mtime_ns != stamp


def test_bad_rows_fail_or_are_quarantined(tmp_path):
    rows = toy_rows(10)
    rows[2]["reward"] = float("nan")
    write_rows(tmp_path / "d", rows)
    with pytest.raises(RolloutError, match="row 2.*reward"):
        prepare_store([str(tmp_path / "d")], tmp_path / "c", DataConfig(train=["x"]), TargetsConfig())
    store = prepare_store([str(tmp_path / "d")], tmp_path / "c", DataConfig(train=["x"], on_bad="skip"),
                          TargetsConfig())
    assert len(store) == 9 and store.stats.bad_rows == 1
    assert "row" in (store.path / "quarantine.jsonl").read_text()


def test_split_by_group_never_leaks_and_is_stable():
    keys = [f"prompt-{i // 8}" for i in range(8000)]
    train, val = split_by_group(keys, 0.1)
    assert set(train).isdisjoint(val) and len(train) + len(val) == len(keys)
    assert {keys[i] for i in train}.isdisjoint({keys[i] for i in val})
    assert 0.06 < len(val) / len(keys) < 0.14
    more = keys + [f"new-{i}" for i in range(500)]  # adding sources does not move old rows
    _, val2 = split_by_group(more, 0.1)
    assert set(val2[val2 < len(keys)]) == set(val)


def test_pack_respects_budget_and_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, 500)
    batches = pack(lengths, 256)
    assert np.array_equal(np.concatenate(batches), np.arange(500))
    assert all(lengths[b].sum() <= 256 for b in batches)
    # greedy: the next rollout would not have fitted
    assert all(lengths[a].sum() + lengths[b[0]] > 256 for a, b in zip(batches, batches[1:]))


def test_plan_is_deterministic_and_sharded():
    rng = np.random.default_rng(1)
    idx = np.arange(300)
    lengths = rng.integers(5, 60, 300)
    cfg = DataConfig(train=["x"], max_tokens=200)
    layout0, layout1 = Layout(2, 0, 3), Layout(2, 1, 3)
    a = plan_epoch(idx, lengths, seed=3, epoch=0, data=cfg, layout=layout0)
    b = plan_epoch(idx, lengths, seed=3, epoch=0, data=cfg, layout=layout1)
    c = plan_epoch(idx, lengths, seed=3, epoch=1, data=cfg, layout=layout0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # every rank derives the same plan
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))  # reshuffled each epoch
    assert len(a) % 6 == 0
    steps = len(a) // 6
    for s in range(steps):
        mine = step_batches(a, s, layout0) + step_batches(a, s, layout1)
        assert sorted(np.concatenate(mine).tolist()) == sorted(np.concatenate(a[s * 6:(s + 1) * 6]).tolist())
    used = np.concatenate(a)
    assert len(set(used.tolist())) == len(used)  # no rollout twice in an epoch


def test_overlong_truncate_or_skip(rows_dir, tmp_path):
    path, _ = rows_dir
    store = store_for(path, tmp_path)
    idx = np.arange(len(store))
    longest = int(store.lengths.max())
    cut = longest - 3
    data = DataConfig(train=["x"], max_tokens=512, max_length=cut)
    assert max_length_of(data) == cut and max_length_of(data, model_limit=cut - 1) == cut - 1
    assert max_length_of(DataConfig(train=["x"], max_tokens=512), model_limit=4096) == 512
    kept, lens = effective_lengths(store, idx, max_length_of(data), "truncate")
    assert len(kept) == len(idx) and lens.max() == cut
    kept, _ = effective_lengths(store, idx, cut, "skip")
    assert len(kept) == int((store.lengths <= cut).sum())
    row = int(np.argmax(store.lengths))
    mb = collate_packed(store, np.array([row]), cut)
    assert mb.input_ids.shape == (1, cut)
    full = store.table.column("returns")[row].as_py()
    assert mb.targets[0].tolist() == pytest.approx(full[:cut])  # targets keep the whole rollout's reward


def test_collate_packed(rows_dir, tmp_path):
    path, rows = rows_dir
    store = store_for(path, tmp_path)
    picked = np.array([0, 5, 2])
    mb = collate_packed(store, picked, 10_000, with_rewards=True)
    lens = store.lengths[picked]
    assert mb.seq_lens.tolist() == lens.tolist() and mb.num_rows == 3
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    assert mb.position_ids[0, starts].tolist() == [0, 0, 0]
    assert mb.position_ids[0, starts[1] - 1].item() == lens[0] - 1
    ids = np.concatenate([store.table.column("input_ids")[int(i)].as_py() for i in picked])
    assert mb.input_ids[0].tolist() == ids.tolist()
    masks = np.concatenate([store.table.column("loss_mask")[int(i)].as_py() for i in picked])
    assert mb.weights[0].tolist() == masks.astype(np.float32).tolist()
    assert mb.valid_tokens == int(masks.sum())
    assert mb.oracle is None  # toy rows carry no oracle values


def test_loss_normalisation_is_independent_of_micro_batching(rows_dir, tmp_path):
    """Accumulating two micro-batches gives the gradient of one packed batch of both."""
    from accelerate import Accelerator

    from critic_pretrain.model import build_value_model
    from critic_pretrain.train import train_step

    path, _ = rows_dir
    store = store_for(path, tmp_path)
    cfg = load_config(None, ["data.train=x", "model.config={model_type: qwen2}", "train.grad_clip=null"])
    acc = Accelerator(cpu=True)
    rows_a, rows_b = np.arange(0, 6), np.arange(6, 9)
    grads = []
    for micro in ([rows_a, rows_b], [np.concatenate([rows_a, rows_b])]):
        torch.manual_seed(0)
        model = build_value_model(ModelConfig(config=dict(TINY_MODEL)))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        captured = {}
        opt.register_step_pre_hook(
            lambda *_: captured.update({n: p.grad.clone() for n, p in model.named_parameters()}))
        train_step(model, opt, sched, [collate_packed(store, m, 4096) for m in micro], acc, cfg)
        grads.append(captured)
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-7)


# --- sources: weights, filters, de-duplication ------------------------------------------------

@pytest.fixture
def two_sources(tmp_path):
    a = toy_rows(40, seed=1)
    for i, r in enumerate(a):
        r["policy_version"] = i % 4
    b = toy_rows(30, seed=2)
    write_rows(tmp_path / "a", a)
    write_rows(tmp_path / "b", b)
    write_rows(tmp_path / "b_copy", b[:10])  # the same sample_ids again, in another folder
    return tmp_path, a, b


def test_sources_filters_and_deduplication(two_sources, tmp_path):
    root, a, b = two_sources
    sources = [SourceConfig(paths=[str(root / "a")], name="a", policy_version=[1, 2], min_policy_tokens=5),
               SourceConfig(paths=[str(root / "b"), str(root / "b_copy")], name="b", reward=[0.5, 1.0], max_length=30)]
    store = prepare_store(sources, tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    st = store.stats
    want_a = [r for r in a if r["policy_version"] in (1, 2) and sum(r["loss_mask"]) >= 5]
    want_b = [r for r in b if r["reward"] >= 0.5 and len(r["input_ids"]) <= 30]
    assert st.sources == {"a": len(want_a), "b": len(want_b)}
    assert st.duplicates == 10  # b_copy repeats b's ids: dropped, counted, not an error
    assert st.filtered["policy_version"] == sum(r["policy_version"] not in (1, 2) for r in a)
    assert st.filtered["reward"] == sum(r["reward"] < 0.5 for r in b)
    ids = store.table.column("split_key").to_pylist()
    assert len(ids) == len(want_a) + len(want_b)
    assert set(store.source.tolist()) == {0, 1}
    manifest = {Path(f["path"]).parent.name for f in store.files}
    assert manifest == {"a", "b", "b_copy"} and all(len(f["fingerprint"]) == 35 for f in store.files)  # "v2:" + 32


def test_filters_that_leave_nothing_name_themselves(two_sources, tmp_path):
    """Every rollout filtered out: the error names each filter with its count and the setting to
    loosen, not `rollouts check` (which sees bad rows, not filters). All weights 0: says so."""
    from critic_pretrain.errors import UserError
    root, a, b = two_sources
    sources = [SourceConfig(paths=[str(root / "a")], policy_version=[9, 9]),
               SourceConfig(paths=[str(root / "b")], reward=[5.0, 6.0])]
    with pytest.raises(UserError) as e:
        prepare_store(sources, tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    assert (f"no usable rollouts in 2 file(s) (0 bad rows, 0 bad files, {len(a)} by filter policy_version, {len(b)} "
            "by filter reward, 0 with sample_weight 0); loosen or remove data.sources[].policy_version and "
            "data.sources[].reward (every rollout was filtered out)") in str(e.value)
    write_rows(tmp_path / "w0", [{**r, "sample_weight": 0.0} for r in a])
    with pytest.raises(UserError, match="every rollout has sample_weight 0 .*; give them a weight above 0"):
        prepare_store([SourceConfig(paths=[str(tmp_path / "w0")])], tmp_path / "cache", DataConfig(train=["x"]),
                      TargetsConfig())


def test_source_weights_per_epoch():
    idx = np.arange(100)
    source = np.array([0] * 60 + [1] * 40)
    rows0, _ = weighted_rows(idx, idx + 1, source, np.array([2.0, 0.5]), seed=0, epoch=0)
    rows1, _ = weighted_rows(idx, idx + 1, source, np.array([2.0, 0.5]), seed=0, epoch=1)
    assert (rows0 < 60).sum() == 120 and (rows0 >= 60).sum() == 20
    assert set(rows0[rows0 >= 60]) != set(rows1[rows1 >= 60])  # a different half each epoch
    same, _ = weighted_rows(idx, idx, source, np.array([1.0, 1.0]), seed=0, epoch=0)
    assert np.array_equal(same, idx)


def test_weighted_sources_train(two_sources, tmp_path):
    root, _, _ = two_sources
    out = tmp_path / "run"
    srcs = '[{paths: [%s], weight: 2}, {paths: [%s], weight: 0.5, name: b}]' % (root / "a", root / "b")
    assert train_main(tiny_overrides(out, root / "a", **{"data.train": "[]", "data.sources": srcs,
                                                         "train.max_steps": 4})) == 0
    manifest = json.loads((out / "step_4" / ckpt.MANIFEST).read_text())
    assert {s["name"] for s in manifest["data"]["sources"]} == {None, "b"}
    assert len(manifest["data"]["files"]) == 2 and manifest["data"]["changes"] == []


@pytest.mark.parametrize("policy", ["truncate", "skip"])
def test_rollouts_longer_than_the_model_follow_overlong(policy, toy_data, tmp_path, capsys):
    """max_position_embeddings 24 < data.max_tokens: the model's limit caps max_length."""
    from conftest import train_main
    over = [o for o in tiny_overrides(tmp_path, toy_data, **{"train.max_steps": 1, "data.overlong": policy})
            if not o.startswith("model.config=")]
    assert train_main([*over, f"model.config={json.dumps({**TINY_MODEL, 'max_position_embeddings': 24})}"]) == 0
    line = next(line for line in capsys.readouterr().err.splitlines() if " INFO data: " in line)
    assert "longer than max_length=24 (the model position limit)" in line
    assert ("truncated" if policy == "truncate" else "skipped") in line
    counted = int(line.split(" longer than max_length")[0].rsplit(" ", 1)[1])
    assert counted > 10  # most toy rollouts are longer than 24 tokens

    from critic_pretrain.data import build_train_data
    cfg = load_config(tmp_path / "config.yaml")
    data = build_train_data(cfg.data, cfg.targets, tmp_path / "data_cache", main_first=contextlib.nullcontext,
                            progress=False, model_limit=24)
    assert data.overlong_rows == counted and data.train_len.max() <= 24
    if policy == "skip":
        assert data.train.lengths[data.train_idx].max() <= 24


def test_recency_half_life_weights_rollouts_by_policy_age(tmp_path):
    """data.recency_half_life: weight 0.5 ** (versions behind the newest / half-life) in every
    packed micro-batch; rows without a version weigh as the oldest; no versions at all: an error."""
    from conftest import toy_rows

    from critic_pretrain.data import collate_packed
    from critic_pretrain.errors import UserError
    from rollouts import write_rows

    rows = toy_rows(8)
    for i, r in enumerate(rows):
        r["policy_version"] = [3, 2, 1, 0, 3, 3, 1, None][i]
    write_rows(tmp_path / "d", rows)
    store = prepare_store([str(tmp_path / "d")], tmp_path / "c", DataConfig(), TargetsConfig())
    info = store.set_recency(2.0)
    assert (info["newest"], info["oldest"], info["without_version"]) == (3, 0, 1)
    np.testing.assert_allclose(store.row_scale, [1, 0.5 ** 0.5, 0.5, 0.5 ** 1.5, 1, 1, 0.5, 0.5 ** 1.5], rtol=1e-6)
    batch = collate_packed(store, np.arange(8), 4096)
    per_row = np.split(batch.weights[0].numpy(), np.cumsum(batch.seq_lens.numpy())[:-1])
    for i, w in enumerate(per_row):
        mask = np.array(rows[i]["loss_mask"], np.float32)
        np.testing.assert_allclose(w, mask * store.row_scale[i], rtol=1e-6)

    write_rows(tmp_path / "nov", toy_rows(4))
    plain = prepare_store([str(tmp_path / "nov")], tmp_path / "c2", DataConfig(), TargetsConfig())
    with pytest.raises(UserError, match="needs a policy_version column"):
        plain.set_recency(1.0)


def test_a_rollout_cut_at_max_length_keeps_its_return_for_bootstrapping(rows_dir, tmp_path):
    """TD targets of a truncated rollout: the last kept policy token carries the whole
    rollout's return (its stored target), so the outcome past the cut is not lost."""
    from critic_pretrain.targets import bootstrapped_returns

    store = prepare_store([str(rows_dir[0])], tmp_path, DataConfig(), TargetsConfig(gamma=0.9))
    row = int(np.argmax(store.lengths * (store.table.column("outcome").to_numpy() > 0)))  # a rewarded rollout
    cut = int(np.flatnonzero(store.table.column("loss_mask")[row].as_py())[-1])  # drops the outcome's token
    mask = np.array(store.table.column("loss_mask")[row].as_py()[:cut])
    last = int(np.flatnonzero(mask)[-1])
    full = collate_packed(store, np.array([row]), 10_000, with_rewards=True)
    short = collate_packed(store, np.array([row]), cut, with_rewards=True)
    returns = store.table.column("returns")[row].as_py()
    assert short.rewards[0, last].item() == pytest.approx(returns[last])
    zeros = torch.zeros_like(short.targets)
    # With zero values and lambda 1 the TD targets are the Monte-Carlo returns of the whole rollout.
    td = bootstrapped_returns(zeros, short, gamma=0.9, lam=1.0)
    torch.testing.assert_close(td[0, :cut][torch.from_numpy(mask) == 1],
                               full.targets[0, :cut][torch.from_numpy(mask) == 1], rtol=1e-5, atol=1e-6)


def test_turn_weights_give_each_turn_an_equal_share_of_its_rollout(toy_data, tmp_path):
    """``data.weighting: turn`` against a per-rollout loop, and a run that trains with it."""
    from conftest import tiny_overrides, train_main

    from critic_pretrain.data.collate import turn_weights

    rng = np.random.default_rng(0)
    lens = rng.integers(1, 30, size=40)
    policy = rng.random(int(lens.sum())) < 0.6
    got = turn_weights(policy, lens)
    at = 0
    for n in lens.tolist():
        m = policy[at:at + n]
        turns, run = [], []
        for i, x in enumerate(m):  # runs of policy tokens, by hand
            if x:
                run.append(i)
            elif run:
                turns.append(run)
                run = []
        if run:
            turns.append(run)
        expected = np.zeros(n)
        for t in turns:
            expected[t] = m.sum() / (len(turns) * len(t))
        assert np.allclose(got[at:at + n], expected)
        assert np.isclose(got[at:at + n].sum(), m.sum())  # the rollout's total weight is unchanged
        at += n
    assert train_main(tiny_overrides(tmp_path / "run", toy_data, **{"data.weighting": "turn",
                                                                      "train.max_steps": 4})) == 0


def test_cut_length_grows_linearly_then_stays_at_max_length():
    from critic_pretrain.config import DataConfig
    from critic_pretrain.data import cut_length

    warm = DataConfig(length_warmup_steps=10, length_warmup_from=100)
    assert [cut_length(s, warm, 1000) for s in (0, 1, 5, 9, 10, 500)] == [100, 190, 550, 910, 1000, 1000]
    assert cut_length(0, warm, 64) == 64  # `from` is capped at max_length
    assert cut_length(0, DataConfig(), 1000) == 1000  # off by default
    held = DataConfig(length_warmup_steps=10, length_warmup_from=100, length_warmup_hold=6)
    assert [cut_length(s, held, 1000) for s in (0, 5, 6, 7, 9, 10)] == [100, 100, 100, 325, 775, 1000]


def test_a_shard_edited_in_place_is_read_again(tmp_path):
    """A shard changed in place with its size and mtime kept (here: one reward's bytes patched in an
    uncompressed file) gets a new store: its key holds the sampled content fingerprint the resume
    check compares. Before, data.allow_changes=true announced "continuing on the new data" and
    trained on the old store."""
    import os
    import struct

    import pyarrow.parquet as pq
    rows = toy_rows(20, seed=3)
    rows[7]["reward"] = 0.123456789
    write_rows(tmp_path / "src", rows)
    table = pq.read_table(next((tmp_path / "src").glob("*.parquet")))
    (tmp_path / "data").mkdir()
    shard = tmp_path / "data" / "part-00000.parquet"
    pq.write_table(table, shard, compression="none")
    first = prepare_store([str(tmp_path / "data")], tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    def has(store, r):
        return any(abs(x - r) < 1e-6 for x in store.table.column("outcome").to_pylist())
    assert has(first, 0.123456789) and not has(first, 0.987654321)
    st = shard.stat()
    raw = shard.read_bytes()
    assert raw.count(struct.pack("<d", 0.123456789)) == 1
    shard.write_bytes(raw.replace(struct.pack("<d", 0.123456789), struct.pack("<d", 0.987654321)))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_size == st.st_size and shard.stat().st_mtime_ns == st.st_mtime_ns
    again = prepare_store([str(tmp_path / "data")], tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    assert has(again, 0.987654321) and not has(again, 0.123456789)


def test_a_prepared_store_changed_after_it_was_written_is_prepared_again(toy_data, tmp_path, caplog):
    """The store is checked against the xxh3-128 checksum it was written with before it is reused:
    bytes changed in place (size and mtime kept; the sixth trial inverted rewards in it and trained
    on them, val loss 0.30 -> 0.67, with the seed check saying OK) are noticed, logged, and the store
    is prepared again from the rollouts."""
    import os

    from critic_pretrain.data.store import STORE_FILE
    first = prepare_store([str(toy_data)], tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    returns = first.table.column("returns").to_pylist()
    del first
    arrow = tmp_path / "cache" / "train" / STORE_FILE
    st, raw = arrow.stat(), bytearray(arrow.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    arrow.write_bytes(bytes(raw))
    os.utime(arrow, ns=(st.st_atime_ns, st.st_mtime_ns))
    with caplog.at_level("INFO", logger="critic_pretrain.data.store"):
        again = prepare_store([str(toy_data)], tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    assert any("changed after it was written (its checksum differs); preparing it again" in r.getMessage()
               for r in caplog.records)
    assert again.table.column("returns").to_pylist() == returns
    caplog.clear()
    with caplog.at_level("INFO", logger="critic_pretrain.data.store"):
        prepare_store([str(toy_data)], tmp_path / "cache", DataConfig(train=["x"]), TargetsConfig())
    assert any("reusing prepared store" in r.getMessage() and "checksum verified" in r.getMessage()
               for r in caplog.records)
