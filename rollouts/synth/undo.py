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

from functools import partial

from .keysteps import chain

build = partial(chain, rule="streak")
"""key-steps' chain, where a bad step resets the count of good steps to 0."""
