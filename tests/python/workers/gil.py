"""Blocking calls release the GIL: a job that can only finish if they do.

Two workers, two tensors, "a" and "b". Rank 0's main thread blocks in
push_pull("a") (and then in barrier()) while a second Python thread of rank 0
does push_pull("b"). Rank 1 does "b" first and "a" only after "b" completed.
So "a" completes only once rank 0's helper thread has run its push_pull("b")
while the main thread was blocked: if a blocking call held the GIL, the helper
could not run, rank 1 would never push "a", and the main thread's wait would
end in a timeout error and the job would fail.
"""

import sys
import threading

import numpy as np

import cortado
import cortado.torch as ct
import torch
from common import parse_args, write_result


def main():
    args = parse_args()
    cortado.init()
    rank, world = cortado.rank(), cortado.size()
    assert world == 2, "run with 2 workers"
    # Declaring is a collective step: do it up front, in the same order everywhere.
    cortado.declare("a", np.float32, 1000)
    cortado.declare("b", np.float32, 1000)
    cortado.declare("c", np.float32, 1000)
    x = np.full(1000, rank + 1, np.float32)
    results = {}
    errors = []

    def helper(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # reported through the result file
            errors.append(f"{name}: {type(e).__name__}: {e}")

    if rank == 0:
        # A long switch interval: the main thread keeps the GIL until it
        # releases it itself, so the helpers, woken by set(), run only inside
        # the main thread's blocking calls (or not at all).
        sys.setswitchinterval(2.0)
        go_b, go_c = threading.Event(), threading.Event()

        def push_b():
            go_b.wait(60)
            return cortado.push_pull(x, name="b", average=False)

        def push_c():
            go_c.wait(60)
            return ct.push_pull(torch.from_numpy(x.copy()), name="c", average=False).numpy()

        t = threading.Thread(target=helper, args=("b", push_b))
        t2 = threading.Thread(target=helper, args=("c", push_c))
        t.start()
        t2.start()
        h = cortado.push_pull_async(x, name="a", average=False)
        go_b.set()
        a = cortado.synchronize(h, timeout=30)
        t.join(timeout=60)
        assert not t.is_alive(), "helper thread still running 60 s after push_pull('a')"
        # The same with barrier(), and a torch push_pull in the helper.
        go_c.set()
        cortado.barrier(timeout=30)
        t2.join(timeout=60)
        assert not t2.is_alive(), "helper thread still running 60 s after barrier()"
    else:
        results["b"] = cortado.push_pull(x, name="b", average=False)
        a = cortado.push_pull(x, name="a", average=False)
        results["c"] = cortado.push_pull(x, name="c", average=False)
        cortado.barrier()
    assert not errors, errors
    expect = np.full(1000, 3, np.float32)
    for name, got in (("a", a), ("b", results["b"]), ("c", results["c"])):
        np.testing.assert_array_equal(got, expect, err_msg=name)
    write_result(args.out, rank, ok=True)
    cortado.shutdown()


if __name__ == "__main__":
    sys.exit(main())
