"""The synthetic environment's vocabulary: token ids and which of them the policy emits.

Vocabulary (``VOCAB_SIZE`` = 512; id 0 is PAD and never appears in data)
-----------------------------------------------------------------------
==========================  =========  ==================================================
ids                         mask       meaning
==========================  =========  ==================================================
1 BOS, 2 PROMPT_END         0          prompt start / end
3 EOT, 4 EOS                1          end of a policy turn / of the answer
5 ENV_END, 6 GAME_OVER      0          end of an environment segment / out of turns
7 GRADER_END                0          end of the grader segment
8 OK, 9 FAIL                0          the environment's verdict on the last turn
10 VERDICT_PASS, 11 ..FAIL  0          the grader's verdict on the answer
12..19 DIFFICULTY+d         0          task difficulty d = 0 (easy) .. 7 (hard)
20..23 NEED+(k-1)           0          successes needed, k = 1..4
24..31 ACT_GOOD, 32..39     1          a good / bad action (first token of a turn)
ACT_BAD
40..43 ANSWER_GOOD, 44..47  1          a good / bad answer (first token of the answer)
ANSWER_BAD
48..112 STATUS              0          STATUS + need_left * 13 + turns_left
128..255 FILLER_PROMPT      0          + 16 * length_class + i
256..383 FILLER_POLICY      1          + 16 * length_class + i
384..511 FILLER_ENV         0          + 16 * length_class + i
==========================  =========  ==================================================
"""

from __future__ import annotations

import numpy as np

VOCAB_SIZE = 512


PAD = 0


BOS = 1


PROMPT_END = 2


EOT = 3


EOS = 4


ENV_END = 5


GAME_OVER = 6


GRADER_END = 7


OK = 8


FAIL = 9


VERDICT_PASS = 10


VERDICT_FAIL = 11


DIFFICULTY = 12


N_DIFFICULTY = 8


NEED = 20


MAX_NEED = 4


ACT_GOOD = 24


ACT_BAD = 32


N_ACT_IDS = 8


ANSWER_GOOD = 40


ANSWER_BAD = 44


N_ANSWER_IDS = 4


STATUS = 48


MAX_TURNS = 12


FILLER_PROMPT = 128


FILLER_POLICY = 256


FILLER_ENV = 384


N_LENGTH_CLASSES = 8


FILLER_IDS_PER_CLASS = 16


def _policy_token_table() -> np.ndarray:
    t = np.zeros(VOCAB_SIZE, dtype=bool)
    t[[EOT, EOS]] = True
    t[ACT_GOOD:ACT_BAD + N_ACT_IDS] = True
    t[ANSWER_GOOD:ANSWER_BAD + N_ANSWER_IDS] = True
    t[FILLER_POLICY:FILLER_ENV] = True
    return t


IS_POLICY_TOKEN = _policy_token_table()
"""``IS_POLICY_TOKEN[id]``: the policy emits this id (its loss_mask is 1)."""
