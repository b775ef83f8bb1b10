"""slime ``--save-debug-rollout-data`` dumps (docs/converters.md: the fields, and where in slime's
code they were read).

slime writes one ``torch.save({"rollout_id": N, "samples": [Sample.to_dict(), ...]})`` file per
rollout step (``<dump_details>/rollout_data/<N>.pt`` with ``--dump-details``). A sample holds the
whole token sequence (``tokens``: prompt then response), ``response_length`` (the response is the
tail), a ``loss_mask`` over the response only (0 on tool and environment tokens of a multi-turn
rollout, ``None`` for all 1), ``reward`` (a number, or a dict read with slime's ``--reward-key``),
``group_index`` (the prompt group), ``index``, ``status`` and ``remove_sample``. The files are read
with the allow-list unpickler (``rollouts.safe_pickle``), never with ``torch.load``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import schema as S
from ..safe_pickle import UnsafePickle, is_torch_archive, load_torch
from .base import BadFile, BadRow, dump_files, prompt_hash, show

SLIME_NAME = re.compile(r"(\d+)\.pt")
"""``--save-debug-rollout-data`` writes ``<rollout_id>.pt`` (evaluation rollouts: ``eval_<id>.pt``)."""
EXTRA_FIELDS = ("index", "rollout_id", "prompt", "response", "label", "status", "weight_versions", "metadata")
"""Sample fields kept with ``--keep-extra`` (``index`` as an integer, the others as text: JSON for
lists, dicts and numbers, so that a field has one type in every row)."""


class SlimeSource:
    """slime's ``--save-debug-rollout-data`` files (``save_debug_rollout_data`` in
    ``slime/observability/rollout_data_utils.py``)."""

    FIELDS = {"input_ids": "tokens", "loss_mask": "loss_mask", "reward": "reward", "group_id": "group_index",
              "sample_id": "index", "policy_version": "rollout_id", "sample_weight": "remove_sample",
              "truncated": "status"}

    def __init__(self, paths, *, reward_key: str | None, keep_extra: bool):
        self.files, self.ignored = slime_files(paths)
        self.reward_key = reward_key
        self.fields = dict(self.FIELDS)
        self.columns = ["input_ids", "loss_mask", "reward", "sample_id", "group_id", "policy_version",
                        "sample_weight", "truncated"]
        self.extra_names = list(EXTRA_FIELDS) if keep_extra else []
        self.derive_group_id = False  # slime's group_index, else the prompt hash (per row)
        self._prefix = _folder_prefixes(self.files)
        self._file: dict[str, Any] = {}
        self.tokenizer_dir = next((d for d in (_tokenizer_dir(f) for f in self.files) if d is not None), None)
        """``<dump_details>/tokenizer``, which slime saves beside ``rollout_data/`` (None: not there)."""

    def records(self, path: Path) -> Iterator[tuple[int, dict | BadRow]]:
        doc = read_dump(path)
        samples = doc["samples"]
        rollout_id = doc.get("rollout_id")
        if type(rollout_id) is not int:
            rollout_id = _rollout_of(path)
        indices = Counter(s.get("index") for s in samples if isinstance(s, dict) and type(s.get("index")) is int)
        self._file = {"rollout_id": rollout_id, "repeated": {i for i, n in indices.items() if n > 1}}
        for row, sample in enumerate(samples):
            if not isinstance(sample, dict):
                yield row, BadRow(None, f"sample {row} is {show(str(type(sample).__name__))}, not a Sample.to_dict()",
                                  "this is not a slime rollout dump", "wrong_type")
                continue
            yield row, sample

    def convert(self, path: Path, row: int, rec: dict) -> dict:
        tokens = _int_list(rec, "tokens")
        n = len(tokens)
        length = rec.get("response_length")
        if type(length) is not int or not 0 <= length <= n:
            raise BadRow("response_length", f"response_length is {show(length)} for {n} tokens",
                         "response_length must count the response tokens at the end of tokens; the sample is "
                         "damaged", "length_mismatch")
        mask = rec.get("loss_mask")
        mask = [1] * length if mask is None else _int_list(rec, "loss_mask")  # slime: None means all 1
        if len(mask) != length:
            raise BadRow("loss_mask", f"loss_mask has {len(mask)} entries but response_length is {length}",
                         "slime's loss_mask covers the response only (one entry per response token); the sample "
                         "is damaged", "length_mismatch")
        rollout_id = self._file["rollout_id"]
        prefix = self._prefix.get(path, "")
        index = rec.get("index")
        step = f"rollout{rollout_id}" if rollout_id is not None else path.stem
        sid = f"{step}-idx{index}" if type(index) is int else f"{step}-row{row}"
        if index in self._file["repeated"]:  # a compact rollout split into several samples
            sid += f"-row{row}"
        group = rec.get("group_index")
        out = {
            "input_ids": tokens,
            "loss_mask": [0] * (n - length) + mask,
            "reward": self._reward(rec.get("reward")),
            "sample_id": prefix + sid,
            "group_id": prefix + f"group{group}" if type(group) is int else prompt_hash(tokens[:n - length]),
            "policy_version": rollout_id,
            "sample_weight": 0.0 if rec.get("remove_sample") else 1.0,  # slime zeroes such a sample's loss mask
            "truncated": rec.get("status") == "truncated",
        }
        for name in self.extra_names:
            out[name] = _plain(rec.get(name), name)
        return out

    def _reward(self, reward: Any) -> Any:
        if isinstance(reward, dict):
            if self.reward_key is None:
                raise BadRow("reward", f"reward is a dict (keys {', '.join(map(str, list(reward)[:6]))})",
                             "pass --reward-field KEY, the key slime's --reward-key reads", "wrong_type")
            if self.reward_key not in reward:
                raise BadRow("reward", f"reward has no key {self.reward_key!r} (keys "
                                       f"{', '.join(map(str, list(reward)[:6]))})",
                             "pass --reward-field naming one of them", "missing_field")
            reward = reward[self.reward_key]
        if reward is None:
            raise BadRow("reward", "reward is None (the sample was never scored)",
                         "convert a dump written after reward computation, or --on-bad skip", "missing_field")
        if isinstance(reward, np.ndarray) and reward.size == 1:  # a one-element tensor
            reward = reward.reshape(())
        return reward.item() if isinstance(reward, (np.generic, np.ndarray)) else reward

    def collected(self) -> dict:
        return {"framework": "slime", "tokenizer_path": str(self.tokenizer_dir) if self.tokenizer_dir else None}

    def field_of(self, column: str) -> str | None:
        return self.fields.get(column)

    def fix_for(self, column: str) -> str:
        if column in S.BY_NAME:
            return (f"'{self.fields.get(column, column)}' must be {S.expected_kind(column)}; is this a slime "
                    "rollout dump?")
        return f"extra field '{column}' changed type; convert without --keep-extra"


def read_dump(path: Path) -> dict:
    """The ``{"rollout_id", "samples"}`` dict of one file; ``BadFile`` for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise BadFile(f"cannot read it ({e.strerror or e})", "check the path and its permissions", "unreadable")
    if not is_torch_archive(head):
        raise BadFile("not a torch.save archive, which slime's --save-debug-rollout-data writes",
                      "convert the <rollout_id>.pt files of rollout_data/", "not_slime_dump")
    try:
        doc = load_torch(path)
    except UnsafePickle as e:
        raise BadFile(str(e), "convert only dumps you trust, as slime wrote them", "unsafe_pickle")
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        what = f"keys {', '.join(map(str, list(doc)[:5]))}" if isinstance(doc, dict) else type(doc).__name__
        raise BadFile(f"holds {what}, not slime's {{'rollout_id', 'samples'}}",
                      "point at rollout_data/ (train_data/ holds slime's training batches, another format)",
                      "not_slime_dump")
    return doc


def _int_list(rec: dict, name: str) -> list:
    value = rec.get(name)
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iub":
        return [int(v) for v in value.tolist()]
    if not isinstance(value, list):
        raise BadRow(name, f"'{name}' is {show(value) if not isinstance(value, np.ndarray) else 'an array'}, not a "
                           "list of integers", f"'{name}' must be a list of integers; is this a slime rollout dump?",
                     "wrong_type" if name in rec else "missing_field")
    return value


def _plain(value: Any, name: str) -> Any:
    """An extra field's value, one type per field whatever the rows hold: ``index`` an integer,
    the others text (JSON for lists and dicts); None stays None."""
    if value is None:
        return None
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    if name == "index" and type(value) is int:
        return value
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def slime_files(paths) -> tuple[list[Path], list[Path]]:
    """Rollout dumps in rollout-id order, and the other ``.pt`` files found in folders (ignored).

    Folders and globs contribute ``<rollout_id>.pt`` files outside ``train_data/`` (slime's
    ``--dump-details`` puts its training batches there, in another format); evaluation dumps
    (``eval_<id>.pt``) are left out. A file named explicitly is always read.
    """
    return dump_files(paths, (".pt",),
                      lambda f, explicit: explicit or (_rollout_of(f) is not None and f.parent.name != "train_data"),
                      "holds no slime rollout dump (<rollout_id>.pt, as --save-debug-rollout-data writes); point at "
                      "the rollout_data folder or at the .pt files",
                      order=lambda f: (str(f.parent), _rollout_of(f) or 0, f.name))


def _rollout_of(path: Path) -> int | None:
    m = SLIME_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else None


def _folder_prefixes(files: list[Path]) -> dict[Path, str]:
    """The same rollout id from several folders (two runs, or a resumed one): ids carry the folder."""
    ids = Counter((_rollout_of(f), f.name) for f in files)
    if all(c == 1 for c in ids.values()):
        return {}
    return {f: f"{f.parent.parent.name if f.parent.name == 'rollout_data' else f.parent.name}/" for f in files}


def _tokenizer_dir(path: Path) -> Path | None:
    d = path.parent.parent / "tokenizer"
    return d if path.parent.name == "rollout_data" and d.is_dir() else None
