"""The ``prefix`` environment: only the work before the first mistake counts.

Rows are key-steps' (``keysteps``: one answer with ``k`` key tokens in filler, then EOS).

- The prompt draws a difficulty ``d`` in 0..7 and a number of key steps ``k`` in 1..max_need,
  as in ``key-steps``: each key step is one token after a run of filler, good (an ACT_GOOD id)
  with probability ``p_good[d]``, bad (an ACT_BAD id) otherwise.
- What counts is the good key steps before the first bad one, ``g``. The first bad step stops
  the count: nothing after it moves the value. The reward is drawn as the answer ends: 1 with
  probability ``g / k``, else 0. A row cut at ``max_length`` earns 0.
- So the credit depends on the history: a key step matters only while no bad one came before
  it, and the first bad step costs the good steps the rest of the answer would have added. The
  mirror of ``undo`` (the good steps after the last bad one count): added in session sixteen as
  a *tuning* environment with history-dependent credit, so that a recipe for such credit can be
  chosen without looking at ``undo``.
"""

from __future__ import annotations

from functools import partial

from .keysteps import chain

build = partial(chain, rule="prefix")
"""key-steps' chain, where the first bad step stops the count of good steps."""
