"""NeMo-RL ``train_data_step<N>.jsonl`` dumps (docs/converters.md: the fields, and where in
NeMo-RL's code they were read)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from .. import schema as S
from .base import BadFile, BadRow, dump_files, jsonl_records, show, union_keys, unwrap

NEMO_RL_NAME = re.compile(r"train_data_step(\d+)\.jsonl")


class NemoRLSource:
    """NeMo-RL ``train_data_step<N>.jsonl`` (``Logger.log_batched_dict_as_jsonl``)."""

    FIELDS = {"input_ids": "token_ids", "loss_mask": "token_loss_mask",
              "sample_weight": "sample_loss_mask", "values": "values"}

    def __init__(self, paths, *, reward_field: str, keep_extra: bool):
        self.files, self.ignored = nemo_rl_files(paths)
        self.reward_field = reward_field
        self.fields = {**self.FIELDS, "reward": reward_field}
        keys = self.keys = union_keys(self.files)
        self.columns = ["input_ids", "loss_mask", "reward", "sample_id", "group_id", "policy_version"]
        self.columns += [c for c in ("sample_weight", "values") if self.fields[c] in keys]
        used = set(self.fields.values()) | {"input_lengths", "idx"}
        self.extra_names = [k for k in keys if k not in used and k not in S.BY_NAME] if keep_extra else []
        self.derive_group_id = True
        self._id_prefix = id_prefixes(self.files)

    def records(self, path: Path) -> Iterator[tuple[int, dict | BadRow]]:
        if step_of(path) is None:
            raise BadFile("the file name does not carry the training step",
                           "keep NeMo-RL's name train_data_step<N>.jsonl: the step sets sample_id "
                           "and policy_version", "bad_file_name")
        return jsonl_records(path)

    def convert(self, path: Path, row: int, rec: dict) -> dict:
        step = step_of(path)
        padded = self._tokens(rec, "token_ids")
        n = unwrap(self._get(rec, "input_lengths"))
        if type(n) is not int or not 0 < n <= len(padded):
            raise BadRow("input_lengths", f"input_lengths is {show(n)} but token_ids has {len(padded)} entries",
                          "input_lengths must be the unpadded length of token_ids (1..len(token_ids)); "
                          "the line is damaged", "length_mismatch")
        out = {
            "input_ids": padded[:n],
            "loss_mask": self._unpadded(rec, "token_loss_mask", n),
            "reward": unwrap(self._get(rec, self.reward_field)),
            "sample_id": f"{self._id_prefix[path]}step{step}-idx{self._idx(rec, row)}",
            # The file is written after step N's update, from rollouts of the policy that had
            # N-1 updates (NeMo-RL names the file total_steps + 1).
            "policy_version": step - 1,
        }
        if "sample_weight" in self.columns and "sample_loss_mask" in rec:
            out["sample_weight"] = unwrap(rec["sample_loss_mask"])
        if "values" in self.columns and "values" in rec:
            out["values"] = self._unpadded(rec, "values", n)
        for name in self.extra_names:
            if name in rec:
                out[name] = unpad_extra(unwrap(rec[name]), len(padded), n)
        return out

    def _get(self, rec: dict, name: str) -> Any:
        if name not in rec:
            if name in self.keys:  # other lines have it: this one is damaged, not the dump of another format
                fix = ("other lines of the dump have it, so this line is damaged; --on-bad skip leaves such rows "
                       "out (--quarantine FILE lists them)")
            elif name == self.reward_field:
                fix = "pass --reward-field <field> naming the reward field"
            elif name == "token_ids":
                fix = ("NeMo-RL versions that log only text (content, rewards, input_lengths) lack token "
                       "ids and cannot be converted; for other formats use --from generic with --map")
            else:
                fix = "this does not look like a NeMo-RL train_data_step dump; use --from generic with --map"
            raise BadRow(name, f"no field '{name}'", fix, "missing_field")
        return rec[name]

    def _tokens(self, rec: dict, name: str) -> list:
        value = unwrap(self._get(rec, name))
        if not isinstance(value, list):
            raise BadRow(name, f"'{name}' is {show(value)}, not a list", self._type_fix(name), "wrong_type")
        return value

    def _unpadded(self, rec: dict, name: str, n: int) -> list:
        value = self._tokens(rec, name)
        if len(value) < n:
            raise BadRow(name, f"'{name}' has {len(value)} entries but input_lengths is {n}",
                          f"'{name}' must cover every token of token_ids; the line is damaged",
                          "length_mismatch")
        return value[:n]

    @staticmethod
    def _idx(rec: dict, row: int) -> int:
        idx = rec.get("idx", row)  # NeMo-RL's idx is the line number; forks may drop it
        if type(idx) is not int:
            raise BadRow("idx", f"idx is {show(idx)}, not an integer",
                          "idx numbers the rollouts of a step; fix or drop the field", "wrong_type")
        return idx

    def collected(self) -> dict:
        return {"framework": "nemo-rl"}

    def field_of(self, column: str) -> str | None:
        return self.fields.get(column)

    def fix_for(self, column: str) -> str:
        return self._type_fix(self.fields.get(column, column))

    def _type_fix(self, name: str) -> str:
        column = next((c for c, f in self.fields.items() if f == name), None)
        if column is None:
            return f"extra field '{name}' changed type; convert without --keep-extra"
        return f"'{name}' must be {S.expected_kind(column)}; is this a NeMo-RL train_data_step dump?"


def nemo_rl_files(paths) -> tuple[list[Path], list[Path]]:
    """Dump files in step order, and the other ``.jsonl`` files found in folders (ignored).

    A NeMo-RL log folder also holds ``val_data_step<N>.jsonl`` and other logs: folders and
    globs contribute only ``train_data_step<N>.jsonl``; a file named explicitly is always read.
    """
    return dump_files(paths, (".jsonl",), lambda f, explicit: explicit or step_of(f) is not None,
                      "holds no train_data_step<N>.jsonl; point at NeMo-RL's log folder (logs/exp_NNN) or at the "
                      "dump files", order=lambda f: (str(f.parent), step_of(f) or 0, f.name))


def step_of(path: Path) -> int | None:
    m = NEMO_RL_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else None


def id_prefixes(files: list[Path]) -> dict[Path, str]:
    """``step<N>-idx<i>`` is unique within one run; when the same step comes from several
    folders (a run resumed into exp_002 repeats the steps after its last checkpoint) the
    ids carry the folder name too."""
    steps = Counter(step_of(f) for f in files)
    if all(c == 1 for c in steps.values()):
        return {f: "" for f in files}
    return {f: f"{f.parent.name}/" for f in files}


def unpad_extra(value: Any, padded_len: int, n: int) -> Any:
    """Per-token number lists (advantages, logprobs) are padded like token_ids: cut them too."""
    if isinstance(value, list) and len(value) == padded_len and value and type(value[0]) in (int, float):
        return value[:n]
    return value
