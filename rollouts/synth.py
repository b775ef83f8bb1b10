"""Synthetic multi-turn rollouts whose true state values are known exactly.

Used to test and demo critic pretraining: a critic trained on these rows can be scored
against ``oracle_values``, the exact value of every state, and an alignment bug shows up
as a measurable error at the positions where the value jumps.

The environment
---------------
Every row is one path of a token-level Markov chain. Each emitted token determines the
chain's next state, so the state before any token is a function of the token prefix and
the value of a prefix is a table lookup ``V[state, position]``; the table is computed
exactly by backward induction over positions (no sampling). Segments of a row::

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
  ``token_rewards``.
- Lengths: each filler run draws a length class ``c`` in 0..7 (weights of a discretised
  normal, mean length ``scale * base * exp(length_sigma * z_c)``) and then a geometric
  length with that mean. The class is visible (every filler id encodes it) and the
  geometric length is memoryless, which keeps the chain's state finite while the row
  lengths are long-tailed. ``scale`` is fitted so the median row length is close to
  ``median_length``; rows are cut at ``max_length`` (``truncated``). Prompts are capped at
  ``max_length // 4`` tokens (the prompt filler then ends with PROMPT_END).

Value semantics
---------------
``oracle_values[t]`` is E[sum of rewards at positions >= t | tokens 0..t-1] under this
chain, i.e. the value of the state just before token ``t`` is emitted, the NeMo-RL / verl
alignment. ``gamma`` (default 1) discounts once per policy token and carries across
prompt and environment tokens, like the project's GAE targets. ``oracle_values[0]`` is 0
by convention (alignment), not the mean return. After EOS every value is 0: the outcome
reward has been received. Truncation is part of the chain, so values near ``max_length``
are lower than far from it.

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

API: ``generate`` (a table), ``write`` (shards and a ``_synth.json`` manifest),
``monte_carlo_value`` (sampled value of a prefix, for tests), ``SynthEnv`` (the chain),
``value_stats`` and ``rollouts synth`` on the command line. numpy and pyarrow only.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from .errors import RolloutError
from .fileio import publish_files, write_json
from .schema import canonical_schema
from .writer import DEFAULT_SHARD_ROWS, ShardWriter

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

# Mean filler lengths of the three kinds of segments before ``scale`` (fitted to the
# median row length) multiplies them; their ratios shape a row (long turns, short prompts).
_BASE_MEAN = {"prompt": 12.0, "policy": 16.0, "env": 8.0}
_Z = np.linspace(-2.0, 2.0, N_LENGTH_CLASSES)
_CLASS_WEIGHTS = np.exp(-_Z ** 2 / 2) / np.exp(-_Z ** 2 / 2).sum()
_CALIBRATION_ROWS = 2048
_CALIBRATION_SEED = 12345
# Rows per generation chunk: tokens and states buffers are chunk_rows x max_length.
_CHUNK_CELLS = 1 << 24
_VALUE_BLOCK = 128
MANIFEST = "_synth.json"
"""Manifest next to the shards; the leading underscore makes pyarrow / pandas dataset readers skip it."""


@dataclass(frozen=True)
class SynthParams:
    """Environment and policy parameters (``generate(..., **params)``)."""

    max_length: int = 2048
    """Rows are cut at this many tokens (``truncated``; reward 0 unless EOS fit)."""
    median_length: float = 200.0
    """Target median row length; the filler length scale is fitted to it."""
    length_sigma: float = 1.3
    """Spread of the log mean length across the 8 length classes (long tail)."""
    group_size: int = 8
    """Rollouts per prompt."""
    max_turns: int = 6
    """Policy turns before GAME_OVER (1..12)."""
    max_need: int = 3
    """Successful turns needed are drawn from 1..max_need (1..4)."""
    p_good_easy: float = 0.85
    """Probability of a good action at difficulty 0."""
    p_good_hard: float = 0.1
    """Probability of a good action at difficulty 7."""
    p_ok_good: float = 0.9
    """Probability that a turn succeeds after a good action."""
    p_ok_bad: float = 0.05
    """Probability that a turn succeeds after a bad action."""
    grader_prob: float = 0.3
    """Probability of a grader segment after the answer (row ends on env tokens)."""
    token_penalty: float = 0.0
    """Per policy token reward of -token_penalty (adds the token_rewards column)."""
    gamma: float = 1.0
    """Discount per policy token for oracle values."""
    policy_version: int = 0
    """Written to every row: the chain's policy is fixed."""

    def check(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        need(self.max_length >= 64, f"max_length must be >= 64, got {self.max_length}")
        need(32 <= self.median_length <= self.max_length / 2,
             f"median_length must be in [32, max_length / 2 = {self.max_length / 2:g}], got {self.median_length:g}")
        need(0 <= self.length_sigma <= 3, f"length_sigma must be in [0, 3], got {self.length_sigma:g}")
        need(self.group_size >= 1, f"group_size must be >= 1, got {self.group_size}")
        need(1 <= self.max_turns <= MAX_TURNS, f"max_turns must be in 1..{MAX_TURNS}, got {self.max_turns}")
        need(1 <= self.max_need <= min(MAX_NEED, self.max_turns),
             f"max_need must be in 1..min({MAX_NEED}, max_turns), got {self.max_need}")
        for name in ("p_good_easy", "p_good_hard", "p_ok_good", "p_ok_bad", "grader_prob"):
            v = getattr(self, name)
            need(0 <= v <= 1, f"{name} must be a probability, got {v:g}")
        need(self.token_penalty >= 0, f"token_penalty must be >= 0, got {self.token_penalty:g}")
        need(0 < self.gamma <= 1, f"gamma must be in (0, 1], got {self.gamma:g}")

    @property
    def max_prompt_length(self) -> int:
        return self.max_length // 4


@dataclass(frozen=True)
class Lengths:
    """Filler length law of one kind of segment: class ``c`` w.p. ``weights[c]``, then
    Geometric(``stop[c]``) tokens (>= 1)."""

    weights: np.ndarray
    stop: np.ndarray

    @classmethod
    def make(cls, mean: float, sigma: float) -> "Lengths":
        means = mean * np.exp(sigma * _Z)
        return cls(_CLASS_WEIGHTS, np.minimum(1.0, 1.0 / means))


class _Chain:
    """Token-level Markov chain: states with outgoing edges; an edge emits one token drawn
    uniformly from ``[tok_lo, tok_lo + tok_n)`` (``tok_n`` 0: no token, the episode ends)."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self._edges: list[list[tuple]] = []
        self._forced: list[tuple[int, int, int]] = []
        self.end = self.state("end")
        self.start = self.state("start")

    def state(self, *name) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.ids)
            self._edges.append([])
        return self.ids[name]

    def edge(self, src: int, dst: int, prob: float, lo: int, n: int = 1, *,
             policy: bool, outcome: float = 0.0) -> None:
        self._edges[src].append((dst, prob, lo, n, outcome, policy))

    def filler(self, first: int, key: tuple, base: int, lengths: Lengths, end: int, end_token: int,
               *, policy: bool, outcome: float = 0.0) -> list[int]:
        """A run of >= 1 filler tokens, then ``end_token`` into ``end``. The first filler id
        picks the length class; each later step ends the run with probability stop[c].
        Returns the in-run states, whose edge 1 is the end edge."""
        inner = []
        for c in range(N_LENGTH_CLASSES):
            lo = base + FILLER_IDS_PER_CLASS * c
            s = self.state(*key, c)
            self.edge(first, s, lengths.weights[c], lo, FILLER_IDS_PER_CLASS, policy=policy)
            self.edge(s, s, 1.0 - lengths.stop[c], lo, FILLER_IDS_PER_CLASS, policy=policy)
            self.edge(s, end, lengths.stop[c], end_token, policy=policy, outcome=outcome)
            inner.append(s)
        return inner

    def force(self, state: int, position: int, edge: int) -> None:
        """At ``position`` the chain takes ``edge`` out of ``state`` (the prompt length cap)."""
        self._forced.append((state, position, edge))

    def freeze(self, token_penalty: float, gamma: float) -> None:
        """Pack edges into arrays: padded [states, edges] for sampling and lookups."""
        n = len(self._edges)
        width = max(len(e) for e in self._edges)
        shape = (n, width)
        self.prob = np.zeros(shape)
        self.dst = np.full(shape, self.end, dtype=np.int64)
        self.tok_lo = np.zeros(shape, dtype=np.int64)
        self.tok_n = np.zeros(shape, dtype=np.int64)
        self.outcome = np.zeros(shape)
        self.policy = np.zeros(shape, dtype=bool)
        self.n_edges = np.array([len(e) for e in self._edges])
        for s, edges in enumerate(self._edges):
            for i, (dst, prob, lo, tn, outcome, policy) in enumerate(edges):
                self.prob[s, i], self.dst[s, i], self.tok_lo[s, i], self.tok_n[s, i] = prob, dst, lo, tn
                self.outcome[s, i], self.policy[s, i] = outcome, policy
        self.reward = self.outcome - token_penalty * self.policy
        self.discount = np.where(self.policy, gamma, 1.0)
        # A self-loop (a filler run) is sampled as one geometric jump, so a chain step is
        # a segment, not a token. Its exits are drawn from ``exit_cum``: edge i is taken
        # when exit_cum[i-1] <= u < exit_cum[i]; padding (2.0) never wins.
        loop = self.dst == np.arange(n)[:, None]
        loop &= np.arange(width)[None, :] < self.n_edges[:, None]
        assert (loop.sum(1) <= 1).all() and not self.outcome[loop].any()
        self.loop_edge = loop.argmax(1)
        self.loop_prob = np.where(loop.any(1), self.prob[np.arange(n), self.loop_edge], 0.0)
        exit_prob = np.where(loop, 0.0, self.prob)
        self.exit_cum = np.cumsum(exit_prob, axis=1) / np.maximum(exit_prob.sum(1, keepdims=True), 1e-300)
        last_exit = width - 1 - np.argmax((exit_prob > 0)[:, ::-1], axis=1)
        self.exit_cum[np.arange(n), last_exit] = 1.0
        self.exit_cum[np.arange(width)[None, :] > last_exit[:, None]] = 2.0
        # Backward induction: V_n = b + sum_e w_e * V_{n+1}[dst_e] over real edges.
        src, idx = np.nonzero(self.prob > 0)
        self.dp_src, self.dp_dst = src, self.dst[src, idx]
        self.dp_w = (self.prob * self.discount)[src, idx]
        self.dp_b = (self.prob * self.reward).sum(1)
        self.force_pos = np.full(n, -1, dtype=np.int64)
        self.force_edge = np.zeros(n, dtype=np.int64)
        for s, pos, e in self._forced:
            self.force_pos[s], self.force_edge[s] = pos, e
        self.names = {v: k for k, v in self.ids.items()}
        assert n < 2 ** 15, "state ids are stored as int16"


@dataclass
class _Run:
    """Where a batch of chain runs stopped, and what they earned from their start."""

    state: np.ndarray
    pos: np.ndarray
    outcome: np.ndarray
    ret: np.ndarray
    """Discounted return (outcome and token rewards) from the start position."""
    truncated: np.ndarray


class SynthEnv:
    """The chain for one parameter set: sampling, exact values, prefix tracing."""

    def __init__(self, params: SynthParams):
        params.check()
        self.params = params
        self.scale = self._fit_scale()  # also leaves self.chain built at that scale

    # -- construction -----------------------------------------------------------------------

    def lengths(self, kind: str, scale: float | None = None) -> Lengths:
        """Filler length law of ``kind`` (prompt, policy, env) at the fitted scale."""
        return Lengths.make(_BASE_MEAN[kind] * (self.scale if scale is None else scale), self.params.length_sigma)

    def p_good(self) -> np.ndarray:
        """Probability of a good action at each difficulty."""
        return np.linspace(self.params.p_good_easy, self.params.p_good_hard, N_DIFFICULTY)

    def _build(self, scale: float) -> _Chain:
        p = self.params
        ch = _Chain()
        lp, lt, le = (self.lengths(k, scale) for k in ("prompt", "policy", "env"))
        p_good = self.p_good()
        p_answer = (1.0 + p_good) / 2

        diff = ch.state("difficulty")
        ch.edge(ch.start, diff, 1.0, BOS, policy=False)
        for d in range(N_DIFFICULTY):
            need = ch.state("need", d)
            ch.edge(diff, need, 1.0 / N_DIFFICULTY, DIFFICULTY + d, policy=False)
            for k in range(1, p.max_need + 1):
                first = ch.state("prompt", d, k)
                ch.edge(need, first, 1.0 / p.max_need, NEED + k - 1, policy=False)
                turn = ch.state("act", d, k, p.max_turns)
                for s in ch.filler(first, ("prompt", d, k), FILLER_PROMPT, lp, turn, PROMPT_END, policy=False):
                    ch.force(s, p.max_prompt_length - 1, edge=1)

        # (d, need_left, turns_left): a policy turn, then the environment's verdict.
        for d, r, u in product(range(N_DIFFICULTY), range(1, p.max_need + 1), range(1, p.max_turns + 1)):
            act = ch.state("act", d, r, u)
            for good, prob, lo in ((True, p_good[d], ACT_GOOD), (False, 1 - p_good[d], ACT_BAD)):
                first = ch.state("turn", d, r, u, good)
                ch.edge(act, first, prob, lo, N_ACT_IDS, policy=True)
                verdict = ch.state("verdict", d, r, u, good)
                ch.filler(first, ("turn", d, r, u, good), FILLER_POLICY, lt, verdict, EOT, policy=True)
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
            ch.filler(env, ("env", d, r, u), FILLER_ENV, le, nxt, tok, policy=False)

        for d in range(N_DIFFICULTY):
            answer = ch.state("answer", d)
            for good, prob, lo in ((True, p_answer[d], ANSWER_GOOD), (False, 1 - p_answer[d], ANSWER_BAD)):
                first = ch.state("answer", d, good)
                ch.edge(answer, first, prob, lo, N_ANSWER_IDS, policy=True)
                ch.filler(first, ("answer", d, good), FILLER_POLICY, lt, ch.state("graded", good), EOS,
                          policy=True, outcome=float(good))
        for good in (True, False):
            graded, grader = ch.state("graded", good), ch.state("grader", good)
            ch.edge(graded, grader, p.grader_prob, VERDICT_PASS if good else VERDICT_FAIL, policy=False)
            ch.edge(graded, ch.end, 1 - p.grader_prob, 0, 0, policy=False)
            ch.filler(grader, ("grader", good), FILLER_ENV, le, ch.end, GRADER_END, policy=False)

        ch.freeze(p.token_penalty, p.gamma)
        ch.after_prompt = np.zeros(len(ch.ids), dtype=bool)
        for d, k in product(range(N_DIFFICULTY), range(1, p.max_need + 1)):
            ch.after_prompt[ch.ids[("act", d, k, p.max_turns)]] = True
        return ch

    def _fit_scale(self) -> float:
        """Length scale whose median row length is within 2% of ``median_length``, by
        fixed-seed simulations (the median grows about linearly with the scale)."""
        target = self.params.median_length
        scale = 1.0
        for _ in range(12):
            self.chain = self._build(scale)
            rng = np.random.default_rng(_CALIBRATION_SEED)
            median = float(np.median(self._sample(_CALIBRATION_ROWS, rng)[2]))
            if abs(median / target - 1) < 0.02:
                return scale
            scale *= target / median
        raise ValueError(f"cannot reach a median length of {target:g} tokens (got {median:g}): rows need "
                         "a few tokens per turn whatever the filler lengths; raise median_length or "
                         "lower max_turns / max_need")

    # -- sampling ---------------------------------------------------------------------------

    def _run(self, state: np.ndarray, pos: np.ndarray, rng: np.random.Generator,
             tokens: np.ndarray | None = None, states: np.ndarray | None = None,
             stop: np.ndarray | None = None) -> _Run:
        """Advance every chain until it ends, is cut at ``max_length`` or reaches a ``stop``
        state; record tokens and the state before each token. A step takes a state's
        self-loop a geometric number of times at once, then one exit edge."""
        ch, L = self.chain, self.params.max_length
        state, pos = state.astype(np.int64), pos.astype(np.int64)
        n = len(state)
        outcome, ret, disc = np.zeros(n), np.zeros(n), np.ones(n)
        truncated = np.zeros(n, dtype=bool)
        halt = np.zeros(len(ch.ids), dtype=bool) if stop is None else stop.copy()
        halt[ch.end] = True
        live = np.flatnonzero(~halt[state])
        while live.size:
            s, p = state[live], pos[live]
            # Self-loop repeats: k ~ Geometric, cut at max_length and at a forced exit.
            rho = ch.loop_prob[s]
            k = rng.geometric(1.0 - rho) - 1
            f = ch.force_pos[s]
            k = np.where(f >= 0, np.minimum(k, f - p), k)
            fit = np.minimum(k, L - p)
            if fit.any():
                le = ch.loop_edge[s]
                self._emit(tokens, states, live, s, p, fit, ch.tok_lo[s, le], ch.tok_n[s, le], rng)
                d = ch.discount[s, le]
                geo = np.where(d == 1.0, fit, (1.0 - d ** fit) / np.where(d == 1.0, 1.0, 1.0 - d))
                ret[live] += disc[live] * ch.reward[s, le] * geo
                disc[live] *= d ** fit
                p = p + fit
                pos[live] = p
            # Then one exit edge (forced where the chain has reached its forced position).
            e = (rng.random(live.size)[:, None] >= ch.exit_cum[s]).sum(1)
            forced = f == p
            e[forced] = ch.force_edge[s[forced]]
            tn = ch.tok_n[s, e]
            cut = (fit < k) | ((tn > 0) & (p >= L))  # the next token would not fit
            truncated[live[cut]] = True
            keep = ~cut
            live, s, p, e, tn = live[keep], s[keep], p[keep], e[keep], tn[keep]
            self._emit(tokens, states, live, s, p, np.minimum(tn, 1), ch.tok_lo[s, e], tn, rng)
            ret[live] += disc[live] * ch.reward[s, e]
            disc[live] *= ch.discount[s, e]
            outcome[live] += ch.outcome[s, e]
            pos[live] = p + (tn > 0)
            nxt = ch.dst[s, e]
            state[live] = nxt
            live = live[~halt[nxt]]
        return _Run(state, pos, outcome, ret, truncated)

    @staticmethod
    def _emit(tokens: np.ndarray | None, states: np.ndarray | None, rows: np.ndarray, s: np.ndarray,
              p: np.ndarray, count: np.ndarray, lo: np.ndarray, n_ids: np.ndarray,
              rng: np.random.Generator) -> None:
        """Write ``count[i]`` tokens (uniform in [lo, lo + n_ids)) for row ``rows[i]`` from
        position ``p[i]``, each preceded by state ``s[i]``. Draws nothing when not recording:
        the ids do not change what the chain does."""
        if tokens is None:
            return
        total = int(count.sum())
        if total == 0:
            return
        i = np.repeat(np.arange(len(rows)), count)
        at = p[i] + np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        tokens[rows[i], at] = lo[i] + (rng.random(total) * n_ids[i]).astype(np.int64)
        states[rows[i], at] = s[i]

    def _sample(self, rows: int, rng: np.random.Generator, record: bool = False):
        """``rows`` rollouts in groups of ``group_size`` sharing a prompt. Returns
        (tokens, states, lengths, outcome, truncated); buffers only when ``record``."""
        p, ch = self.params, self.chain
        groups = -(-rows // p.group_size)
        P, L = p.max_prompt_length, p.max_length
        ptok = np.zeros((groups, P), dtype=np.int16) if record else None
        pst = np.zeros((groups, P), dtype=np.int16) if record else None
        prompt = self._run(np.full(groups, ch.start), np.zeros(groups, dtype=np.int64), rng, ptok, pst,
                           stop=ch.after_prompt)
        group = np.arange(rows) // p.group_size
        tokens = states = None
        if record:
            tokens = np.zeros((rows, L), dtype=np.int16)
            states = np.zeros((rows, L), dtype=np.int16)
            tokens[:, :P], states[:, :P] = ptok[group], pst[group]
        run = self._run(prompt.state[group], prompt.pos[group], rng, tokens, states)
        return tokens, states, run.pos, run.outcome, run.truncated

    # -- exact values -----------------------------------------------------------------------

    def values(self, states: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Exact value of each (state, position) query, by backward induction over positions
        from V_max_length = 0: V_n = sum over edges of prob * (reward + discount * V_{n+1}[dst]).
        Positions are swept in blocks of ``_VALUE_BLOCK``; each block's queries are answered
        with one gather, which keeps memory at one block of the table."""
        ch, L = self.chain, self.params.max_length
        out = np.zeros(len(states), dtype=np.float32)
        block_of = (positions // _VALUE_BLOCK).astype(np.int16)
        order = np.argsort(block_of, kind="stable")
        bounds = np.searchsorted(block_of[order], np.arange(-(-L // _VALUE_BLOCK) + 1))
        forced = np.flatnonzero(ch.force_pos >= 0)
        table = np.zeros((_VALUE_BLOCK, len(ch.ids)))
        V = np.zeros(len(ch.ids))  # V_L: nothing is earned past max_length
        for start in range((L - 1) // _VALUE_BLOCK * _VALUE_BLOCK, -1, -_VALUE_BLOCK):
            for n in range(min(L, start + _VALUE_BLOCK) - 1, start - 1, -1):
                nxt = V
                V = ch.dp_b + np.bincount(ch.dp_src, ch.dp_w * nxt[ch.dp_dst], minlength=len(nxt))
                at = forced[ch.force_pos[forced] == n]
                if at.size:
                    e = ch.force_edge[at]
                    V[at] = ch.reward[at, e] + ch.discount[at, e] * nxt[ch.dst[at, e]]
                table[n - start] = V
            i = order[bounds[start // _VALUE_BLOCK]:bounds[start // _VALUE_BLOCK + 1]]
            out[i] = table[positions[i] - start, states[i]]
        return out

    # -- public helpers ---------------------------------------------------------------------

    def trace(self, input_ids) -> list[int]:
        """Chain states before each token of ``input_ids`` and after the last one
        (``len + 1`` entries). Raises ValueError at a token the chain cannot emit there."""
        ch = self.chain
        s, out = ch.start, [ch.start]
        for n, x in enumerate(int(t) for t in input_ids):
            edges = [int(ch.force_edge[s])] if ch.force_pos[s] == n else range(ch.n_edges[s])
            for e in edges:
                if ch.prob[s, e] > 0 and ch.tok_lo[s, e] <= x < ch.tok_lo[s, e] + ch.tok_n[s, e]:
                    s = int(ch.dst[s, e])
                    break
            else:
                raise ValueError(f"token {x} at position {n} is impossible in state {ch.names[s]}")
            out.append(s)
        return out

    def monte_carlo_value(self, prefix, n_samples: int, seed: int = 0) -> tuple[float, float]:
        """Mean and standard error of the return from position ``len(prefix)`` over
        ``n_samples`` continuations sampled by the generator's own chain: an independent
        estimate of ``oracle_values[len(prefix)]`` (for ``len(prefix)`` >= 1)."""
        state = self.trace(prefix)[-1]
        rng = np.random.default_rng(seed)
        run = self._run(np.full(n_samples, state), np.full(n_samples, len(prefix)), rng)
        return float(run.ret.mean()), float(run.ret.std(ddof=1) / math.sqrt(n_samples))

    def chunk_rows(self) -> int:
        """Rows generated at once (a multiple of group_size): bounds the token buffers."""
        g = self.params.group_size
        return max(g, _CHUNK_CELLS // self.params.max_length // g * g)

    def tables(self, rows: int, seed: int) -> Iterator[pa.Table]:
        """The ``rows`` rollouts of ``seed`` as a sequence of tables. Chunk ``i`` draws from
        its own stream (SeedSequence([seed, i])), so the data do not depend on how a caller
        batches or shards it."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        step = self.chunk_rows()
        for i, first in enumerate(range(0, rows, step)):
            rng = np.random.default_rng(np.random.SeedSequence([seed, i]))
            yield self._table(min(step, rows - first), first, seed, rng)

    def _table(self, rows: int, first: int, seed: int, rng: np.random.Generator) -> pa.Table:
        p = self.params
        tokens, states, lengths, outcome, truncated = self._sample(rows, rng, record=True)
        cells = np.arange(p.max_length)[None, :] < lengths[:, None]
        flat = tokens[cells].astype(np.int32)
        starts = np.cumsum(lengths) - lengths
        positions = np.arange(len(flat)) - np.repeat(starts, lengths)
        values = self.values(states[cells], positions)
        values[starts[lengths > 0]] = 0.0  # position 0 gets 0 (alignment convention)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        mask = IS_POLICY_TOKEN[flat].astype(np.int8)
        group0 = first // p.group_size
        data = {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(flat)),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask)),
            "reward": pa.array(outcome, pa.float64()),
            "sample_id": pa.array([f"s{seed}-{first + i:08d}" for i in range(rows)]),
            "group_id": pa.array([f"s{seed}-p{group0 + i // p.group_size:07d}" for i in range(rows)]),
            "policy_version": pa.array(np.full(rows, p.policy_version, dtype=np.int64)),
            "truncated": pa.array(truncated),
            "oracle_values": pa.ListArray.from_arrays(offsets, pa.array(values)),
        }
        if p.token_penalty > 0:
            penalty = (-p.token_penalty * mask).astype(np.float32)
            data["token_rewards"] = pa.ListArray.from_arrays(offsets, pa.array(penalty))
        schema = canonical_schema(list(data))
        return pa.Table.from_arrays([data[f.name] for f in schema], schema=schema)


@lru_cache(maxsize=8)
def _env(params: SynthParams) -> SynthEnv:
    return SynthEnv(params)


def make_env(**env_params) -> SynthEnv:
    """The (cached) chain for these parameters; see ``SynthParams`` for their meaning."""
    known = {f.name for f in fields(SynthParams)}
    unknown = sorted(set(env_params) - known)
    if unknown:
        raise ValueError(f"unknown synth parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return _env(SynthParams(**env_params))


def generate(rows: int, seed: int, **env_params) -> pa.Table:
    """``rows`` synthetic rollouts (schema v1 with ``oracle_values``), deterministic in
    ``seed`` and the parameters."""
    return pa.concat_tables(make_env(**env_params).tables(rows, seed)).combine_chunks()


def monte_carlo_value(prefix, n_samples: int, seed: int = 0, **env_params) -> tuple[float, float]:
    """Sampled value (mean, standard error) of the state after ``prefix``; see
    ``SynthEnv.monte_carlo_value``."""
    return make_env(**env_params).monte_carlo_value(prefix, n_samples, seed)


class ValueStats:
    """What a critic can learn from an archive, accumulated table by table (groups must
    not straddle tables). Over policy tokens (loss_mask 1), token-weighted:

    - mean/std of the oracle values and their variance split: between prompts, between
      rollouts of a prompt, within rollouts (sums to the total);
    - explained variance of the Monte-Carlo return G by the oracle (the ceiling for a
      learned critic) and by the value at the row's first policy token (a critic that reads
      only the prompt). G assumes this generator's rewards: the outcome on the last policy
      token and ``-token_penalty`` on every policy token, discounted by ``gamma`` per
      policy token.
    """

    def __init__(self, gamma: float = 1.0, token_penalty: float = 0.0):
        self.gamma = gamma
        self.token_penalty = token_penalty
        self.rows = 0
        self.truncated = 0
        self.ends_on_env = 0
        self._lengths: list[np.ndarray] = []
        self._turns: list[np.ndarray] = []
        self._rewards: list[np.ndarray] = []
        self._difficulty: list[np.ndarray] = []
        self.n = 0
        self.s_v = self.s_vv = self.s_g = self.s_gg = self.s_err = self.s_err_prompt = 0.0
        self.ss_rows = self.ss_groups = 0.0  # sum over rows / groups of (sum V)^2 / count

    def add(self, table: pa.Table) -> None:
        ids = table.column("input_ids").combine_chunks()
        offsets = ids.offsets.to_numpy().astype(np.int64)
        tokens = ids.values.to_numpy()
        mask = table.column("loss_mask").combine_chunks().values.to_numpy().astype(bool)
        values = table.column("oracle_values").combine_chunks().values.to_numpy().astype(np.float64)
        reward = table.column("reward").to_numpy()
        lengths = np.diff(offsets)
        rows = len(lengths)
        row = np.repeat(np.arange(rows), lengths)
        self.rows += rows
        self.truncated += int(table.column("truncated").to_numpy().sum())
        self.ends_on_env += int((~mask[offsets[1:] - 1]).sum())
        self._lengths.append(lengths)
        self._rewards.append(reward)
        self._difficulty.append(tokens[offsets[:-1] + 1] - DIFFICULTY)
        starts = np.zeros(len(mask), dtype=bool)
        starts[1:] = mask[1:] & ~mask[:-1]
        starts[offsets[:-1]] = mask[offsets[:-1]]
        self._turns.append(np.bincount(row[starts], minlength=rows))

        # Policy tokens left in the row, counting this one: the discount exponent of G.
        cm = np.cumsum(mask)
        before_row = (cm - mask)[offsets[:-1]]
        left = (cm[offsets[1:] - 1] - before_row)[row] - (cm - mask - before_row[row])
        g = self.gamma
        m = left[mask]
        disc_sum = m if g == 1.0 else (1 - g ** m) / (1 - g)
        G = g ** (m - 1) * reward[row[mask]] - self.token_penalty * disc_sum
        V = values[mask]
        prow = row[mask]
        first = np.zeros(rows)
        rows_with_policy, first_at = np.unique(prow, return_index=True)
        first[rows_with_policy] = V[first_at]  # value at each row's first policy token
        groups = np.unique(table.column("group_id").to_numpy(zero_copy_only=False), return_inverse=True)[1]
        n_row = np.bincount(prow, minlength=rows)
        s_row = np.bincount(prow, weights=V, minlength=rows)
        n_grp = np.bincount(groups, weights=n_row)
        s_grp = np.bincount(groups, weights=s_row)
        self.n += len(V)
        self.s_v += V.sum()
        self.s_vv += (V * V).sum()
        self.s_g += G.sum()
        self.s_gg += (G * G).sum()
        self.s_err += ((G - V) ** 2).sum()
        self.s_err_prompt += ((G - first[prow]) ** 2).sum()
        self.ss_rows += (s_row[n_row > 0] ** 2 / n_row[n_row > 0]).sum()
        self.ss_groups += (s_grp[n_grp > 0] ** 2 / n_grp[n_grp > 0]).sum()

    def result(self) -> dict:
        lengths = np.concatenate(self._lengths)
        rewards = np.concatenate(self._rewards)
        difficulty = np.concatenate(self._difficulty)
        turns = np.concatenate(self._turns)
        n = self.n
        mean = self.s_v / n
        c = self.s_v ** 2 / n
        ss_total = self.s_vv - c
        ss_g = self.s_gg - self.s_g ** 2 / n
        return {
            "rows": self.rows,
            "tokens": int(lengths.sum()),
            "policy_tokens": n,
            "length": {"p50": float(np.percentile(lengths, 50)), "p90": float(np.percentile(lengths, 90)),
                       "p99": float(np.percentile(lengths, 99)), "max": int(lengths.max())},
            "truncated_rows": self.truncated,
            "rows_ending_on_env": self.ends_on_env,
            "policy_turns": {str(k): int(v) for k, v in zip(*np.unique(turns, return_counts=True))},
            "reward_mean": float(rewards.mean()),
            "reward_mean_by_difficulty": [round(float(rewards[difficulty == d].mean()), 4)
                                          if (difficulty == d).any() else None for d in range(N_DIFFICULTY)],
            "oracle_value": {"mean": mean, "std": math.sqrt(max(ss_total, 0.0) / n)},
            "oracle_variance": {"total": ss_total / n,
                                "between_prompts": (self.ss_groups - c) / n,
                                "between_rollouts_of_a_prompt": (self.ss_rows - self.ss_groups) / n,
                                "within_rollouts": (self.s_vv - self.ss_rows) / n},
            "return_variance": ss_g / n,
            "explained_variance": {"oracle": 1 - self.s_err / ss_g,
                                   "prompt_only": 1 - self.s_err_prompt / ss_g},
        }


def value_stats(table: pa.Table, gamma: float = 1.0, token_penalty: float = 0.0) -> dict:
    """``ValueStats`` of one table (a generated or read-back synthetic archive)."""
    stats = ValueStats(gamma, token_penalty)
    stats.add(table)
    return stats.result()


def write(out_dir: str | os.PathLike, rows: int, seed: int, shard_rows: int = DEFAULT_SHARD_ROWS, *,
          overwrite: bool = False, **env_params) -> list[Path]:
    """Write ``generate(rows, seed, **env_params)`` as schema-v1 shards (``part-*.parquet``)
    under ``out_dir`` plus a ``_synth.json`` manifest (parameters, seed, ``value_stats``).
    Refuses a folder that already holds parquet files unless ``overwrite``, which replaces
    earlier ``part-*.parquet`` shards (and nothing else)."""
    return _write(out_dir, rows, seed, shard_rows, overwrite, env_params)[0]


def _write(out_dir: str | os.PathLike, rows: int, seed: int, shard_rows: int, overwrite: bool,
           env_params: dict) -> tuple[list[Path], dict]:
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    env = make_env(**env_params)
    out = Path(out_dir)
    old = _shards_to_replace(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    # Staged in a hidden folder inside `out` (readers skip it): the folder shows the old shards
    # or the new ones, never a half-written mix, whatever stops the generator.
    staging = Path(tempfile.mkdtemp(prefix=".synth-", dir=out))
    try:
        stats = ValueStats(env.params.gamma, env.params.token_penalty)
        with ShardWriter(staging, shard_rows=shard_rows) as writer:
            for table in env.tables(rows, seed):
                stats.add(table)
                writer.write_table(table)
        manifest = {
            "generator": "rollouts.synth",
            "rows": rows,
            "seed": seed,
            "shard_rows": shard_rows,
            "params": asdict(env.params),
            "length_scale": env.scale,
            "vocab_size": VOCAB_SIZE,
            "shards": [p.name for p in writer.paths],
            "stats": stats.result(),
        }
        write_json(staging / MANIFEST, manifest)
        published = publish_files([*writer.paths, staging / MANIFEST], out, old)
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [p for p in published if p.suffix == ".parquet"], manifest


def _shards_to_replace(out: Path, overwrite: bool) -> list[Path]:
    """The shards new ones will replace; refuses to mix with other parquet files."""
    existing = sorted(out.glob("*.parquet")) if out.is_dir() else []
    if not existing:
        return []
    if not overwrite:
        raise RolloutError(f"{out} already holds {len(existing)} parquet file(s); write to an empty "
                           "folder, or pass --overwrite to replace its part-*.parquet shards")
    foreign = [p.name for p in existing if not p.match("part-*.parquet")]
    if foreign:
        raise RolloutError(f"{out} holds parquet files this generator does not write ({', '.join(foreign[:3])}); "
                           "refusing to mix them with synthetic shards: use another folder")
    return existing


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = SynthParams()
    p = sub.add_parser("synth", help="generate synthetic rollouts with exact oracle values",
                       description="Generate synthetic multi-turn rollouts (schema v1) whose true state "
                                   "values are known exactly (oracle_values). Writes part-*.parquet "
                                   "shards and a _synth.json manifest with the parameters and value "
                                   "statistics.")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--rows", type=int, required=True, help="number of rollouts")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--shard-rows", type=int, default=DEFAULT_SHARD_ROWS,
                   help=f"rows per shard (default {DEFAULT_SHARD_ROWS})")
    p.add_argument("--median-length", type=float, default=d.median_length,
                   help=f"target median row length in tokens (default {d.median_length:g})")
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help=f"rows are truncated at this many tokens (default {d.max_length})")
    p.add_argument("--length-sigma", type=float, default=d.length_sigma,
                   help=f"length tail heaviness (default {d.length_sigma:g})")
    p.add_argument("--group-size", type=int, default=d.group_size,
                   help=f"rollouts per prompt (default {d.group_size})")
    p.add_argument("--max-turns", type=int, default=d.max_turns,
                   help=f"policy turns before GAME_OVER, <= {MAX_TURNS} (default {d.max_turns})")
    p.add_argument("--max-need", type=int, default=d.max_need,
                   help=f"most successful turns a task needs, <= {MAX_NEED} (default {d.max_need})")
    p.add_argument("--token-penalty", type=float, default=d.token_penalty,
                   help="reward of -X on every policy token, written as token_rewards (default 0)")
    p.add_argument("--gamma", type=float, default=d.gamma,
                   help="discount per policy token for oracle_values (default 1)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace part-*.parquet shards already in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = {"median_length": args.median_length, "max_length": args.max_length,
              "length_sigma": args.length_sigma, "group_size": args.group_size,
              "max_turns": args.max_turns, "max_need": args.max_need,
              "token_penalty": args.token_penalty, "gamma": args.gamma}
    try:
        paths, manifest = _write(args.out, args.rows, args.seed, args.shard_rows, args.overwrite, params)
    except RolloutError:
        raise
    except ValueError as e:  # bad parameters: a user error like any other
        raise RolloutError(str(e)) from None
    st = manifest["stats"]
    length, value, ev = st["length"], st["oracle_value"], st["explained_variance"]
    print(f"wrote {st['rows']:,} rows ({st['tokens']:,} tokens) in {len(paths)} shard(s) to {args.out}: "
          f"length p50 {length['p50']:.0f} p99 {length['p99']:.0f} max {length['max']} "
          f"({st['truncated_rows']} truncated), reward mean {st['reward_mean']:.3f}, oracle value at "
          f"policy tokens mean {value['mean']:.3f} std {value['std']:.3f}, explained variance of "
          f"returns: oracle {ev['oracle']:.3f}, prompt only {ev['prompt_only']:.3f}")
    return 0
