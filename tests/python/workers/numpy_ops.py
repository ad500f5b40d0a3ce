"""push_pull, async handles and broadcast on NumPy arrays, checked against NumPy.

Every worker can replay every other worker's inputs (seeded by rank), so each
computes the reference with NumPy and compares. Integer-valued inputs make the
sums exact in every dtype whatever order the servers add in; random floats are
compared with a tolerance.
"""

import array
import sys
import time

import numpy as np

import cortado
from common import parse_args, write_result

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8]
SIZES = [1, 7, 1000, 70_000]  # 70k float64 spans several 64 KiB chunks


def values(dtype, n, rank, salt):
    rng = np.random.default_rng([rank, salt, n, np.dtype(dtype).num])
    lo, hi = (0, 40) if dtype == np.uint8 else (-8, 9)
    return rng.integers(lo, hi, size=n).astype(dtype)


def expected_sum(dtype, n, world, salt):
    stack = np.stack([values(dtype, n, r, salt) for r in range(world)])
    if dtype == np.float16:  # the servers sum fp16 in fp32 and round once
        return stack.astype(np.float32).sum(axis=0).astype(np.float16)
    return stack.sum(axis=0, dtype=dtype)


def expected_average(dtype, total, world):
    if np.issubdtype(dtype, np.integer):  # C division: truncation toward zero
        return np.fix(total.astype(np.float64) / world).astype(dtype)
    if dtype == np.float16:
        return (total.astype(np.float32) * np.float32(1.0 / world)).astype(np.float16)
    return (total * dtype(1.0 / world)).astype(dtype)


def check_sums(rank, world):
    checked = 0
    for dtype in DTYPES:
        for n in SIZES:
            x = values(dtype, n, rank, 1)
            got = cortado.push_pull(x, name=f"sum.{np.dtype(dtype).name}.{n}", average=False)
            assert got.dtype == dtype and got.shape == x.shape
            np.testing.assert_array_equal(got, expected_sum(dtype, n, world, 1),
                                          err_msg=f"sum of {dtype} x {n}")
            avg = cortado.push_pull(x, name=f"sum.{np.dtype(dtype).name}.{n}", average=True)
            np.testing.assert_array_equal(
                avg, expected_average(dtype, expected_sum(dtype, n, world, 1), world),
                err_msg=f"average of {dtype} x {n}")
            checked += 2
    # Random floats: any summation order is within a few ulps.
    for dtype, rtol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        rng = lambda r: np.random.default_rng([r, 99]).standard_normal(5000).astype(dtype)
        got = cortado.push_pull(rng(rank), name=f"random.{np.dtype(dtype).name}", average=False)
        ref = np.sum([rng(r).astype(np.float64) for r in range(world)], axis=0)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol)
        checked += 1
    # Shapes survive; in place; fp16 compression of integer-valued floats is exact.
    x = values(np.float32, 60, rank, 2).reshape(3, 4, 5)
    ref = expected_sum(np.float32, 60, world, 2).reshape(3, 4, 5)
    out = cortado.push_pull(x, name="shaped", average=False)
    assert out.shape == (3, 4, 5)
    np.testing.assert_array_equal(out, ref)
    y = x.copy()
    assert cortado.push_pull(y, name="shaped", average=False, output=y) is y
    np.testing.assert_array_equal(y, ref)
    z = cortado.push_pull(x, name="shaped.fp16", average=False, compression="fp16")
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z, ref)
    checked += 3
    return checked


def check_async(rank, world):
    n_tensors = 12
    inputs = [values(np.float32, 10_000 + 97 * t, rank, 10 + t) for t in range(n_tensors)]
    handles = [cortado.push_pull_async(x, name=f"async.{t}", average=False, priority=-t)
               for t, x in enumerate(inputs)]
    assert all(isinstance(h, cortado.Handle) for h in handles)
    deadline = time.monotonic() + 60
    while not all(cortado.poll(h) for h in handles):
        assert time.monotonic() < deadline, "async handles did not complete within 60 s"
        time.sleep(0.001)
    for t, h in enumerate(handles):
        np.testing.assert_array_equal(cortado.synchronize(h),
                                      expected_sum(np.float32, 10_000 + 97 * t, world, 10 + t))
        # A completed handle keeps its result.
        assert cortado.synchronize(h) is cortado.synchronize(h)

    # synchronize() with a timeout: rank 0 waits for a tensor that the others
    # push only after a barrier, so its first wait times out.
    cortado.declare("late", np.float32, 4)
    x = np.full(4, rank + 1, np.float32)
    if rank == 0:
        h = cortado.push_pull_async(x, name="late", average=False)
        if world > 1:
            try:
                cortado.synchronize(h, timeout=0.3)
                raise AssertionError("synchronize(timeout=0.3) returned before the others pushed")
            except cortado.CortadoError as e:
                assert e.code == "timeout", e
                assert "late" in str(e), e
            assert not cortado.poll(h)
        cortado.barrier()
    else:
        cortado.barrier()
        h = cortado.push_pull_async(x, name="late", average=False)
    np.testing.assert_array_equal(cortado.synchronize(h, timeout=60),
                                  np.full(4, world * (world + 1) / 2, np.float32))
    return n_tensors + 1


def check_release(rank, world):
    """A released name refuses another round, naming the tensor; declared
    again, it is a new tensor (here of another size)."""
    x = np.full(8, rank + 1, np.float32)
    got = cortado.push_pull(x, name="released.once", average=False)
    np.testing.assert_array_equal(got, np.full(8, world * (world + 1) / 2, np.float32))
    rt = cortado._runtime.require("check_release")
    assert rt.is_declared("released.once") and not rt.is_released("released.once")
    cortado.release("released.once")
    cortado.release("released.once")  # twice: harmless
    assert rt.is_declared("released.once") and rt.is_released("released.once")
    try:
        cortado.push_pull(x, name="released.once", average=False)
        raise AssertionError("push_pull of a released tensor returned")
    except cortado.CortadoError as e:
        assert e.code == "invalid_argument", e
        assert "'released.once' was released" in str(e), e
    cortado.declare("released.once", np.float32, 5)
    assert not rt.is_released("released.once")
    got = cortado.push_pull(np.full(5, rank + 1, np.float32), name="released.once", average=False)
    np.testing.assert_array_equal(got, np.full(5, world * (world + 1) / 2, np.float32))
    return 3


def check_broadcast(rank, world):
    root = world - 1
    for dtype in DTYPES:
        x = values(dtype, 333, rank, 20)
        got = cortado.broadcast(x, root_rank=root, name=f"bcast.{np.dtype(dtype).name}")
        np.testing.assert_array_equal(got, values(dtype, 333, root, 20))
        np.testing.assert_array_equal(x, values(dtype, 333, rank, 20))  # input untouched
    y = values(np.float64, 50, rank, 21)
    cortado.broadcast(y, root_rank=0, name="bcast.inplace", inplace=True)
    np.testing.assert_array_equal(y, values(np.float64, 50, 0, 21))
    # Special values cross unchanged.
    special = np.array([np.inf, -np.inf, 1e-40, 65504.0, -3.5], np.float32)
    got = cortado.broadcast(special if rank == 0 else np.zeros(5, np.float32), 0, name="special")
    np.testing.assert_array_equal(got, special)
    return len(DTYPES) + 2


def check_buffer_protocol(rank, world):
    # The core takes any buffer-protocol object: array.array, bytearray, memoryview.
    rt = cortado._runtime.require("test")
    a = array.array("i", [rank + 1] * 9)
    rt.push_pull_buffer("buf.int32", a, a).wait(60)
    assert list(a) == [world * (world + 1) // 2] * 9, a
    b = bytearray([rank + 1] * 5)
    out = bytearray(5)
    rt.push_pull_buffer("buf.uint8", b, out).wait(60)
    assert list(out) == [world * (world + 1) // 2] * 5 and list(b) == [rank + 1] * 5
    strided = np.arange(20, dtype=np.float32)[::2]
    try:
        rt.push_pull_buffer("buf.strided", strided, strided)
        raise AssertionError("a strided buffer was accepted")
    except (cortado.CortadoError, BufferError, ValueError) as e:
        assert "contiguous" in str(e).lower(), e
    return 2


def main():
    args = parse_args()
    cortado.init()
    rank, world = cortado.rank(), cortado.size()
    assert 0 <= rank < world
    assert cortado.local_rank() == rank and cortado.local_size() == world
    checked = check_sums(rank, world)
    checked += check_async(rank, world)
    checked += check_broadcast(rank, world)
    checked += check_release(rank, world)
    checked += check_buffer_protocol(rank, world)
    write_result(args.out, rank, ok=True, checked=checked, world=world)
    cortado.shutdown()
    print(f"worker {rank}: {checked} checks passed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
