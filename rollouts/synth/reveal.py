"""The ``reveal`` environment: tool outputs reveal, test by test, whether the policy's plan works.

Segments of a row::

    prompt  BOS DIFFICULTY+d NEED+(k-1) prompt-filler... PROMPT_END          mask 0
    plan    ACT_GOOD|ACT_BAD policy-filler... EOT                             mask 1
    test    OK|FAIL env-filler... ENV_END                                     mask 0
    react   policy-filler... EOT                                              mask 1
    ...     2k tests, a reaction after each but the last
    answer  policy-filler... EOS                                              mask 1

- The prompt draws a difficulty ``d`` in 0..7 and ``k`` in 1..max_need (2k tests).
- The plan is good (an ACT_GOOD id) with probability ``p_good[d]``. Whether the plan *works* is
  hidden: it works with probability ``PRIOR[good]``. Each test passes (OK) with probability
  ``p_ok_good`` when it works and ``p_ok_bad`` when it does not.
- The reward is 1 if the plan works (drawn as the answer ends, given what the tests showed),
  0 if the answer does not fit in ``max_length``.
- The chain's state is the belief, (plan, passes, fails): the exact value after a test is the
  posterior chance that the plan works (times the chance that EOS still fits), so the value moves
  on environment tokens and nothing the policy writes after its plan matters. A critic must read
  the tool outputs; the advantage of the policy's later tokens is 0.
"""

from __future__ import annotations

from itertools import product

from .chain import Chain, Exit, Lengths, SynthParams
from .vocab import ACT_BAD, ACT_GOOD, ENV_END, EOS, EOT, FAIL, FILLER_ENV, FILLER_POLICY, N_ACT_IDS, N_DIFFICULTY, OK

PRIOR = {True: 0.8, False: 0.2}
"""Chance that the plan works, by whether the policy's plan token was good."""


def posterior(p: SynthParams, good: bool, passes: int, fails: int) -> float:
    """P(the plan works | its token, ``passes`` passed and ``fails`` failed tests)."""
    w = PRIOR[good] * p.p_ok_good ** passes * (1 - p.p_ok_good) ** fails
    b = (1 - PRIOR[good]) * p.p_ok_bad ** passes * (1 - p.p_ok_bad) ** fails
    return w / (w + b)


def build(p: SynthParams, lengths: dict[str, Lengths]) -> Chain:
    ch = Chain()
    lt, le = lengths["policy"], lengths["env"]
    p_good = p.p_good()
    ch.prompt(p, lengths["prompt"], lambda d, k: ch.state("plan", d, k))
    for d, k in product(range(N_DIFFICULTY), range(1, p.max_need + 1)):
        plan = ch.state("plan", d, k)
        for good, prob, lo in ((True, p_good[d], ACT_GOOD), (False, 1 - p_good[d], ACT_BAD)):
            first = ch.state("planning", d, k, good)
            ch.edge(plan, first, prob, lo, N_ACT_IDS, policy=True)
            ch.filler(first, ("plan", d, k, good), FILLER_POLICY, lt, [Exit(ch.state("test", 2 * k, good, 0, 0), EOT)],
                      policy=True)
    # ("test", n, good, passes, fails): the next test's output, n tests in all.
    for n, good in product(range(2, 2 * p.max_need + 1, 2), (True, False)):
        for passes, fails in ((a, t - a) for t in range(n) for a in range(t + 1)):
            w = posterior(p, good, passes, fails)
            p_pass = w * p.p_ok_good + (1 - w) * p.p_ok_bad
            test = ch.state("test", n, good, passes, fails)
            ch.edge(test, ch.state("output", n, good, passes + 1, fails), p_pass, OK, policy=False)
            ch.edge(test, ch.state("output", n, good, passes, fails + 1), 1 - p_pass, FAIL, policy=False)
        # ("output", n, good, passes, fails): the rest of a test's output, then the policy's turn.
        for passes, fails in ((a, t - a) for t in range(1, n + 1) for a in range(t + 1)):
            seen = (n, good, passes, fails)
            last = passes + fails == n
            nxt = ch.state("answer" if last else "react", *seen)
            ch.filler(ch.state("output", *seen), ("output", *seen), FILLER_ENV, le, [Exit(nxt, ENV_END)],
                      policy=False)
            if last:
                works = posterior(p, good, passes, fails)
                exits = [Exit(ch.end, EOS, works, outcome=1.0), Exit(ch.end, EOS, 1 - works)]
            else:
                exits = [Exit(ch.state("test", *seen), EOT)]
            ch.filler(nxt, ("answer" if last else "react", *seen), FILLER_POLICY, lt,
                      [x for x in exits if x.prob > 0], policy=True)
    return ch
