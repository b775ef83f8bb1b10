"""Continuations of a policy from given token prefixes (``critic-pretrain audit``'s sampler).

``Sampling`` holds the settings the rollouts were sampled with (``_rollouts.json`` ``generation``);
``HFSampler`` samples with transformers ``generate`` (left-padded batches, ``n`` samples per
prefix, cut at the first end-of-sequence token and at each prefix's own budget); ``VLLMSampler``
does the same through vLLM when it is installed. Both return token ids only: scoring is the
caller's.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from ..errors import UserError


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the rollouts were sampled (``_rollouts.json`` ``generation``), overridable per flag."""

    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int = 0
    top_k: int | None = None
    """As recorded; None: not passed, so generate applies the policy's own generation config, as a
    plain ``generate(do_sample=True, temperature=..., top_p=...)`` call (the collector's) did."""

    @classmethod
    def of(cls, recorded: dict | None, *, temperature: float | None, top_p: float | None,
           max_new_tokens: int | None, seed: int) -> Sampling:
        rec = recorded or {}
        t = temperature if temperature is not None else rec.get("temperature")
        m = max_new_tokens if max_new_tokens is not None else rec.get("max_new_tokens")
        missing = [flag for flag, v in (("--temperature", t), ("--max-new-tokens", m)) if v is None]
        if missing:
            raise UserError(f"the rollouts do not record how they were sampled (_rollouts.json 'generation'); pass "
                            f"{' and '.join(missing)} as the policy sampled them")
        p = top_p if top_p is not None else rec.get("top_p", 1.0)
        if t < 0 or not 0 < p <= 1 or m < 1:
            raise UserError(f"sampling settings temperature={t} top_p={p} max_new_tokens={m}: need temperature >= 0, "
                            "0 < top_p <= 1, max_new_tokens >= 1")
        k = rec.get("top_k")
        return cls(float(t), float(p), int(m), seed, None if k is None else int(k))


class HFSampler:
    """Continuations with transformers ``generate``: prefixes left-padded into one batch, ``n``
    samples each (``num_return_sequences``), cut at the first end-of-sequence token (kept: the
    policy generated it) and at each prefix's own budget. temperature 0 is greedy (one sample)."""

    name = "transformers generate"

    def __init__(self, model, tokenizer, sampling: Sampling, device: torch.device):
        self.model, self.sampling, self.device = model, sampling, device
        eos = model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            self.eos.add(tokenizer.eos_token_id)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos, default=0)

    @torch.no_grad()
    def sample(self, prefixes: list[list[int]], budgets: list[int], n: int) -> list[list[list[int]]]:
        s = self.sampling
        width = max(map(len, prefixes))
        ids = torch.full((len(prefixes), width), self.pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prefixes):                                   # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        greedy = s.temperature == 0
        kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=s.temperature, top_p=s.top_p,
                                                           num_return_sequences=n)
        if s.top_k is not None and not greedy:
            kwargs["top_k"] = s.top_k
        out = self.model.generate(ids.to(self.device), attention_mask=attn.to(self.device),
                                  max_new_tokens=max(budgets), pad_token_id=self.pad,
                                  eos_token_id=sorted(self.eos) or None, **kwargs)
        new = out[:, width:].tolist()                                      # [len * n, new]; host sync
        per = 1 if greedy else n
        return [[self._trim(new[i * per + j], budgets[i]) for j in range(per)] for i in range(len(prefixes))]

    def _trim(self, tokens: list[int], budget: int) -> list[int]:
        tokens = tokens[:budget]
        for j, tok in enumerate(tokens):
            if tok in self.eos:
                return tokens[:j + 1]
        return tokens


class VLLMSampler:
    """The same continuations through vLLM (used when it is installed): token-id prompts, one
    ``SamplingParams`` per prefix for its budget. Not exercised by the CPU test suite."""

    name = "vLLM"

    def __init__(self, policy: str, sampling: Sampling):
        from vllm import LLM
        self.llm, self.sampling = LLM(model=policy, seed=sampling.seed), sampling

    def sample(self, prefixes: list[list[int]], budgets: list[int], n: int) -> list[list[list[int]]]:
        from vllm import SamplingParams
        s = self.sampling
        greedy = s.temperature == 0
        top_k = {} if s.top_k is None else {"top_k": s.top_k}
        params = [SamplingParams(n=1 if greedy else n, temperature=s.temperature, top_p=s.top_p, max_tokens=b, **top_k)
                  for b in budgets]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prefixes], params, use_tqdm=False)
        return [[list(o.token_ids) for o in out.outputs] for out in outs]


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def load_tokenizer(policy: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(policy, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(f"--policy {policy}: cannot load its tokenizer ({str(e).splitlines()[0]}); "
                        "pass the policy's folder or hub id") from None


def load_policy(policy: str, device: torch.device):
    """The causal LM of ``policy`` (a local folder or hub id, no remote code), loaded only once
    every check passed: bf16 on CUDA, float32 on CPU."""
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(policy, dtype=dtype, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(f"--policy {policy}: cannot load a causal LM ({str(e).splitlines()[0]}); "
                        "pass the policy's folder or hub id") from None
    return model.to(device).eval()
