"""Synthetic rollouts whose true state values are known exactly (``oracle_values``).

Used to test and demo critic pretraining: a critic trained on these rows can be scored against
the exact value of every state, and an alignment bug shows up as a measurable error where the
value jumps. ``chain`` is the engine (exact values, sampling); one environment per module
(``multiturn``: tools and dense, ``keysteps``: key-steps and long, ``fatal``, ``reveal``, ``undo``,
``prefix``, ``synergy``), named in ``envs``; token ids in ``vocab``; ``oracle`` (the variance split,
the EV ceiling and the calibration check of an archive); ``archive`` (shards and the
``_synth.json`` manifest); ``cli`` (``rollouts synth``). numpy and pyarrow only.
"""

from .archive import MANIFEST, write
from .chain import Lengths, SynthEnv, SynthParams
from .cli import add_parser, run
from .envs import ENVIRONMENTS, generate, make_env, monte_carlo_value, params_of
from .oracle import ValueStats, value_stats
from .vocab import *  # noqa: F403 (the token ids: synth.EOS, synth.VOCAB_SIZE, ...)
from .vocab import IS_POLICY_TOKEN, VOCAB_SIZE

__all__ = ["ENVIRONMENTS", "IS_POLICY_TOKEN", "MANIFEST", "VOCAB_SIZE", "Lengths", "SynthEnv", "SynthParams",
           "ValueStats", "add_parser", "generate", "make_env", "monte_carlo_value", "params_of", "run", "value_stats",
           "write"]
