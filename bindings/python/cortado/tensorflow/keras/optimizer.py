"""DistributedOptimizer for Keras 3: any Keras optimizer whose updates use
gradients averaged (or summed) over all workers.

The wrapper is an object of a subclass of the optimizer's class, made from
the optimizer's config (Horovod's way), whose apply() -- which
apply_gradients() and model.fit's train step call -- first reduces the
gradients through the engine (ops.GradientReducer: inside model.fit's
tf.function, one start op per gradient, sent as soon as backward produced it,
and one wait op before the update), then runs the wrapped class's apply().
"""

from ... import _runtime
from ...compression import Compression, dgc_momentum, warn_momentum_twice
from ..ops import GradientReducer


class _Settings:
    """Held by the optimizer as one plain object, so that Keras's attribute
    tracking leaves it alone."""

    def __init__(self, reducer, passes=1, average_aggregated=False):
        self.reducer = reducer
        self.passes = passes
        self.average_aggregated = average_aggregated
        self.variables = None  # with passes > 1: the variables of the step being applied


class _DistributedOptimizer:
    # Its methods are mixed into the wrapped optimizer's class by
    # DistributedOptimizer().

    def apply(self, grads, trainable_variables=None):
        if self._cortado.passes > 1:
            # Keras accumulates (gradient_accumulation_steps); the reduction
            # runs on the update steps only, in _clip_gradients below.
            return super(self.__class__, self).apply(grads, trainable_variables)
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                # The wrapped apply() raises Keras's own error for this.
                return super(self.__class__, self).apply(grads, trainable_variables)
            variables = list(self._trainable_variables)
        else:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
        reduced = self._cortado.reducer.reduce(grads, variables)
        return super(self.__class__, self).apply(reduced, trainable_variables)

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The variables after Keras filtered those without a gradient: the
        # ones _clip_gradients' gradients belong to.
        if self._cortado.passes > 1:
            self._cortado.variables = list(trainable_variables)
        return super(self.__class__, self)._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        # With gradient accumulation Keras calls this on update steps only,
        # with the accumulated gradients averaged over the passes: they are
        # reduced over the workers here, before clipping (as they are with
        # one pass, where apply() reduces first).
        settings = self._cortado
        if settings.passes > 1 and settings.variables is not None:
            grads = settings.reducer.reduce(list(grads), settings.variables)
            if not settings.average_aggregated:
                grads = [None if g is None else g * settings.passes for g in grads]
        return super(self.__class__, self)._clip_gradients(grads)


def DistributedOptimizer(optimizer, compression=Compression.none, average=True,
                         name_prefix="grad", backward_passes_per_step=1,
                         average_aggregated_gradients=False, sparse_as_dense=False,
                         fusion_bytes=None):
    """Wraps a Keras 3 optimizer so that its updates use gradients averaged
    (average=False: summed) over all workers; use it in model.compile() or
    in a custom loop's apply_gradients().

    - compression: a cortado.Compression member or name for every gradient
      (none, fp16, topk(0.01), ..., or "auto": the planner chooses per
      gradient).
    - name_prefix: gradients are named `<name_prefix>.<index>.<variable
      path>`; two optimizers over different variables in one job need
      different prefixes.
    - backward_passes_per_step (Horovod's): gradients of this many steps
      are accumulated locally (Keras's gradient_accumulation_steps) and
      reduced over the workers once, on the step that updates the weights;
      summed over the passes, or averaged with
      average_aggregated_gradients=True. The wrapped optimizer must not set
      gradient_accumulation_steps itself.
    - sparse_as_dense: accepted for Horovod's scripts; sparse gradients
      (tf.IndexedSlices) are always made dense before they are reduced.
    - fusion_bytes: consecutive gradients in backward order of one dtype
      travel in fused groups that close at this many bytes or more, one
      push_pull (one encode, with compression) each; None: 4 MiB
      (cortado.tensorflow.DEFAULT_FUSION_BYTES); 0: every gradient on its
      own.
    Compile the model with jit_compile=False: XLA cannot compile the op (a
    train step traced with jit_compile=True raises CortadoError). Call
    cortado.tensorflow.init() first. Wrap a freshly made optimizer: its state
    (built variables) is not carried over, only its config.
    """
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise _runtime.error("invalid_argument",
                             f"cortado.tensorflow.keras.DistributedOptimizer wraps a Keras 3 "
                             f"optimizer (keras.optimizers.Optimizer), got "
                             f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise _runtime.error("invalid_argument",
                             f"cortado.tensorflow.keras.DistributedOptimizer: "
                             f"backward_passes_per_step must be an integer of at least 1, got "
                             f"{backward_passes_per_step!r}")
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise _runtime.error("invalid_argument",
                                 f"cortado.tensorflow.keras.DistributedOptimizer: the optimizer "
                                 f"already accumulates gradients (gradient_accumulation_steps="
                                 f"{config['gradient_accumulation_steps']}); use either it or "
                                 f"backward_passes_per_step={backward_passes_per_step}, not both")
        config["gradient_accumulation_steps"] = backward_passes_per_step
    reducer = GradientReducer("DistributedOptimizer", compression, average, name_prefix,
                              fusion_bytes)
    # DGC's momentum correction and the optimizer's own (SGD's momentum).
    warn_momentum_twice("cortado.tensorflow.keras.DistributedOptimizer",
                        dgc_momentum(compression), float(config.get("momentum") or 0),
                        stacklevel=2)
    _runtime.require("tensorflow.keras.DistributedOptimizer")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    wrapped = cls.from_config(config)
    wrapped._cortado = _Settings(reducer, backward_passes_per_step,
                                 bool(average_aggregated_gradients))
    return wrapped


class _Loader:
    """What keras.models.load_model finds for an optimizer class's name:
    from_config() makes the optimizer and wraps it in DistributedOptimizer."""

    def __init__(self, cls, compression, average, name_prefix, passes, average_aggregated,
                 fusion_bytes):
        self._cls = cls
        self._args = (compression, average, name_prefix)
        self._passes = passes
        self._average_aggregated = average_aggregated
        self._fusion_bytes = fusion_bytes

    def from_config(self, config):
        config = dict(config)
        saved = config.pop("gradient_accumulation_steps", None) or 1
        passes = self._passes if self._passes is not None else saved
        return DistributedOptimizer(self._cls.from_config(config), *self._args,
                                    backward_passes_per_step=passes,
                                    average_aggregated_gradients=self._average_aggregated,
                                    fusion_bytes=self._fusion_bytes)


def load_model(filepath, compression=Compression.none, average=True, name_prefix="grad",
               custom_objects=None, backward_passes_per_step=None,
               average_aggregated_gradients=False, fusion_bytes=None, **kwargs):
    """keras.models.load_model for a model saved with a DistributedOptimizer
    (whose class Keras cannot find by itself): every Keras optimizer comes back
    wrapped in DistributedOptimizer (with these settings), its state restored.
    backward_passes_per_step=None takes the saved optimizer's accumulation
    steps (1 when it had none). `custom_objects` and `kwargs` go to
    keras.models.load_model; an entry in `custom_objects` under an
    optimizer's class name takes precedence."""
    import keras

    objects = {}
    for attr in dir(keras.optimizers):
        cls = getattr(keras.optimizers, attr)
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer) \
                and cls is not keras.optimizers.Optimizer:
            objects[cls.__name__] = _Loader(cls, compression, average, name_prefix,
                                            backward_passes_per_step,
                                            average_aggregated_gradients, fusion_bytes)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects, **kwargs)
