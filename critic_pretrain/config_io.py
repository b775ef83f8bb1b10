"""Loading run configs: YAML files (or a bundled config by name), dotted ``key=value`` overrides,
type coercion with a did-you-mean, and the reference text of every key.

    cfg = load_config("configs/demo.yaml", ["train.max_steps=50", "optim.lr=3e-4"])

``describe()`` turns the field docstrings into the reference printed by ``critic-pretrain train
--help-config`` and docs/config.md (``python -m critic_pretrain.config_io > docs/config.md``).
The resolved config is written into every run folder and checkpoint as ``config.yaml``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from .config import Config, check_values
from .errors import UserError, did_you_mean, yaml_problem


def bundled_configs() -> Path:
    """The shipped ``configs/`` folder: inside the installed package (a wheel carries it as
    ``critic_pretrain/configs``), or the checkout's own folder (an editable install)."""
    here = Path(__file__).resolve().parent
    return here / "configs" if (here / "configs").is_dir() else here.parent / "configs"


def find_config(path: str | os.PathLike) -> Path:
    """``path`` when it is a file; else the bundled config it names: ``demo``, ``qwen2.5-1.5b.yaml``,
    ``configs/demo.yaml`` run outside a checkout (a relative path, ``.yaml`` optional)."""
    p = Path(path)
    if p.is_file():
        return p
    rel = Path(*p.parts[1:]) if p.parts[:1] == ("configs",) else p
    if not p.is_absolute() and rel.parts:
        for shipped in (bundled_configs() / rel, bundled_configs() / rel.with_name(rel.name + ".yaml")):
            if shipped.is_file():
                return shipped
    raise UserError(f"{path}: config file not found; pass --config FILE.yaml or a bundled config "
                    f"({', '.join(bundled_config_names())})")


def bundled_config_names() -> list[str]:
    return sorted(q.stem for q in bundled_configs().glob("*.yaml"))


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: dict | None = None) -> Config:
    """Read a YAML file (a path, or the name of a bundled config: ``demo``) or start from
    defaults, apply ``key=value`` overrides, validate."""
    raw: dict = dict(base or {})
    if path is not None:
        raw = read_yaml_mapping(find_config(path), missing="config file not found", expected="a mapping of config keys")
    for item in overrides:
        apply_override(raw, item)
    cfg = _build(Config, raw, "")
    check_values(cfg)
    return cfg


def read_yaml_mapping(path: str | os.PathLike, *, missing: str, expected: str) -> dict:
    """A YAML file whose top level is a mapping, or a one-line ``UserError`` saying what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: {missing}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8 YAML") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({yaml_problem(e)}); fix the file") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected {expected} at the top level")
    return doc


def apply_override(raw: dict, item: str) -> None:
    """``a.b.c=value`` (value parsed as YAML: numbers, bools, lists, null)."""
    if "=" not in item:
        raise UserError(f"override {item!r} is not key=value; e.g. train.max_steps=100")
    key, _, text = item.partition("=")
    keys = key.strip().split(".")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    node = raw
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value


# Names other trainers use for our keys (HF TrainingArguments, NeMo-RL, verl): a spelling-based
# did-you-mean sent `optim.learning_rate` to `optim.min_lr`.
SYNONYMS = {"learning_rate": "lr", "min_learning_rate": "min_lr", "lr_min": "min_lr", "warmup": "warmup_steps",
            "num_warmup_steps": "warmup_steps", "steps": "max_steps", "total_steps": "max_steps",
            "num_steps": "max_steps", "gradient_accumulation_steps": "grad_accum", "max_grad_norm": "grad_clip",
            "clip_grad": "grad_clip", "save_steps": "save_every", "eval_steps": "every", "lambda": "lam",
            "gae_lambda": "lam", "discount": "gamma", "gae_gamma": "gamma", "lr_scheduler_type": "schedule"}


def _unknown_key(prefix: str, key: str, names: set[str]) -> str:
    """The one line for an unknown key: a known synonym first, else the closest spelling."""
    if SYNONYMS.get(key) in names:
        return f"unknown config key '{prefix}{key}'; did you mean '{prefix}{SYNONYMS[key]}'?"
    return f"unknown config key '{prefix}{key}'; {did_you_mean(f'{prefix}{key}', (prefix + n for n in names))}"


def _build(cls, raw: Any, prefix: str):
    if not isinstance(raw, dict):
        raise UserError(f"config key '{prefix.rstrip('.')}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in names:
            raise UserError(_unknown_key(prefix, k, names))
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            kwargs[f.name] = _build(t, raw[f.name] if raw[f.name] is not None else {}, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _coerce(raw[f.name], t, f"{prefix}{f.name}")
    return cls(**kwargs)


def _coerce(value: Any, t: Any, key: str) -> Any:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except UserError as e:
                errors.append(e)
        raise errors[0]
    if origin is Literal:
        if isinstance(value, bool):  # YAML 1.1 reads no/off as False and yes/on as True
            value = next((a for a in (("yes", "on", "true") if value else ("no", "off", "false")) if a in args), value)
        if value not in args:
            raise UserError(f"config key '{key}' is {value!r}; use one of: {', '.join(map(str, args))}")
        return value
    if dataclasses.is_dataclass(t):
        return _build(t, value if value is not None else {}, f"{key}.")
    if origin is list:
        if isinstance(value, (str, int, float)) and args and args[0] is str:
            value = [value]  # data.train=path is a one-item list
        if not isinstance(value, list):
            raise UserError(f"config key '{key}' must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict or t is dict:
        if not isinstance(value, dict):
            raise UserError(f"config key '{key}' must be a mapping, got {value!r}")
        return value
    if t is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"config key '{key}' must be true or false, got {value!r}")
    if t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"config key '{key}' must be an integer, got {value!r}")
    if t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"config key '{key}' must be a number, got {value!r}")
    if t is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise UserError(f"config key '{key}' must be a string, got {value!r}")
    if t is Any:
        return value
    raise TypeError(f"unsupported config type {t} for {key}")


# ---------------------------------------------------------------------------------------------
# Reference text from the field docstrings

def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal under each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe(cls=Config, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, str]]:
    """(key, default, doc) for every leaf config key."""
    defaults = defaults if defaults is not None else cls()
    docs = field_docs(cls)
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(defaults, f.name)
        item = (typing.get_args(hints[f.name]) or [None])[0]
        if dataclasses.is_dataclass(value):
            rows += describe(type(value), f"{prefix}{f.name}.", value)
        elif typing.get_origin(hints[f.name]) is list and dataclasses.is_dataclass(item):
            rows.append((f"{prefix}{f.name}", "[]", docs.get(f.name, "")))
            rows += describe(item, f"{prefix}{f.name}[].", item())
        else:
            rows.append((f"{prefix}{f.name}", yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("..."
                                                                                                              ).strip(),
                         docs.get(f.name, "")))
    return rows


def reference_markdown() -> str:
    """docs/config.md: every key, its default and its docstring (kept in sync by a test)."""
    lines = ["# Run configuration reference", "",
             "Generated from the dataclasses in `critic_pretrain/config.py` "
             "(`python -m critic_pretrain.config_io > docs/config.md`). Set keys in a YAML file "
             "(`--config configs/x.yaml`) or as dotted overrides (`optim.lr=1e-5`)."]
    section = None
    for key, default, doc in describe():
        head = key.split(".")[0] if "." in key else "top level"
        if head != section:
            section = head
            lines += ["", f"## {section}", "", "| key | default | meaning |", "|---|---|---|"]
        lines.append(f"| `{key}` | `{default}` | {doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
