"""Horovod's basics for cortado.torch: the reduction ops, process sets (the
global one only), and what the job and this build have (ranks beyond
cortado's own, the *_built() functions, barrier, the timeline stubs)."""

import warnings

from .. import _C, _runtime
from .._runtime import rank, size


def _error(code, message):
    return _runtime.error(code, message)


class ReduceOp(int):
    """A reduction op (an int, as Horovod's are); prints its name."""

    def __new__(cls, value, name):
        op = int.__new__(cls, value)
        op.op_name = name
        return op

    def __repr__(self):
        return f"cortado.torch.{self.op_name}"

    __str__ = __repr__


Average = ReduceOp(0, "Average")
Sum = ReduceOp(1, "Sum")
Adasum = ReduceOp(2, "Adasum")
Min = ReduceOp(3, "Min")
Max = ReduceOp(4, "Max")
Product = ReduceOp(5, "Product")
_OPS = {int(o): o for o in (Average, Sum, Adasum, Min, Max, Product)}


def resolve_op(op, average, api, allowed=(Average, Sum, Min, Max, Product)):
    """The ReduceOp that `op` (or Horovod's deprecated `average`) asks for;
    CortadoError for an unknown op, for Adasum, and for an op that `api`
    does not take."""
    if op is not None and average is not None:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: pass op= or the deprecated average=, not both")
    if op is None:
        if average is not None:
            warnings.warn(f"cortado.torch.{api}: average= is deprecated (as in Horovod); "
                          f"use op=Average or op=Sum", DeprecationWarning, stacklevel=3)
            return Average if average else Sum
        return Average
    if isinstance(op, bool) or not isinstance(op, int) or int(op) not in _OPS:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: unknown reduction op {op!r}: valid are "
                     f"{', '.join(o.op_name for o in allowed)}")
    op = _OPS[int(op)]
    if op is Adasum:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: op=Adasum is not implemented in Cortado (its "
                     f"pairwise scaled combination has no counterpart in the servers' sums): "
                     f"use op=Average (the gradient mean; scale the learning rate as for "
                     f"plain data-parallel training), or op=Sum")
    if op not in allowed:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: op={op.op_name} is not supported here: valid are "
                     f"{', '.join(o.op_name for o in allowed)}")
    return op


class ProcessSet:
    """Horovod's process sets: Cortado has the global one only."""

    def __init__(self, ranks=None):
        self.ranks = ranks

    def size(self):
        return size()

    def rank(self):
        return rank()

    def included(self):
        return True

    def __repr__(self):
        return "cortado.torch.global_process_set"


global_process_set = ProcessSet()


def _check_process_set(process_set, api):
    if process_set is not None and process_set is not global_process_set:
        raise _error("invalid_argument",
                     f"cortado.torch.{api}: process sets other than global_process_set are not "
                     f"supported: every Cortado operation spans all workers of the job")


def add_process_set(process_set):
    raise _error("invalid_argument",
                 "cortado.torch.add_process_set: process sets other than the global one are "
                 "not supported: every Cortado operation spans all workers of the job")


def remove_process_set(process_set):
    return add_process_set(process_set)



def barrier(process_set=global_process_set, timeout=None):
    """Returns when every worker entered the barrier (the scheduler's), or
    raises CortadoError after `timeout` seconds (None: CORTADO_TIMEOUT_MS).
    A number as the first argument is the timeout, as cortado.barrier takes it."""
    if isinstance(process_set, (int, float)) and not isinstance(process_set, bool):
        process_set, timeout = global_process_set, process_set
    _check_process_set(process_set, "barrier")
    _runtime.barrier(timeout)


def cross_rank():
    """The index of this worker's machine (rank // local_size())."""
    rt = _runtime.require("cross_rank")
    return rt.rank // max(rt.local_size, 1)


def cross_size():
    """The number of machines (size // local_size())."""
    rt = _runtime.require("cross_size")
    return max(rt.size // max(rt.local_size, 1), 1)


def is_homogeneous():
    """True when every machine runs local_size() workers."""
    rt = _runtime.require("is_homogeneous")
    return rt.size % max(rt.local_size, 1) == 0


def nccl_built():
    """Whether this build's core has NCCL collectives (cortado.torch's
    operations go through the servers either way)."""
    return bool(getattr(_C, "built_with_nccl", False))


def mpi_built():
    """Whether this build's core has MPI collectives (Python workers run
    without MPI groups)."""
    return bool(getattr(_C, "built_with_mpi", False))


def gloo_built():
    """False: Cortado has no Gloo."""
    return False


def cuda_built():
    """Whether this build has CUDA (CUDA tensors are accepted either way when
    torch has CUDA: they are staged through host memory)."""
    return bool(_C.built_with_cuda)


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def mpi_enabled():
    """False: Python workers do not run MPI."""
    return False


def gloo_enabled():
    return False


def mpi_threads_supported():
    """False: Python workers do not run MPI (every call may come from any
    thread; blocking calls release the GIL)."""
    return False


def start_timeline(file_path, mark_cycles=False):
    """Horovod's timeline: Cortado traces with `cortado launch --trace DIR`
    (CORTADO_TRACE_DIR) instead; this warns and does nothing."""
    warnings.warn("cortado.torch.start_timeline does nothing: trace a Cortado job with "
                  "`cortado launch --trace DIR` (docs/tracing.md)")


def stop_timeline():
    """See start_timeline."""
