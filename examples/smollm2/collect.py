"""Collect real rollouts from SmolLM2-135M-Instruct on the addition task, as schema v1.

    python examples/smollm2/collect.py --prompts 48 --group 8 --out examples/smollm2/rollouts

Each prompt is sampled ``--group`` times in one batch (the chat template, temperature 0.7, at
most ``--max-new-tokens``); a response ends at the first end-of-turn token, which it keeps (the
policy generated it). A rollout is the prompt's tokens (loss_mask 0) followed by the response's
(loss_mask 1), with the task's reward, ``group_id`` per prompt, the decoded ``prompt`` and
``response`` as extra columns. ``_rollouts.json`` records the model, the tokenizer's fingerprint,
the generation settings and that the rewards are raw. Time is bounded by prompts x group x
max-new-tokens; the first batch gives an estimate of the rest (about 8 s per batch of 8 x 32
tokens on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the checkout: rollouts, and examples.smollm2

from examples.smollm2 import task  # noqa: E402
from examples.smollm2.model import hf_folder  # noqa: E402


def generate_group(model, tok, prompt: str, group: int, max_new_tokens: int, temperature: float):
    """``group`` sampled responses to ``prompt``: (prompt ids, [response ids], [truncated])."""
    import torch

    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    batch = torch.tensor([ids] * group)
    with torch.no_grad():
        out = model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=max_new_tokens,
                             do_sample=True, temperature=temperature, top_p=1.0, pad_token_id=tok.pad_token_id)
    responses, truncated = [], []
    for row in out[:, len(ids):].tolist():
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        responses.append(row[:end])
        truncated.append(tok.eos_token_id not in row)
    return ids, responses, truncated


def collect(out: Path, n_prompts: int, group: int, max_new_tokens: int, temperature: float, seed: int) -> dict:
    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollouts import ShardWriter, table_from_rows
    from rollouts.provenance import RewardsLogged, write_manifest
    from rollouts.tokenizer import fingerprint

    folder = hf_folder()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    rows, t0 = [], time.perf_counter()
    for i, prompt in enumerate(task.prompts(n_prompts, seed=seed)):
        ids, responses, truncated = generate_group(model, tok, prompt, group, max_new_tokens, temperature)
        for j, (resp, cut) in enumerate(zip(responses, truncated)):
            text = tok.decode(resp, skip_special_tokens=True)
            rows.append({"input_ids": ids + resp, "loss_mask": [0] * len(ids) + [1] * len(resp),
                         "reward": task.reward(prompt, text), "sample_id": f"p{i}-s{j}", "group_id": f"p{i}",
                         "policy_version": 0, "truncated": cut, "prompt": prompt, "response": text})
        if i == 0:
            per = time.perf_counter() - t0
            print(f"first group: {per:.1f} s; about {per * (n_prompts - 1) / 60:.1f} min for the rest", flush=True)
    with ShardWriter(out) as writer:  # the text columns are extras: they need their types
        writer.write_table(table_from_rows(rows, extra=pa.schema([("prompt", pa.string()), ("response", pa.string())])))
    settings = {"prompts": n_prompts, "group": group, "max_new_tokens": max_new_tokens, "temperature": temperature,
                "seed": seed}
    write_manifest(out, generator="examples/smollm2/collect.py", model="SmolLM2-135M-Instruct (Q4_1 GGUF, "
                   "dequantized)", tokenizer=fingerprint(tok), generation=settings,
                   rewards=RewardsLogged(stated_by="examples/smollm2/task.py: reward").to_dict())
    rewards = [r["reward"] for r in rows]
    return {"rollouts": len(rows), "mean_reward": sum(rewards) / len(rewards), "seconds": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "rollouts")
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(collect(a.out, a.prompts, a.group, a.max_new_tokens, a.temperature, a.seed))


if __name__ == "__main__":
    main()
