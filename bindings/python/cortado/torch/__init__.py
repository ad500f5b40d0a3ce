"""Cortado for PyTorch, in the manner of horovod.torch and byteps.torch.

    import cortado.torch as ct
    ct.init()
    optimizer = ct.DistributedOptimizer(optimizer, model.named_parameters())
    ct.broadcast_parameters(model.state_dict(), root_rank=0)
    ct.broadcast_optimizer_state(optimizer, root_rank=0)

This layer is pure Python over the C++ core (cortado._C): a tensor reaches the
engine as (data_ptr(), numel(), dtype), so it must be a contiguous CPU tensor
of a supported dtype; anything else raises CortadoError before any data moves.
The tensors stay referenced until their operation completes.
"""

from .. import _runtime
from .._runtime import (CortadoError, Handle, barrier, init, is_initialized, local_rank,
                        local_size, num_servers, poll, rank, shutdown, size, synchronize)
from ..compression import Compression, Compressor
from .ops import (DTYPES, broadcast, broadcast_, broadcast_async_, broadcast_parameters,
                  check_tensor, push_pull, push_pull_, push_pull_async, push_pull_async_)
from .optimizer import DistributedOptimizer, broadcast_optimizer_state

__all__ = [
    "CortadoError", "Compression", "Compressor", "Handle", "init", "shutdown", "is_initialized",
    "rank", "size", "local_rank", "local_size", "num_servers", "barrier", "push_pull",
    "push_pull_", "push_pull_async", "push_pull_async_", "poll", "synchronize", "broadcast",
    "broadcast_", "broadcast_async_", "broadcast_parameters", "broadcast_optimizer_state",
    "DistributedOptimizer",
]
