"""The seed verdict (critic_pretrain/eval/verdict.py) and the two held-out regimes
(``data.val_split``), against independent computations: per-rollout unpacked forwards of plain
transformers, python loops over tokens, AUC by counting pairs, the bootstrap redone by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TINY_MODEL, tiny_overrides, train_main
from reference_gae import reference_gae

from critic_pretrain.config import DataConfig, ModelConfig, TargetsConfig
from critic_pretrain.data import Layout, build_train_data, prepare_store, split_by_response
from critic_pretrain.eval import evaluate_detailed, verdict
from critic_pretrain.model import build_value_model
from rollouts import synth

SYNTH_MODEL = {**TINY_MODEL, "vocab_size": synth.VOCAB_SIZE}
ENV = dict(group_size=6, max_length=256, median_length=48)


# ---------------------------------------------------------------------------------------------
# The response split

def test_response_split_keeps_every_prompt_in_training_and_is_stable():
    rng = np.random.default_rng(0)
    keys = [f"p{g}" for g in range(200) for _ in range(rng.integers(1, 9))]
    hashes = rng.integers(0, 2**64 - 1, len(keys), dtype=np.uint64, endpoint=True)   # full range, as xxh3
    hashes[5] = hashes[6] if keys[5] == keys[6] else hashes[5]            # an identical response of one prompt
    train, val = split_by_response(keys, hashes, 0.3)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(keys)))
    k = np.array(keys)
    assert set(k[val]) <= set(k[train])                                  # each prompt keeps a response in training
    sizes = {key: keys.count(key) for key in set(keys)}
    assert all(sizes[key] >= 2 for key in k[val])                         # a lone response is never held out
    assert 0.15 < len(val) / len(keys) < 0.35
    if keys[5] == keys[6]:
        assert (5 in val) == (6 in val)                                   # identical tokens, one side
    perm = rng.permutation(len(keys))                                     # order does not move a row
    t2, v2 = split_by_response([keys[i] for i in perm], hashes[perm], 0.3)
    assert sorted(perm[v2].tolist()) == sorted(val.tolist())
    # a prompt whose every response hashes low keeps its highest-hash one
    t3, v3 = split_by_response(["a", "a", "a", "b"], np.array([1, 2, 3, 4], np.uint64) << np.uint64(32), 0.5)
    assert t3.tolist() == [2, 3] and v3.tolist() == [0, 1]


def test_val_split_both_gives_disjoint_regimes(tmp_path):
    path = tmp_path / "r" / "part-0.parquet"
    path.parent.mkdir()
    pq.write_table(synth.generate(240, seed=1, **ENV), path)
    data = build_train_data(DataConfig(train=[str(path.parent)], val_split="both", val_fraction=0.2), TargetsConfig(),
                            tmp_path / "cache", main_first=__import__("contextlib").nullcontext, progress=False)
    (prompt, response) = data.val_sets
    assert (prompt.prefix, prompt.regime, response.prefix, response.regime) == ("val", "prompt", "val_response",
                                                                               "response")
    keys = np.array(data.train.split_keys())
    train_keys = set(keys[data.train_idx])
    assert not set(keys[prompt.idx]) & train_keys                         # new prompts
    assert set(keys[response.idx]) <= train_keys                          # fresh responses to trained prompts
    assert not set(prompt.idx) & set(response.idx) and not set(response.idx) & set(data.train_idx)
    assert len(prompt.idx) + len(response.idx) + len(data.train_idx) == 240
    hashes = data.trained_hashes
    assert np.array_equal(hashes["prompts"], np.unique(data.train.row_hashes(prompt_only=True)[data.train_idx]))
    assert len(hashes["rollouts"]) <= len(data.train_idx)


# ---------------------------------------------------------------------------------------------
# The measures against python loops

def unpacked_values(m: torch.nn.Module, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([ids])).logits[0, :, 0].double().numpy()
    return np.concatenate([[0.0], logits[:-1]])


def returns(row: dict) -> np.ndarray:
    mask = np.array(row["loss_mask"], np.float64)
    r = np.zeros(len(mask))
    r[np.flatnonzero(mask)[-1]] = row["reward"]
    t = lambda x: torch.tensor(x)[None]  # noqa: E731
    return reference_gae(t(r), t(mask), gamma=1.0, lam=1.0, values=None)[1][0].numpy()


def brute_force(rows: list[dict], critic) -> dict:
    """Every measure of the verdict from python loops over tokens and pairs."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row["group_id"], []).append(i)
    G, V, g, quarter, last, first = [], [], [], [], [], []
    outcome = [returns(row)[np.flatnonzero(row["loss_mask"])[0]] for row in rows]
    for i, row in enumerate(rows):
        mates = [j for j in groups[row["group_id"]] if j != i]
        loo = float(np.mean([outcome[j] for j in mates]))
        v, ret = unpacked_values(critic, row["input_ids"]), returns(row)
        policy = np.flatnonzero(row["loss_mask"])
        G += list(ret[policy])
        V += list(v[policy])
        g += [loo] * len(policy)
        quarter.append([np.mean([v[t] for n, t in enumerate(policy) if 4 * n // len(policy) == q])
                        if any(4 * n // len(policy) == q for n in range(len(policy))) else np.nan for q in range(4)])
        last.append(v[policy[-1]])
        first.append((outcome[i] - v[policy[0]], outcome[i] - loo))
    G, V, g = map(np.array, (G, V, g))
    out = {"ev_vs_group_mean": 1 - np.var(G - V) / np.var(G - g), "ev_vs_batch_mean": 1 - np.var(G - V) / np.var(G),
           "rho": np.cov(G - g, V - g, bias=True)[0, 1] / np.var(V - g)}
    f = np.array(first)
    out["first_token_ev_vs_group_mean"] = 1 - np.var(f[:, 0]) / np.var(f[:, 1])
    for q in range(4):
        conc = pairs = 0.0
        for members in groups.values():
            for a in members:
                for b in members:
                    if outcome[a] > outcome[b] and np.isfinite(quarter[a][q]) and np.isfinite(quarter[b][q]):
                        pairs += 1
                        conc += 1.0 if quarter[a][q] > quarter[b][q] else 0.5 if quarter[a][q] == quarter[b][q] else 0
        out[f"sibling_auc_q{q + 1}"] = conc / pairs
    win = [i for i in range(len(rows)) if outcome[i] == max(outcome)]
    lose = [i for i in range(len(rows)) if outcome[i] != max(outcome)]
    out["terminal_auc"] = np.mean([1.0 if last[a] > last[b] else 0.5 if last[a] == last[b] else 0.0
                                   for a in win for b in lose])
    return out


@pytest.fixture(scope="module")
def synth_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("verdict")
    pq.write_table(synth.generate(60, seed=3, **ENV), d / "part-0.parquet")
    store = prepare_store([str(d / "part-0.parquet")], d / "cache", DataConfig(), TargetsConfig(),
                          vocab_size=synth.VOCAB_SIZE)
    return store, pq.read_table(d / "part-0.parquet").to_pylist()


def critic_of(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_value_model(ModelConfig(config=SYNTH_MODEL, head_std=0.5), init_head=True).eval()


def test_measures_match_python_loops(synth_store):
    store, rows = synth_store
    critic = critic_of(0)
    result = evaluate_detailed(critic, store, np.arange(len(store)), max_tokens=1024, max_length=256,
                               layout=Layout(1, 0, 1), device=torch.device("cpu"))
    v, want = result.verdict, brute_force(rows, critic)
    assert v.baseline == "leave-one-out group mean" and v.rows == 60 and v.groups == 10
    for name in ("ev_vs_group_mean", "ev_vs_batch_mean", "rho", "first_token_ev_vs_group_mean"):
        assert getattr(v, name).est == pytest.approx(want[name], rel=1e-5, abs=1e-6), name
    for q in range(4):
        assert v.sibling_auc[q].est == pytest.approx(want[f"sibling_auc_q{q + 1}"], abs=1e-9)
    assert v.terminal_auc.est == pytest.approx(want["terminal_auc"], abs=1e-9)
    assert result.metrics["val/ev_vs_group_mean"] == v.ev_vs_group_mean.est
    assert result.metrics["val/verdict"] == verdict.CALLS[v.call]


def test_rollouts_cut_inside_the_prompt_add_nothing(synth_store):
    """A micro-batch whose rollouts are all cut before their first policy token (a small
    max_length) has no policy columns: its rows' sums are zero, not an index error."""
    from critic_pretrain.data import collate_packed

    store, _ = synth_store
    batch = collate_packed(store, np.arange(4), 3)   # 3 tokens: BOS and the prompt's first tokens only
    assert batch.policy_rows().mask.shape == (4, 0)
    out = verdict.row_sums(torch.ones(1, batch.input_ids.shape[1]), batch, torch.zeros(4),
                           torch.ones(4, dtype=torch.bool))
    assert out.shape == (4, verdict.N_FIELDS) and not out[:, :verdict.MEASURED].any()


def test_bootstrap_is_a_resample_of_prompts(synth_store):
    """The interval is the percentile interval of the measure recomputed on prompts drawn with
    replacement (the same draws, redone on the rollouts by hand)."""
    store, rows = synth_store
    critic = critic_of(1)
    result = evaluate_detailed(critic, store, np.arange(len(store)), max_tokens=1024, max_length=256,
                               layout=Layout(1, 0, 1), device=torch.device("cpu"))
    order = sorted({r["group_id"] for r in rows})
    by_group = {k: [r for r in rows if r["group_id"] == k] for k in order}
    # the group index judge() sees is the dictionary order of the store's split keys
    codes = list(dict.fromkeys(store.split_keys()))
    counts = np.random.default_rng(0).multinomial(len(codes), np.full(len(codes), 1 / len(codes)),
                                                  size=verdict.BOOTSTRAP)
    evs = []
    tokens = {}
    for k in codes:
        G, V = [], []
        for row in by_group[k]:
            policy = np.flatnonzero(row["loss_mask"])
            G += list(returns(row)[policy])
            V += list(unpacked_values(critic, row["input_ids"])[policy])
        tokens[k] = (np.array(G), np.array(V))
    for c in counts:
        G = np.concatenate([np.tile(tokens[k][0], n) for k, n in zip(codes, c)])
        V = np.concatenate([np.tile(tokens[k][1], n) for k, n in zip(codes, c)])
        evs.append(1 - np.var(G - V) / np.var(G))
    lo, hi = np.quantile(evs, [0.025, 0.975])
    iv = result.verdict.ev_vs_batch_mean
    assert (iv.lo, iv.hi) == (pytest.approx(lo, rel=1e-5), pytest.approx(hi, rel=1e-5))
    assert iv.lo <= iv.est <= iv.hi


def test_auc_by_pair_counting_with_ties_and_weights():
    rng = np.random.default_rng(4)
    score = rng.integers(0, 5, 40).astype(float)                          # many ties
    label = rng.random(40) < 0.4
    weights = rng.integers(0, 3, (3, 40)).astype(float)
    for w in weights:
        num = sum(w[a] * w[b] * (1.0 if score[a] > score[b] else 0.5 if score[a] == score[b] else 0.0)
                  for a in np.flatnonzero(label) for b in np.flatnonzero(~label))
        den = w[label].sum() * w[~label].sum()
        assert verdict.weighted_auc(score, label, w[None])[0] == pytest.approx(num / den)


def interval(est: float, lo: float, hi: float) -> verdict.Interval:
    return verdict.Interval(est, lo, hi)


@pytest.mark.parametrize("ev_g,ev_b,call", [
    ((0.3, 0.1, 0.5), (0.5, 0.4, 0.6), "helps"),
    ((0.1, -0.1, 0.3), (0.5, 0.4, 0.6), "no better than the group mean"),
    ((-0.4, -0.6, -0.2), (0.1, 0.05, 0.2), "no better than the group mean"),   # worse than GRPO, better than none
    ((0.12, 0.05, 0.2), (0.0, -0.02, 0.02), "no better than the group mean"),  # a constant beats noisy siblings
    ((-0.9, -1.2, -0.6), (-0.3, -0.5, -0.1), "harmful"),
])
def test_the_call_follows_the_intervals(monkeypatch, ev_g, ev_b, call):
    """helps: EV over the group mean and over the batch mean surely above 0; harmful: EV over the
    batch mean surely below 0 (more advantage variance than no critic); else no better."""
    results = iter([ev_g, ev_b])
    real = verdict._ev

    def fake(*args):  # the first two calls (over the group mean, over the batch mean) get set intervals
        out = real(*args)
        est, lo, hi = next(results, (None, None, None))
        return out if est is None else np.concatenate([[est], np.linspace(lo, hi, len(out) - 1)])

    monkeypatch.setattr(verdict, "_ev", fake)
    rng = np.random.default_rng(0)
    rows = rng.random((40, verdict.N_FIELDS)) + 1
    rows[:, verdict.MEASURED] = 1
    v = verdict.judge(rows, np.repeat(np.arange(10), 4), rng.random(40), rng.random(40), grouped=True)
    assert v.call == call
    assert v.line().count("**") == 2 and call in v.line()


def test_too_few_prompts_is_unknown():
    rows = np.ones((3, verdict.N_FIELDS))
    v = verdict.judge(rows, np.zeros(3, np.int64), np.array([0.0, 1.0, 1.0]), np.zeros(3), grouped=True)
    assert v.call == "unknown" and "more rollouts" in v.line()
    assert math.isnan(v.metrics("val")["val/verdict"])
    # 2 prompts: a bootstrap over them has 3 distinct resamples, a bound equal to the estimate: no call
    rng = np.random.default_rng(1)
    rows = rng.random((8, verdict.N_FIELDS)) + 1
    rows[:, verdict.MEASURED] = 1
    v = verdict.judge(rows, np.repeat(np.arange(2), 4), rng.random(8), rng.random(8), grouped=True)
    assert v.call == "unknown" and v.groups == 2 and "(8 rollouts, 2 prompts)" in v.line()
    # returns that do not vary (every rollout solved): both EVs are 0/0, so no call, not "no better"
    rows = rng.random((40, verdict.N_FIELDS)) + 1
    rows[:, verdict.MEASURED] = 1
    rows[:, verdict.S_G], rows[:, verdict.S_G2] = rows[:, verdict.N], rows[:, verdict.N]  # G = 1 at every token
    v = verdict.judge(rows, np.repeat(np.arange(10), 4), np.ones(40), np.ones(40), grouped=True)
    assert v.call == "unknown" and "with different returns" in v.line()


# ---------------------------------------------------------------------------------------------
# The regimes in a run, in eval, in the checkpoint

def test_run_with_both_regimes_and_eval_on_its_own_rollouts(tmp_path, capsys):
    """A run with data.val_split=both logs val/ and val_response/ verdicts; `eval --rollouts` on the
    run's own archive leaves out what it trained on and, split by trained prompts, reproduces the
    run's two regimes to float32 precision (the two evals batch the rows differently, and with
    several threads a matmul's sums depend on the batch's shape: 1e-8 relative was seen; one row
    more or less moves these estimates by far more than the 1e-6 allowed)."""
    from critic_pretrain import cli
    from critic_pretrain.checkpoint import Manifest, StepPaths

    data = tmp_path / "r"
    data.mkdir()
    pq.write_table(synth.generate(160, seed=2, **ENV), data / "part-0.parquet")
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, data, **{
        "model.config": json.dumps(SYNTH_MODEL), "train.max_steps": 4, "data.max_tokens": 1024,
        "data.val_split": "both", "data.val_fraction": 0.25})) == 0
    last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"val/loss"' in x][-1]
    for prefix in ("val", "val_response"):
        assert {f"{prefix}/verdict", f"{prefix}/ev_vs_group_mean_lo", f"{prefix}/sibling_auc_q4",
                f"{prefix}/sibling_pairs"} <= last.keys()
    step = out / "step_4"
    m = Manifest.read(step)
    assert m.val_split == "both" and set(m.raw["data"]["val_regimes"]) == {"prompt", "response"}
    info = StepPaths(step).read_training_info()
    assert info["val:loss"] == last["val/loss"] and info["val_response:loss"] == last["val_response/loss"]
    assert StepPaths(step).read_trained() is not None

    assert cli.main(["eval", str(step), "--out", str(tmp_path / "own.json")]) == 0
    own = {r["regime"]: r["verdict"] for r in json.loads((tmp_path / "own.json").read_text())["regimes"]}
    assert cli.main(["eval", str(step), "--rollouts", str(data), "--out", str(tmp_path / "all.json")]) == 0
    said = capsys.readouterr().out
    ev = json.loads((tmp_path / "all.json").read_text())
    given = {r["regime"]: r for r in ev["regimes"]}
    trained_rows = 160 - sum(m.raw["data"]["val_regimes"].values())
    assert given["response"]["trained_on_left_out"] == trained_rows
    assert f"note: {trained_rows} of these rollouts are ones the critic trained on" in said
    for regime in ("prompt", "response"):
        a, b = own[regime], given[regime]["verdict"]
        assert given[regime]["rows"] == m.raw["data"]["val_regimes"][regime]
        for name in ("ev_vs_group_mean", "ev_vs_batch_mean", "rho"):
            assert b[name]["est"] == pytest.approx(a[name]["est"], rel=1e-6, abs=1e-9), (regime, name)
        assert b["call"] == a["call"]


def test_critics_that_learned_nothing_are_never_called_helps(tmp_path):
    """The outcome of each toy rollout shows in its first token, so a trained critic knows it and
    its verdict on held-out responses is **helps**; trained on the same rollouts with rewards
    permuted across them, or left at step 0 (lr 1e-30), it knows nothing and must not be."""
    from conftest import toy_rows

    from critic_pretrain.eval import evaluate_checkpoint
    from rollouts import write_rows

    rows = toy_rows(240, seed=3)
    perm = np.random.default_rng(0).permutation(len(rows))
    shuffled = [{**r, "reward": rows[j]["reward"]} for r, j in zip(rows, perm)]
    calls = {}
    for name, table, extra in (("trained", rows, {"train.max_steps": 40}),
                               ("shuffled", shuffled, {"train.max_steps": 40}),
                               ("step 0", rows, {"train.max_steps": 1, "optim.lr": 1e-30, "optim.warmup_steps": 0})):
        data, out = tmp_path / f"{name}-data", tmp_path / name
        write_rows(data, table)
        steps = extra["train.max_steps"]
        assert train_main(tiny_overrides(out, data, **{"data.val_split": "response", "data.val_fraction": 0.3,
                                                       "checkpoint.save_every": steps, **extra})) == 0
        if name == "shuffled":  # judged on the true rewards, as seed check --rollouts would
            write_rows(tmp_path / "true", rows)
            ev = evaluate_checkpoint(out / f"step_{steps}", [str(tmp_path / "true")], cold_every=0,
                                     leave_out_trained=True)
        else:
            ev = evaluate_checkpoint(out / f"step_{steps}", cold_every=0)
        calls[name] = {r["regime"]: r["verdict"]["call"] for r in ev["regimes"] if r["rows"]}
        assert all(r["verdict"]["bootstrapped"] is False for r in ev["regimes"])  # tiny_overrides: Monte-Carlo
    assert calls["trained"] == {"response": "helps"}
    assert "helps" not in calls["shuffled"].values() and "helps" not in calls["step 0"].values(), calls


def test_the_oracle_rule_needs_a_margin_beyond_rounding():
    assert not verdict.beats_with_oracle(0.0387, 0.0386, 1000)        # a collapsed critic ties the control
    assert verdict.beats_with_oracle(0.76, 0.55, 1000)
    assert not verdict.beats_with_oracle(0.60, 0.55, 1000)           # 0.05 < 2 / sqrt(1000) = 0.063


def test_end_of_run_flags_a_critic_on_the_prompt_only_plateau(tmp_path):
    """Next to the last evaluation's verdict, a step whose sibling AUC q4 is near chance over enough
    pairs gets one line naming the plateau and the check on unseen rollouts; a critic that ranks
    siblings, or too few pairs to tell, gets none."""
    from critic_pretrain.checkpoint import MANIFEST
    from critic_pretrain.commands.train import verdict_lines

    def step(name: str, auc: float, pairs: int):
        d = tmp_path / name
        d.mkdir()
        info = {"val:verdict": 1.0, "val:ev_vs_group_mean": 0.21, "val:ev_vs_group_mean_lo": 0.09,
                "val:ev_vs_group_mean_hi": 0.31, "val:sibling_auc_q4": auc, "val:sibling_pairs": pairs}
        (d / "training_info.json").write_text(json.dumps(info))
        size = (d / "training_info.json").stat().st_size
        (d / MANIFEST).write_text(json.dumps({"files": {"training_info.json": size}}))
        return verdict_lines(d)

    verdict_line, plateau = step("flat", 0.55, 240)
    assert verdict_line.startswith("verdict at the last evaluation on")
    assert ": helps (EV over the group mean" in verdict_line
    assert plateau.startswith("prompt-only plateau on") and "sibling AUC q4 0.55 over 240 pairs" in plateau
    assert f"`critic-pretrain seed check {tmp_path / 'flat'} --rollouts R`" in plateau
    assert len(step("ranks", 0.80, 240)) == 1
    assert len(step("few", 0.55, verdict.PLATEAU_PAIRS - 1)) == 1
    assert verdict.plateau_note(verdict.PLATEAU_AUC - 0.01, verdict.PLATEAU_PAIRS) is not None
    assert verdict.plateau_note(math.nan, 500) is None and verdict.plateau_note(None, None) is None
    # seed check, eval and report.md print Verdict.line: the same note follows the fix there
    iv = verdict.Interval(0.1, 0.05, 0.2)

    def judged(auc: float) -> str:
        return verdict.Verdict(call="helps", baseline="leave-one-out group mean", ev_vs_group_mean=iv,
                               ev_vs_batch_mean=iv, rho=iv,
                               sibling_auc=[verdict.Interval(auc, auc - 0.03, auc + 0.03)] * 4,
                               sibling_pairs=300, terminal_auc=None, first_token_ev_vs_group_mean=iv, groups=50,
                               rows=400).line()
    assert "Note: its values rank a prompt's better and worse responses near chance" in judged(0.55)
    assert "Note:" not in judged(0.8)


def test_a_verdict_over_few_prompts_says_its_intervals_are_optimistic(tmp_path):
    """Over 2 prompts a percentile bootstrap has 3 distinct resamples and a bound can equal the
    estimate (a new user saw "helps (EV 0.059 [0.059, 0.313])"): the call stands, its line says
    the interval is optimistic, below FEW_PROMPTS prompts and not at it; so do the end-of-run lines."""
    from critic_pretrain.checkpoint import MANIFEST
    from critic_pretrain.commands.train import verdict_lines

    rng = np.random.default_rng(1)
    for groups, noted in ((verdict.MIN_PROMPTS, True), (verdict.FEW_PROMPTS - 1, True), (verdict.FEW_PROMPTS, False)):
        rows = rng.random((4 * groups, verdict.N_FIELDS)) + 1
        rows[:, verdict.MEASURED] = 1
        rows[:, [verdict.S_G2, verdict.S_GG2]] += 10  # sums of squares that fit the sums: returns that vary
        v = verdict.judge(rows, np.repeat(np.arange(groups), 4), rng.random(4 * groups), rng.random(4 * groups),
                          grouped=True)
        assert v.call != "unknown" and v.groups == groups and v.metrics("val")["val/prompts"] == groups
        assert (f"Note: only {groups} prompts: a bootstrap over fewer than {verdict.FEW_PROMPTS} understates"
                in v.line()) is noted, v.line()

    def lines(prompts: int) -> list[str]:
        d = tmp_path / f"step_{prompts}"
        d.mkdir()
        info = {"val:verdict": 1.0, "val:ev_vs_group_mean": 0.06, "val:ev_vs_group_mean_lo": 0.06,
                "val:ev_vs_group_mean_hi": 0.31, "val:prompts": float(prompts)}
        (d / "training_info.json").write_text(json.dumps(info))
        size = (d / "training_info.json").stat().st_size
        (d / MANIFEST).write_text(json.dumps({"files": {"training_info.json": size}}))
        return verdict_lines(d)

    few, many = lines(2), lines(40)
    assert len(few) == 2 and "only 2 prompts" in few[1]
    assert few[1].endswith("evaluate on more prompts before relying on the call")
    assert len(many) == 1


def test_no_better_advice_follows_the_critic_s_targets():
    """"retrain with bootstrapped targets (..., if it did not use them)" was said to critics that
    did: the caller that knows the checkpoint's targets (eval, seed check) sets ``bootstrapped``."""
    iv = verdict.Interval(0.01, -0.1, 0.1)
    v = verdict.Verdict(call="no better than the group mean", baseline="leave-one-out group mean",
                        ev_vs_group_mean=iv, ev_vs_batch_mean=iv, rho=iv, sibling_auc=[iv] * 4, sibling_pairs=300,
                        terminal_auc=None, first_token_ev_vs_group_mean=iv, groups=50, rows=400)
    assert "targets.values_from=critic, if it did not use them" in v.fix
    v.bootstrapped = False
    assert "retrain with bootstrapped targets (targets.values_from=critic), more rollouts" in v.fix
    v.bootstrapped = True
    assert "values_from" not in v.fix and "(it already bootstraps from its own values)" in v.fix
    assert v.to_json()["bootstrapped"] is True and v.fix in v.line()

