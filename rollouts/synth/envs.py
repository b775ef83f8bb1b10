"""The named synthetic environments, each with a credit structure of its own, and the entry points
that build them (``make_env``, ``generate``, ``monte_carlo_value``).

======================  ===================================================================
name                    where the credit sits
======================  ===================================================================
``tools`` (default)     turn-first actions of a multi-turn tool task, judged by the tool's
                        verdict; the outcome at the end (the bundled sample)
``key-steps``           a few decisive tokens in the middle of one long answer
``fatal``               one mistake token mid-turn ends the episode (value drops to 0)
``reveal``              one plan token; tool outputs then reveal, test by test, whether it
                        works: the value moves on environment tokens
``long``                ``key-steps`` at 2k+ policy tokens per row (long horizons)
``long-tools``          ``tools`` at 2k+ policy tokens per row (long horizons, credit on turns)
``dense``               ``tools`` with a per-token process reward on every action (+/-0.1)
                        and a length penalty (-0.001 per policy token)
``undo``                a bad key step undoes the good ones before it: the reward counts the
                        streak since the last mistake, so a mistake costs what came before it
``prefix``              only the good key steps before the first mistake count: a key step
                        matters only while no mistake came before it
``synergy``             the reward's chance is the share of good key steps squared: a good step
                        is worth more the more good steps came before it
======================  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache

import pyarrow as pa

from . import fatal, keysteps, multiturn, prefix, reveal, synergy, undo
from .chain import Builder, SynthEnv, SynthParams


@dataclass(frozen=True)
class Environment:
    """A named environment: its chain, what it tests, and the parameters it changes."""

    build: Builder
    credit: str
    """Where the credit sits (``rollouts synth --list``)."""
    defaults: dict = field(default_factory=dict)
    """Parameters that differ from ``SynthParams``' defaults; explicit ones still win."""


ENVIRONMENTS: dict[str, Environment] = {
    "tools": Environment(multiturn.build, "turn-first actions of a multi-turn tool task, judged by the tool's "
                                          "verdict; the outcome at the end (the bundled sample)"),
    "key-steps": Environment(keysteps.build, "a few decisive tokens in the middle of one long answer"),
    "fatal": Environment(fatal.build, "one mistake token mid-turn ends the episode (the value drops to 0)"),
    "reveal": Environment(reveal.build, "one plan token; tool outputs then reveal, test by test, whether it works",
                          {"p_ok_good": 0.7, "p_ok_bad": 0.3}),
    "long": Environment(keysteps.build, "key-steps at 2k+ policy tokens per row (long horizons)",
                        {"median_length": 3500.0, "max_length": 8192, "length_sigma": 0.6}),
    "long-tools": Environment(multiturn.build, "tools at 2k+ policy tokens per row (long horizons, credit on turns)",
                              {"median_length": 4000.0, "max_length": 8192, "length_sigma": 0.6}),
    "dense": Environment(multiturn.build, "tools with a per-token process reward on every action (+/-0.1) and a "
                                          "length penalty (-0.001 per policy token)",
                         {"step_reward": 0.1, "token_penalty": 0.001}),
    "undo": Environment(undo.build, "a bad key step undoes the good ones before it: the reward counts the streak "
                                    "since the last mistake, so a mistake costs what came before it",
                        {"max_need": 4, "p_good_easy": 0.95, "p_good_hard": 0.3}),
    "prefix": Environment(prefix.build, "only the good key steps before the first mistake count: a key step matters "
                                        "only while no mistake came before it",
                          {"max_need": 4, "p_good_easy": 0.95, "p_good_hard": 0.3}),
    "synergy": Environment(synergy.build, "the reward's chance is the share of good key steps squared: a good step is "
                                          "worth more the more good steps came before it",
                           {"max_need": 4, "p_good_easy": 0.95, "p_good_hard": 0.3}),
}


def params_of(env: str = "tools", **params) -> SynthParams:
    """The parameters of environment ``env``: its defaults, then ``params``."""
    if env not in ENVIRONMENTS:
        raise ValueError(f"unknown synth environment {env!r}; known: {', '.join(ENVIRONMENTS)}")
    known = {f.name for f in fields(SynthParams)} - {"env"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown synth parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return SynthParams(env=env, **{**ENVIRONMENTS[env].defaults, **params})


@lru_cache(maxsize=8)
def _env(params: SynthParams) -> SynthEnv:
    return SynthEnv(params, ENVIRONMENTS[params.env].build)


def make_env(env: str = "tools", **params) -> SynthEnv:
    """The (cached) chain of environment ``env`` with these parameters (``SynthParams``)."""
    return _env(params_of(env, **params))


def generate(rows: int, seed: int, env: str = "tools", **params) -> pa.Table:
    """``rows`` synthetic rollouts of ``env`` (schema v1 with ``oracle_values``), deterministic in
    ``seed`` and the parameters."""
    return pa.concat_tables(make_env(env, **params).tables(rows, seed)).combine_chunks()


def monte_carlo_value(prefix, n_samples: int, seed: int = 0, env: str = "tools", **params) -> tuple[float, float]:
    """Sampled value (mean, standard error) of the state after ``prefix``; see
    ``SynthEnv.monte_carlo_value``."""
    return make_env(env, **params).monte_carlo_value(prefix, n_samples, seed)
