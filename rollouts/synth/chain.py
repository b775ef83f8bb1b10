"""The engine every synthetic environment shares: a token-level Markov chain whose values are exact.

An environment (``multiturn``, ``keysteps``, ``fatal``, ``reveal``, ``undo``, ``prefix``,
``synergy``; named in ``envs``) is a function that builds a ``Chain`` from ``SynthParams``:
states, and edges that emit one token each. Every emitted token determines the chain's next state,
so the state before any token is a function of the token prefix and the value of a prefix is a
table lookup ``V[state, position]``, computed exactly by backward induction over positions (no
sampling). ``SynthEnv`` samples rows from the chain, looks their values up, traces prefixes and
writes schema-v1 tables.

Value semantics
---------------
``oracle_values[t]`` is E[sum of rewards at positions >= t | tokens 0..t-1] under the chain,
i.e. the value of the state just before token ``t`` is emitted, the NeMo-RL / verl alignment.
``gamma`` (default 1) discounts once per policy token and carries across prompt and environment
tokens, like the project's GAE targets. ``oracle_values[0]`` is 0 by convention (alignment), not
the mean return. After the outcome reward every value is 0. Truncation at ``max_length`` is part
of the chain, so values near it are lower than far from it.

Rewards: an edge's ``outcome`` is summed into the row's ``reward`` (the schema places it on the
last policy token); an edge's ``token_reward`` (and ``-token_penalty`` on every policy token) is
written at that token in ``token_rewards``. Two edges of a state may emit the same token when
they lead to the same state: a reward drawn at random as the token is emitted (a graded answer).

Lengths: each filler run draws a length class ``c`` in 0..7 (weights of a discretised normal,
mean length ``scale * base * exp(length_sigma * z_c)``) and then a geometric length with that
mean. The class is visible (every filler id encodes it) and the geometric length is memoryless,
which keeps the chain's state finite while the row lengths are long-tailed. ``scale`` is fitted
so the median row length is close to ``median_length``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from ..schema import canonical_schema
from .vocab import (
    BOS,
    DIFFICULTY,
    FILLER_IDS_PER_CLASS,
    FILLER_PROMPT,
    IS_POLICY_TOKEN,
    MAX_NEED,
    MAX_TURNS,
    N_DIFFICULTY,
    N_LENGTH_CLASSES,
    NEED,
    PROMPT_END,
)

BASE_MEAN = {"prompt": 12.0, "policy": 16.0, "env": 8.0}
"""Mean filler lengths of the three kinds of segments before ``scale`` (fitted to the median row
length) multiplies them; their ratios shape a row (long turns, short prompts)."""

_Z = np.linspace(-2.0, 2.0, N_LENGTH_CLASSES)
_CLASS_WEIGHTS = np.exp(-_Z ** 2 / 2) / np.exp(-_Z ** 2 / 2).sum()
_CALIBRATION_ROWS = 2048
_CALIBRATION_SEED = 12345
_CHUNK_CELLS = 1 << 24
"""Rows per generation chunk: tokens and states buffers are chunk_rows x max_length."""
_VALUE_BLOCK = 128


@dataclass(frozen=True)
class SynthParams:
    """Environment and policy parameters (``generate(..., **params)``). Each environment reads
    the ones its docstring names; ``envs.ENVIRONMENTS`` gives each name its own defaults."""

    env: str = "tools"
    """The environment (``rollouts synth --list``): tools, key-steps, fatal, reveal, long, long-tools,
    dense, undo, prefix, synergy."""
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
    """Successful turns (tools, fatal), key steps (key-steps, undo, prefix, synergy) or test pairs (reveal) a prompt
    needs are drawn from 1..max_need (1..4)."""
    p_good_easy: float = 0.85
    """Probability of a good action at difficulty 0."""
    p_good_hard: float = 0.1
    """Probability of a good action at difficulty 7."""
    p_ok_good: float = 0.9
    """Probability that a turn succeeds after a good action (reveal: a test passes on working code)."""
    p_ok_bad: float = 0.05
    """Probability that a turn succeeds after a bad action (reveal: a test passes on broken code)."""
    grader_prob: float = 0.3
    """Probability of a grader segment after the answer (row ends on env tokens)."""
    token_penalty: float = 0.0
    """Per policy token reward of -token_penalty (adds the token_rewards column)."""
    step_reward: float = 0.0
    """tools: a per-token reward of +step_reward on a good action's token, -step_reward on a
    bad one's (a process reward; adds the token_rewards column)."""
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
        need(self.step_reward >= 0, f"step_reward must be >= 0, got {self.step_reward:g}")
        need(0 < self.gamma <= 1, f"gamma must be in (0, 1], got {self.gamma:g}")

    @property
    def max_prompt_length(self) -> int:
        return self.max_length // 4

    def p_good(self) -> np.ndarray:
        """Probability of a good action at each difficulty (linear from easy to hard)."""
        return np.linspace(self.p_good_easy, self.p_good_hard, N_DIFFICULTY)


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


@dataclass(frozen=True)
class Exit:
    """One way out of a filler run: ``n`` token ids from ``lo`` into ``dst`` with probability
    ``prob`` (of the run's end), earning ``outcome`` (the row's reward) and ``token_reward``."""

    dst: int
    lo: int
    prob: float = 1.0
    n: int = 1
    outcome: float = 0.0
    token_reward: float = 0.0


class Chain:
    """Token-level Markov chain: states with outgoing edges; an edge emits one token drawn
    uniformly from ``[tok_lo, tok_lo + tok_n)`` (``tok_n`` 0: no token, the episode ends)."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self._edges: list[list[tuple]] = []
        self._forced: list[tuple[int, int, int]] = []
        self._after_prompt: list[int] = []
        self.end = self.state("end")
        self.start = self.state("start")

    def state(self, *name) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.ids)
            self._edges.append([])
        return self.ids[name]

    def edge(self, src: int, dst: int, prob: float, lo: int, n: int = 1, *,
             policy: bool, outcome: float = 0.0, token_reward: float = 0.0) -> None:
        self._edges[src].append((dst, prob, lo, n, outcome, token_reward, policy))

    def filler(self, first: int, key: tuple, base: int, lengths: Lengths, exits: list[Exit],
               *, policy: bool) -> list[int]:
        """A run of >= 1 filler tokens, then one of ``exits``. The first filler id picks the
        length class; each later step ends the run with probability stop[c], through exit ``i``
        with probability ``exits[i].prob``. Returns the in-run states, whose edges 1.. are the
        exits."""
        inner = []
        for c in range(N_LENGTH_CLASSES):
            lo = base + FILLER_IDS_PER_CLASS * c
            s = self.state(*key, c)
            self.edge(first, s, lengths.weights[c], lo, FILLER_IDS_PER_CLASS, policy=policy)
            self.edge(s, s, 1.0 - lengths.stop[c], lo, FILLER_IDS_PER_CLASS, policy=policy)
            for x in exits:
                self.edge(s, x.dst, lengths.stop[c] * x.prob, x.lo, x.n, policy=policy, outcome=x.outcome,
                          token_reward=x.token_reward)
            inner.append(s)
        return inner

    def prompt(self, p: SynthParams, lengths: Lengths, after: Callable[[int, int], int]) -> None:
        """The prompt every environment shares, ``BOS DIFFICULTY+d NEED+(k-1) filler... PROMPT_END``
        (mask 0): difficulty ``d`` uniform in 0..7, ``k`` uniform in 1..max_need, then the state
        ``after(d, k)``. Prompts are capped at ``max_length // 4`` tokens (the filler then ends
        with PROMPT_END). The ``group_size`` rollouts of a group share it."""
        diff = self.state("difficulty")
        self.edge(self.start, diff, 1.0, BOS, policy=False)
        for d in range(N_DIFFICULTY):
            need = self.state("need", d)
            self.edge(diff, need, 1.0 / N_DIFFICULTY, DIFFICULTY + d, policy=False)
            for k in range(1, p.max_need + 1):
                first = self.state("prompt", d, k)
                self.edge(need, first, 1.0 / p.max_need, NEED + k - 1, policy=False)
                nxt = after(d, k)
                self._after_prompt.append(nxt)
                for s in self.filler(first, ("prompt", d, k), FILLER_PROMPT, lengths, [Exit(nxt, PROMPT_END)],
                                     policy=False):
                    self.force(s, p.max_prompt_length - 1, edge=1)

    def force(self, state: int, position: int, edge: int) -> None:
        """At ``position`` the chain takes ``edge`` out of ``state`` (the prompt length cap)."""
        self._forced.append((state, position, edge))

    # long: packs the edge lists into the arrays sampling and backward induction index, with checks
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
        self.token_reward = np.zeros(shape)
        self.policy = np.zeros(shape, dtype=bool)
        self.n_edges = np.array([len(e) for e in self._edges])
        for s, edges in enumerate(self._edges):
            for i, (dst, prob, lo, tn, outcome, tr, policy) in enumerate(edges):
                self.prob[s, i], self.dst[s, i], self.tok_lo[s, i], self.tok_n[s, i] = prob, dst, lo, tn
                self.outcome[s, i], self.token_reward[s, i], self.policy[s, i] = outcome, tr, policy
            for i, j in ((i, j) for i in range(len(edges)) for j in range(i)):  # tokens say where the chain is
                a, b = edges[i], edges[j]
                overlap = a[3] and b[3] and a[2] < b[2] + b[3] and b[2] < a[2] + a[3]
                assert not overlap or a[0] == b[0], f"state {s}: one token leads to two states"
        assert np.allclose(self.prob.sum(1)[self.n_edges > 0], 1.0), "a state's edge probabilities must sum to 1"
        assert not self.token_reward[~self.policy].any(), "token rewards sit on policy tokens (targets ignore others)"
        self.token_reward = self.token_reward - token_penalty * self.policy
        self.reward = self.outcome + self.token_reward
        self.has_token_rewards = bool(np.any(self.token_reward != 0))
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
        self.after_prompt = np.zeros(n, dtype=bool)
        self.after_prompt[self._after_prompt] = True
        self.names = {v: k for k, v in self.ids.items()}
        assert n < 2 ** 15, "state ids are stored as int16"


Builder = Callable[[SynthParams, dict[str, Lengths]], Chain]
"""An environment: the chain for these parameters and filler length laws (prompt, policy, env)."""


@dataclass
class _Run:
    """Where a batch of chain runs stopped, and what they earned from their start."""

    state: np.ndarray
    pos: np.ndarray
    outcome: np.ndarray
    ret: np.ndarray
    """Discounted return (outcome and token rewards) from the start position."""
    truncated: np.ndarray


@dataclass
class _Buffers:
    """What a recording run writes per (row, position): the token, the state before it, and
    its token reward (only when the chain has token rewards)."""

    tokens: np.ndarray
    states: np.ndarray
    token_rewards: np.ndarray | None


class SynthEnv:
    """The chain of one environment and parameter set: sampling, exact values, prefix tracing."""

    def __init__(self, params: SynthParams, build: Builder):
        params.check()
        self.params = params
        self._build_chain = build
        self.scale = self._fit_scale()  # also leaves self.chain built at that scale

    # -- construction -----------------------------------------------------------------------

    def lengths(self, kind: str, scale: float | None = None) -> Lengths:
        """Filler length law of ``kind`` (prompt, policy, env) at the fitted scale."""
        return Lengths.make(BASE_MEAN[kind] * (self.scale if scale is None else scale), self.params.length_sigma)

    def _build(self, scale: float) -> Chain:
        ch = self._build_chain(self.params, {k: self.lengths(k, scale) for k in BASE_MEAN})
        ch.freeze(self.params.token_penalty, self.params.gamma)
        return ch

    def _fit_scale(self) -> float:
        """Length scale whose median row length is within 2% of ``median_length``, by
        fixed-seed simulations (the median grows about linearly with the scale)."""
        target = self.params.median_length
        scale = 1.0
        for _ in range(12):
            self.chain = self._build(scale)
            rng = np.random.default_rng(_CALIBRATION_SEED)
            median = float(np.median(self._sample(_CALIBRATION_ROWS, rng)[1]))
            if abs(median / target - 1) < 0.02:
                return scale
            scale *= target / median
        raise ValueError(f"cannot reach a median length of {target:g} tokens (got {median:g}): rows need "
                         "a few tokens per turn whatever the filler lengths; raise median_length or "
                         "lower max_turns / max_need")

    # -- sampling ---------------------------------------------------------------------------

    def _run(self, state: np.ndarray, pos: np.ndarray, rng: np.random.Generator, buf: _Buffers | None = None,
             stop: np.ndarray | None = None) -> _Run:
        """Advance every chain until it ends, is cut at ``max_length`` or reaches a ``stop``
        state; record into ``buf`` (tokens, the state before each token, token rewards). A step
        takes a state's self-loop a geometric number of times at once, then one exit edge."""
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
                self._emit(buf, live, s, p, fit, ch.tok_lo[s, le], ch.tok_n[s, le], ch.token_reward[s, le], rng)
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
            self._emit(buf, live, s, p, np.minimum(tn, 1), ch.tok_lo[s, e], tn, ch.token_reward[s, e], rng)
            ret[live] += disc[live] * ch.reward[s, e]
            disc[live] *= ch.discount[s, e]
            outcome[live] += ch.outcome[s, e]
            pos[live] = p + (tn > 0)
            nxt = ch.dst[s, e]
            state[live] = nxt
            live = live[~halt[nxt]]
        return _Run(state, pos, outcome, ret, truncated)

    @staticmethod
    def _emit(buf: _Buffers | None, rows: np.ndarray, s: np.ndarray, p: np.ndarray, count: np.ndarray,
              lo: np.ndarray, n_ids: np.ndarray, token_reward: np.ndarray, rng: np.random.Generator) -> None:
        """Write ``count[i]`` tokens (uniform in [lo, lo + n_ids)) for row ``rows[i]`` from
        position ``p[i]``, each preceded by state ``s[i]`` and earning ``token_reward[i]``.
        Draws nothing when not recording: the ids do not change what the chain does."""
        if buf is None:
            return
        total = int(count.sum())
        if total == 0:
            return
        i = np.repeat(np.arange(len(rows)), count)
        at = p[i] + np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        buf.tokens[rows[i], at] = lo[i] + (rng.random(total) * n_ids[i]).astype(np.int64)
        buf.states[rows[i], at] = s[i]
        if buf.token_rewards is not None:
            buf.token_rewards[rows[i], at] = token_reward[i]

    def _sample(self, rows: int, rng: np.random.Generator, record: bool = False):
        """``rows`` rollouts in groups of ``group_size`` sharing a prompt. Returns
        (buffers or None, lengths, outcome, truncated); buffers only when ``record``."""
        p, ch = self.params, self.chain
        groups = -(-rows // p.group_size)
        P, L = p.max_prompt_length, p.max_length
        rewarded = ch.has_token_rewards

        def buffers(n: int, width: int) -> _Buffers | None:
            if not record:
                return None
            return _Buffers(np.zeros((n, width), dtype=np.int16), np.zeros((n, width), dtype=np.int16),
                            np.zeros((n, width), dtype=np.float32) if rewarded else None)

        pbuf = buffers(groups, P)
        prompt = self._run(np.full(groups, ch.start), np.zeros(groups, dtype=np.int64), rng, pbuf,
                           stop=ch.after_prompt)
        group = np.arange(rows) // p.group_size
        buf = buffers(rows, L)
        if buf is not None:
            buf.tokens[:, :P], buf.states[:, :P] = pbuf.tokens[group], pbuf.states[group]
            if rewarded:
                buf.token_rewards[:, :P] = pbuf.token_rewards[group]
        run = self._run(prompt.state[group], prompt.pos[group], rng, buf)
        return buf, run.pos, run.outcome, run.truncated

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
        buf, lengths, outcome, truncated = self._sample(rows, rng, record=True)
        cells = np.arange(p.max_length)[None, :] < lengths[:, None]
        flat = buf.tokens[cells].astype(np.int32)
        starts = np.cumsum(lengths) - lengths
        positions = np.arange(len(flat)) - np.repeat(starts, lengths)
        values = self.values(buf.states[cells], positions)
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
        if buf.token_rewards is not None:  # per-token rewards (process rewards, a length penalty)
            data["token_rewards"] = pa.ListArray.from_arrays(offsets, pa.array(buf.token_rewards[cells]))
        schema = canonical_schema(list(data))
        return pa.Table.from_arrays([data[f.name] for f in schema], schema=schema)


