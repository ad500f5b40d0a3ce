"""Cortado for TensorFlow 2 and Keras 3, in the manner of horovod.tensorflow
and byteps.tensorflow.

    import cortado.tensorflow as ct
    ct.init()                                   # under `cortado launch`
    total = ct.push_pull(tf.ones(4), average=False)
    tape = ct.DistributedGradientTape(tape)     # a custom training loop
    opt = ct.DistributedOptimizer(keras.optimizers.SGD(0.01))   # model.fit
    callbacks = [ct.BroadcastGlobalVariablesCallback(0), ct.MetricAverageCallback()]

Every reduction goes through Cortado's engine (cortado._C: the servers, as for
cortado and cortado.torch); ops.py says how the op is built (a Python op:
eager, tf.function and model.fit; not XLA). The process's one Cortado worker
is shared with `cortado` (NumPy) and `cortado.torch`.
"""

try:
    import tensorflow as _tf  # noqa: F401
    import keras as _keras
except ImportError as _e:
    raise ImportError(
        f"cortado.tensorflow needs TensorFlow 2 with Keras 3 ({_e}). scripts/install_deps.sh "
        f"installs them (tensorflow-cpu, keras) into the project's virtual environment "
        f"(CORTADO_VENV, default .venv): run Python from there, e.g. .venv/bin/python") from _e
if not _keras.__version__.startswith("3."):
    raise ImportError(f"cortado.tensorflow needs Keras 3, and this Python has Keras "
                      f"{_keras.__version__}")

from .._runtime import (CortadoError, barrier, init, is_initialized, local_rank, local_size,
                        num_servers, pulled_bytes, pushed_bytes, rank, shutdown, size)
from ..compression import Compression, Compressor
from .ops import (DEFAULT_FUSION_BYTES, Average, Sum, allreduce, broadcast, broadcast_variables,
                  push_pull)
from .tape import DistributedGradientTape
from .keras import (BroadcastGlobalVariablesCallback, DistributedOptimizer,
                    MetricAverageCallback, load_model)
from . import keras

__all__ = [
    "CortadoError", "Compression", "Compressor", "init", "shutdown", "is_initialized", "rank",
    "size", "local_rank", "local_size", "num_servers", "barrier", "pushed_bytes", "pulled_bytes",
    "Average", "Sum", "DEFAULT_FUSION_BYTES", "push_pull",
    "allreduce", "broadcast", "broadcast_variables", "DistributedGradientTape",
    "DistributedOptimizer", "BroadcastGlobalVariablesCallback", "MetricAverageCallback",
    "load_model", "keras",
]
