"""Generic JSONL or parquet rows mapped onto schema columns (``--map``, or a prompt and a
response field), with padding dropped by a mask field or a pad id."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from .. import schema as S
from ..errors import RolloutError
from ..paths import PARQUET_SUFFIXES, resolve
from .base import MISSING, BadRow, jsonl_records, lookup, parquet_records, show, top, union_keys


class GenericSource:
    """JSONL or parquet rows whose fields are mapped onto schema columns."""

    def __init__(self, paths, mapping: Mapping[str, str] | None, *, prompt_field: str | None,
                 response_field: str | None, keep_extra: bool, pad_id: int | None = None,
                 mask_field: str | None = None):
        mapping = dict(mapping or {})
        self.pad_id, self.mask_field = pad_id, mask_field
        check_mapping(mapping, prompt_field, response_field)
        self.files = resolve(paths, suffixes=(".jsonl",) + PARQUET_SUFFIXES)
        keys = union_keys(self.files)
        self.explicit = mapping
        self.prompt_field, self.response_field = prompt_field, response_field
        built = {"input_ids", "loss_mask"} if prompt_field else set()
        # A source field named like a schema column is taken as that column unless mapped.
        self.implicit = {c: c for c in S.BY_NAME
                         if (c in keys or c in S.REQUIRED) and c not in mapping and c not in built}
        self.fields = {**self.implicit, **mapping}
        if prompt_field:
            self.fields.update(input_ids=f"{prompt_field}+{response_field}",
                               loss_mask=f"{prompt_field}+{response_field}")
        self.columns = [c.name for c in S.COLUMNS if c.name in self.fields]
        self.derive_group_id = "group_id" not in self.fields
        if self.derive_group_id:
            self.columns.append("group_id")
        used = {top(f) for f in [*mapping.values(), prompt_field, response_field, mask_field] if f}
        self.extra_names = ([k for k in keys if k not in used and k not in S.BY_NAME]
                            if keep_extra else [])

    def records(self, path: Path) -> Iterator[tuple[int, dict | BadRow]]:
        if path.suffix in PARQUET_SUFFIXES:
            return parquet_records(path)
        return jsonl_records(path)

    def convert(self, path: Path, row: int, rec: dict) -> dict:
        out: dict[str, Any] = {}
        for column, path_ in self.fields.items():
            if column in ("input_ids", "loss_mask") and self.prompt_field:
                continue
            value = lookup(rec, path_)
            if value is MISSING:
                if column in self.explicit or column in S.REQUIRED:
                    target = f" (for '{column}')" if path_ != column else ""
                    raise BadRow(path_, f"no field '{path_}'{target}",
                                  f"pass --map {column}=<field> naming the field that holds "
                                  f"{S.expected_kind(column)}", "missing_field")
                continue
            out[column] = value
        prompt_len = None
        if self.prompt_field:
            prompt = self._token_list(rec, self.prompt_field)
            response = self._token_list(rec, self.response_field)
            out["input_ids"] = prompt + response
            out["loss_mask"] = [0] * len(prompt) + [1] * len(response)
            prompt_len = len(prompt)
        keep = self._unpadded(rec, out.get("input_ids"), prompt_len)
        if keep is not None:
            n = len(out["input_ids"])
            for column, value in out.items():
                if column in S.BY_NAME and isinstance(value, list) and len(value) == n:
                    out[column] = [v for v, k in zip(value, keep) if k]
        if out.get("reward") is None and out.get("token_rewards") is None:
            present = [c for c in ("reward", "token_rewards") if c in self.fields]
            raise BadRow(self.fields.get("reward", "reward"),
                          "no reward" + (f" (field '{self.fields[present[0]]}' is empty)" if present else ""),
                          "pass --map reward=<field> (outcome reward) or --map token_rewards=<field> "
                          "(one reward per token)", "missing_field")
        for name in self.extra_names:
            if name in rec:
                out[name] = rec[name]
        return out

    def _unpadded(self, rec: dict, ids: Any, prompt_len: int | None) -> list[bool] | None:
        """Which tokens are real: ``mask_field``'s 1s (over the whole sequence, or over the
        response in prompt/response mode), else everything but ``pad_id`` runs at the padded ends
        (a prompt's left, a response's right; both ends of a single token list). None: all."""
        if not isinstance(ids, list):
            return None
        n = len(ids)
        if self.mask_field:
            mask = lookup(rec, self.mask_field)
            if not isinstance(mask, list) or any(m not in (0, 1, True, False) for m in mask):
                raise BadRow(self.mask_field, f"'{self.mask_field}' is {show(mask)}, not a 0/1 list",
                              "pass --mask-field naming the attention (or response) mask", "wrong_type")
            if len(mask) == n:
                return [bool(m) for m in mask]
            if prompt_len is not None and len(mask) == n - prompt_len:
                return [True] * prompt_len + [bool(m) for m in mask]
            raise BadRow(self.mask_field, f"'{self.mask_field}' has {len(mask)} entries for {n} tokens"
                          + (f" ({n - prompt_len} in the response)" if prompt_len is not None else ""),
                          "the mask must cover every token (or every response token)", "length_mismatch")
        if self.pad_id is None:
            return None
        keep = [True] * n
        head, tail = (prompt_len, n - prompt_len) if prompt_len is not None else (n, n)
        for i in range(head):  # left padding
            if ids[i] != self.pad_id:
                break
            keep[i] = False
        for i in range(n - 1, n - 1 - tail, -1):  # right padding
            if ids[i] != self.pad_id:
                break
            keep[i] = False
        return keep

    def _token_list(self, rec: dict, name: str) -> list:
        value = lookup(rec, name)
        option = "--prompt-field" if name == self.prompt_field else "--response-field"
        if value is MISSING:
            raise BadRow(name, f"no field '{name}'", f"pass {option} <field> naming the token id list",
                          "missing_field")
        if not isinstance(value, list):
            raise BadRow(name, f"'{name}' is {show(value)}, not a list of token ids",
                          f"pass {option} <field> naming the token id list", "wrong_type")
        return value

    def field_of(self, column: str) -> str | None:
        return self.fields.get(column)

    def fix_for(self, column: str) -> str:
        if column in S.BY_NAME:
            if self.prompt_field and column in ("input_ids", "loss_mask"):
                return "--prompt-field and --response-field must name lists of integer token ids"
            return f"map '{column}' to a field that holds {S.expected_kind(column)}: --map {column}=<field>"
        return f"extra field '{column}' changed type; convert without --keep-extra"


def check_mapping(mapping: Mapping[str, str], prompt_field: str | None, response_field: str | None) -> None:
    unknown = [c for c in mapping if c not in S.BY_NAME]
    if unknown:
        raise RolloutError(f"--map {unknown[0]}=...: '{unknown[0]}' is not a schema column; "
                           f"use one of {', '.join(S.BY_NAME)}")
    empty = [c for c, f in mapping.items() if not f]
    if empty:
        raise RolloutError(f"--map {empty[0]}=: name the source field after '='")
    if bool(prompt_field) != bool(response_field):
        raise RolloutError("pass both --prompt-field and --response-field (or neither)")
    if prompt_field and {"input_ids", "loss_mask"} & set(mapping):
        raise RolloutError("--prompt-field/--response-field build input_ids and loss_mask; "
                           "drop --map input_ids/loss_mask")
