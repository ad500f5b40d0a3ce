"""Horovod's torch API over Cortado's engine: `import cortado.torch as hvd`.

Every operation here is a push_pull through the servers (the engine's one
reduction), or a few of them; nothing goes through another framework's
collectives. How each of Horovod's operations is built:

- allreduce with Sum or Average: one push_pull (averaging in the engine).
  prescale_factor/postscale_factor multiply before and after it.
- allgather (first dimensions may differ): the shapes are exchanged first
  (below), then one push_pull (sum) of a zero-filled buffer of the
  concatenated shape in which each worker wrote its own rows: adding zeros
  is exact for every dtype, so the sum is the concatenation.
- allreduce with Min, Max or Product: an allgather of the tensor, then the
  reduction over the workers' copies on every worker. The servers only sum,
  so this moves `size()` times the bytes of a Sum; meant for metrics and
  other small tensors (gradients use Sum/Average).
- alltoall: an allgather of every worker's whole tensor, from which each
  worker takes the rows sent to it (again `size()` times the bytes of a real
  alltoall).
- reducescatter: an allreduce of the whole tensor, then each worker keeps
  its rows.
- broadcast: a sum to which the other workers contribute zeros.
- broadcast_object/allgather_object: pickled bytes through broadcast and
  allgather.
- join: a push_pull of every worker's arrival time (a barrier that also
  tells which worker came last).

Checks. A Horovod call names a tensor of a fixed shape; before a name's
first use (and before every allgather, alltoall and object call, whose sizes
change) the workers exchange a small description of the call (kind, op,
dtype, shape, root) through one push_pull, so that workers that disagree
all raise CortadoError (code "mismatch") naming each worker's call, instead
of waiting for one another. An unknown op or Adasum raises before anything
is sent. Every wait has the job's deadline (CORTADO_TIMEOUT_MS).

Names. A named call keeps its engine tensor (one per name, dtype and element
count) for the next call with the same name. An unnamed call gets a name by
call order (workers must make their unnamed calls in the same order) and
releases its engine tensor when it completes.
"""

import math
import pickle
import time
import zlib

import torch

from .. import _runtime
from .._runtime import Handle, rank, size
from ..compression import Compression
from . import ops
from .horovod_basics import (Average, Max, Min, Product, Sum, _check_process_set, _error,
                             global_process_set, resolve_op)
from .horovod_checks import (_MAX_DIMS, _META, _All, _agree, _describe, _engine_name,
                             _exchange, _first_use, _release_after)


# -- allgather, the base of Min/Max/Product and alltoall ----------------------

def _carrier(tensor):
    """bool travels as uint8; everything else as itself."""
    return tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor


def _gather_rows(api, tensor, name, rows_of, ename, auto):
    """Starts the concatenation (on dimension 0) of every worker's `tensor`,
    where rows_of[r] is worker r's first dimension (known from the exchange).
    The handle's result is the concatenated tensor."""
    rt = _runtime.require(api)
    src = _carrier(tensor.detach())
    if src.dim() == 0:
        src = src.reshape(1)
    total = sum(rows_of)
    offset = sum(rows_of[:rt.rank])
    buf = torch.zeros((total,) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
    if src.shape[0]:
        buf[offset:offset + src.shape[0]].copy_(src)
    buf = buf.contiguous()
    release = _release_after(ename, auto)
    inner = ops.submit(api, buf, buf, False, ename, 0, None)

    def finish():
        inner.wait()
        release()
        return buf.bool() if tensor.dtype == torch.bool else buf
    return Handle(ename, _All([inner]), finish)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every worker's `tensor` on dimension 0 (first
    dimensions may differ; the others, the dtype and the number of
    dimensions must agree). synchronize(handle) returns the result."""
    _check_process_set(process_set, "allgather")
    ops.check_tensor(_carrier(tensor) if isinstance(tensor, torch.Tensor) else tensor,
                     "allgather")
    t = tensor if tensor.dim() > 0 else tensor.reshape(1)
    row = _describe("allgather", t)
    rows = _exchange("allgather", row)
    shown = name or "(unnamed)"
    _agree("allgather", shown, rows,
           lambda r: (r[0], r[2], r[4]) + tuple(r[8:7 + min(r[4], _MAX_DIMS)]))
    rows_of = [r[7] for r in rows]
    total = sum(rows_of) * math.prod(t.shape[1:])
    if name is None:
        ename, auto = _runtime.auto_name("hvd.allgather"), True
    else:
        ename, auto = f"hvd.allgather.{name}.{str(t.dtype).replace('torch.', '')}.{total}", False
    return _gather_rows("allgather", t, name, rows_of, ename, auto)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        return _runtime.synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        # As Horovod: the gradients of the gathered tensor, averaged over the
        # workers, and this worker's rows of it.
        reduced = allreduce(grad.contiguous(), op=Average)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64))
        offset = int(rows[:rank()].sum().item())
        return reduced.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every worker's `tensor`, concatenated on dimension 0 (see
    allgather_async); differentiable as Horovod's."""
    _check_process_set(process_set, "allgather")
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply(tensor, name)
    return _runtime.synchronize(allgather_async(tensor, name))


# -- allreduce ------------------------------------------------------------------

def _scale_check(tensor, factor, api, what):
    if factor != 1.0 and not (tensor.is_floating_point() or tensor.is_complex()):
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: {what}={factor} on a {tensor.dtype} tensor: scale "
                     f"factors apply to floating-point tensors")


def _reduce_copies(stacked, op, dtype):
    """Min/Max/Product over dimension 0 of `stacked` (the workers' copies)."""
    if dtype == torch.bool:
        x = stacked.to(torch.uint8)
    elif dtype in (torch.float16, torch.bfloat16):
        x = stacked.float()
    else:
        x = stacked
    if op is Min:
        out = torch.amin(x, dim=0)
    elif op is Max:
        out = torch.amax(x, dim=0)
    else:
        out = torch.prod(x, dim=0, dtype=x.dtype)
    return out.to(dtype)


def _allreduce_start(api, tensor, output, name, op, compression, prescale, postscale,
                     shown=None):
    """One allreduce of `tensor` into `output` (None: a new tensor; `tensor`:
    in place). The handle's result is the output."""
    compressor = Compression.lookup(compression)
    if not isinstance(tensor, torch.Tensor):
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: expected a torch.Tensor, got {type(tensor).__name__}")
    _scale_check(tensor, prescale, api, "prescale_factor")
    _scale_check(tensor, postscale, api, "postscale_factor")
    gather = op in (Min, Max, Product)
    if gather and compressor is not Compression.none:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: compression applies to op=Sum and op=Average, not "
                     f"op={op.op_name}")
    ops.check_tensor(_carrier(tensor) if gather else tensor, api)
    ename, auto = _engine_name(api, name, tensor, f".{op.op_name.lower()}" if gather else "")
    shown = shown or name or "(unnamed)"
    _first_use(api, ename, auto, tensor, _describe("allreduce", tensor, op), shown=shown)
    rt = _runtime.require(api)
    if gather:
        src = tensor.detach()
        if prescale != 1.0:
            src = src * prescale
        flat = src.reshape(1, -1)
        h = _gather_rows(api, flat, name, [1] * rt.size, ename, auto)

        def finish():
            copies = h.wait()
            result = _reduce_copies(copies, op, tensor.dtype).view(tensor.shape)
            if postscale != 1.0:
                result = result * postscale
            if output is None:
                return result
            with torch.no_grad():
                output.copy_(result)
            return output
        return Handle(ename, _All([h]), finish)
    if output is tensor:
        work, into = tensor, tensor  # in place
        if prescale != 1.0:
            with torch.no_grad():
                work.mul_(prescale)
    elif prescale != 1.0:
        work = tensor.detach() * prescale  # a new tensor: reduced in place
        into = work
    else:
        work, into = tensor.detach(), None  # into a new tensor; the input stays
    release = _release_after(ename, auto)
    inner = ops.submit(api, work, into, op is Average, ename, 0, compressor)

    def finish():
        result = inner.wait()
        release()
        if postscale != 1.0:
            with torch.no_grad():
                result.mul_(postscale)
        if output is not None and result is not output:
            with torch.no_grad():
                output.copy_(result)
            return output
        return result
    return Handle(ename, _All([inner]), finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over all workers (op: Average, the default,
    Sum, Min, Max, Product); `tensor` is not modified. synchronize(handle)
    returns a new tensor."""
    op = resolve_op(op, average, "allreduce_async")
    _check_process_set(process_set, "allreduce_async")
    return _allreduce_start("allreduce_async", tensor, None, name, op, Compression.none,
                            prescale_factor, postscale_factor)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce_async: synchronize(handle) returns `tensor`."""
    op = resolve_op(op, average, "allreduce_async_")
    _check_process_set(process_set, "allreduce_async_")
    return _allreduce_start("allreduce_async_", tensor, tensor, name, op, Compression.none,
                            prescale_factor, postscale_factor)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, compression, prescale, postscale):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return _runtime.synchronize(_allreduce_start("allreduce", tensor, None, name, op,
                                                     compression, prescale, postscale))

    @staticmethod
    def backward(ctx, grad):
        if ctx.op not in (Sum, Average):
            raise _error("invalid_argument",
                         f"cortado.torch.allreduce: no gradient for op={ctx.op.op_name} "
                         f"(as in Horovod, allreduce is differentiable for Sum and Average)")
        return allreduce(grad.contiguous(), op=ctx.op, prescale_factor=ctx.prescale,
                         postscale_factor=ctx.postscale), None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns `tensor` reduced over all workers (op: Average, the default,
    Sum, Min, Max, Product); `tensor` is not modified. `compression`
    (Compression.none, fp16 or a Cortado codec) applies to Sum and Average.
    Differentiable for Sum and Average, as Horovod's."""
    op = resolve_op(op, average, "allreduce")
    _check_process_set(process_set, "allreduce")
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _AllreduceFn.apply(tensor, name, op, compression, prescale_factor,
                                  postscale_factor)
    return _runtime.synchronize(_allreduce_start("allreduce", tensor, None, name, op,
                                                 compression, prescale_factor, postscale_factor))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns `tensor`."""
    return _runtime.synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                                 postscale_factor, process_set))


# -- grouped allreduce: one engine tensor per dtype (fusion) -------------------

def _grouped_start(api, tensors, inplace, name, op, compression, prescale, postscale):
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise _error("invalid_argument",
                         f"cortado.torch.{api}: item {i} is a {type(t).__name__}, not a tensor")
        if t.device != tensors[0].device:
            raise _error("invalid_argument",
                         f"cortado.torch.{api}: the tensors are on {tensors[0].device} and "
                         f"{t.device}; a group lives on one device")
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    handles = []
    for dtype, idx in by_dtype.items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        gname = None if name is None else \
            f"{name}.{len(tensors)}.{zlib.crc32(repr([tuple(tensors[i].shape) for i in idx]).encode())}"
        handles.append((idx, _allreduce_start(api, flat, flat, gname, op, compression, prescale,
                                              postscale, shown=name)))

    def finish():
        out = list(tensors) if inplace else [None] * len(tensors)
        for idx, h in handles:
            flat = h.wait()
            at = 0
            for i in idx:
                n = tensors[i].numel()
                piece = flat[at:at + n].view(tensors[i].shape)
                at += n
                if inplace:
                    with torch.no_grad():
                        tensors[i].copy_(piece)
                else:
                    out[i] = piece.clone()
        return out
    return Handle(name or "grouped_allreduce", _All([h for _, h in handles]), finish)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one allreduce of a list of tensors, fused: the tensors of each
    dtype travel as one engine tensor. synchronize(handle) returns a list."""
    op = resolve_op(op, average, "grouped_allreduce_async")
    _check_process_set(process_set, "grouped_allreduce_async")
    return _grouped_start("grouped_allreduce_async", tensors, False, name, op, Compression.none,
                          prescale_factor, postscale_factor)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce_async."""
    op = resolve_op(op, average, "grouped_allreduce_async_")
    _check_process_set(process_set, "grouped_allreduce_async_")
    return _grouped_start("grouped_allreduce_async_", tensors, True, name, op, Compression.none,
                          prescale_factor, postscale_factor)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A list of tensors reduced over all workers, fused (see
    grouped_allreduce_async). Not differentiable."""
    op = resolve_op(op, average, "grouped_allreduce")
    _check_process_set(process_set, "grouped_allreduce")
    return _runtime.synchronize(_grouped_start("grouped_allreduce", tensors, False, name, op,
                                               compression, prescale_factor, postscale_factor))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce; returns the tensors."""
    return _runtime.synchronize(grouped_allreduce_async_(tensors, average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set))


# -- broadcast -------------------------------------------------------------------

def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set, priority=0):
    """Starts overwriting `tensor` with root_rank's on every worker.
    synchronize(handle) returns `tensor`. (A number as the fourth argument
    is the priority, as cortado.torch's broadcast_async_ took it before.)"""
    if isinstance(process_set, int) and not isinstance(process_set, bool):
        process_set, priority = global_process_set, process_set
    _check_process_set(process_set, "broadcast_async_")
    rt = _runtime.require("broadcast")
    ops.check_tensor(_carrier(tensor) if isinstance(tensor, torch.Tensor) else tensor,
                     "broadcast")
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < rt.size:
        raise _error("invalid_argument",
                     f"cortado.torch.broadcast: root_rank {root_rank!r} is out of range for "
                     f"{rt.size} workers")
    if name is None:
        ename, auto = _runtime.auto_name("hvd.broadcast"), True
    else:
        ename, auto = name, False  # the name BytePS-style broadcast uses too
    _first_use("broadcast", ename, auto, tensor, _describe("broadcast", tensor, root=root_rank),
               shown=name or "(unnamed)")
    inner = ops.broadcast_async_(tensor, root_rank, ename, priority)
    release = _release_after(ename, auto)

    def finish():
        inner.wait()
        release()
        return tensor
    return Handle(ename, _All([inner]), finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` into a new tensor, which
    synchronize(handle) returns; `tensor` is not modified."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format) \
        if isinstance(tensor, torch.Tensor) else tensor
    return broadcast_async_(out, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's on every worker; returns it."""
    return _runtime.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return _runtime.synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        # As Horovod: the averaged gradient on the root, zero elsewhere.
        reduced = allreduce(grad.contiguous(), op=Average)
        if rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's `tensor`, on every worker;
    differentiable as Horovod's."""
    _check_process_set(process_set, "broadcast")
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank, name)
    return _runtime.synchronize(broadcast_async(tensor, root_rank, name))


# -- alltoall ----------------------------------------------------------------------

def _splits_list(splits, rows, world, api):
    if splits is None:
        if rows % world:
            raise _error("invalid_argument",
                         f"cortado.torch.{api}: without splits the first dimension ({rows}) "
                         f"must divide by the number of workers ({world})")
        return [rows // world] * world
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: splits {splits} must be {world} non-negative row "
                     f"counts (one per worker) that add up to the first dimension {rows}")
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[r] rows of `tensor` (on dimension 0, in order)
    to each worker r. synchronize(handle) returns (the rows received, by
    sender, concatenated; the row counts received from each worker, int32)."""
    _check_process_set(process_set, "alltoall")
    api = "alltoall"
    rt = _runtime.require(api)
    ops.check_tensor(_carrier(tensor) if isinstance(tensor, torch.Tensor) else tensor, api)
    if tensor.dim() == 0:
        raise _error("invalid_argument", "cortado.torch.alltoall: the tensor needs at least one "
                                         "dimension (rows are sent along dimension 0)")
    mine = _splits_list(splits, tensor.shape[0], rt.size, api)
    rows = _exchange(api, _describe(api, tensor), mine)
    _agree(api, name or "(unnamed)", rows,
           lambda r: (r[0], r[2], r[4]) + tuple(r[8:7 + min(r[4], _MAX_DIMS)]))
    split = [r[_META:] for r in rows]  # split[src][dst]
    rows_of = [sum(s) for s in split]
    row_elems = math.prod(tensor.shape[1:])
    if name is None:
        ename, auto = _runtime.auto_name("hvd.alltoall"), True
    else:
        ename, auto = (f"hvd.alltoall.{name}.{str(tensor.dtype).replace('torch.', '')}."
                       f"{sum(rows_of) * row_elems}"), False
    gathered = _gather_rows(api, tensor, name, rows_of, ename, auto)
    me = rt.rank
    received = torch.tensor([split[src][me] for src in range(rt.size)], dtype=torch.int32)

    def finish():
        full = gathered.wait()
        pieces, at = [], 0
        for src in range(rt.size):
            start = at + sum(split[src][:me])
            pieces.append(full[start:start + split[src][me]])
            at += rows_of[src]
        return torch.cat(pieces).contiguous(), received
    return Handle(ename, _All([gathered]), finish)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = _runtime.synchronize(alltoall_async(tensor, splits, name))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        back, _ = _runtime.synchronize(alltoall_async(grad.contiguous(), ctx.received))
        return back, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[r] rows of `tensor` to worker r (equal parts without
    splits) and returns what this worker received; with splits, as Horovod,
    (received rows, int32 row counts received from each worker)."""
    _check_process_set(process_set, "alltoall")
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        out, received = _AlltoallFn.apply(tensor, splits, name)
    else:
        out, received = _runtime.synchronize(alltoall_async(tensor, splits, name))
    return out if splits is None else (out, received)


# -- reducescatter -----------------------------------------------------------------

def _scatter_rows(rows, world, r):
    base, extra = divmod(rows, world)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def reducescatter_async(tensor, name=None, op=Average, prescale_factor=1.0,
                        postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over all workers, of which each keeps its
    part of dimension 0 (the first `rows % size()` workers one row more)."""
    api = "reducescatter"
    op = resolve_op(op, None, api, allowed=(Average, Sum, Min, Max, Product))
    _check_process_set(process_set, api)
    if isinstance(tensor, torch.Tensor) and tensor.dim() == 0:
        raise _error("invalid_argument", "cortado.torch.reducescatter: the tensor needs at least "
                                         "one dimension (it is scattered along dimension 0)")
    h = _allreduce_start(api, tensor, None, name, op, Compression.none, prescale_factor,
                         postscale_factor)
    offset, count = _scatter_rows(tensor.shape[0], size(), rank())

    def finish():
        return h.wait()[offset:offset + count].clone()
    return Handle(h.name, _All([h]), finish)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """This worker's part (dimension 0) of `tensor` reduced over all
    workers (see reducescatter_async)."""
    if Compression.lookup(compression) is not Compression.none:
        raise _error("invalid_argument",
                     "cortado.torch.reducescatter: compression is not supported here")
    return _runtime.synchronize(reducescatter_async(tensor, name, op, prescale_factor,
                                                    postscale_factor, process_set))


# -- objects -------------------------------------------------------------------------

def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (anything pickle takes), on every worker."""
    api = "broadcast_object"
    _check_process_set(process_set, api)
    rt = _runtime.require(api)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < rt.size:
        raise _error("invalid_argument",
                     f"cortado.torch.broadcast_object: root_rank {root_rank!r} is out of range "
                     f"for {rt.size} workers")
    data = pickle.dumps(obj) if rt.rank == root_rank else b""
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.zeros(0, dtype=torch.uint8)
    row = _describe(api, payload, root=root_rank, aux=len(data))
    rows = _exchange(api, row)
    _agree(api, name or "(unnamed)", rows, lambda r: (r[0], r[3]))
    length = rows[root_rank][5]
    buf = payload if rt.rank == root_rank else torch.zeros(length, dtype=torch.uint8)
    if name is None:
        ename, auto = _runtime.auto_name("hvd.broadcast_object"), True
    else:
        ename, auto = f"hvd.broadcast_object.{name}.{length}", False
    inner = ops.broadcast_async_(buf, root_rank, ename)
    _runtime.synchronize(inner)
    _release_after(ename, auto)()
    return obj if rt.rank == root_rank else pickle.loads(buf.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every worker's `obj` (anything pickle takes), as a list by rank."""
    api = "allgather_object"
    _check_process_set(process_set, api)
    _runtime.require(api)
    data = pickle.dumps(obj)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = _exchange(api, _describe(api, payload))
    _agree(api, name or "(unnamed)", rows, lambda r: r[0])
    lengths = [r[7] for r in rows]
    if name is None:
        ename, auto = _runtime.auto_name("hvd.allgather_object"), True
    else:
        ename, auto = f"hvd.allgather_object.{name}.{sum(lengths)}", False
    full = _runtime.synchronize(_gather_rows(api, payload, name, lengths, ename, auto))
    out, at = [], 0
    raw = full.numpy().tobytes()
    for n in lengths:
        out.append(pickle.loads(raw[at:at + n]))
        at += n
    return out


# -- join, barrier, and what this build has -------------------------------------------

def join(device=-1):
    """Waits until every worker called join(); returns the rank that called
    it last (by each worker's clock). Unlike Horovod's, a worker in join()
    does not stand in for the others' allreduces: a worker that still
    reduces while another waits here fails after CORTADO_TIMEOUT_MS, naming
    the tensor (every worker must leave its loop at the same step)."""
    rt = _runtime.require("join")
    buf = torch.zeros(rt.size, dtype=torch.int64)
    buf[rt.rank] = time.time_ns()
    _runtime.synchronize(ops.submit("join", buf, buf, False, "cortado.hvd.join", 0, None))
    return int(torch.argmax(buf).item())
