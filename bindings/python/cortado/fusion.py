"""Groups by size, shared by cortado.torch's default path (torch/fusion.py)
and cortado.tensorflow's gradient reduction (tensorflow/ops.py): which
consecutive gradients travel fused as one engine tensor, as DDP's buckets
and Horovod's fusion buffer. Pure: the same items give every worker the
same groups without exchanging them."""


def consecutive_groups(items, fusion_bytes, kind, nbytes, apart=lambda item: False):
    """Consecutive `items` (in the order given: the backward order) of one
    kind(item), each group closed at the item that brings it to
    `fusion_bytes` or more (nbytes(item) each). An item for which
    apart(item) is true travels on its own and closes the group before it.
    A group of one is no group, so fusion_bytes 0 makes none. A list of
    groups, each a list of items in the order given."""
    out, cur, size, current = [], [], 0, None

    def close():
        if len(cur) > 1:
            out.append(list(cur))

    for item in items:
        if apart(item):
            close()
            cur, size, current = [], 0, None
            continue
        k = kind(item)
        if current is None or k != current:
            close()
            cur, size, current = [], 0, k
        cur.append(item)
        size += nbytes(item)
        if size >= fusion_bytes:
            close()
            cur, size, current = [], 0, None
    close()
    return out
