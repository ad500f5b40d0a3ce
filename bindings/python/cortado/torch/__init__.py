"""Cortado for PyTorch, with the APIs of both horovod.torch and byteps.torch.

    import cortado.torch as hvd          # or: as bps
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters(), op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

This layer is pure Python over the C++ core (cortado._C): a tensor reaches the
engine as (data_ptr(), numel(), dtype), so it must be a contiguous CPU (or
CUDA) tensor of a supported dtype; anything else raises CortadoError before
any data moves. The tensors stay referenced until their operation completes.
BytePS's calls (push_pull*) are in ops.py; Horovod's (allreduce, allgather,
broadcast, alltoall, reducescatter, objects, join, the ops Average/Sum/Min/
Max/Product) in horovod.py, which says how each is built from push_pull
(horovod_basics.py: ops, process sets, build queries; horovod_checks.py: what
workers compare before a name's first use);
SyncBatchNorm in sync_batch_norm.py; DistributedOptimizer (both APIs) in
optimizer.py, its groups by size in fusion.py.
"""

from .. import _runtime
from .._runtime import (CortadoError, Handle, init, is_initialized, local_rank, local_size,
                        num_servers, poll, pulled_bytes, pushed_bytes, rank, shutdown, size,
                        synchronize)
from ..compression import Compression, Compressor
from .horovod import (allgather, allgather_async, allgather_object, allreduce, allreduce_,
                      allreduce_async, allreduce_async_, alltoall, alltoall_async, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, broadcast_object,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, join, reducescatter, reducescatter_async)
from .horovod_basics import (Adasum, Average, Max, Min, Product, ProcessSet, ReduceOp, Sum,
                             add_process_set, barrier, ccl_built, cross_rank, cross_size,
                             cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set,
                             is_homogeneous, mpi_built, mpi_enabled, mpi_threads_supported,
                             nccl_built, remove_process_set, rocm_built, start_timeline,
                             stop_timeline)
from .ops import (DTYPES, broadcast_parameters, check_tensor, push_pull, push_pull_,
                  push_pull_async, push_pull_async_)
from .optimizer import (DEFAULT_ENGINE_FUSION_BYTES, DEFAULT_FUSION_BYTES,
                        DistributedOptimizer, broadcast_optimizer_state)
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    # both
    "CortadoError", "Compression", "Compressor", "Handle", "init", "shutdown", "is_initialized",
    "rank", "size", "local_rank", "local_size", "barrier", "poll", "synchronize",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_parameters",
    "broadcast_optimizer_state", "DistributedOptimizer", "DEFAULT_FUSION_BYTES",
    "DEFAULT_ENGINE_FUSION_BYTES",
    # BytePS
    "num_servers", "push_pull", "push_pull_", "push_pull_async", "push_pull_async_",
    "pushed_bytes", "pulled_bytes",
    # Horovod
    "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "broadcast_object", "allgather_object", "join", "SyncBatchNorm", "cross_rank",
    "cross_size", "is_homogeneous", "nccl_built", "mpi_built", "gloo_built", "cuda_built",
    "rocm_built", "ddl_built", "ccl_built", "mpi_enabled", "gloo_enabled",
    "mpi_threads_supported", "start_timeline", "stop_timeline", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set",
]
