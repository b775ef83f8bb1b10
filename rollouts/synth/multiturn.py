"""The ``tools`` environment (the bundled one): a multi-turn tool task. ``dense`` is the same chain
with a process reward on every action and a per-token penalty.

Used to test and demo critic pretraining: a critic trained on these rows can be scored
against ``oracle_values``, the exact value of every state, and an alignment bug shows up
as a measurable error at the positions where the value jumps.

The environment
---------------
Every row is one path of a token-level Markov chain (``chain``: exact values, sampling, value
semantics). Segments of a row::

    prompt  BOS DIFFICULTY+d NEED+(k-1) prompt-filler... PROMPT_END                 mask 0
    turn    ACT_GOOD|ACT_BAD policy-filler... EOT                                   mask 1
    env     OK|FAIL STATUS(need_left, turns_left) env-filler... ENV_END|GAME_OVER    mask 0
    ...     turns repeat until k turns succeeded or ``max_turns`` turns were used
    answer  ANSWER_GOOD|ANSWER_BAD policy-filler... EOS                              mask 1
    grader  (with probability grader_prob) VERDICT_* env-filler... GRADER_END        mask 0

- The prompt (shared by the ``group_size`` rollouts of a group) draws a difficulty
  ``d`` in 0..7 and a number of successes needed ``k`` in 1..max_need, both uniform.
- The policy plays a good action with probability ``p_good[d]``, linear in ``d`` from
  ``p_good_easy`` to ``p_good_hard``. The environment's turn succeeds (OK) with probability
  ``p_ok_good`` after a good action and ``p_ok_bad`` after a bad one, then shows the
  progress in a STATUS token.
- After ``k`` successes the policy answers; the answer is good with probability
  ``(1 + p_good[d]) / 2``. Out of turns, the environment says GAME_OVER and the row ends on
  an environment segment. A grader segment after the answer also ends a row on
  environment tokens: its outcome reward still sits on the last policy token (EOS).
- Outcome reward (``reward``) is 1 for a good answer whose EOS fits in ``max_length``,
  else 0; truncated rows therefore get 0, as length-capped rollouts do in real runs.
  With ``token_penalty`` > 0 every policy token also carries ``-token_penalty`` in
  ``token_rewards``; with ``step_reward`` > 0 a good action's token carries +step_reward and a
  bad one's -step_reward (the credit is then immediate as well as delayed).
- Lengths: ``chain`` (long-tailed filler runs, fitted to ``median_length``).
"""

from __future__ import annotations

from itertools import product

from .chain import Chain, Exit, Lengths, SynthParams
from .vocab import (
    ACT_BAD,
    ACT_GOOD,
    ANSWER_BAD,
    ANSWER_GOOD,
    ENV_END,
    EOS,
    EOT,
    FAIL,
    FILLER_ENV,
    FILLER_POLICY,
    GAME_OVER,
    GRADER_END,
    MAX_TURNS,
    N_ACT_IDS,
    N_ANSWER_IDS,
    N_DIFFICULTY,
    OK,
    STATUS,
    VERDICT_FAIL,
    VERDICT_PASS,
)


# long: the chain's edges, one segment of a rollout after another (prompt, turns, env, answer, grader)
def build(p: SynthParams, lengths: dict[str, Lengths]) -> Chain:
    ch = Chain()
    lt, le = lengths["policy"], lengths["env"]
    p_good = p.p_good()
    ch.prompt(p, lengths["prompt"], lambda d, k: ch.state("act", d, k, p.max_turns))

    # (d, need_left, turns_left): a policy turn, then the environment's verdict.
    for d, r, u in product(range(N_DIFFICULTY), range(1, p.max_need + 1), range(1, p.max_turns + 1)):
        act = ch.state("act", d, r, u)
        for good, prob, lo in ((True, p_good[d], ACT_GOOD), (False, 1 - p_good[d], ACT_BAD)):
            first = ch.state("turn", d, r, u, good)
            ch.edge(act, first, prob, lo, N_ACT_IDS, policy=True,
                    token_reward=p.step_reward if good else -p.step_reward)
            verdict = ch.state("verdict", d, r, u, good)
            ch.filler(first, ("turn", d, r, u, good), FILLER_POLICY, lt, [Exit(verdict, EOT)], policy=True)
            p_ok = p.p_ok_good if good else p.p_ok_bad
            ch.edge(verdict, ch.state("status", d, r - 1, u - 1), p_ok, OK, policy=False)
            ch.edge(verdict, ch.state("status", d, r, u - 1), 1 - p_ok, FAIL, policy=False)

    # The environment's segment after a verdict: progress, output, and what comes next.
    for d, r, u in product(range(N_DIFFICULTY), range(p.max_need + 1), range(p.max_turns)):
        status = ch.state("status", d, r, u)
        env = ch.state("env", d, r, u)
        ch.edge(status, env, 1.0, STATUS + r * (MAX_TURNS + 1) + u, policy=False)
        if r == 0:
            nxt, tok = ch.state("answer", d), ENV_END
        elif u == 0:
            nxt, tok = ch.end, GAME_OVER
        else:
            nxt, tok = ch.state("act", d, r, u), ENV_END
        ch.filler(env, ("env", d, r, u), FILLER_ENV, le, [Exit(nxt, tok)], policy=False)

    answer_segment(ch, p, lt, le)
    return ch


def answer_segment(ch: Chain, p: SynthParams, lt: Lengths, le: Lengths) -> None:
    """From states ``("answer", d)``: ``ANSWER_GOOD|ANSWER_BAD policy-filler... EOS`` (mask 1), good
    with probability ``(1 + p_good[d]) / 2`` and reward 1 when good, then the grader segment."""
    p_answer = (1.0 + p.p_good()) / 2
    for d in range(N_DIFFICULTY):
        answer = ch.state("answer", d)
        for good, prob, lo in ((True, p_answer[d], ANSWER_GOOD), (False, 1 - p_answer[d], ANSWER_BAD)):
            first = ch.state("answer", d, good)
            ch.edge(answer, first, prob, lo, N_ANSWER_IDS, policy=True)
            ch.filler(first, ("answer", d, good), FILLER_POLICY, lt,
                      [Exit(ch.state("graded", good), EOS, outcome=float(good))], policy=True)
    grader_segment(ch, p, le)


def grader_segment(ch: Chain, p: SynthParams, le: Lengths) -> None:
    """After the answer's EOS (states ``("graded", good)``): with probability ``grader_prob`` a
    grader segment ``VERDICT_* env-filler... GRADER_END`` (mask 0), else the row ends there."""
    for good in (True, False):
        graded, grader = ch.state("graded", good), ch.state("grader", good)
        ch.edge(graded, grader, p.grader_prob, VERDICT_PASS if good else VERDICT_FAIL, policy=False)
        ch.edge(graded, ch.end, 1 - p.grader_prob, 0, 0, policy=False)
        ch.filler(grader, ("grader", good), FILLER_ENV, le, [Exit(ch.end, GRADER_END)], policy=False)
