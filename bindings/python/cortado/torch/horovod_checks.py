"""What Horovod's calls in cortado.torch share (horovod.py): the description
of a call that the workers exchange and compare before a name's first use,
the engine names of named and unnamed calls, and handles over several
engine operations."""

import threading
import zlib

import torch

from .. import _runtime
from .._runtime import Handle
from . import ops
from .horovod_basics import _OPS, _error
from .ops import DTYPES

# -- the call descriptions that workers compare ------------------------------

_KINDS = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
          "reducescatter", "broadcast_object", "allgather_object"]
_DTYPE_LIST = list(DTYPES) + [torch.bool]
_META = 32       # values per worker; alltoall appends size() splits
_MAX_DIMS = 23   # dimensions carried one by one; the shape's checksum covers the rest
_meta_lock = threading.Lock()


def _dtype_code(dtype):
    return _DTYPE_LIST.index(dtype) if dtype in _DTYPE_LIST else -1


def _describe(api, tensor, op=None, root=None, aux=0):
    """A call's description: [kind, op, dtype, root, ndim, aux, checksum, dims...]."""
    shape = tuple(tensor.shape)
    row = [_KINDS.index(api), -1 if op is None else int(op), _dtype_code(tensor.dtype),
           -1 if root is None else int(root), len(shape), int(aux),
           zlib.crc32(repr(shape).encode())]
    row += list(shape[:_MAX_DIMS])
    return row + [0] * (_META - len(row))


def _show(row):
    kind = _KINDS[row[0]] if 0 <= row[0] < len(_KINDS) else f"call {row[0]}"
    dtype = str(_DTYPE_LIST[row[2]]).replace("torch.", "") if 0 <= row[2] < len(_DTYPE_LIST) \
        else "?"
    ndim = row[4]
    dims = row[7:7 + min(ndim, _MAX_DIMS)]
    shape = "(" + ", ".join(str(d) for d in dims) + ("," if ndim == 1 else "") + \
        (", ..." if ndim > _MAX_DIMS else "") + ")"
    article = "an" if dtype.startswith("int") else "a"
    text = f"{kind} of {article} {dtype} tensor of shape {shape}"
    if row[1] >= 0:
        text += f" with op {_OPS[row[1]].op_name}" if row[1] in _OPS else f" with op {row[1]}"
    if row[3] >= 0:
        text += f" from root rank {row[3]}"
    return text


def _exchange(api, row, extra=()):
    """Every worker's `row` + `extra` (lists of ints), by rank: one push_pull
    (sum) of a buffer in which each worker fills its own slot."""
    rt = _runtime.require(api)
    length = _META + len(extra)
    buf = torch.zeros(rt.size, length, dtype=torch.int64)
    buf[rt.rank] = torch.tensor(list(row) + list(extra), dtype=torch.int64)
    with _meta_lock:  # one round of the key at a time
        _runtime.synchronize(ops.submit(api, buf, buf, False, f"cortado.hvd.meta.{length}", 0,
                                        None))
    return buf.tolist()


def _agree(api, name, rows, key):
    """Raises CortadoError (mismatch) on every worker unless key(row) is the
    same for every worker's row."""
    keys = [key(r) for r in rows]
    if all(k == keys[0] for k in keys):
        return
    groups = {}
    for r, (k, row) in enumerate(zip(keys, rows)):
        groups.setdefault(repr(k), (row, []))[1].append(r)
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {_show(row)}"
             for row, ranks in groups.values()]
    raise _error("mismatch",
                 f"cortado.torch.{api} of '{name}': the workers disagree: {'; '.join(parts)}")


def _same_call(row):
    return tuple(row[:_META])


# -- names --------------------------------------------------------------------

_declared_shapes = {}  # engine name -> the shape its first call had


def _engine_name(api, name, tensor, suffix=""):
    """(engine name, auto): a named call keeps one engine tensor per name,
    dtype and element count; an unnamed one gets a fresh name by call order."""
    if name is None:
        return _runtime.auto_name(f"hvd.{api}") + suffix, True
    if not isinstance(name, str):
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: name must be a string or None, got "
                     f"{type(name).__name__} {name!r}")
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"hvd.{api}.{name}.{dtype}.{tensor.numel()}{suffix}", False


def _first_use(api, ename, auto, tensor, row, key=_same_call, shown=None):
    """Before an engine name's first push_pull: the workers compare their
    calls. Later calls of a name check the shape here."""
    rt = _runtime.require(api)
    shape = tuple(tensor.shape)
    if not auto and rt.is_declared(ename):
        first = _declared_shapes.get(ename)
        if first is not None and first != shape:
            raise _error("invalid_argument",
                         f"cortado.torch.{api} of '{shown or ename}': shape {shape} differs "
                         f"from the shape {first} of this name's first call; use another name")
        return
    _agree(api, shown or ename, _exchange(api, row), key)
    _declared_shapes[ename] = shape


def _release_after(ename, auto):
    """For an unnamed call: its engine tensor is released once it completed."""
    if not auto:
        return lambda: None

    def release():
        rt = _runtime._ctx.runtime
        if rt is not None and rt.is_declared(ename):
            rt.release(ename)
    return release


class _All:
    """Waits for several engine handles (the core of one Horovod handle)."""

    __slots__ = ("handles",)

    def __init__(self, handles):
        self.handles = handles

    def poll(self):
        return all(h.poll() for h in self.handles)

    def wait(self, timeout=None):
        for h in self.handles:
            h.wait(timeout)


def _handle(name, handles, finish):
    return Handle(name, _All(handles), finish)
