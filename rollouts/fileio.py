"""Files on disk, written one way everywhere (torch-free: the data layer and the trainer use it).

- ``write_text`` / ``write_json``: a temporary file beside the target, fsync, ``os.replace``:
  a reader, or a crash, sees the old file or the new one, never half of one.
- ``dumps``: JSON with NaN and infinities as ``null`` (``json.dumps`` writes ``NaN``, which is
  not JSON), numpy scalars as numbers and paths as strings.
- ``replace_dir`` / ``staged_dir``: build a folder under a temporary name and put it in place
  by rename; an existing folder is renamed aside first and removed only after the new one is in.
- ``publish_files``: move staged files into a folder that may hold other things, after
  removing the files they replace (rollout shards: ``convert``, ``synth``).
- ``fsync_tree`` / ``fsync_dir``: make a finished folder durable before a rename publishes it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Iterator


def plain(obj: Any) -> Any:
    """A JSON-ready copy: non-finite floats -> None, numpy scalars -> Python numbers."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, str) else k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and hasattr(obj, "dtype") and getattr(obj, "ndim", 1) == 0:  # numpy / torch scalar
        return plain(obj.item())
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def dumps(obj: Any, **kwargs) -> str:
    """JSON text of ``obj`` with NaN / inf as null (``kwargs`` go to ``json.dumps``)."""
    return json.dumps(plain(obj), allow_nan=False, **kwargs)


def read_json(path: str | os.PathLike) -> dict | None:
    """A JSON object from ``path``, or None when the file is missing, unreadable or not an object."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def file_checksum(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    """xxh3-128 of the file's bytes (no fallback hash: a digest that differs by machine would
    call a sound file corrupted): checkpoints and the prepared data store."""
    import xxhash  # a dependency of critic-pretrain

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` atomically with ``text`` (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: str | os.PathLike, obj: Any, *, sort_keys: bool = False) -> None:
    """``write_text`` of ``dumps(obj)``, indented, with a final newline."""
    write_text(path, dumps(obj, indent=2, sort_keys=sort_keys) + "\n")


def fsync_dir(d: str | os.PathLike) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and folder under ``root`` (a node crash must not publish holes)."""
    root = Path(root)
    for f in root.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    for d in [root, *[d for d in root.rglob("*") if d.is_dir()]]:
        fsync_dir(d)


def umask_modes(root: str | os.PathLike) -> None:
    """Give every file under ``root`` the mode a plain ``open`` would (0666 less the umask).
    safetensors 0.8 writes 0600 files (an atomic temp file), so a checkpoint's weights were
    private while its JSON next to them was not: a PPO job run by a teammate could read the
    manifest and not the critic."""
    mask = os.umask(0)
    os.umask(mask)  # read back: there is no os.getumask before Python 3.13
    mode = 0o666 & ~mask
    for f in Path(root).rglob("*"):
        if f.is_file() and not f.is_symlink() and (f.stat().st_mode & 0o777) != mode:
            f.chmod(mode)


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike, old: str | os.PathLike | None = None) -> None:
    """Put the finished folder ``tmp`` at ``final`` by rename, its files readable as the umask
    allows (``umask_modes``). An existing ``final`` is first renamed to ``old`` (default
    ``.<name>.old``), never deleted before the new one is in place."""
    tmp, final = Path(tmp), Path(final)
    umask_modes(tmp)
    if final.exists():
        old = Path(old) if old is not None else final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Build a folder under ``.<name>.tmp`` beside ``final``; on success it replaces ``final``
    (``replace_dir``), on any error it is removed and ``final`` is left as it was."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, final)


def publish_files(staged: list[Path], out: str | os.PathLike, replaced: list[Path] = ()) -> list[Path]:
    """Remove ``replaced``, then move each staged file into ``out`` by rename (same file
    system: the staging folder lives inside ``out``). Returns the published paths."""
    out = Path(out)
    for path in replaced:
        path.unlink()
    published = []
    for path in staged:
        target = out / Path(path).name
        os.replace(path, target)
        published.append(target)
    return published
