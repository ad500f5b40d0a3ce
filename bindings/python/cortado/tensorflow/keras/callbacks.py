"""Keras callbacks of cortado.tensorflow.keras (Horovod's names).

BroadcastGlobalVariablesCallback makes every worker start from root_rank's
weights; MetricAverageCallback replaces each epoch's metrics by their average
over the workers, before the callbacks after it in the list see them.
"""

import numbers
import zlib

import keras
import numpy as np

from ... import push_pull
from ..ops import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, overwrites every worker's model variables
    (and the optimizer's, when it has built them: a restored checkpoint) with
    root_rank's. Once per callback object: a second fit() keeps training from
    where the workers are."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(self.model.variables, self.root_rank, prefix="broadcast.model")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built and optimizer.variables:
            broadcast_variables(optimizer.variables, self.root_rank,
                                prefix="broadcast.optimizer")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, replaces every numeric entry of `logs` (loss,
    metrics, validation metrics) by its average over the workers: one
    push_pull of all of them. Put it before the callbacks that read the
    metrics (ModelCheckpoint, ReduceLROnPlateau, EarlyStopping)."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items()
                      if isinstance(v, (numbers.Number, np.generic)) and not isinstance(v, bool))
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        # The name carries the keys, so an epoch with validation metrics and
        # one without are different tensors.
        name = f"metric_average.{zlib.crc32(','.join(keys).encode()):08x}"
        averaged = push_pull(values, name=name, average=True)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)
