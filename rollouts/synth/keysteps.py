"""The ``key-steps`` environment (and ``long``, the same chain at 2k+ policy tokens; ``undo``,
``prefix`` and ``synergy``, the same chain where what a key step is worth depends on the ones
before it): the
credit sits on a few decisive tokens in the middle of one long answer.

Segments of a row::

    prompt  BOS DIFFICULTY+d NEED+(k-1) prompt-filler... PROMPT_END          mask 0
    answer  policy-filler... KEY  (k times)  policy-filler... EOS              mask 1

- The prompt draws a difficulty ``d`` in 0..7 and a number of key steps ``k`` in 1..max_need.
- Each key step is one token after a run of filler: good (an ACT_GOOD id) with probability
  ``p_good[d]``, bad (an ACT_BAD id) otherwise. Nothing else the policy writes matters.
- The outcome reward is drawn as the answer ends: 1 with probability ``g / k`` (``g`` good key
  steps), else 0; so the value after the last key step is ``g / k`` and every key step moves it
  by ``(1 - p_good[d]) / k`` or ``-p_good[d] / k``. A row cut at ``max_length`` earns 0.
- No environment tokens after the prompt: the critic has to find the key tokens inside the
  turn; a turn-level critic (one value per turn) cannot express this credit.
"""

from __future__ import annotations

from functools import partial
from itertools import product

from .chain import Chain, Exit, Lengths, SynthParams
from .vocab import ACT_BAD, ACT_GOOD, EOS, FILLER_POLICY, N_ACT_IDS, N_DIFFICULTY

RULES = ("sum", "streak", "prefix", "synergy")
"""Which good key steps count and how: all of them (key-steps), those since the last bad one
(undo), those before the first bad one (prefix); all of them, the reward's chance their share
squared (synergy)."""


def chain(p: SynthParams, lengths: dict[str, Lengths], *, rule: str) -> Chain:
    """The key-step chain; ``rule`` (``RULES``) says which good steps count towards ``g``."""
    if rule not in RULES:
        raise ValueError(f"unknown key-step rule {rule!r}; known: {', '.join(RULES)}")
    ch = Chain()
    lt = lengths["policy"]
    p_good = p.p_good()
    ch.prompt(p, lengths["prompt"], lambda d, k: ch.state("run", d, k, 0, 0, 0))
    # ("run", d, k, j, g, x): filler before key step j + 1 (j == k: before EOS), g good steps that
    # count, x = 1 once a bad step has stopped the count (prefix only).
    stops = (0, 1) if rule == "prefix" else (0,)
    for d, k, x in product(range(N_DIFFICULTY), range(1, p.max_need + 1), stops):
        for j in range(k + 1):
            for g in range(j + 1):
                if j < k:
                    good = (g + 1, x) if not x else (g, x)
                    bad = {"sum": (g, 0), "streak": (0, 0), "prefix": (g, 1), "synergy": (g, 0)}[rule]
                    exits = [Exit(ch.state("run", d, k, j + 1, *good), ACT_GOOD, p_good[d], N_ACT_IDS),
                             Exit(ch.state("run", d, k, j + 1, *bad), ACT_BAD, 1 - p_good[d], N_ACT_IDS)]
                else:  # one EOS, two outcomes: the reward is drawn as the answer ends
                    win = (g / k) ** 2 if rule == "synergy" else g / k
                    exits = [Exit(ch.end, EOS, win, outcome=1.0), Exit(ch.end, EOS, 1 - win)]
                ch.filler(ch.state("run", d, k, j, g, x), ("filler", d, k, j, g, x), FILLER_POLICY, lt,
                          [e for e in exits if e.prob > 0], policy=True)
    return ch


build = partial(chain, rule="sum")
