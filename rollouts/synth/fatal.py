"""The ``fatal`` environment: one mistake ends the episode.

Segments of a row::

    prompt  BOS DIFFICULTY+d NEED+(k-1) prompt-filler... PROMPT_END          mask 0
    turn    policy-filler... STEP policy-filler... EOT                        mask 1
    env     OK env-filler... ENV_END                                          mask 0
    ...     k turns whose step was sound
    answer  ANSWER_GOOD|ANSWER_BAD policy-filler... EOS                        mask 1
    grader  (with probability grader_prob) VERDICT_* env-filler... GRADER_END  mask 0

- The prompt draws a difficulty ``d`` in 0..7 and a number of turns ``k`` in 1..max_need.
- Inside every turn, after a run of filler, the policy takes one step: sound (an ACT_GOOD id)
  or a mistake (an ACT_BAD id) with probability ``(1 - p_good[d]) / 2``. A mistake ends the
  episode at once: the environment answers GAME_OVER (one token, mask 0), reward 0.
- After ``k`` sound steps the policy answers as in ``tools``: good with probability
  ``(1 + p_good[d]) / 2``, reward 1 for a good answer whose EOS fits in ``max_length``.
- The value drops to 0 at the mistake token, in the middle of a turn, and the row ends on an
  environment token right after it: the critic must put the loss on that one policy token.
"""

from __future__ import annotations

from itertools import product

from .chain import Chain, Exit, Lengths, SynthParams
from .multiturn import answer_segment
from .vocab import (
    ACT_BAD,
    ACT_GOOD,
    ENV_END,
    EOT,
    FILLER_ENV,
    FILLER_POLICY,
    GAME_OVER,
    N_ACT_IDS,
    N_DIFFICULTY,
    OK,
)


def p_mistake(p: SynthParams):
    """Probability of a mistake in a turn at each difficulty."""
    return (1 - p.p_good()) / 2


def build(p: SynthParams, lengths: dict[str, Lengths]) -> Chain:
    ch = Chain()
    lt, le = lengths["policy"], lengths["env"]
    mistake = p_mistake(p)
    ch.prompt(p, lengths["prompt"], lambda d, k: ch.state("turn", d, k))
    dead = ch.state("dead")
    ch.edge(dead, ch.end, 1.0, GAME_OVER, policy=False)
    # ("turn", d, r): a turn with r sound steps still needed.
    for d, r in product(range(N_DIFFICULTY), range(1, p.max_need + 1)):
        sound = ch.state("sound", d, r)
        ch.filler(ch.state("turn", d, r), ("before", d, r), FILLER_POLICY, lt,
                  [Exit(sound, ACT_GOOD, 1 - mistake[d], N_ACT_IDS), Exit(dead, ACT_BAD, mistake[d], N_ACT_IDS)],
                  policy=True)
        env = ch.state("env", d, r - 1)
        ch.filler(sound, ("after", d, r), FILLER_POLICY, lt, [Exit(env, EOT)], policy=True)
        ok = ch.state("ok", d, r - 1)
        ch.edge(env, ok, 1.0, OK, policy=False)
        nxt = ch.state("answer", d) if r == 1 else ch.state("turn", d, r - 1)
        ch.filler(ok, ("env", d, r - 1), FILLER_ENV, le, [Exit(nxt, ENV_END)], policy=False)
    answer_segment(ch, p, lt, le)
    return ch
