"""``critic-pretrain audit``: Monte-Carlo values from the policy against independent computations.

A tiny random policy (Qwen2 from a config) with a word-level tokenizer samples the rollouts'
continuations; the reward is a function of the decoded text. Greedy sampling makes every MC
value exact, so a per-state loop (unpadded ``generate`` one prefix at a time, the reward function
on the decoded text) must give the same numbers as the batched, left-padded audit; the critic's
values must be the head's output at ``t - 1`` of a plain forward; the prompt-only value the mean
reward of the group's other rollouts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL, tiny_overrides, train_main

from critic_pretrain.cli import main as cli_main
from critic_pretrain.eval import audit

PAD, UNK, EOS, BOS = 0, 1, 2, 3
REWARD_PY = '''
import re


def reward(prompt, response):
    """1.0 when the response names w5 or w9 (any turn), else 0.0."""
    return float(bool({"5", "9"} & set(re.findall(r"w(\\d+)", response))))


def wrong(prompt, response):
    return 1.0 - reward(prompt, response)
'''


def word_tokenizer(folder: Path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[EOS]", "[BOS]"] + [f"w{i}" for i in range(60)]
    raw = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]",
                                  bos_token="[BOS]")
    tok.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))  # as the audit loads it (decodes "w3w7": no spaces)


def rows(tok, reward, n_groups: int, per_group: int, seed: int) -> list[dict]:
    """Rollouts of a prompt, a first action, a tool reply (loss_mask 0) and a last action ending
    in EOS; rewards from ``reward`` on the decoded text, as a collector would score them."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(n_groups):
        prompt = [BOS] + rng.integers(4, 64, int(rng.integers(3, 6))).tolist()
        for i in range(per_group):
            act = rng.integers(4, 64, int(rng.integers(1, 4))).tolist()
            tool = rng.integers(4, 64, 2).tolist()
            last = rng.integers(4, 64, int(rng.integers(2, 7))).tolist() + [EOS]
            ids = prompt + act + tool + last
            mask = [0] * len(prompt) + [1] * len(act) + [0] * len(tool) + [1] * len(last)
            r = reward(tok.decode(prompt, skip_special_tokens=True),
                       tok.decode(ids[len(prompt):], skip_special_tokens=True))
            out.append({"input_ids": ids, "loss_mask": mask, "reward": r, "group_id": f"g{g}",
                        "sample_id": f"g{g}-{i}"})
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(policy folder, rollouts folder, reward file, a trained step, the rollout rows)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rollouts import write_rows
    from rollouts.provenance import write_manifest
    from rollouts.tokenizer import fingerprint

    tmp = tmp_path_factory.mktemp("audit")
    reward_py = tmp / "task.py"
    reward_py.write_text(REWARD_PY)
    ns: dict = {}
    exec(REWARD_PY, ns)
    policy = tmp / "policy"
    tok = word_tokenizer(policy)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**{**TINY_MODEL, "eos_token_id": EOS, "bos_token_id": BOS, "pad_token_id": PAD})
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(policy))
    data = tmp / "rollouts"
    table = rows(tok, ns["reward"], n_groups=24, per_group=6, seed=1)
    write_rows(data, table, shard_rows=200)
    write_manifest(data, tokenizer=fingerprint(tok), generation={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8})
    out = tmp / "run"
    assert train_main(tiny_overrides(out, data, **{"data.val_fraction": 0.25, "data.val_split": "both",
                                                    "train.max_steps": 4, "checkpoint.save_every": 4})) == 0
    return policy, data, reward_py, out / "step_4", table, ns["reward"]


def run_audit(world, tmp_path, *extra) -> dict:
    policy, data, reward_py, step, _, _ = world
    out = tmp_path / "audit.json"
    assert cli_main(["audit", str(step), "--policy", str(policy), "--reward", f"{reward_py}:reward",
                     "--rollouts", str(data), "--out", str(out), "--device", "cpu", *extra]) == 0
    return json.loads(out.read_text())


def test_greedy_audit_matches_a_per_state_loop(world, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from critic_pretrain import checkpoint as ckpt
    from critic_pretrain.config_io import load_config
    from critic_pretrain.eval import load_checkpoint_model

    policy, data, _, step, table, reward = world
    res = run_audit(world, tmp_path, "--temperature", "0", "--cuts", "3", "--max-rollouts", "8", "--batch", "3")
    printed = capsys.readouterr().out
    assert "estimate: the first batch of 3 states took" in printed and "vLLM is not installed" in printed
    assert {r["regime"] for r in res["rows"]} == {"prompt", "response"}  # both held-out regimes, nothing trained on
    n = {k: sum(r["regime"] == k for r in res["rows"]) for k in ("prompt", "response")}
    assert (f"audit: 8 held-out rollouts ({n['prompt']} of prompts it never trained on, {n['response']} of fresh "
            "responses to prompts it trained on)" in printed or f"audit: 8 held-out rollouts ({n['response']} of fresh "
            f"responses to prompts it trained on, {n['prompt']} of prompts it never trained on)" in printed), printed
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    critic = load_checkpoint_model(step, load_config(ckpt.StepPaths(step).config_yaml), torch.device("cpu"))
    import xxhash
    by_hash = {f"{xxhash.xxh3_64_intdigest(np.asarray(r['input_ids'], np.int32).tobytes()):016x}": r for r in table}
    checked = 0
    for row in res["rows"]:
        src = by_hash[row["row_hash"]]
        ids, mask = src["input_ids"], np.array(src["loss_mask"])
        first = int(np.flatnonzero(mask)[0])
        on = np.flatnonzero(mask)
        a = int(on[np.flatnonzero(np.diff(on) > 1)[-1] + 1])           # the last action's first token
        assert row["turn"] == [a, len(ids) - 1]
        others = [r["reward"] for r in table if r["group_id"] == src["group_id"] and r is not src]
        assert row["prompt_only"] == pytest.approx(np.mean(others))
        with torch.no_grad():
            head = critic(input_ids=torch.tensor([ids])).logits[0, :, 0]    # plain forward, no shifting
        length = len(ids) - a
        assert [c["position"] for c in row["cuts"]] == sorted({a + k * length // 3 for k in range(3)})
        for cut in row["cuts"]:
            t = cut["position"]
            assert cut["critic"] == pytest.approx(float(head[t - 1]), abs=1e-5)
            budget = max(1, 8 - (t - a))
            with torch.no_grad():  # one prefix, no padding
                gen = model.generate(torch.tensor([ids[:t]]), max_new_tokens=budget, do_sample=False,
                                     pad_token_id=PAD, eos_token_id=EOS)[0, t:].tolist()
            cont = gen[:gen.index(EOS) + 1] if EOS in gen else gen
            want = reward(tok.decode(ids[:first], skip_special_tokens=True),
                          tok.decode(ids[first:t] + cont, skip_special_tokens=True))
            assert cut["mc"] == want and cut["mc_se"] == 0 and cut["samples"] == 1
            checked += 1
    assert checked >= 16


def test_sampled_audit_writes_what_report_reads(world, tmp_path):
    res = run_audit(world, tmp_path, "--cuts", "2", "--samples", "4", "--max-rollouts", "6")
    assert res["settings"]["temperature"] == 1.0 and res["settings"]["max_new_tokens"] == 8  # as recorded
    for row in res["rows"]:
        for cut in row["cuts"]:
            assert cut["samples"] == 4 and cut["mc"] * 4 == pytest.approx(round(cut["mc"] * 4))  # 0/1 rewards
    o = res["summary"]["overall"]
    c = np.array([cut["critic"] for r in res["rows"] for cut in r["cuts"]])
    m = np.array([cut["mc"] for r in res["rows"] for cut in r["cuts"]])
    if "corr_critic" in o:
        assert o["corr_critic"] == pytest.approx(np.corrcoef(c, m)[0, 1])
    assert res["summary"]["call"] in ("better", "no better", "worse", "unknown")


def test_reward_function_that_disagrees_with_the_rollouts_is_refused(world, tmp_path, capsys):
    policy, data, reward_py, step, _, _ = world
    code = cli_main(["audit", str(step), "--policy", str(policy), "--reward", f"{reward_py}:wrong",
                     "--rollouts", str(data), "--out", str(tmp_path / "a.json"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "the reward function" in err[0] and "rollout " in err[0]
    assert not (tmp_path / "a.json").exists()


@pytest.mark.parametrize("spec, says", [("nocolon", "expected module:function"),
                                        ("no_such_module_xyz:f", "cannot import"),
                                        ("missing.py:f", "no such file")])
def test_bad_reward_specs_are_one_line(spec, says):
    from critic_pretrain.errors import UserError
    with pytest.raises(UserError, match=says):
        audit.load_reward_fn(spec)


def test_ceiling_is_what_a_perfect_value_reaches_with_noisy_mc():
    """Independent check of the MC-noise ceiling: simulate true values, estimate them with n
    Bernoulli samples each; the true values' correlation with the estimates is the ceiling."""
    rng = np.random.default_rng(0)
    v = rng.uniform(0.05, 0.95, 4000)
    n = 8
    mc = rng.binomial(n, v) / n
    se = np.sqrt(mc * (1 - mc) / (n - 1))                 # the sample sd / sqrt(n), as Cut.mc_se
    out = audit.compare(v, np.full_like(v, v.mean()) + rng.normal(0, 1e-3, len(v)), mc, se,
                        np.arange(len(v)), boot=50)
    assert out["ceiling"] == pytest.approx(np.corrcoef(v, mc)[0, 1], abs=0.02)
    assert out["mse_critic"] == pytest.approx(0.0, abs=0.003)  # noise removed: a perfect value has no error
    assert audit.call(out) == "better"


def test_cut_positions_and_last_turn():
    assert audit.last_turn(np.array([0, 0, 1, 1, 0, 1, 1, 1])) == (5, 7)
    assert audit.last_turn(np.array([0, 1, 1, 1])) == (1, 3)
    assert audit.cut_positions((5, 12), 4) == [5, 7, 9, 11]
    assert audit.cut_positions((5, 6), 4) == [5, 6]
    c = audit.Cut(0, 5, 3, returns=[1.0, 0.0, 1.0, 1.0])
    assert c.mc == 0.75 and c.mc_se == pytest.approx(np.std([1, 0, 1, 1], ddof=1) / 2)
    assert math.isnan(audit.Cut(0, 5, 3).mc)


def test_report_quotes_the_audit(world, tmp_path):
    """The default output lands where `report` reads it; report.md gets a section with the findings."""
    from critic_pretrain.report import write_report
    policy, data, reward_py, step, _, _ = world
    assert cli_main(["audit", str(step), "--policy", str(policy), "--reward", f"{reward_py}:reward",
                     "--rollouts", str(data), "--cuts", "2", "--samples", "2", "--max-rollouts", "6",
                     "--device", "cpu"]) == 0
    saved = step.parent / "eval" / "step_4-audit.json"
    res = json.loads(saved.read_text())
    _, text = write_report([step.parent], tmp_path / "report", evaluate=False)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Audit of step_4: the critic against the policy's Monte-Carlo values" in md
    assert all(line.strip() in md for line in res["lines"])
    saved.unlink()  # other tests in this module see the run as it was


def test_a_constant_critic_is_compared_not_skipped():
    rng = np.random.default_rng(1)
    mc = rng.binomial(8, rng.uniform(0.1, 0.9, 300)) / 8
    prompt = mc + rng.normal(0, 0.3, 300)               # knows something
    out = audit.compare(np.full(300, 0.5), prompt, mc, np.full(300, 0.1), np.arange(300), boot=50)
    assert out["corr_critic"] == 0.0 and audit.call(out) == "worse"


def test_mc_from_reuses_an_earlier_audits_continuations(world, tmp_path, capsys):
    """MC values belong to the policy: a second audit with --mc-from samples nothing and carries
    the same returns; an audit with other sampling settings is refused in one line."""
    first = run_audit(world, tmp_path, "--cuts", "2", "--samples", "3", "--max-rollouts", "5")
    src = tmp_path / "first.json"
    (tmp_path / "audit.json").rename(src)
    capsys.readouterr()
    second = run_audit(world, tmp_path, "--cuts", "2", "--samples", "3", "--max-rollouts", "5", "--mc-from", str(src))
    said = capsys.readouterr().out
    states = sum(len(r["cuts"]) for r in first["rows"])
    assert f"reused the continuations of {states} state(s)" in said and "estimate:" not in said
    assert [[c["returns"] for c in r["cuts"]] for r in second["rows"]] == \
        [[c["returns"] for c in r["cuts"]] for r in first["rows"]]
    assert second["summary"] == first["summary"] and second["reused"] == states
    policy, data, reward_py, step, _, _ = world
    code = cli_main(["audit", str(step), "--policy", str(policy), "--reward", f"{reward_py}:reward", "--rollouts",
                     str(data), "--cuts", "2", "--samples", "4", "--max-rollouts", "5", "--mc-from", str(src),
                     "--out", str(tmp_path / "x.json"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "its samples is 3, this audit's 4" in err[0]


def test_rollouts_the_policy_cannot_have_sampled_are_refused(world, tmp_path, capsys):
    """Token ids beyond the policy's vocabulary: one line naming the rollout, before any sampling."""
    import json as _json

    from transformers import AutoConfig
    policy, data, reward_py, step, _, _ = world
    small = tmp_path / "small-policy"
    import shutil
    shutil.copytree(policy, small)
    cfg = AutoConfig.from_pretrained(small)
    cfg.vocab_size = 8
    (small / "config.json").write_text(_json.dumps(cfg.to_dict()))
    code = cli_main(["audit", str(step), "--policy", str(small), "--reward", f"{reward_py}:reward", "--rollouts",
                     str(data), "--out", str(tmp_path / "a.json"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "outside the policy's vocabulary (8 tokens)" in err[0]
