"""The default path's groups by size (DistributedOptimizer without the plan
executor; docs/python.md, "Fused gradients"): which gradients travel fused
as one engine tensor.

The groups are a pure function of the parameters (model order, dtypes,
devices, sizes), their compressors, fusion_bytes and the set of gradients
kept apart, so every worker that holds the same model and the same agreed
Zen decision computes the same groups without exchanging them.
"""

from ..fusion import consecutive_groups


def size_groups(ordered, compressors, fusion_bytes, apart):
    """Consecutive gradients in backward order (the reverse of `ordered`,
    the (name, parameter) pairs in model order) of one dtype, device and
    compressor, each group closed at the gradient that brings it to
    `fusion_bytes` or more, as DDP's buckets and Horovod's fusion buffer
    (cortado.fusion.consecutive_groups). A parameter for which apart(p) is
    true travels on its own and closes the group before it. A group of one
    is no group. Each group lists its parameters in model order."""
    rank = {id(p): i for i, (_, p) in enumerate(ordered)}
    groups = consecutive_groups([p for _, p in reversed(ordered)], fusion_bytes,
                                lambda p: (p.dtype, p.device, compressors[p]),
                                lambda p: p.numel() * p.element_size(), apart)
    return [sorted(g, key=lambda q: rank[id(q)]) for g in groups]
