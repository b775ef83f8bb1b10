"""The ``synergy`` environment: a good step is worth more the more good steps came before it.

Rows are key-steps' (``keysteps``: one answer with ``k`` key tokens in filler, then EOS).

- The prompt draws a difficulty ``d`` in 0..7 and a number of key steps ``k`` in 1..max_need,
  as in ``key-steps``: each key step is one token after a run of filler, good (an ACT_GOOD id)
  with probability ``p_good[d]``, bad (an ACT_BAD id) otherwise.
- Every good key step counts, as in key-steps, but the reward is 1 with probability ``(g / k)^2``
  (``g`` good steps), else 0. A row cut at ``max_length`` earns 0.
- So what a key step is worth depends on the history: after ``g`` good steps, with ``r`` more to
  come after this one at ``p = p_good[d]``, a good step rather than a bad one adds ``(2 (g + r p) + 1) / k^2`` to the
  value, growing with every good step before it. The critic has to count, as in ``undo`` (where a
  step's worth grows with the streak before it); here nothing is thrown away. Added in session
  sixteen as a *tuning* environment for credit that depends on a count of earlier steps, so that a
  recipe for ``undo``'s kind of credit is chosen without ``undo``'s figures (``prefix``, added
  first, turned out to depend on a flag only: its steps' worth does not grow with a count).
"""

from __future__ import annotations

from functools import partial

from .keysteps import chain

build = partial(chain, rule="synergy")
"""key-steps' chain, where the reward's chance is the share of good steps squared."""
