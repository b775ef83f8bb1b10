"""The ``undo`` environment: a mistake undoes the work before it.

Segments of a row::

    prompt  BOS DIFFICULTY+d NEED+(k-1) prompt-filler... PROMPT_END          mask 0
    answer  policy-filler... KEY  (k times)  policy-filler... EOS              mask 1

- The prompt draws a difficulty ``d`` in 0..7 and a number of key steps ``k`` in 1..max_need,
  as in ``key-steps``: each key step is one token after a run of filler, good (an ACT_GOOD id)
  with probability ``p_good[d]``, bad (an ACT_BAD id) otherwise.
- What counts is the *streak*: the good key steps since the last bad one. A bad step sets it to
  0, so it throws away the good steps before it. The reward is drawn as the answer ends: 1 with
  probability ``s / k`` (``s`` the final streak), else 0. A row cut at ``max_length`` earns 0.
- So the credit depends on the history: a bad step costs the streak it ends (nothing after an
  earlier bad one, the most after a run of good ones), and a good step is worth the chance that
  no bad step follows it. ``key-steps`` adds the good steps up (``g / k``): the same tokens, where
  every bad step costs the same.
"""

from __future__ import annotations

from itertools import product

from .chain import Chain, Exit, Lengths, SynthParams
from .vocab import ACT_BAD, ACT_GOOD, EOS, FILLER_POLICY, N_ACT_IDS, N_DIFFICULTY


def build(p: SynthParams, lengths: dict[str, Lengths]) -> Chain:
    ch = Chain()
    lt = lengths["policy"]
    p_good = p.p_good()
    ch.prompt(p, lengths["prompt"], lambda d, k: ch.state("run", d, k, 0, 0))
    # ("run", d, k, j, s): filler before key step j + 1 (j == k: before EOS), a streak of s good steps.
    for d, k in product(range(N_DIFFICULTY), range(1, p.max_need + 1)):
        for j in range(k + 1):
            for s in range(j + 1):
                if j < k:
                    exits = [Exit(ch.state("run", d, k, j + 1, s + 1), ACT_GOOD, p_good[d], N_ACT_IDS),
                             Exit(ch.state("run", d, k, j + 1, 0), ACT_BAD, 1 - p_good[d], N_ACT_IDS)]
                else:  # one EOS, two outcomes: the reward is drawn as the answer ends
                    exits = [Exit(ch.end, EOS, s / k, outcome=1.0), Exit(ch.end, EOS, 1 - s / k)]
                ch.filler(ch.state("run", d, k, j, s), ("filler", d, k, j, s), FILLER_POLICY, lt,
                          [x for x in exits if x.prob > 0], policy=True)
    return ch
