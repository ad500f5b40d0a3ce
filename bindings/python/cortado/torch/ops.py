"""Tensor operations of cortado.torch: push_pull, broadcast, broadcast_parameters.

A tensor reaches the engine as (data_ptr(), numel(), dtype), so it must be a
contiguous CPU tensor of a supported dtype; check_tensor() raises CortadoError
before any data moves otherwise. The tensors stay referenced (by the core)
until their operation completes.
"""

import torch

from .. import _C, _runtime
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
        if not _C.built_with_cuda:
            raise _runtime.error(
                "invalid_argument",
                f"cortado.torch.{api}: {what} is on {device}, but this build of Cortado has no "
                f"CUDA support (configured with CORTADO_WITH_CUDA off or without a CUDA "
                f"toolkit); move it to the CPU with .cpu() or rebuild with CUDA")
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: {what} is on {device}; the PyTorch binding "
                             f"moves CPU tensors only so far: use .cpu()")
    if device.type != "cpu":
        raise _runtime.error("invalid_argument",
                             f"cortado.torch.{api}: {what} is on device '{device}'; Cortado "
                             f"sums CPU tensors")
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
    if output is None:
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    elif output is not tensor:
        check_tensor(output, api, "output")
        if output.dtype != tensor.dtype or output.numel() != tensor.numel():
            raise _runtime.error("invalid_argument",
                                 f"cortado.torch.{api}: output ({output.dtype}, "
                                 f"{output.numel()} elements) does not match the tensor "
                                 f"({tensor.dtype}, {tensor.numel()} elements)")
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
