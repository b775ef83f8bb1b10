"""verl's rollout cache: the ``DataProto`` batches ``skip.rollout`` pickles (``gen_batch.dp``), read
without verl, tensordict or torch (docs/converters.md: the fields, and where in verl's code they
were read).

``DataProto.save_to_disk`` is ``pickle.dump(self)``; its ``__getstate__`` gives ``(batch,
non_tensor_batch, meta_info)`` where ``batch`` is the bytes of ``torch.save(TensorDict)`` (by
default; a consolidated TensorDict since tensordict 0.5) or, with
``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``, a ``(batch_size, device, {key: (dtype, shape,
uint8 array)})`` tuple, and ``non_tensor_batch`` maps keys to numpy arrays. Both pickles go
through the allow-list unpickler (``rollouts.safe_pickle``), with verl's and tensordict's
classes replaced by stand-ins that only hold their state.

verl's other dump, ``trainer.rollout_data_dir``, is decoded text and is refused (``TEXT_DUMP``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import schema as S
from ..errors import RolloutError
from ..safe_pickle import Stand, UnsafePickle, load_pickle, load_torch, numpy_dtype, stand_in, view_bytes
from .base import BadFile, BadRow, dump_files, show

CACHE_NAME = "gen_batch.dp"
"""``RolloutSkip.gen_batch_name``: the generated batch of one step (``new_batch.dp`` beside it in
older layouts is the prompt batch, without responses)."""
REWARD_KEYS = ("token_level_scores", "rm_scores")
"""Per-token reward tensors, in the order looked for (``rm_scores``: scored in the agent loop)."""
TEXT_DUMP = ("verl's trainer.rollout_data_dir dump is decoded text with the special tokens stripped "
             "(tokenizer.batch_decode(..., skip_special_tokens=True)): the token ids and the chat template cannot "
             "be rebuilt from it; dump the token-level batches instead (skip.rollout.enable=True "
             "skip.rollout.action=cache skip.rollout.dump_dir=DIR skip.rollout.steps=[1,2,...]) and convert DIR")
STEP_DIR = re.compile(r"(?:genstep_)?(\d+)")

DataProto = stand_in("verl.protocol.DataProto")
TensorDict = stand_in("tensordict._td.TensorDict")


def _consolidated(metadata: dict, storage: np.ndarray) -> dict:
    """tensordict's ``_rebuild_tensordict_files_consolidated``: every leaf is a slice of one
    uint8 storage, ``(dtype, shape, start, stop, pad)``."""
    if not isinstance(metadata, dict) or not isinstance(storage, np.ndarray):
        raise UnsafePickle("a consolidated TensorDict without its metadata and storage")
    out = {}
    for key, leaf in (metadata.get("leaves") or {}).items():
        dtype, shape, start, stop = leaf[:4]
        if str(key).startswith("<NJT"):
            raise UnsafePickle(f"'{key}' is a nested (jagged) tensor, which is not read")
        value = view_bytes(storage[int(start):int(stop)], numpy_dtype(dtype))
        out[key] = value[: math.prod(shape)].reshape(tuple(shape))
    for key, sub in metadata.items():
        if key not in ("leaves", "non_tensors", "cls", "cls_metadata", "size") and isinstance(sub, dict):
            out.update({f"{key}.{k}": v for k, v in _consolidated(sub, storage).items()})
    return out


def _make_td(cls, state) -> dict:
    td = cls.__new__(cls) if isinstance(cls, type) and issubclass(cls, Stand) else None
    if td is None:
        raise UnsafePickle("a TensorDict of an unknown class")
    td.__setstate__(state)
    return tensors_of(td)


TENSORDICT_GLOBALS = {
    ("tensordict._reductions", "_rebuild_tensordict_files_consolidated"): _consolidated,
    ("tensordict._reductions", "_make_td"): _make_td,
    ("tensordict._td", "TensorDict"): TensorDict,
    ("tensordict.tensordict", "TensorDict"): TensorDict,  # tensordict < 0.5
    ("tensordict.utils", "_StringOnlyDict"): dict,
}
"""What ``torch.save(TensorDict)`` names, as tensordict 0.4-0.15 write it."""


def tensors_of(td: Any) -> dict[str, np.ndarray]:
    """The tensors of an unpickled TensorDict (a dict already, or a stand-in with ``_tensordict``)."""
    if isinstance(td, dict):
        return td
    state = td.state if isinstance(td, Stand) else None
    inner = state.get("_tensordict") if isinstance(state, dict) else None
    if not isinstance(inner, dict):
        raise UnsafePickle("a TensorDict without its tensors")
    return {k: v if isinstance(v, np.ndarray) else tensors_of(v) for k, v in inner.items()}


@dataclass
class Batch:
    """One ``DataProto``: tensors ``[B, ...]``, per-row ``non_tensor_batch`` arrays, ``meta_info``."""

    tensors: dict[str, np.ndarray]
    non_tensor: dict[str, Any]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        first = next(iter(self.tensors.values()), None)
        return 0 if first is None else len(first)


def read_batch(path: Path) -> Batch:
    """The batch ``DataProto.save_to_disk`` pickled to ``path``; ``BadFile`` for anything else."""
    try:
        with open(path, "rb") as f:
            obj = load_pickle(f, {("verl.protocol", "DataProto"): DataProto})
    except OSError as e:
        raise BadFile(f"cannot read it ({e.strerror or e})", "check the path and its permissions", "unreadable")
    except UnsafePickle as e:
        raise BadFile(str(e), "convert only gen_batch.dp files you trust, as verl's DataProto.save_to_disk wrote "
                              "them", "unsafe_pickle")
    if not isinstance(obj, DataProto) or not (isinstance(obj.state, tuple) and len(obj.state) == 3):
        raise BadFile(f"holds a pickled {type(obj).__name__}, not a verl DataProto",
                      "convert the gen_batch.dp files that skip.rollout writes", "not_verl_batch")
    batch, non_tensor, meta = obj.state
    if not isinstance(batch, (bytes, bytearray)) and not (isinstance(batch, tuple) and len(batch) == 3
                                                          and isinstance(batch[2], dict)):
        raise BadFile("a DataProto without a tensor batch (prompts, responses, masks)",
                      "convert the gen_batch.dp files that skip.rollout writes", "missing_field")
    try:
        if isinstance(batch, (bytes, bytearray)):
            tensors = tensors_of(load_torch(bytes(batch), TENSORDICT_GLOBALS))
        else:  # VERL_DATAPROTO_SERIALIZATION_METHOD=numpy
            tensors = {k: _numpy_leaf(k, v) for k, v in batch[2].items()}
    except UnsafePickle as e:
        raise BadFile(str(e), "convert the gen_batch.dp files that skip.rollout writes", "unsafe_pickle")
    return Batch(tensors, non_tensor if isinstance(non_tensor, dict) else {}, meta if isinstance(meta, dict) else {})


def _numpy_leaf(key: str, leaf: Any) -> np.ndarray:
    if not (isinstance(leaf, tuple) and len(leaf) == 3 and isinstance(leaf[2], np.ndarray)):
        raise UnsafePickle(f"'{key}' is a nested tensor, which is not read")
    dtype, shape, data = leaf
    return view_bytes(data, numpy_dtype(dtype)).reshape(tuple(shape))


@dataclass
class Layout:
    """Where prompt and response sit in a batch's ``[B, L]`` tensors: ``L = P + R``, the prompt
    left-padded in the first ``P`` columns, the response right-padded in the last ``R``."""

    ids: np.ndarray           # [B, L]
    attention: np.ndarray     # [B, L]: 1 on real tokens
    policy: np.ndarray        # [B, R]: 1 on tokens the policy generated (response_mask), 0 on tool tokens
    reward: np.ndarray        # [B, R] per-token scores, or [B]
    reward_field: str
    R: int

    @classmethod
    def of(cls, batch: Batch, reward_field: str | None) -> "Layout":
        t = batch.tensors
        if "attention_mask" not in t:
            raise BadFile("the batch has no attention_mask", "convert the gen_batch.dp files that skip.rollout "
                          "writes (generate_sequences' output)", "missing_field")
        if "responses" in t:
            R = t["responses"].shape[1]
        elif "response_mask" in t:
            R = t["response_mask"].shape[1]
        else:
            raise BadFile("the batch has neither responses nor response_mask: prompt and response cannot be told "
                          "apart", "convert the gen_batch.dp files that skip.rollout writes", "missing_field")
        ids = t["input_ids"] if "input_ids" in t else (
            np.concatenate([t["prompts"], t["responses"]], axis=1) if "prompts" in t and "responses" in t else None)
        if ids is None:
            raise BadFile("the batch has neither input_ids nor prompts + responses", "convert the gen_batch.dp "
                          "files that skip.rollout writes", "missing_field")
        attention = t["attention_mask"]
        policy = t["response_mask"] if "response_mask" in t else attention[:, -R:]
        name, reward = _reward(batch, reward_field)
        B = len(ids)
        for key, arr, shape in (("attention_mask", attention, ids.shape), ("response_mask", policy, (B, R)),
                                (name, reward, (B, R) if reward.ndim == 2 else (B,))):
            if arr.shape != shape:
                raise BadFile(f"'{key}' has shape {list(arr.shape)}, expected {list(shape)} (input_ids "
                              f"{list(ids.shape)}, {R} response columns)", "the batch is damaged", "length_mismatch")
        return cls(ids, attention, policy, reward, name, R)

    def row(self, i: int) -> dict:
        """Schema columns of row ``i``: padding dropped by the attention mask; the outcome reward on
        its own when the scores are one number on the last real response token (where verl puts it),
        else per-token rewards."""
        L, R = self.ids.shape[1], self.R
        keep = self.attention[i] == 1
        policy = np.zeros(L, dtype=np.int64)
        policy[L - R:] = self.policy[i] != 0
        out = {"input_ids": self.ids[i][keep].tolist(), "loss_mask": policy[keep].tolist()}
        scores = self.reward[i]
        if scores.ndim == 0:
            out["reward"] = float(scores)
            return out
        real = np.flatnonzero(self.attention[i, L - R:] == 1)
        hit = np.flatnonzero(scores != 0)
        if len(hit) == 0 or (len(hit) == 1 and len(real) and hit[0] == real[-1]):
            out["reward"] = float(scores.sum())
        else:
            token = np.zeros(L, dtype=np.float64)
            token[L - R:] = scores
            out["token_rewards"] = token[keep].tolist()
        return out


def _reward(batch: Batch, wanted: str | None) -> tuple[str, np.ndarray]:
    names = [wanted] if wanted else list(REWARD_KEYS)
    for name in names:
        if name in batch.tensors:
            return name, batch.tensors[name].astype(np.float64)
        if name in batch.non_tensor:
            try:
                return name, np.asarray(batch.non_tensor[name], dtype=np.float64)
            except (TypeError, ValueError):
                raise BadFile(f"non_tensor_batch['{name}'] holds {show(batch.non_tensor[name][:3].tolist())}, not "
                              "numbers", "pass --reward-field naming a numeric field", "wrong_type") from None
    if wanted:
        raise BadFile(f"the batch has no '{wanted}' (tensors: {', '.join(sorted(batch.tensors))})",
                      "pass --reward-field naming a batch tensor or non_tensor_batch field", "missing_field")
    raise BadFile("the batch holds no reward (neither token_level_scores nor rm_scores): verl put none in the "
                  "cached batch", "score in the agent loop (a reward function without a separate reward model "
                  "writes rm_scores), or pass --reward-field naming the field that holds it", "missing_field")


class VerlSource:
    """verl's ``skip.rollout`` cache (``RolloutSkip.prepare_data`` in ``verl/utils/skip/rollout_skip.py``)."""

    FIELDS = {"input_ids": "input_ids", "loss_mask": "response_mask", "reward": "token_level_scores/rm_scores",
              "token_rewards": "token_level_scores/rm_scores", "sample_id": "step", "policy_version": "step"}

    def __init__(self, paths, *, reward_field: str | None, keep_extra: bool):
        self.files, self.ignored = verl_files(paths)
        self.reward_field = reward_field
        self.fields = dict(self.FIELDS)
        self.columns = ["input_ids", "loss_mask", "reward", "token_rewards", "sample_id", "group_id",
                        "policy_version"]
        self.keep_extra = keep_extra
        self.extra_names: list[str] = []
        """Set from the first batch read (its scalar ``non_tensor_batch`` fields) with ``--keep-extra``."""
        self.derive_group_id = True
        self.max_length: int | None = None
        """The widest batch (prompt + response columns: verl pads to its configured lengths)."""
        self._layout: Layout | None = None
        self._batch: Batch | None = None
        self._step: int | None = None
        self._extras_fixed = False
        steps = [step_of(f) for f in self.files]
        repeated = len(set(steps)) < len(steps)  # two experiments (or a resumed one) in one conversion
        self._prefix = {f: "/".join(f.parts[-4:-2]) + "/" if repeated else "" for f in self.files}

    def records(self, path: Path) -> Iterator[tuple[int, dict | BadRow]]:
        batch = read_batch(path)
        layout = Layout.of(batch, self.reward_field)
        self.fields["reward"] = self.fields["token_rewards"] = layout.reward_field
        self._batch, self._layout = batch, layout
        self.max_length = max(self.max_length or 0, layout.ids.shape[1])
        if self.keep_extra and not self._extras_fixed:
            self.extra_names = [k for k, v in batch.non_tensor.items() if _scalar_field(v, len(layout.ids))]
            self._extras_fixed = True
        self._step = step_of(path)
        for i in range(len(layout.ids)):
            yield i, {"row": i}

    def convert(self, path: Path, row: int, rec: dict) -> dict:
        out = self._layout.row(row)
        step = self._step
        where = f"step{step}" if step is not None else f"{path.parent.name}/{path.name}"
        out["sample_id"] = f"{self._prefix.get(path, '')}{where}-{row}"
        out["policy_version"] = step - 1 if step is not None else None  # step N was generated after N-1 updates
        for name in self.extra_names:
            values = self._batch.non_tensor.get(name)
            value = values[row] if values is not None and len(values) > row else None
            out[name] = value.item() if isinstance(value, np.generic) else value
        return out

    def collected(self) -> dict:
        return {"framework": "verl", "max_length": self.max_length}

    def field_of(self, column: str) -> str | None:
        return self.fields.get(column)

    def fix_for(self, column: str) -> str:
        if column in S.BY_NAME:
            return (f"'{self.fields.get(column, column)}' must hold {S.expected_kind(column)}; is this a verl "
                    "gen_batch.dp?")
        return f"extra field '{column}' changed type; convert without --keep-extra"


def _scalar_field(values: Any, n: int) -> bool:
    if not isinstance(values, np.ndarray) or values.ndim != 1 or len(values) != n:
        return False
    if values.dtype.kind in "biufU":
        return True
    return values.dtype == object and all(v is None or isinstance(v, (str, bool, int, float, np.generic))
                                          for v in values.tolist())


def verl_files(paths) -> tuple[list[Path], list[Path]]:
    """``gen_batch.dp`` files in step order, and the other ``.dp`` files found in folders (ignored).

    A folder or glob contributes ``gen_batch.dp`` files (``<dump_dir>/<exp>_<project>/GBS.._N.._in.._out../
    <step>/gen_batch.dp``; ``genstep_<step>/`` in older layouts); a file named explicitly is read
    whatever its name (the oldest layout is one file named after the experiment). JSONL is
    verl's decoded-text dump: refused, with what to dump instead.
    """
    def refuse_text(found: list[Path], kept: list[Path], explicit: bool) -> None:
        text = [f for f in found if f.suffix == ".jsonl"]
        if text and (explicit or not kept):
            raise RolloutError(f"{text[0]}: {TEXT_DUMP}")

    return dump_files(paths, (".dp", ".jsonl"),
                      lambda f, explicit: f.suffix != ".jsonl" and (explicit or f.name == CACHE_NAME),
                      f"holds no {CACHE_NAME}; point at skip.rollout's dump_dir (or a step folder in it), or at the "
                      ".dp files", order=lambda f: (str(f.parent.parent), step_of(f) or 0, str(f)), check=refuse_text)


def step_of(path: Path) -> int | None:
    """The trainer step of a cached batch: ``meta.json``'s ``global_steps`` beside it, else its
    folder's name (``<step>`` or ``genstep_<step>``)."""
    meta = path.parent / "meta.json"
    try:
        steps = json.loads(meta.read_text()).get("global_steps") if meta.is_file() else None
    except (OSError, ValueError, AttributeError):
        steps = None
    if type(steps) is int:
        return steps
    m = STEP_DIR.fullmatch(path.parent.name)
    return int(m.group(1)) if m else None
