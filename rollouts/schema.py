"""Rollout schema v1: the one table format every reader, converter and trainer agrees on.

A rollout is one row. Per-token columns are lists with exactly one entry per token of
``input_ids``. The canonical Arrow types below are what readers hand out and writers
write; readers also accept the looser types listed in ``ACCEPTED`` and cast them.

Alignment of ``values`` / ``oracle_values`` follows NeMo-RL / verl: ``values[t]`` is the
value of the state *before* token ``t`` is generated (computed from the hidden state at
``t-1``); ``values[0]`` is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    """Canonical Arrow type."""
    per_token: bool
    """A list with one entry per token of ``input_ids``."""
    required: bool
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("input_ids", pa.list_(pa.int32()), True, True,
           "whole token sequence: prompt, every turn, tool and environment output"),
    Column("loss_mask", pa.list_(pa.int8()), True, True,
           "1 where the policy generated the token, else 0"),
    Column("reward", pa.float64(), False, False,
           "outcome reward, placed on the last policy token"),
    Column("token_rewards", pa.list_(pa.float32()), True, False,
           "per-token rewards; added to the outcome reward when both are given"),
    Column("sample_id", pa.string(), False, False, "unique id of the rollout"),
    Column("group_id", pa.string(), False, False,
           "id of the prompt; rollouts of one group never straddle the train/val split"),
    Column("values", pa.list_(pa.float32()), True, False,
           "the collecting critic's values: values[t] = V(state before token t), values[0] = 0 "
           "(NeMo-RL's right_shift_values)"),
    Column("policy_version", pa.int64(), False, False, "policy step that generated the rollout"),
    Column("sample_weight", pa.float64(), False, False,
           "weight of the rollout in the loss (NeMo-RL's sample mask); 0 drops it"),
    Column("truncated", pa.bool_(), False, False, "generation stopped at a length limit"),
    Column("oracle_values", pa.list_(pa.float32()), True, False,
           "true state values (synthetic data only), aligned like `values`"),
)

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
REQUIRED = tuple(c.name for c in COLUMNS if c.required)
REWARD_COLUMNS = ("reward", "token_rewards")
PER_TOKEN = tuple(c.name for c in COLUMNS if c.per_token)
FLOAT_COLUMNS = ("reward", "token_rewards", "values", "oracle_values", "sample_weight")

# What each kind of canonical type accepts on input (cast on read).
_KIND_DOC = {
    "input_ids": "a list of integers",
    "loss_mask": "a list of 0/1 integers or booleans",
    "reward": "a number",
    "token_rewards": "a list of numbers",
    "sample_id": "a string or an integer",
    "group_id": "a string or an integer",
    "values": "a list of numbers",
    "policy_version": "an integer",
    "sample_weight": "a number",
    "truncated": "a boolean",
    "oracle_values": "a list of numbers",
}


def expected_kind(name: str) -> str:
    """Human description of what a column must hold, for error messages."""
    return _KIND_DOC[name]


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)


def accepts(name: str, t: pa.DataType) -> bool:
    """Whether a file's Arrow type for column ``name`` can be cast to the canonical type."""
    if pa.types.is_null(t):  # an all-null column: handled as nulls, not as a type error
        return True
    col = BY_NAME[name]
    if col.per_token:
        if not _is_list(t):
            return False
        v = t.value_type
        if name == "input_ids":
            return pa.types.is_integer(v) or pa.types.is_null(v)
        if name == "loss_mask":
            return pa.types.is_integer(v) or pa.types.is_boolean(v) or pa.types.is_null(v)
        return _is_number(v)
    if name in ("reward", "sample_weight"):
        return _is_number(t)
    if name in ("sample_id", "group_id"):
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
    if name == "policy_version":
        return pa.types.is_integer(t)
    if name == "truncated":
        return pa.types.is_boolean(t) or pa.types.is_integer(t)
    raise KeyError(name)


def describe() -> str:
    """Markdown table of the schema (used by the docs and ``rollouts schema``)."""
    lines = ["| column | type | required | meaning |", "|---|---|---|---|"]
    for c in COLUMNS:
        req = "yes" if c.required else ("one of reward/token_rewards" if c.name in REWARD_COLUMNS else "no")
        lines.append(f"| `{c.name}` | `{c.type}` | {req} | {c.doc} |")
    return "\n".join(lines)


def canonical_schema(names: list[str] | tuple[str, ...], extra: pa.Schema | None = None) -> pa.Schema:
    """Canonical Arrow schema for the given schema columns (in schema order) plus extras."""
    fields = [pa.field(c.name, c.type) for c in COLUMNS if c.name in names]
    if extra is not None:
        fields += [f for f in extra if f.name not in BY_NAME]
    return pa.schema(fields, metadata={b"critic_pretrain.rollout_schema": str(SCHEMA_VERSION).encode()})
