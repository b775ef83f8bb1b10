"""The benchmarks: the throughput benchmark end to end at tiny size on CPU (figures are not asserted),
and the PPO benchmark's bookkeeping (resume, summary, verdict) on hand-made runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from critic_pretrain.bench import Result, main


def test_bench_tiny_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--shape", "tiny", "--steps", "2", "--warmup", "1", "--max-tokens", "1024", "--median", "100",
                 "--max-len", "512", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    # MFU against a GPU's peak is no figure for a CPU run: none, unless the CPU's peak is given
    assert "| MFU (n/a on CPU: --peak-tflops) |" in capsys.readouterr().out
    assert all(r["mfu"] is None for r in res["results"].values())
    assert res["results"]["ours"]["padding"] == 0.0
    assert res["results"]["baseline"]["padding"] > 0.1  # long-tailed lengths waste padded tokens
    for r in res["results"].values():
        assert r["tokens_per_s"] > 0 and 0 <= r["data_wait"] < 1
    assert res["pipeline"]["prepare_tokens_per_s"] > 0


def test_mfu_formula():
    # 6 * N * tokens + 12 * layers * hidden * sum(L^2), over time and peak
    r = Result("x", steps=1, seconds=2.0, real_tokens=1000, padded_tokens=1000, attn_sum_sq=1e6, data_wait=0.0,
               peak_mem_gb=0.0)
    flops = 6 * 1e9 * 1000 + 12 * 10 * 100 * 1e6
    assert abs(r.mfu(n_matmul=10**9, layers=10, hidden=100, peak_tflops=1.0) - flops / 2.0 / 1e12) < 1e-12


def _bench(name: str):
    """bench/<name>.py as a module (bench/ is scripts, not a package)."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ppo_warm():
    return _bench("ppo_warm")


def test_ppo_benchmark_continues_its_own_runs_and_refuses_other_settings(tmp_path):
    w = _ppo_warm()
    settings = {"ppo": w.PPO, "steps": 30, "warmup": 50}
    assert w.resume(tmp_path, settings) == []
    (tmp_path / "runs.json").write_text(json.dumps([{"arm": "warm", "seed": 0}]))
    assert w.resume(tmp_path, settings) == [{"arm": "warm", "seed": 0}]
    import pytest
    with pytest.raises(SystemExit, match="other settings"):
        w.resume(tmp_path, {**settings, "warmup": 10})


def test_ppo_benchmark_verdict_names_the_control_when_it_is_as_good():
    w = _ppo_warm()

    def run(arm, seed, reward, ev=0.1):
        return {"arm": arm, "seed": seed, "warmup": [], "seconds": 1.0,
                "steps": [{"reward": reward, "value_loss": 0.1, "ev": ev, "ev_prompt": 0.0, "seconds": i + 1.0}
                          for i in range(10)]}
    runs = [run(a, s, r + 0.01 * s) for s in (0, 1) for a, r in (("warm", 0.9), ("cold", 0.88), ("no critic", 0.9))]
    rows = w.summarize(runs, pretrain_s=60.0, threshold=0.8, steps=10)
    assert [r["arm"] for r in rows] == ["warm", "cold", "no critic"]
    assert rows[0]["steps_to_threshold"] == [5, 5] and rows[0]["seconds_to_threshold"] == [65.0, 65.0]
    said = w.verdict(rows)
    assert "no critic" in said and "is as good" in said
    runs = [run(a, s, r) for s in (0, 1) for a, r in (("warm", 0.95), ("no critic", 0.5))]
    assert "is as good" not in w.verdict(w.summarize(runs, 60.0, 0.8, 10))


def test_key_response_scores_the_exact_values_as_exact(tmp_path, monkeypatch):
    """A "critic" that returns the exact values moves exactly as they do at every decisive token
    (a shift between the script's critic and exact changes would break the correlation); a
    trained tiny critic runs end to end on the same decisive tokens."""
    import json as _json

    import pyarrow.dataset as ds
    import torch
    from conftest import TINY_MODEL, tiny_overrides, train_main

    from rollouts.synth.archive import write
    from rollouts.synth.vocab import VOCAB_SIZE
    data = tmp_path / "ks"
    write(data, rows=24, seed=3, env="key-steps", median_length=60.0)
    model = {**TINY_MODEL, "vocab_size": VOCAB_SIZE}
    assert train_main(tiny_overrides(tmp_path / "run", data, **{"train.max_steps": 2, "checkpoint.save_every": 0,
                                                               "model.config": _json.dumps(model)})) == 0
    step = tmp_path / "run" / "step_2"
    kr = _bench("key_response")
    trained = kr.summary(kr.changes(step, data, rows=12), threshold=0.01)
    assert trained["decisive"] > 0 and trained["other"] > trained["decisive"]

    rows = ds.dataset(data).head(12).to_pylist()
    exact = {tuple(r["input_ids"]): r["oracle_values"] for r in rows}
    monkeypatch.setattr(kr, "token_values", lambda m, ids, pos: torch.tensor([exact[tuple(ids[0].tolist())]]))
    s = kr.summary(kr.changes(step, data, rows=12), threshold=0.01)
    assert s["corr_decisive"] > 0.999999
    assert s["critic_std_decisive"] == s["exact_std_decisive"] and s["critic_std_other"] == s["exact_std_other"]
    assert s["decisive"] == trained["decisive"]


def test_recipe_table_names_the_shipped_default_from_the_config():
    """bench/recipes.md's "shipped default" is read from configs/demo.yaml, and every recipe names its
    lambda, so moving the default relabels no recipe and no stored row."""
    import yaml
    from conftest import ROOT

    r = _bench("recipe_envs")
    lam = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())["targets"]["lam"]
    shipped = [name for name in r.RECIPES if r.shipped(name)]
    assert len(shipped) == 1 and f"TD({lam:g})" in r.RECIPES[shipped[0]][0]
    assert all(any(o.startswith("targets.lam=") for o in over) for _, over in r.RECIPES.values())
    row = {"steps": 1200, "all": {"gap_closed": 0.5}, "first": {"gap_closed": 0.4}, "ev": 0.3, "ev_ceiling": 0.5,
           "ev_group_mean": 0.1, "turn_change_corr": None}
    cell = {"critic": 0.2, "prompt_only": 0.1, "exact": 0.3}
    runs = [{**row, "recipe": shipped[0], "env": e, "all": {**cell, "gap_closed": g}}
            for e, g in zip(r.TUNE, (0.7, 0.2, 0.9, 0.6, 0.6, 0.6), strict=True)]
    table = r.render({"runs": runs})
    line = next(x for x in table.splitlines() if x.startswith(f"| **{shipped[0]}** (shipped default)"))
    assert line.endswith("| 20% | 60% |")  # the worst tuning environment, the choice; then the mean


def test_recipe_table_reports_the_seed_spread():
    """The line under the table says how far the shipped recipe moves with another training seed,
    from the rows of its seed twins (the shipped config plus `seed=` only); other recipes do not count."""
    r = _bench("recipe_envs")
    shipped = next(name for name in r.RECIPES if r.shipped(name))
    twins = [name for name in r.RECIPES if r.seed_of(name) is not None]
    assert twins and shipped not in twins and all(r.seed_of(t) != 0 for t in twins)
    assert r.seed_of("td0.8") is None  # another lambda: not a twin, whatever its seed
    row = {"steps": 1200, "first": {"gap_closed": 0.4}, "ev": 0.3, "ev_ceiling": 0.5, "ev_group_mean": 0.1,
           "turn_change_corr": None}
    cell = {"critic": 0.2, "prompt_only": 0.1, "exact": 0.3}
    runs = [{**row, "recipe": name, "env": env, "all": {**cell, "gap_closed": g}}
            for name, env, g in [(shipped, "tools", 0.70), (twins[0], "tools", 0.58), (shipped, "fatal", 0.56),
                                 (twins[0], "fatal", 0.60), (shipped, "key-steps", 0.1), ("td0.8", "tools", 0.0)]]
    line = next(x for x in r.render({"runs": runs}).splitlines() if x.startswith("Seed spread"))
    assert "tools 70% / 58%; fatal 56% / 60%." in line and "key-steps" not in line
    assert "up to 12% (8% on average)" in line
    assert not any(x.startswith("Seed spread") for x in r.render({"runs": runs[:1]}).splitlines())


def test_recipe_table_retrains_a_row_whose_targets_differ(tmp_path, monkeypatch):
    """A stored row is reused only for the targets it ran: after the default's lambda moved, a row
    trained with another lambda is trained again, never relabelled."""
    r = _bench("recipe_envs")
    monkeypatch.setattr(r, "NUMBERS", tmp_path / "n.json")
    monkeypatch.setattr(r, "DOC", tmp_path / "doc.md")
    r.DOC.write_text("")
    trained = []
    monkeypatch.setattr(r, "archive", lambda work, env, rows, seed: tmp_path / f"{env}-{seed}")
    monkeypatch.setattr(r, "train", lambda work, recipe, env, data: (trained.append(recipe),
                                                                      (tmp_path / "step_1200", 1.0))[1])
    monkeypatch.setattr(r, "score", lambda step, heldout: {
        "all": {"gap_closed": 0.5, "critic": 0.2, "prompt_only": 0.1, "exact": 0.3}, "first": {"gap_closed": 0.5},
        "ev": 0.3, "ev_ceiling": 0.5, "ev_group_mean": 0.1, "turn_change_corr": None, "value_std": 0.1})
    stale = {"recipe": "td0.8", "env": "tools", "steps": r.steps_of("td0.8", "tools"),
             "targets": {**r.targets_of("td0.8", "tools"), "lam": 0.95}, "all": {"gap_closed": 0.1},
             "first": {"gap_closed": 0.1}}
    r.NUMBERS.write_text(json.dumps({"runs": [stale]}))
    monkeypatch.setattr("sys.argv", ["recipe_envs", "--only", "td0.8", "--envs", "tools"])
    r.main()
    assert trained == ["td0.8"]
    row = json.loads(r.NUMBERS.read_text())["runs"][0]
    assert row["targets"]["lam"] == 0.8 and row["all"]["gap_closed"] == 0.5
    r.main()  # now it matches: kept
    assert trained == ["td0.8"]


def test_profile_step_names_the_top_operators(capsys):
    """bench/profile_step.py: tokens/s and an operator table per variant (what found the
    per-rollout SDPA on the H200)."""
    assert _bench("profile_step").main(["--shape", "tiny", "--steps", "1", "--warmup", "1", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "## ours: parameters torch.float32, attention critic_packed" in out and "## baseline" in out
    assert out.count("real tokens/s over 1 steps") == 2 and "aten::mm" in out


def test_length_sweep_trains_the_shipped_default_per_median(tmp_path, monkeypatch):
    """bench/length_sweep.py: one run per median with the shipped config's schedule and no recipe
    overrides beyond the long-row budget, scored like recipe_envs, one JSON line per median."""
    s = _bench("length_sweep")
    made, trained = [], []
    monkeypatch.setattr(s, "archive", lambda work, median, rows, seed, cut: made.append((median, rows, seed, cut))
                        or tmp_path)
    monkeypatch.setattr(s.recipe_envs, "train_run", lambda run, data, steps, over: (
        trained.append((run.name, steps, over)), (tmp_path / f"step_{steps}", 1.0))[1])
    monkeypatch.setattr(s.recipe_envs, "score", lambda step, heldout: {"all": {"gap_closed": 0.5}})
    out = tmp_path / "rows.jsonl"
    assert s.main(["--medians", "1000", "2000", "--work", str(tmp_path), "--json", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["median"] for r in rows] == [1000, 2000] and rows[0]["all"]["gap_closed"] == 0.5
    steps = s.recipe_envs.steps_of("td0.98", "long")
    assert trained == [("tools-1000", steps, ["data.max_tokens=8192"]), ("tools-2000", steps, ["data.max_tokens=8192"])]
    assert (1000, s.recipe_envs.TRAIN_ROWS, 0, 4096) in made and (2000, 800, s.recipe_envs.HELDOUT_SEED, 4096) in made
    # the cut-or-length probe: long-tools' generator cut, a model with 8,192 positions, fresh seeds
    made.clear(), trained.clear()
    assert s.main(["--medians", "4000", "--work", str(tmp_path), "--generator-cut", "8192", "--positions", "8192",
                   "--seed", "1"]) == 0
    assert made == [(4000, s.recipe_envs.TRAIN_ROWS, 1, 8192), (4000, 800, s.recipe_envs.HELDOUT_SEED + 1, 8192)]
    assert trained == [("tools-4000-g8192-p8192-s1", steps, ["data.max_tokens=8192",
                                                            "model.config.max_position_embeddings=8192"])]


def test_recipe_table_scores_a_keep_best_recipe_at_its_own_pick(tmp_path, monkeypatch):
    """A recipe that sets checkpoint.keep_best is scored at the saved step with the best validation
    loss (read from the run's training_info.json, as a user's keep_best and report pick it), and its
    row keeps the same run's last step next to it; other recipes are scored at their last step."""
    from critic_pretrain import checkpoint as ckpt

    r = _bench("recipe_envs")
    best = next(name for name, (_, over) in r.RECIPES.items() if "checkpoint.keep_best=1" in over)
    run = tmp_path / "run"
    for step, loss in {100: 0.30, 200: 0.10, 300: 0.10, 2400: 0.20}.items():  # ties go to the earlier step
        d = run / f"step_{step}"
        d.mkdir(parents=True)
        (d / "training_info.json").write_text(json.dumps({"val:loss": loss}))
        (d / ckpt.MANIFEST).write_text(json.dumps({"files": {"training_info.json": (d / "training_info.json")
                                                                                     .stat().st_size}}))
    last = run / "step_2400"
    assert r.picked(best, "tools", last) == run / "step_200"
    assert r.picked("td0.98-2400", "tools", last) == last

    monkeypatch.setattr(r, "NUMBERS", tmp_path / "n.json")
    monkeypatch.setattr(r, "DOC", tmp_path / "doc.md")
    r.DOC.write_text("")
    monkeypatch.setattr(r, "archive", lambda work, env, rows, seed: tmp_path / f"{env}-{seed}")
    monkeypatch.setattr(r, "train", lambda work, recipe, env, data: (last, 1.0))
    gap = {"step_200": 0.7, "step_2400": 0.5}
    monkeypatch.setattr(r, "score", lambda step, heldout: {
        "all": {"gap_closed": gap[step.name], "critic": 0.2, "prompt_only": 0.1, "exact": 0.3},
        "first": {"gap_closed": 0.4}, "ev": 0.3, "ev_ceiling": 0.5, "ev_group_mean": 0.1, "turn_change_corr": None,
        "value_std": 0.1})
    monkeypatch.setattr("sys.argv", ["recipe_envs", "--only", best, "--envs", "tools"])
    r.main()
    row = json.loads(r.NUMBERS.read_text())["runs"][0]
    assert row["scored_step"] == 200 and row["all"]["gap_closed"] == 0.7 and row["last"]["all"]["gap_closed"] == 0.5
    doc = r.DOC.read_text()
    assert "2,400 steps; scored at step tools 200 |" in doc
    assert "tools 70% at step 200 / 50% at step 2,400." in doc

    (last / "training_info.json").write_text(json.dumps({"val:loss": 0.0}))  # now the last step is the best
    (last / ckpt.MANIFEST).write_text(json.dumps({"files": {"training_info.json": (last / "training_info.json")
                                                                                   .stat().st_size}}))
    monkeypatch.setattr("sys.argv", ["recipe_envs", "--only", best, "--envs", "tools", "--redo"])
    r.main()
    row = json.loads(r.NUMBERS.read_text())["runs"][0]
    assert row["scored_step"] == 2400 and "last" not in row
    assert "2,400 steps; scored at step tools 2,400 |" in r.DOC.read_text()


def test_recipe_table_records_when_each_run_left_the_prompt_only_plateau(tmp_path):
    """left_plateau reads a run's metrics.jsonl: the first validation step whose advantages close
    PLATEAU_EXIT of the gap (training lines and a learn-then-lose later do not count); the line
    under the table lists it per environment, 'never' for a run that did not."""
    r = _bench("recipe_envs")
    key = "val/adv_corr_all_lam0.95"

    def run(name: str, gaps: dict[int, float]) -> Path:
        d = tmp_path / name
        d.mkdir()
        lines = [{"step": 1, "train/loss": 0.1}]
        lines += [{"step": s, key: 0.1 + 0.2 * g, f"{key}_group_mean": 0.1, f"{key}_oracle_values": 0.3}
                  for s, g in gaps.items()]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return d

    assert r.left_plateau(run("a", {0: -0.3, 50: -0.03, 100: 0.09, 150: 0.4, 200: 0.02})) == 150
    assert r.left_plateau(run("b", {0: -0.3, 50: -0.03, 100: 0.05})) is None
    row = {"steps": 1200, "first": {"gap_closed": 0.4}, "ev": 0.3, "ev_ceiling": 0.5, "ev_group_mean": 0.1,
           "turn_change_corr": None, "all": {"gap_closed": 0.5, "critic": 0.2, "prompt_only": 0.1, "exact": 0.3}}
    shipped = next(name for name in r.RECIPES if r.shipped(name))
    twin = next(name for name in r.RECIPES if r.seed_of(name) is not None)
    runs = [{**row, "recipe": shipped, "env": "key-steps", "left_plateau": 150},
            {**row, "recipe": twin, "env": "key-steps", "left_plateau": None},
            {**row, "recipe": shipped, "env": "tools", "left_plateau": 100}]  # alone in its env: no entry
    line = next(x for x in r.render({"runs": runs}).splitlines() if x.startswith("Leaving the prompt-only plateau"))
    assert f"key-steps: {shipped} 150, {twin} never in 1,200." in line and "tools" not in line
    assert not any(x.startswith("Leaving") for x in r.render({"runs": runs[:1]}).splitlines())

    # the oracle-free sign: the scored step's validation sibling AUC q4 (the last one logged at that step)
    d = run("c", {})
    with (d / "metrics.jsonl").open("a") as f:
        f.writelines(json.dumps({"step": s, "val/sibling_auc_q4": a}) + "\n" for s, a in ((100, 0.5), (200, 0.6),
                                                                                            (200, 0.9)))
    assert r.val_at(d, 200, "val/sibling_auc_q4") == 0.9 and r.val_at(d, 300, "val/sibling_auc_q4") is None
    runs = [{**x, "val_sibling_auc_q4": a} for x, a in zip(runs, (0.85, 0.55, 0.75))]
    text = r.render({"runs": runs})
    assert "never left the plateau: 0.55-0.55 (1 runs); runs that did: 0.75-0.85 (2 runs)." in text


def test_credit_parts_scores_the_exact_values_one_and_the_prompt_only_value_zero():
    """bench/credit_parts.py: the exact values as the critic close the whole gap, the prompt-only
    value none; leaving out the exact change at good or at bad key steps loses part of it (undo's
    credit sits on both). Its reference GAE loop equals the project's compute_gae."""
    import torch

    from critic_pretrain.targets import compute_gae
    from rollouts import synth

    c = _bench("credit_parts")
    rows = synth.generate(160, seed=3, env="undo").to_pylist()
    exact = [np.asarray(r["oracle_values"]) for r in rows]
    parts = c.gap_closed(rows, exact)
    assert parts["critic"] == pytest.approx(1.0)
    assert parts["exact + the critic's jitter"] > 0.95  # the exact values' own small moves within a stretch
    assert 0.05 < parts["exact without the good steps' change"] < 0.95
    assert 0.05 < parts["exact without the bad steps' change"] < 0.95
    means = {}
    for r in rows:
        means.setdefault(r["group_id"], []).append(r["reward"])
    loo = [np.full(len(r["input_ids"]), (sum(means[r["group_id"]]) - r["reward"]) / (len(means[r["group_id"]]) - 1))
           for r in rows]
    assert c.gap_closed(rows, loo)["critic"] == pytest.approx(0.0, abs=1e-9)
    rng = np.random.default_rng(0)
    v, rew = rng.normal(size=40), rng.normal(size=40)
    ours, _ = compute_gae(torch.tensor(rew)[None], torch.ones(1, 40), gamma=1.0, lam=0.95, values=torch.tensor(v)[None])
    assert np.allclose(c.gae(v, rew), ours[0].numpy())


def test_state_ceiling_reads_the_whole_state_before_each_token():
    """bench/state_ceiling.py: positions that share its state share their exact value (up to the
    truncation risk of long rows), at the alignment of oracle_values (the value before token t);
    the views without the rule's count do not. Its tabular values close most of undo's gap, a view
    without any count almost none. Non-key-step environments are refused."""
    from collections import defaultdict

    from rollouts import synth

    s = _bench("state_ceiling")
    for env in ("undo", "prefix", "synergy", "key-steps"):
        rows, rule = synth.generate(120, seed=3, env=env).to_pylist(), s.rule_of(env)
        spread = {}
        for name, view in s.VIEWS.items():
            seen = defaultdict(list)
            for r in rows:
                for t, (st, v, m) in enumerate(zip(s.states(r["input_ids"], rule), r["oracle_values"], r["loss_mask"])):
                    if m and t < 400:  # later positions carry max_length's truncation risk
                        seen[tuple(st[i] for i in view)].append(v)
            spread[name] = max(np.ptp(v) for v in seen.values())
        full, summed, none = spread.values()
        assert full < 0.1, env
        assert none > 0.5, env
        assert (summed > 0.5) == (env in ("undo", "prefix")), env  # the rules that drop good steps
    assert s.rule_of("undo") == "streak"
    with pytest.raises(SystemExit, match="not a key-step environment"):
        s.rule_of("tools")
    train, fresh = (synth.generate(n, seed=seed, env="undo").to_pylist() for n, seed in ((800, 3), (240, 4)))
    closed = s.ceiling(train, fresh, "streak")
    assert closed["the state (d, k, j, the rule's count)"] > 0.6
    assert closed["d, k, j (no count)"] < 0.2


def test_backbone_envs_trains_the_shipped_targets_on_a_given_folder_and_scores_both_picks(tmp_path):
    """bench/backbone_envs.py (the device measurement of issue 23) on a tiny Hugging Face folder:
    the run starts from the folder's weights (they barely move in 2 steps at lr 2e-5), uses the
    shipped targets, and one JSON line scores the kept best and the last step."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from critic_pretrain.config_io import load_config
    from critic_pretrain.eval.from_checkpoint import load_checkpoint_model

    folder = tmp_path / "backbone"
    cfg = AutoConfig.for_model("qwen2", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    source = AutoModelForCausalLM.from_config(cfg)
    source.save_pretrained(folder)
    b = _bench("backbone_envs")
    out = tmp_path / "out.jsonl"
    assert b.main([str(folder), "--envs", "undo", "--steps", "2", "--rows", "48", "--fresh-rows", "32",
                   "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["env"] == "undo" and res["best"]["step"] == res["last"]["step"] == 2
    assert all(np.isfinite(res[k]["gap_closed"]) for k in ("best", "last"))
    step = tmp_path / "work" / "runs" / "backbone-backbone-undo-48-2" / "step_2"
    run_cfg = load_config(step / "config.yaml")
    assert run_cfg.model.name_or_path == str(folder) and run_cfg.targets.lam == 0.98
    assert run_cfg.targets.values_from == "critic" and run_cfg.train.rollouts_per_step == 12
    critic = load_checkpoint_model(step, run_cfg, torch.device("cpu"))
    embed = source.model.embed_tokens.weight
    assert torch.allclose(critic.model.embed_tokens.weight, embed, atol=1e-3)
    assert not torch.allclose(critic.model.embed_tokens.weight, embed)  # trained, from the folder's weights


def test_exact_targets_trains_the_shipped_model_on_the_exact_values(tmp_path):
    """bench/exact_targets.py (issue 23's reading of what the model can learn): the archive it trains
    on carries the exact values as its `values` column, row for row, and the run bootstraps TD(0)
    targets from them (the shipped model and optimizer otherwise); one JSON line scores it."""

    import pyarrow.parquet as pq

    from critic_pretrain.config_io import load_config

    e = _bench("exact_targets")
    out = tmp_path / "out.jsonl"
    assert e.main(["--envs", "undo", "--seeds", "0", "--steps", "2", "--rows", "48", "--fresh-rows", "32",
                   "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["env"] == "undo" and res["lam"] == 0.0 and np.isfinite(res["gap_closed"])
    for name in ("undo-48-0-exact", "undo-32-101-exact"):
        table = pq.read_table(tmp_path / "work" / "data" / name)
        assert table.column("values").to_pylist() == table.column("oracle_values").to_pylist()
        assert table.num_rows in (48, 32)
    step = tmp_path / "work" / "runs" / "exact-lam0-seed0-undo-48-2" / "step_2"
    cfg = load_config(step / "config.yaml")
    assert cfg.targets.values_from == "data" and cfg.targets.lam == 0.0
    assert cfg.model.config["hidden_size"] == 64 and cfg.optim.lr == 3e-3  # configs/demo.yaml's model and optimizer
