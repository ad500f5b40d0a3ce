"""cortado.tensorflow for Keras 3 (model.fit), in the manner of
horovod.tensorflow.keras:

    import cortado.tensorflow.keras as ck
    ck.init()
    model.compile(optimizer=ck.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=..., jit_compile=False)
    model.fit(x, y, callbacks=[ck.callbacks.BroadcastGlobalVariablesCallback(0),
                               ck.callbacks.MetricAverageCallback()])
"""

from .. import (DEFAULT_FUSION_BYTES, Average, Compression, Compressor, CortadoError, Sum,
                allreduce, barrier,
                broadcast, broadcast_variables, init, is_initialized, local_rank, local_size,
                num_servers, pulled_bytes, push_pull, pushed_bytes, rank, shutdown, size)
from . import callbacks
from .callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback
from .optimizer import DistributedOptimizer, load_model

__all__ = [
    "DEFAULT_FUSION_BYTES", "Average", "Compression", "Compressor", "CortadoError", "Sum",
    "allreduce", "barrier", "broadcast", "broadcast_variables", "init", "is_initialized",
    "local_rank", "local_size",
    "num_servers", "pulled_bytes", "push_pull", "pushed_bytes", "rank", "shutdown", "size",
    "callbacks", "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback", "DistributedOptimizer", "load_model",
]
