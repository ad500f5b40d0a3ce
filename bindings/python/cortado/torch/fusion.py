"""The default path's groups by size (DistributedOptimizer without the plan
executor; docs/python.md, "Fused gradients"): which gradients travel fused
as one engine tensor.

The groups are a pure function of the parameters (model order, dtypes,
devices, sizes), their compressors, fusion_bytes and the set of gradients
kept apart, so every worker that holds the same model and the same agreed
Zen decision computes the same groups without exchanging them.
"""


def size_groups(ordered, compressors, fusion_bytes, apart):
    """Consecutive gradients in backward order (the reverse of `ordered`,
    the (name, parameter) pairs in model order) of one dtype, device and
    compressor, each group closed at the gradient that brings it to
    `fusion_bytes` or more, as DDP's buckets and Horovod's fusion buffer.
    A parameter for which apart(p) is true travels on its own and closes
    the group before it. A group of one is no group. Each group lists its
    parameters in model order."""
    rank = {id(p): i for i, (_, p) in enumerate(ordered)}
    out, cur, size, kind = [], [], 0, None

    def close():
        if len(cur) > 1:
            out.append(sorted(cur, key=lambda q: rank[id(q)]))

    for _, p in reversed(ordered):
        if apart(p):
            close()
            cur, size, kind = [], 0, None
            continue
        k = (p.dtype, p.device, compressors[p])
        if k != kind:
            close()
            cur, size, kind = [], 0, k
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= fusion_bytes:
            close()
            cur, size, kind = [], 0, None
    close()
    return out
