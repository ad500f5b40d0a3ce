"""Cortado for Python: sum NumPy arrays across the workers of a Cortado job.

    import numpy as np, cortado
    cortado.init()                       # in a process started by `cortado launch`
    total = cortado.push_pull(np.ones(4, np.float32), name="x", average=False)
    cortado.shutdown()

`cortado.torch` has the PyTorch API (push_pull on tensors, broadcast_parameters,
DistributedOptimizer). Every worker must push_pull the same names, with the
same dtype and element count; the first push_pull of a name declares it (a
collective step: every worker must reach it). Blocking calls release the GIL.
Errors raise `cortado.CortadoError`, whose `code` says what kind.
"""

import numpy as _np

from . import _C
from ._runtime import (CortadoError, Handle, barrier, init, is_initialized, local_rank,
                       local_size, num_servers, poll, pulled_bytes, pushed_bytes, rank, shutdown,
                       size, synchronize)
from . import _runtime
from .compression import AutoCompression, Compression, Compressor

__version__ = _C.version

__all__ = [
    "CortadoError", "Compression", "Compressor", "Handle", "init", "shutdown", "is_initialized",
    "rank", "size", "local_rank", "local_size", "num_servers", "barrier", "declare",
    "push_pull", "push_pull_async", "broadcast", "broadcast_async", "poll", "synchronize",
    "release", "pushed_bytes", "pulled_bytes",
]

_DTYPES = {
    _np.dtype(_np.float32): "float32",
    _np.dtype(_np.float64): "float64",
    _np.dtype(_np.float16): "float16",
    _np.dtype(_np.int32): "int32",
    _np.dtype(_np.int64): "int64",
    _np.dtype(_np.uint8): "uint8",
    _np.dtype(_np.int8): "int8",
}


def _check_array(array, api, what="array"):
    if not isinstance(array, _np.ndarray):
        raise _runtime.error("invalid_argument",
                             f"cortado.{api}: expected a numpy.ndarray, got {type(array).__name__}")
    if array.dtype not in _DTYPES:
        raise _runtime.error("invalid_argument",
                             f"cortado.{api}: {what} has dtype {array.dtype}, which Cortado does "
                             f"not sum; supported: {', '.join(sorted(_DTYPES.values()))}")
    if not array.flags.c_contiguous:
        raise _runtime.error("invalid_argument",
                             f"cortado.{api}: {what} is not C-contiguous (strides "
                             f"{array.strides}); pass numpy.ascontiguousarray(...)")


def release(name):
    """Done with a tensor: call it after its last push_pull completed (every worker
    that pushes it should). The servers free its state once every worker released
    it; a later push_pull of the name raises CortadoError (invalid_argument) until
    the name is declared again (declare), which makes a new tensor."""
    _runtime.require("release").release(name)


def declare(name, dtype, count):
    """Declares a tensor ahead of its first push_pull (optional; every worker must
    declare the same name with the same dtype and element count). After
    release(name), declaring the name again (on every worker) makes a new tensor,
    of any dtype and count."""
    rt = _runtime.require("declare")
    return _runtime.declare(rt, name, _DTYPES.get(_np.dtype(dtype), str(dtype)), int(count))


def push_pull_async(array, name=None, average=True, priority=0, output=None,
                    compression=None):
    """Starts summing (or, with average=True, averaging) `array` across workers.

    Returns a Handle; `synchronize(handle)` returns the result, written into
    `output` (a new array when None; `output=array` works in place). `array`
    and `output` must stay untouched until then. Higher `priority` goes first.
    """
    compressor = Compression.lookup(compression)
    rt = _runtime.require("push_pull")
    _check_array(array, "push_pull")
    if name is not None and not isinstance(name, str):
        raise _runtime.error("invalid_argument",
                             f"cortado.push_pull: name must be a string or None, got "
                             f"{type(name).__name__} {name!r} (the order is array, name, "
                             f"average, priority; pass average=... by keyword)")
    if output is None:
        output = _np.empty_like(array, order="C")
    else:
        _check_array(output, "push_pull", "output")
        if output.dtype != array.dtype or output.size != array.size:
            raise _runtime.error("invalid_argument",
                                 f"cortado.push_pull: output ({output.dtype}, {output.size} "
                                 f"elements) does not match the input ({array.dtype}, "
                                 f"{array.size} elements)")
        if not output.flags.writeable:
            raise _runtime.error("invalid_argument", "cortado.push_pull: output is read-only")
    name = name if name is not None else _runtime.auto_name("push_pull")
    if isinstance(compressor, AutoCompression):
        compressor = _runtime.auto_choice(name, lambda: compressor.plan(
            [(name, array.size, array.itemsize)], rt.size)[name])
    sent, ctx = compressor.compress(array)
    if sent is array:
        inp, out = array, output
        finish = lambda: output  # noqa: E731
    else:
        inp = out = sent

        def finish():
            output[...] = compressor.decompress(out, ctx).reshape(output.shape)
            return output
    return _runtime.submit("push_pull", name, _DTYPES[inp.dtype], inp.size, inp.ctypes.data,
                           out.ctypes.data, average, priority, (inp, out, array, output), finish,
                           compressor.engine_codec)


def push_pull(array, name=None, average=True, priority=0, output=None, compression=None):
    """Sums (or averages) `array` across workers and returns the result."""
    return synchronize(push_pull_async(array, name, average, priority, output, compression))


def broadcast_async(array, root_rank, name=None, inplace=False):
    """Starts sending root_rank's `array` to every worker.

    Implemented as a sum in which the other workers contribute zeros, so it is
    exact for every dtype. The result is a new array, or `array` itself with
    inplace=True.
    """
    rt = _runtime.require("broadcast")
    _check_array(array, "broadcast")
    if not 0 <= root_rank < rt.size:
        raise _runtime.error("invalid_argument",
                             f"cortado.broadcast: root_rank {root_rank} is out of range for "
                             f"{rt.size} workers")
    source = array if rt.rank == root_rank else _np.zeros_like(array, order="C")
    output = array if inplace else _np.empty_like(array, order="C")
    name = name if name is not None else _runtime.auto_name("broadcast")
    return push_pull_async(source, name=name, average=False, output=output)


def broadcast(array, root_rank, name=None, inplace=False):
    """Returns root_rank's `array` on every worker (see broadcast_async)."""
    return synchronize(broadcast_async(array, root_rank, name, inplace))
