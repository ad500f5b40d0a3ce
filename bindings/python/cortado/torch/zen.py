"""Sparse gradients through Zen (docs/zen.md): the gradient of an
nn.Embedding(sparse=True) or nn.EmbeddingBag(sparse=True) travels as the
(index, value) pairs of its rows, each element index to the server that the
tensor's ownership hash names, and comes back as the servers' hash bitmaps;
the result is a sparse gradient again (the rows where the sum is non-zero)."""

import numpy as np
import torch

from .. import _runtime

# Zen's indices are u32 (compressor/zen/zen_hash.h, kMaxElements).
MAX_ELEMENTS = 2**32 - 1


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
