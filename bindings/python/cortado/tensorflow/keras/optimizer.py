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
from ...compression import Compression
from ..ops import GradientReducer


class _Settings:
    """Held by the optimizer as one plain object, so that Keras's attribute
    tracking leaves it alone."""

    def __init__(self, reducer):
        self.reducer = reducer


class _DistributedOptimizer:
    # Its methods are mixed into the wrapped optimizer's class by
    # DistributedOptimizer().

    def apply(self, grads, trainable_variables=None):
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


def DistributedOptimizer(optimizer, compression=Compression.none, average=True,
                         name_prefix="grad"):
    """Wraps a Keras 3 optimizer so that its updates use gradients averaged
    (average=False: summed) over all workers; use it in model.compile() or
    in a custom loop's apply_gradients().

    - compression: a cortado.Compression member or name for every gradient
      (none, fp16, topk(0.01), ..., or "auto": the planner chooses per
      gradient).
    - name_prefix: gradients are named `<name_prefix>.<index>.<variable
      path>`; two optimizers over different variables in one job need
      different prefixes.
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
    reducer = GradientReducer("DistributedOptimizer", compression, average, name_prefix)
    _runtime.require("tensorflow.keras.DistributedOptimizer")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._cortado = _Settings(reducer)
    return wrapped


class _Loader:
    """What keras.models.load_model finds for an optimizer class's name:
    from_config() makes the optimizer and wraps it in DistributedOptimizer."""

    def __init__(self, cls, compression, average, name_prefix):
        self._cls = cls
        self._args = (compression, average, name_prefix)

    def from_config(self, config):
        return DistributedOptimizer(self._cls.from_config(config), *self._args)


def load_model(filepath, compression=Compression.none, average=True, name_prefix="grad",
               custom_objects=None, **kwargs):
    """keras.models.load_model for a model saved with a DistributedOptimizer
    (whose class Keras cannot find by itself): every Keras optimizer comes back
    wrapped in DistributedOptimizer (with these settings), its state restored.
    `custom_objects` and `kwargs` go to keras.models.load_model; an entry in
    `custom_objects` under an optimizer's class name takes precedence."""
    import keras

    objects = {}
    for attr in dir(keras.optimizers):
        cls = getattr(keras.optimizers, attr)
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer) \
                and cls is not keras.optimizers.Optimizer:
            objects[cls.__name__] = _Loader(cls, compression, average, name_prefix)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects, **kwargs)
