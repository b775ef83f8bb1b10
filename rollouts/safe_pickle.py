"""Pickled dumps of other frameworks, read without running their code: an allow-list unpickler.

slime saves its rollouts with ``torch.save`` and verl pickles its ``DataProto`` batches. Both
formats can name any Python callable, and a plain ``pickle.load`` (or ``torch.load`` with
``weights_only=False``, which both frameworks use to read their own dumps) calls it: a planted
``__reduce__`` runs ``os.system``. Here every global a pickle names is looked up in an allow-list
before anything is called; any other one stops the load with ``UnsafePickle`` (one line naming
the global), so nothing from the file runs.

What is allowed: containers (``collections.OrderedDict``, sets, ``bytes`` from protocol 2),
numpy's array and scalar constructors (the values of verl's ``non_tensor_batch``), torch's tensor
rebuild functions and storage types, ``torch.Size``, dtypes and devices. Tensors come back as
numpy arrays (``bfloat16`` widened to ``float32``), so this module needs no torch and the data
layer stays torch-free. Callers add the classes of their peer, mapped to stand-ins of their own
(``Stand``: an object that only keeps the state it is given); the peer's module is never imported.

``load_pickle`` reads a plain pickle, ``load_torch`` a ``torch.save`` zip archive (the format
torch writes since 1.6: ``<name>/data.pkl`` plus one ``<name>/data/<key>`` file per storage).
"""

from __future__ import annotations

import codecs
import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np


class UnsafePickle(ValueError):
    """The file names a global outside the allow-list (nothing was called), or is not a pickle."""


class Stand:
    """Stand-in for a peer's class: keeps what the pickle gives it, runs nothing.

    ``peer`` names the class it stands for (``verl.protocol.DataProto``)."""

    peer = ""
    args: tuple = ()
    kwargs: dict = {}
    state: Any = None
    """What the pickle's BUILD gave (None when it gave nothing)."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


def stand_in(peer: str) -> type[Stand]:
    """A fresh ``Stand`` subclass for the class named ``peer`` (``module.Class``)."""
    return type(peer.rpartition(".")[2], (Stand,), {"peer": peer})


# ---------------------------------------------------------------------------------------------
# torch: storages and tensors, as numpy

TORCH_STORAGE_DTYPES = {
    "ByteStorage": np.uint8, "CharStorage": np.int8, "ShortStorage": np.int16, "IntStorage": np.int32,
    "LongStorage": np.int64, "HalfStorage": np.float16, "FloatStorage": np.float32, "DoubleStorage": np.float64,
    "BoolStorage": np.bool_, "BFloat16Storage": "bfloat16", "ComplexFloatStorage": np.complex64,
    "ComplexDoubleStorage": np.complex128, "UntypedStorage": np.uint8,
}
"""``torch.<X>Storage`` (as ``torch.save`` names a tensor's storage) -> the numpy dtype of its items."""

TORCH_DTYPES = {
    "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "float16": np.float16,
    "float32": np.float32, "float64": np.float64, "bool": np.bool_, "bfloat16": "bfloat16",
    "complex64": np.complex64, "complex128": np.complex128,
}
"""``torch.<dtype>`` names -> numpy dtypes (``bfloat16``: read as uint16 and widened)."""
TORCH_DTYPE_ALIASES = {"long": "int64", "int": "int32", "short": "int16", "half": "float16", "float": "float32",
                       "double": "float64"}


class TorchDType(str):
    """``torch.float32`` and friends, as their name (``"float32"``)."""


class _StorageType:
    def __init__(self, name: str):
        self.name = name


def numpy_dtype(name: str) -> Any:
    """The numpy dtype of a torch dtype name (``"torch.int64"`` or ``"int64"``)."""
    name = name.removeprefix("torch.")
    name = TORCH_DTYPE_ALIASES.get(name, name)
    if name not in TORCH_DTYPES:
        raise UnsafePickle(f"a tensor of dtype {name}, which a rollout dump does not hold")
    return TORCH_DTYPES[name]


def view_bytes(raw: np.ndarray, dtype: Any) -> np.ndarray:
    """``raw`` (uint8, little-endian) as ``dtype``; bfloat16 becomes float32 (exact)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if isinstance(dtype, str) and dtype == "bfloat16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    return raw.view(np.dtype(dtype).newbyteorder("<")).astype(np.dtype(dtype))


def _strided(storage: np.ndarray, offset: int, size, stride) -> np.ndarray:
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    need = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else offset
    if offset < 0 or any(s < 0 for s in stride) or need > len(storage):
        raise UnsafePickle("a tensor reaches past the end of its storage: the file is damaged")
    flat = storage[offset:]
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape=size, strides=[s * item for s in stride]).copy()


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    if not isinstance(storage, np.ndarray):
        raise UnsafePickle("a tensor without its storage: not a torch.save archive")
    return _strided(storage, int(storage_offset), size, stride)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None):
    if not isinstance(storage, np.ndarray):
        raise UnsafePickle("a tensor without its storage: not a torch.save archive")
    return _strided(view_bytes(storage, numpy_dtype(str(dtype))), int(storage_offset), size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


def _torch_size(*args):
    return tuple(*args)


def _torch_globals() -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch", "Size"): _torch_size,
        ("torch", "device"): lambda *args: ":".join(str(a) for a in args),
    }
    for name in TORCH_STORAGE_DTYPES:
        out[("torch", name)] = _StorageType(name)
        out[("torch.storage", name)] = _StorageType(name)
    for name in [*TORCH_DTYPES, *TORCH_DTYPE_ALIASES]:
        out[("torch", name)] = TorchDType(name)
    return out


# ---------------------------------------------------------------------------------------------
# numpy and the builtins a pickle of plain data uses

def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode``, as protocol 2 pickles ``bytes`` (latin-1 only: no other codec runs)."""
    if encoding.replace("-", "").replace("_", "").lower() not in ("latin1", "iso88591"):
        raise UnsafePickle(f"_codecs.encode with the {encoding!r} codec, which plain bytes never use")
    return codecs.encode(text, "latin1")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric
    out: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for core in ("numpy.core", "numpy._core"):  # numpy 1 writes the first, numpy 2 the second
        out[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        out[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        out[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "bool_"):
        out[("numpy", name)] = getattr(np, name)
    out[("numpy.dtypes", "ObjectDType")] = type(np.dtype(object))
    return out


BASE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "complex"): complex,
    ("builtins", "slice"): slice, ("builtins", "bytearray"): bytearray, ("builtins", "range"): range,
    ("_codecs", "encode"): _latin1,
    **_numpy_globals(),
    **_torch_globals(),
}
"""Globals any rollout dump may name: plain data only, nothing that imports, opens or executes."""


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, allowed: Mapping[tuple[str, str], Any],
                 persistent: Callable[[Any], Any] | None):
        super().__init__(f)
        self._allowed = allowed
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise UnsafePickle(f"the pickle calls {module}.{name}, which a rollout dump never holds (a planted "
                               "__reduce__?); refused before anything ran") from None

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise UnsafePickle("the pickle refers to external storage, which a plain pickle does not")
        return self._persistent(pid)


def load_pickle(data: bytes | io.IOBase, allowed: Mapping[tuple[str, str], Any] | None = None) -> Any:
    """Unpickle ``data`` allowing ``BASE_GLOBALS`` plus ``allowed``; ``UnsafePickle`` otherwise."""
    f = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    return _load(f, {**BASE_GLOBALS, **(allowed or {})}, None)


def _load(f, allowed, persistent) -> Any:
    try:
        return _Unpickler(f, allowed, persistent).load()
    except UnsafePickle:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            OverflowError, MemoryError, RecursionError) as e:
        raise UnsafePickle(f"not a readable pickle ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None


def is_torch_archive(head: bytes) -> bool:
    """Whether bytes (the first few of a file) start a zip archive, as ``torch.save`` writes."""
    return head[:4] == b"PK\x03\x04"


def load_torch(source: bytes | str | Path, allowed: Mapping[tuple[str, str], Any] | None = None) -> Any:
    """Read a ``torch.save`` zip archive (a path or its bytes) like ``torch.load(weights_only=True)``
    would, but with tensors as numpy arrays; ``UnsafePickle`` for anything else."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source)
    except (zipfile.BadZipFile, OSError) as e:
        raise UnsafePickle(f"not a torch.save archive ({' '.join(str(e).split())[:120]}): torch < 1.6 and "
                           "_use_new_zipfile_serialization=False write another format, which is not read") from None
    with zf:
        pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise UnsafePickle("a zip file without the data.pkl of a torch.save archive")
        prefix = pkl[0][: -len("data.pkl")]
        names = set(zf.namelist())
        order = zf.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
        if order != "little":
            raise UnsafePickle(f"a torch archive written on a {order}-endian machine, which is not read")
        storages: dict[str, np.ndarray] = {}

        def storage(pid: Any) -> np.ndarray:
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                    and isinstance(pid[1], _StorageType)):
                raise UnsafePickle(f"a persistent id {str(pid)[:60]} that is not a torch storage")
            _, kind, key, _location, _numel = pid
            if key not in storages:
                try:
                    raw = np.frombuffer(zf.read(f"{prefix}data/{key}"), dtype=np.uint8)
                except KeyError:
                    raise UnsafePickle(f"storage {key} is missing from the archive: the file is damaged") from None
                storages[key] = view_bytes(raw, TORCH_STORAGE_DTYPES[kind.name])
            return storages[key]

        return _load(io.BytesIO(zf.read(pkl[0])), {**BASE_GLOBALS, **(allowed or {})}, storage)
