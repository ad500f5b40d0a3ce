"""Sparse gradients through Zen (docs/zen.md): the gradient of an
nn.Embedding(sparse=True) or nn.EmbeddingBag(sparse=True) travels as the
(index, value) pairs of its rows, each element index to the server that the
tensor's ownership hash names, and comes back as the servers' hash bitmaps;
the result is a sparse gradient again (the rows where the sum is non-zero).

Dense gradients that are mostly zeros (an nn.Embedding without sparse=True,
a masked layer) go the same way without any change to the script: the
DistributedOptimizer measures each candidate gradient's density at the
first step, the workers agree on the mean, and from the second step on the
gradients below `sparse_threshold` are scanned for their non-zeros, which
travel as pairs; the answer is written back into the dense gradient."""

import numpy as np
import torch

from .. import _runtime

# Zen's indices are u32 (compressor/zen/zen_hash.h, kMaxElements).
MAX_ELEMENTS = 2**32 - 1

# DistributedOptimizer's sparse_threshold by default: dense gradients whose
# mean density over the workers at the first step is below 1% go through Zen
# (at 1% it moved a 16M-element tensor 10x faster than dense push/pull on 4
# emulated hosts at 1 Gbit/s; docs/benchmarks.md).
DEFAULT_SPARSE_THRESHOLD = 0.01
# Dense gradients this small or smaller stay dense whatever their density:
# hashing and a server key per server cost more than they save (the
# authors' code keeps tensors of at most 4096 elements dense too).
MIN_DENSE_ELEMENTS = 4096


def usable(grad, param):
    """Whether Zen can carry this sparse gradient: rows as the one sparse
    dimension, float32 on the CPU, at most MAX_ELEMENTS elements, and a job
    with servers."""
    return (grad.sparse_dim() == 1 and grad.dtype == torch.float32
            and grad.device.type == "cpu" and 0 < param.numel() <= MAX_ELEMENTS
            and _runtime.require("DistributedOptimizer").num_servers > 0)


def push_pull_async(grad, name, average, priority, scale=1.0):
    """Starts the sum (or average) of a coalesced sparse gradient with one
    sparse dimension. Returns (handle, result): after synchronizing the
    handle, result() is the reduced sparse gradient."""
    rows = grad.indices()[0]
    width = int(np.prod(grad.shape[1:], dtype=np.int64))  # elements per row
    values = grad.values()
    if scale != 1.0:
        values = values * scale
    values = values.reshape(-1).to(torch.float32).contiguous()
    index = (rows.to(torch.int64).unsqueeze(1) * width + torch.arange(width)).reshape(-1)
    index = np.ascontiguousarray(index.numpy().astype(np.uint32))
    out = torch.empty(grad.shape, dtype=torch.float32)
    handle = _runtime.submit_sparse("DistributedOptimizer", name, out.numel(), index, values, out,
                                    average, priority, None)

    def result():
        flat = out.view(grad.shape[0], width)
        nonzero = flat.ne(0).any(1).nonzero().squeeze(1)
        return torch.sparse_coo_tensor(nonzero.unsqueeze(0), out[nonzero], grad.shape)

    return handle, result


def dense_candidate(param, compressor):
    """Whether a dense gradient of `param` may go through Zen when sparse
    enough: float32 on the CPU, more than MIN_DENSE_ELEMENTS and at most
    MAX_ELEMENTS elements, no compression, and a job with servers."""
    return (param.dtype == torch.float32 and param.device.type == "cpu"
            and MIN_DENSE_ELEMENTS < param.numel() <= MAX_ELEMENTS
            and compressor.name == "none" and compressor.engine_codec is None
            and _runtime.require("DistributedOptimizer").num_servers > 0)


def declare_dense(name, count):
    """Declares `name` as the Zen tensor of a dense gradient of `count`
    elements (a collective step: every worker at the same point)."""
    rt = _runtime.require("DistributedOptimizer")
    if not _runtime.usable(rt, name):
        rt.declare(name, "float32", count, sparse=True)


def push_pull_dense_async(grad, name, average, priority):
    """Starts the sum (or average) of a dense float32 CPU gradient through
    Zen tensor `name`: the core scans it for its non-zeros, sends them as
    pairs and writes the sum back in place. Returns (handle, tmp): tmp is a
    contiguous copy to copy back after the handle completes, or None."""
    rt = _runtime.require("DistributedOptimizer")
    buf = grad if grad.is_contiguous() else grad.contiguous()
    core = rt.push_pull(name, "float32", buf.numel(), buf.data_ptr(), buf.data_ptr(),
                        bool(average), int(priority), buf)
    return _runtime.Handle(name, core, None), (None if buf is grad else buf)


def density(grad):
    """The share of non-zero elements of a dense gradient."""
    return float(torch.count_nonzero(grad)) / max(1, grad.numel())
