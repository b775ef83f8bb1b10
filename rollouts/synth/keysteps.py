"""The ``key-steps`` environment (and ``long``, the same chain at 2k+ policy tokens; ``undo``, the
same chain where a bad step resets the count): the credit sits on a few decisive tokens in the
middle of one long answer.

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


def chain(p: SynthParams, lengths: dict[str, Lengths], *, undo: bool) -> Chain:
    """The key-step chain; ``undo``: a bad step resets the count of good steps to 0 (``undo``'s
    streak) instead of leaving it (key-steps' sum)."""
    ch = Chain()
    lt = lengths["policy"]
    p_good = p.p_good()
    ch.prompt(p, lengths["prompt"], lambda d, k: ch.state("run", d, k, 0, 0))
    # ("run", d, k, j, g): filler before key step j + 1 (j == k: before EOS), g good steps that count.
    for d, k in product(range(N_DIFFICULTY), range(1, p.max_need + 1)):
        for j in range(k + 1):
            for g in range(j + 1):
                if j < k:
                    exits = [Exit(ch.state("run", d, k, j + 1, g + 1), ACT_GOOD, p_good[d], N_ACT_IDS),
                             Exit(ch.state("run", d, k, j + 1, 0 if undo else g), ACT_BAD, 1 - p_good[d], N_ACT_IDS)]
                else:  # one EOS, two outcomes: the reward is drawn as the answer ends
                    exits = [Exit(ch.end, EOS, g / k, outcome=1.0), Exit(ch.end, EOS, 1 - g / k)]
                ch.filler(ch.state("run", d, k, j, g), ("filler", d, k, j, g), FILLER_POLICY, lt,
                          [x for x in exits if x.prob > 0], policy=True)
    return ch


build = partial(chain, undo=False)
