"""torch.distributed.checkpoint folders read without running their code, and without knowing
their structure.

DCP stores ``.metadata`` with pickle and loads non-tensor entries with
``torch.load(weights_only=False)``: a planted folder could run code. ``dcp_load`` reads the
metadata with an unpickler that builds only DCP's own metadata classes (and the torch dtypes
and sizes they hold), and non-tensor entries with ``torch.load(weights_only=True)``; tensor
entries are already read with ``weights_only=True``. Used by resume, ``seed check``, ``export``.
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from rollouts.errors import first_line


class UntrustedContent(Exception):
    """A checkpoint file asks for something outside the allow-list (nothing was executed)."""


def _allowed_global(module: str, name: str):
    import pathlib

    import torch.distributed.checkpoint.filesystem as dcp_fs
    import torch.distributed.checkpoint.metadata as dcp_md

    if module == dcp_md.__name__:
        obj = getattr(dcp_md, name, None)
        if isinstance(obj, type):
            return obj
    if (module, name) == (dcp_fs.__name__, "_StorageInfo"):
        return dcp_fs._StorageInfo
    if module == "torch":
        obj = getattr(torch, name, None)
        if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
    if (module, name) == ("torch.serialization", "_get_layout"):
        from torch.serialization import _get_layout
        return _get_layout  # maps a layout name to a torch.layout
    if module == "pathlib" and name in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
        return getattr(pathlib, name)
    if (module, name) == ("collections", "OrderedDict"):
        import collections
        return collections.OrderedDict
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        obj = _allowed_global(module, name)
        if obj is None:
            raise UntrustedContent(f"DCP metadata refers to {module}.{name}, which is not part of a checkpoint")
        return obj


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            meta_path = Path(str(self.path)) / ".metadata"
            try:
                with open(meta_path, "rb") as f:
                    metadata = _MetadataUnpickler(f).load()
            except UntrustedContent:
                raise
            except Exception as e:  # a truncated or foreign file
                raise UntrustedContent(f"unreadable DCP metadata ({type(e).__name__}: {e})") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = getattr(self, "load_id", None)
            return metadata

    return SafeFileSystemReader(str(path))


def _safe_planner():
    import io

    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            """DefaultLoadPlanner.load_bytes with ``weights_only=True``: plain data only."""
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as e:
                raise UntrustedContent(f"a non-tensor entry is not plain data ({first_line(e)})") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner()


def dcp_metadata(path: Path):
    """The ``Metadata`` of a DCP folder, read without running code."""
    return _safe_reader(path).read_metadata()


def dcp_load(state: dict, path: Path) -> None:
    """``dcp.load(state)`` from ``path``, with the safe reader and planner."""
    reader = _safe_reader(path)
    reader.read_metadata()  # refuse a foreign .metadata here, before DCP wraps the error per rank
    with single_process_ok():
        try:
            dcp.load(state, storage_reader=reader, planner=_safe_planner(), no_dist=not distributed())
        except dcp.api.CheckpointException as e:
            ours = [line for line in str(e).splitlines() if "not plain data" in line or "not part of" in line]
            if ours:
                raise UntrustedContent(ours[0].split("AssertionError: ")[-1].strip()) from None
            raise






@contextlib.contextmanager
def single_process_ok():
    """DCP warns on every single-process save/load, which is our normal case: silence that one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def distributed() -> bool:
    """Whether a process group is up (DCP then coordinates all ranks)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


# ---------------------------------------------------------------------------------------------
# Reading a folder of unknown structure

def read_dcp(path: Path, *, tensors: bool) -> dict:
    """Load a torch.distributed.checkpoint folder without knowing its structure.

    Builds the nested state dict from the checkpoint's own metadata (``planner_data`` holds
    each entry's path) and loads into it with the public ``dcp.load``. ``tensors=False``
    reads only the non-tensor entries (param groups, scheduler): cheap for any model size.
    """
    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    md = dcp_metadata(path)  # no pickle code runs
    state: dict = {}
    for key, meta in md.state_dict_metadata.items():
        where = (md.planner_data or {}).get(key, (key,))
        if isinstance(meta, BytesStorageMetadata):
            _put(state, where, None)
        elif tensors and isinstance(meta, TensorStorageMetadata):
            _put(state, where, torch.empty(meta.size, dtype=meta.properties.dtype))
    dcp_load(state, path)
    return state


def _put(root: dict, path: tuple, value) -> None:
    """Set ``root[path[0]][path[1]]... = value``, creating dicts (or lists for int keys)."""
    node: Any = root
    for key, nxt in zip(path, path[1:]):
        child = [] if isinstance(nxt, int) else {}
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            node[key] = node[key] if node[key] is not None else child
            node = node[key]
        else:
            node = node.setdefault(key, child)
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


def scheduler_class(sched: dict) -> str:
    """Name the LR scheduler class a state dict came from (its keys are class-specific)."""
    if "_schedulers" in sched:
        inner = "+".join(scheduler_class(s) for s in sched["_schedulers"] if isinstance(s, dict))
        return f"SequentialLR[{inner}]" if inner else "SequentialLR"
    if "lr_lambdas" in sched:
        return "LambdaLR"
    if {"factor", "total_iters"} <= sched.keys():
        return "ConstantLR"
    return "unknown"


