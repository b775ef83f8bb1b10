"""Turn user path specs (files, folders, globs, lists of these) into a sorted file list.

Hugging Face datasets count as rollout archives too: a ``Dataset.save_to_disk`` folder, an
``hf:NAME[:SPLIT]`` spec (``datasets.load_dataset`` from the local cache; set
``HF_DATASETS_OFFLINE=1`` where there is no network) and, from Python, a ``datasets.Dataset``
itself. Each resolves to its Arrow files, which the reader memory-maps (zero-copy).
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Iterable

from .errors import RolloutError, require

PARQUET_SUFFIXES = (".parquet", ".pq")
_GLOB_CHARS = set("*?[")
BUILTIN_SAMPLE = "builtin:sample"
"""Path spec for the bundled sample archive (works from any working directory)."""


def _is_glob(s: str) -> bool:
    return any(ch in s for ch in _GLOB_CHARS)


def resolve(specs: str | os.PathLike | Iterable[str | os.PathLike],
            suffixes: tuple[str, ...] = PARQUET_SUFFIXES) -> list[Path]:
    """Expand ``specs`` into an ordered, de-duplicated list of data files.

    - a file is taken as is (whatever its suffix);
    - a folder is searched recursively for files ending in ``suffixes`` (hidden files and
      in-progress ``*.tmp`` files are skipped);
    - a glob (``*``, ``?``, ``[...]``, ``**``) is expanded; folders it matches are searched.

    - ``builtin:sample`` is the bundled sample archive.

    Order is sorted within each spec and follows the spec order across specs, so the same
    arguments always give the same list. A spec matching nothing is an error.
    """
    if isinstance(specs, (str, os.PathLike)) or _is_dataset(specs):
        specs = [specs]
    out: list[Path] = []
    seen: set[Path] = set()
    for spec in specs:
        if _is_dataset(spec) or (isinstance(spec, str) and spec.startswith(HF_PREFIX)):
            found = dataset_files(spec)
            out += [f for f in found if f.resolve() not in seen]
            seen.update(f.resolve() for f in found)
            continue
        s = os.fspath(spec)
        if not s:
            raise RolloutError("empty path given for rollouts; pass a file, folder or glob")
        if s == BUILTIN_SAMPLE:
            s = str(Path(__file__).parent / "sample")
        if _is_glob(s):
            matches = [Path(m) for m in sorted(glob.glob(os.path.expanduser(s), recursive=True))]
            if not matches:
                raise RolloutError(f"{s}: the pattern matches no file; check the path and quote the glob")
        else:
            p = Path(s).expanduser()
            if not p.exists():  # a relative path from a config file is read from the current folder: say which
                where = "" if p.is_absolute() else f" (relative to the current folder, {os.getcwd()})"
                raise RolloutError(f"{s}: no such file or folder{where}; check the path")
            matches = [p]
        found: list[Path] = []
        for m in matches:
            if m.is_dir() and (saved := saved_dataset_files(m)) is not None:
                found += saved
            elif m.is_dir():
                found += _walk(m, suffixes)
            elif m.is_file() and not m.name.endswith(".tmp"):
                found.append(m)
        if not found:
            what = "rollout shards" if suffixes == PARQUET_SUFFIXES else f"the {'/'.join(suffixes)} files to read"
            raise RolloutError(f"{s}: holds no {'/'.join(suffixes)} files; point at {what}")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def archive_folder(spec) -> Path | None:
    """The folder whose ``_rollouts.json`` describes a rollout spec: the folder itself, a
    file's folder, a glob's fixed leading folder, the bundled sample's; None for datasets."""
    if not isinstance(spec, (str, os.PathLike)):
        return None
    s = os.fspath(spec)
    if s.startswith(HF_PREFIX):
        return None
    if s == BUILTIN_SAMPLE:
        return Path(__file__).parent / "sample"
    p = Path(s).expanduser()
    if _is_glob(s):
        fixed = [part for part in p.parts[:next(i for i, part in enumerate(p.parts) if _is_glob(part))]]
        return Path(*fixed) if fixed else Path(".")
    return p if p.is_dir() else p.parent


HF_PREFIX = "hf:"


def saved_dataset_files(folder: Path) -> list[Path] | None:
    """The Arrow files of a ``Dataset.save_to_disk`` folder (from its state.json), or None."""
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise RolloutError(f"{folder}: a saved DatasetDict; pass one split's folder, e.g. "
                           f"{folder / (splits[0] if splits else 'train')}")
    if not ((folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()):
        return None
    try:
        files = [folder / f["filename"] for f in json.loads((folder / "state.json").read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RolloutError(f"{folder}: state.json of a saved dataset is unreadable ({e}); save it again") from None
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise RolloutError(f"{folder}: saved dataset without {missing[0].name}; copy the whole folder again")
    return files


def _is_dataset(obj) -> bool:
    return type(obj).__name__ == "Dataset" and type(obj).__module__.startswith("datasets")


def dataset_files(spec) -> list[Path]:
    """Arrow files behind a ``datasets.Dataset`` or an ``hf:NAME[:SPLIT]`` spec (default split
    ``train``, loaded from the local datasets cache)."""
    if isinstance(spec, str):
        datasets = require("datasets", f"the rollout source {spec!r}")
        name, _, split = spec[len(HF_PREFIX):].partition(":")
        try:
            spec = datasets.load_dataset(name, split=split or "train")
        except Exception as e:  # datasets raises assorted errors (not cached, offline, no such split)
            raise RolloutError(f"{spec}: cannot load it from the datasets cache ({str(e).splitlines()[0][:200]}); "
                               "download it once with network, or save it with Dataset.save_to_disk and pass "
                               "that folder") from None
    if getattr(spec, "_indices", None) is not None:
        raise RolloutError("the datasets.Dataset has an indices mapping (select/shuffle/filter): its Arrow files hold "
                           "other rows; call .flatten_indices() first")
    files = [Path(f["filename"]) for f in spec.cache_files]
    if not files:
        raise RolloutError("the datasets.Dataset lives in memory only (no Arrow files to map); save it with "
                           ".save_to_disk(PATH) and pass PATH")
    return files


def _walk(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files += [Path(dirpath) / f for f in sorted(filenames)
                  if f.endswith(suffixes) and not f.startswith(".")]
    return files


def file_fingerprint(path: str | os.PathLike, limit: int = 16 << 20, samples: int = 32, block: int = 4096) -> str:
    """A cheap content fingerprint: sha256 of the size, the parquet footer (row groups,
    offsets, sizes and statistics; the last 64 KiB for other files) and ``samples`` blocks of
    ``block`` bytes spread evenly over the data pages. Detects appended, rewritten and
    truncated shards and most in-place edits without reading whole archives (the data
    manifest also compares mtime). ``v2:``-prefixed; ``legacy_fingerprint`` is the footer-only
    version older manifests hold."""
    import hashlib

    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(p, "rb") as f:
        tail = _footer_bytes(f, size, limit)
        h.update(tail)
        body = size - len(tail)
        if body > 0:
            step = max(body // samples, 1)
            for off in range(0, body, step if body > samples * block else block):
                f.seek(off)
                h.update(f.read(min(block, body - off)))
    return "v2:" + h.hexdigest()[:32]


def legacy_fingerprint(path: str | os.PathLike, limit: int = 16 << 20) -> str:
    """The footer-only fingerprint of manifests written before ``v2:`` fingerprints."""
    import hashlib

    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(p, "rb") as f:
        h.update(_footer_bytes(f, size, limit))
    return h.hexdigest()[:32]


def _footer_bytes(f, size: int, limit: int) -> bytes:
    """The parquet footer (metadata + length + magic), or the last 64 KiB of another file."""
    tail = 64 << 10
    if size >= 12:
        f.seek(size - 8)
        end = f.read(8)
        if end[4:] == b"PAR1":
            tail = int.from_bytes(end[:4], "little") + 8
    tail = min(tail, size, limit)
    f.seek(size - tail)
    return f.read(tail)