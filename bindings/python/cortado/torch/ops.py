"""Tensor operations of cortado.torch: push_pull, broadcast, broadcast_parameters.

A tensor reaches the engine as (data_ptr(), numel(), dtype), so it must be a
contiguous tensor of a supported dtype; check_tensor() raises CortadoError
before any data moves otherwise. The tensors stay referenced (by the core)
until their operation completes.

CUDA tensors travel as BytePS moves them to its CPU servers: copied into a
pinned host buffer (one per tensor name, kept for the next iteration) after
the work queued on the tensor's current stream, summed there like a CPU
tensor, and copied back into the CUDA output when the caller synchronizes.
The caller does not wait for the copy: a stager thread waits for its CUDA
event and then starts the push_pull, so a gradient hook returns at once and
backward keeps the GPU busy.
"""

import queue
import threading

import torch

from .. import _runtime
from .._runtime import Handle, synchronize
from ..compression import AutoCompression, Compression

DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.int8: "int8",
}


def check_tensor(tensor, api, what="tensor"):
    """Raises CortadoError unless `tensor` is something the engine can sum."""
    if not isinstance(tensor, torch.Tensor):
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: expected a torch.Tensor, got "
                             f"{type(tensor).__name__}")
    device = tensor.device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise _runtime.error(
                "invalid_argument",
                f"cortado.torch.{api}: {what} is on {device}, but this process's torch "
                f"reports no usable CUDA (torch.cuda.is_available() is False)")
    elif device.type != "cpu":
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: {what} is on device '{device}'; Cortado "
                             f"sums CPU and CUDA tensors")
    if tensor.layout != torch.strided:
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: {what} has layout {tensor.layout}; Cortado "
                             f"sums dense (strided) tensors")
    if tensor.dtype not in DTYPES:
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: {what} has dtype {tensor.dtype}, which "
                             f"Cortado does not sum; supported: "
                             f"{', '.join(str(d) for d in DTYPES)}")
    if not tensor.is_contiguous():
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: {what} is not contiguous (shape "
                             f"{tuple(tensor.shape)}, strides {tensor.stride()}); pass "
                             f"tensor.contiguous()")


# Pinned host buffers of CUDA tensors, by tensor name: a gradient's buffer is
# reused every iteration (allocating pinned memory costs more than the copy).
# One-off operations (broadcasts) take a buffer that is not kept.
_staging = {}


def _host_buffer(api, name, tensor):
    if api.startswith("broadcast"):
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    buf = _staging.get(name)
    if buf is None or buf.dtype != tensor.dtype or buf.shape != tensor.shape:
        buf = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        _staging[name] = buf
    return buf


class _Staged:
    """A push_pull whose start waits for a device-to-host copy: what Handle
    polls and waits on until the stager thread has started it."""

    __slots__ = ("_started", "_handle", "_error", "_keep")

    def __init__(self, keep):
        self._started = threading.Event()
        self._handle = None
        self._error = None
        self._keep = keep  # the CUDA tensor, until its copy has completed

    def poll(self):
        if not self._started.is_set():
            return False
        return self._error is not None or self._handle.poll()

    def wait(self, timeout=None):
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self._handle.wait(timeout)


class _Stager:
    """One thread per process, started at the first CUDA tensor: waits for
    each copy's event (torch releases the GIL meanwhile) and starts its
    push_pull, in the order the calls were made."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="cortado-cuda-stager", daemon=True).start()

    def start(self, event, staged, begin):
        self._queue.put((event, staged, begin))

    def _run(self):
        while True:
            event, staged, begin = self._queue.get()
            try:
                event.synchronize()
                staged._handle = begin()
            except Exception as e:  # reported by wait(), on the caller's thread
                staged._error = e
            staged._keep = None
            staged._started.set()


_stager = None
_stager_lock = threading.Lock()


def _start_after(event, keep, begin):
    global _stager
    with _stager_lock:
        if _stager is None:
            _stager = _Stager()
    staged = _Staged(keep)
    _stager.start(event, staged, begin)
    return staged


def _submit_cuda(api, tensor, output, average, name, priority, compression):
    """push_pull of a CUDA tensor through a pinned host buffer (see the module
    docstring); the result lands in `output` (a new CUDA tensor when None)."""
    if output is None:
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    name = name if name is not None else _runtime.auto_name("push_pull")
    host = _host_buffer(api, name, tensor)
    stream = torch.cuda.current_stream(tensor.device)
    with torch.no_grad():
        host.copy_(tensor.detach(), non_blocking=True)
    # The copy is queued on the tensor's current stream, after the kernels
    # that produced the tensor; the push_pull starts once it has completed.
    copied = torch.cuda.Event()
    copied.record(stream)
    staged = _start_after(copied, tensor, lambda: submit(api, host, host, average, name, priority,
                                                         compression))

    def finish():
        result = staged.wait()
        with torch.no_grad():
            output.copy_(result)
        return output
    return Handle(name, staged, finish)


def submit(api, tensor, output, average, name, priority, compression):
    """Checks, compresses and starts one push_pull of `tensor` into `output`
    (None: a new tensor; `tensor` itself: in place)."""
    compressor = Compression.lookup(compression)
    rt = _runtime.require(api)
    check_tensor(tensor, api)
    if name is not None and not isinstance(name, str):
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: name must be a string or None, got "
                             f"{type(name).__name__} {name!r} (the order is tensor, name, "
                             f"average, priority; pass average=... by keyword)")
    if output is not None and output is not tensor:
        check_tensor(output, api, "output")
        if output.device != tensor.device:
            raise _runtime.error("invalid_argument",
                                 f"cortado.torch.{api}: output is on {output.device} but the "
                                 f"tensor is on {tensor.device}; pass an output on the "
                                 f"tensor's device")
        if output.dtype != tensor.dtype or output.numel() != tensor.numel():
            raise _runtime.error("invalid_argument",
                                 f"cortado.torch.{api}: output ({output.dtype}, "
                                 f"{output.numel()} elements) does not match the tensor "
                                 f"({tensor.dtype}, {tensor.numel()} elements)")
    if tensor.device.type == "cuda":
        return _submit_cuda(api, tensor, output, average, name, priority, compression)
    if output is None:
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    name = name if name is not None else _runtime.auto_name("push_pull")
    if isinstance(compressor, AutoCompression):
        compressor = _runtime.auto_choice(name, lambda: compressor.plan(
            [(name, tensor.numel(), tensor.element_size())], rt.size)[name])
    sent, ctx = compressor.compress(tensor)
    if sent is tensor:
        inp, out = tensor, output

        def finish():
            return output
    else:
        inp = out = sent

        def finish():
            with torch.no_grad():
                output.copy_(compressor.decompress(out, ctx).view_as(output))
            return output
    return _runtime.submit(api, name, DTYPES[inp.dtype], inp.numel(), inp.data_ptr(),
                           out.data_ptr(), average, priority, (inp, out, tensor, output), finish,
                           compressor.engine_codec)


def push_pull_async(tensor, name=None, average=True, priority=0, compression=None):
    """Starts summing (average=False) or averaging `tensor` across workers.

    Returns a Handle; synchronize(handle) returns a new tensor with the result.
    `tensor` must stay untouched until then. Every worker must use the same
    `name` (dtype and element count) for the same tensor; unnamed calls are
    named by call order. Higher `priority` is sent first.
    """
    return submit("push_pull_async", tensor, None, average, name, priority, compression)


def push_pull_async_(tensor, name=None, average=True, priority=0, compression=None):
    """In-place push_pull_async: synchronize(handle) returns `tensor`, overwritten."""
    return submit("push_pull_async_", tensor, tensor, average, name, priority, compression)


def push_pull(tensor, name=None, average=True, priority=0, compression=None):
    """Returns a new tensor with the sum or average of `tensor` over all workers."""
    return synchronize(submit("push_pull", tensor, None, average, name, priority, compression))


def push_pull_(tensor, name=None, average=True, priority=0, compression=None):
    """Sums or averages `tensor` over all workers, in place; returns it."""
    return synchronize(submit("push_pull_", tensor, tensor, average, name, priority,
                              compression))


def broadcast_async_(tensor, root_rank, name=None, priority=0):
    """Starts overwriting `tensor` with root_rank's, on every worker.

    A push_pull (sum) to which the other workers contribute zeros: exact for
    every dtype. bool tensors travel as uint8.
    """
    rt = _runtime.require("broadcast")
    if not 0 <= root_rank < rt.size:
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.broadcast: root_rank {root_rank} is out of range "
                             f"for {rt.size} workers")
    if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bool:
        carrier = tensor.to(torch.uint8)
        inner = broadcast_async_(carrier, root_rank, name, priority)
        return Handle(inner.name, inner, lambda: tensor.copy_(carrier.bool()))
    check_tensor(tensor, "broadcast")
    name = name if name is not None else _runtime.auto_name("broadcast")
    source = tensor if rt.rank == root_rank else torch.zeros_like(tensor)
    return submit("broadcast", source, tensor, False, name, priority, None)


def broadcast_(tensor, root_rank, name=None):
    """Overwrites `tensor` with root_rank's, on every worker; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def broadcast(tensor, root_rank, name=None):
    """Returns a new tensor holding root_rank's `tensor`, on every worker."""
    result = tensor.clone(memory_format=torch.contiguous_format) \
        if isinstance(tensor, torch.Tensor) else tensor
    return broadcast_(result, root_rank, name)


def broadcast_parameters(params, root_rank, prefix="broadcast.parameters"):
    """Overwrites every worker's parameters with root_rank's.

    `params` is a state_dict (model.state_dict()), or a list of (name, tensor)
    pairs (model.named_parameters()). Every worker must pass the same names.
    All tensors travel at once; the call returns when all arrived.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = list(params)
        if not all(isinstance(i, tuple) and len(i) == 2 for i in items):
            raise _runtime.error("invalid_argument",
                                 "cortado.torch.broadcast_parameters takes a state_dict or a "
                                 "list of (name, tensor) pairs")
    else:
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.broadcast_parameters takes a state_dict or a list "
                             f"of (name, tensor) pairs, got {type(params).__name__}")
    _runtime.require("broadcast_parameters")
    pending = []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise _runtime.error("invalid_argument",
                                 f"cortado.torch.broadcast_parameters: '{name}' is a "
                                 f"{type(p).__name__}, not a tensor")
        target = p.data if p.requires_grad else p
        if target.is_contiguous():
            pending.append((broadcast_async_(target, root_rank, f"{prefix}.{name}"), None, None))
        else:
            tmp = target.contiguous()
            pending.append((broadcast_async_(tmp, root_rank, f"{prefix}.{name}"), target, tmp))
    for handle, target, tmp in pending:
        synchronize(handle)
        if target is not None:
            with torch.no_grad():
                target.copy_(tmp)
