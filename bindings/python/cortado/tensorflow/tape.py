"""DistributedGradientTape: a tf.GradientTape whose gradient() averages the
gradients over all workers (Horovod's DistributedGradientTape).

    with tf.GradientTape() as tape:
        loss = ...
    tape = cortado.tensorflow.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

The wrapped tape's recording is taken over (its state is copied into an
object of a subclass of its class), so the result is still a tf.GradientTape;
wrapping it before `with` works too. Gradients are reduced as ops.py
describes (GradientReducer), eagerly or inside a tf.function.
"""

import tensorflow as tf

from ..compression import Compression
from .ops import GradientReducer


class _DistributedGradientTape(tf.GradientTape):
    # Mixed into the wrapped tape's class by DistributedGradientTape().

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        reduced = self._cortado_reducer.reduce(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape, compression=Compression.none, average=True,
                            name_prefix="tape", sparse_as_dense=False, fusion_bytes=None):
    """Wraps `gradtape` so that gradient() returns gradients averaged (or, with
    average=False, summed) over all workers.

    - compression: a cortado.Compression member or name for every gradient
      (none, fp16, topk(0.01), ..., or "auto": the planner chooses per
      gradient, planned once per set of sources).
    - name_prefix: gradients are named `<name_prefix>.<index>.<variable path>`;
      two tapes whose sources differ at the same index need different
      prefixes.
    - sparse_as_dense: accepted for Horovod's scripts; sparse gradients
      (tf.IndexedSlices) are always made dense before they are reduced.
    - fusion_bytes: consecutive gradients in backward order of one dtype
      travel in fused groups that close at this many bytes or more, one
      push_pull each; None: 4 MiB (DEFAULT_FUSION_BYTES); 0: every
      gradient on its own.
    Every worker must take the gradients of the same sources.
    """
    reducer = GradientReducer("DistributedGradientTape", compression, average, name_prefix,
                              fusion_bytes)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               dict(_DistributedGradientTape.__dict__))
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._cortado_reducer = reducer
    return tape
