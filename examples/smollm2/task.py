"""The task of the real SmolLM2 sample: single-digit addition with a programmatic reward.

"What is 7 + 5? Answer with the number only." SmolLM2-135M-Instruct answers such prompts right
about a quarter of the time when sampled at temperature 0.7 ("7 + 5 = 13", "The answer is 12"),
so rewards vary within a prompt's group. The credit sits inside the response, at the number the
model writes last: the tokens after it do not change the reward.

``reward(prompt, response)`` is the reward function (1.0 when the last integer in the response
is the sum, else 0.0); it takes the prompt's text, so it can score any continuation of it
(``module:function`` for tools that need a reward function: ``examples.smollm2.task:reward``).
"""

from __future__ import annotations

import random
import re

TEMPLATE = "What is {a} + {b}? Answer with the number only."
_PROMPT = re.compile(r"What is (\d+) \+ (\d+)\?")
_INT = re.compile(r"-?\d+")


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct prompts (at most 81: a, b in 1..9), in a seeded order."""
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(seed).shuffle(pairs)
    if n > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct prompts, asked for {n}")
    return [TEMPLATE.format(a=a, b=b) for a, b in pairs[:n]]


def answer(prompt: str) -> int:
    m = _PROMPT.search(prompt)
    if m is None:
        raise ValueError(f"not a prompt of this task: {prompt[:80]!r}")
    return int(m.group(1)) + int(m.group(2))


def reward(prompt: str, response: str) -> float:
    """1.0 when the last integer of ``response`` is the sum asked for in ``prompt``, else 0.0."""
    found = _INT.findall(response)
    return float(bool(found) and int(found[-1]) == answer(prompt))
