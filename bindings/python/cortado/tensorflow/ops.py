"""Tensor operations of cortado.tensorflow: push_pull (allreduce), broadcast,
broadcast_variables, and the reduction of a step's gradients.

The op is a Python op over the C++ core (cortado._C). In eager mode these
functions run at once on the tensors' NumPy views. Inside a tf.function (and
so in `model.fit`, whose train step Keras traces into one) they become
`tf.py_function` ops, which TensorFlow's executor runs on its inter-op
threads as soon as their inputs are ready; the engine releases the GIL while
it waits. A step's gradients are reduced by two kinds of op: one start op per
fused group of gradients (or per gradient on its own), which hands the
group's concatenation to the engine as one tensor and returns at once (a
token), and one wait op that takes every token and returns the reduced
gradients, each group's result split back into its gradients. In a graph a
start op runs as soon as backward produced the last gradient of its group,
so the engine sends it while the rest of the backward pass runs; in eager
mode the tape has computed every gradient before the first is sent, and the
engine still overlaps them with one another (chunks over every server, in
priority order).

Fused groups (fusion_groups) are consecutive gradients in backward order of
one dtype and compression, each closed at the gradient that brings it to
`fusion_bytes` or more (default DEFAULT_FUSION_BYTES, 4 MiB, as
cortado.torch's default path): one push_pull, one encode and one residual
per group instead of per gradient, as Horovod's fusion buffer. The groups
are a pure function of the gradients' names, dtypes, sizes and compression,
so every worker makes the same ones without exchanging them. A group's
push_pull runs in place in an array that the group keeps from step to step
(as a lone gradient keeps its result array), since TensorFlow copies the
results into its tensors (Reduction.result_array).

Every worker declares all of a step's gradients, in variable order, in the
first start op that runs (under a lock), so that start ops that run in
another order on another worker never wait on one another's declarations.

XLA cannot compile a Python op: a call traced inside a function compiled with
`jit_compile=True` raises CortadoError when it is traced, saying what to do.
A graph holding these ops cannot be saved as a SavedModel that runs without
this process (py_function ops are not serialized).
"""

import collections
import functools
import hashlib
import itertools
import threading

import numpy as np
import tensorflow as tf

from .. import _runtime
from .._runtime import synchronize
from ..compression import AutoCompression, Compression
from ..fusion import consecutive_groups

# What the engine sums, by NumPy dtype name (TensorFlow's bfloat16 arrives
# in NumPy as ml_dtypes' bfloat16, whose name is "bfloat16").
ENGINE_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")

# The default size at which a fused group of gradients closes (as
# cortado.torch's DEFAULT_ENGINE_FUSION_BYTES: about one server partition,
# so that the first group of the backward pass leaves early).
DEFAULT_FUSION_BYTES = 4 << 20

# Reduction ops, as Horovod names them (allreduce's op=).
Average = "average"
Sum = "sum"


class Error(_runtime.CortadoError):
    """A CortadoError raised by cortado.tensorflow itself (code, by default
    invalid_argument, as CortadoError's)."""

    code = "invalid_argument"
    # AutoGraph re-raises an error from traced code (a tf.function's body) as
    # a new object of the same type only when the type is constructed from a
    # message alone, as Exception is; of any other type it raises a
    # StagingError. So `except CortadoError` catches these inside tf.function.
    __init__ = Exception.__init__


class XlaUnsupportedError(Error):
    """Cortado's op traced inside a function compiled with XLA."""


def _error(api, message, code="invalid_argument"):
    e = Error(f"cortado.tensorflow.{api}: {message}")
    e.code = code
    return e


def check_not_xla(api):
    """Raises CortadoError when the graph being traced is compiled with XLA."""
    if tf.executing_eagerly():
        return
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):  # another TensorFlow's internals: cannot tell
        return
    if in_xla:
        raise XlaUnsupportedError(
            f"cortado.tensorflow.{api}: called inside a function compiled with XLA "
            f"(jit_compile=True). Cortado's op hands tensors to the engine from Python "
            "(tf.py_function), which XLA cannot compile. Compile without XLA: "
            "model.compile(..., jit_compile=False), or tf.function(jit_compile=False); XLA "
            "may still compile the rest through auto-clustering "
            "(tf.config.optimizer.set_jit(True)), which leaves Cortado's ops outside its "
            "clusters")


def _tf_dtype(dtype):
    return tf.as_dtype(dtype)  # Keras 3 variables give their dtype as a string


def _engine_dtype(tf_dtype):
    name = tf_dtype.name
    return name if name in ENGINE_DTYPES else None


def _as_array(tensor):
    """A C-contiguous NumPy array holding `tensor`, to be read only: for a
    CPU tensor a view of its memory (np.asarray; the array keeps that memory
    alive), where Tensor.numpy() would copy it."""
    return np.ascontiguousarray(np.asarray(tensor))


@functools.lru_cache(maxsize=None)
def _tf_copies_arrays():
    """Whether tf.convert_to_tensor copies a NumPy array into the tensor it
    makes (TensorFlow 2.17 does, aligned or not, as py_function does with
    the arrays its function returns) rather than sharing its memory: only
    then may a reduction's results be views into arrays that the next step
    writes again (Reduction.result_array)."""
    raw = np.zeros(4096 + 64, np.uint8)
    start = -raw.ctypes.data % 64
    array = raw[start:start + 4096].view(np.float32)
    tensor = tf.convert_to_tensor(array)
    array[:] = 1.0
    return not tensor.numpy().any()


class _Spec:
    """One tensor of a reduction: its name, dtype, element count (None when the
    shape is not known when traced), average or sum, priority, compressor."""

    __slots__ = ("name", "dtype", "count", "average", "priority", "compressor")

    def __init__(self, name, dtype, count, average, priority, compressor):
        self.name = name
        self.dtype = dtype
        self.count = count
        self.average = average
        self.priority = priority
        self.compressor = compressor


def _check_compressor(api, name, dtype, compressor):
    if compressor.engine_codec is not None and dtype != tf.float32:
        raise _error(api, f"tensor '{name}' is {dtype.name}, but compression "
                          f"'{compressor.engine_codec[0]}' encodes float32 tensors: cast it "
                          f"with tf.cast(..., tf.float32), or use compression none or fp16 "
                          f"for it")
    if _engine_dtype(dtype) is None:
        raise _error(api, f"tensor '{name}' has dtype {dtype.name}, which Cortado does not "
                          f"sum; supported: {', '.join(ENGINE_DTYPES)}")


def make_specs(api, names, dtypes, shapes, average, compression, priorities=None):
    """The specs of one reduction; "auto" compression is planned here, for all
    of its tensors together (in the order given: model order)."""
    rt = _runtime.require(f"tensorflow.{api}")
    compressor = Compression.lookup(compression)
    counts = [int(np.prod(s.as_list())) if s.is_fully_defined() else None for s in shapes]
    if isinstance(compressor, AutoCompression):
        if any(c is None for c in counts):
            raise _error(api, "compression 'auto' plans tensors by their size, and some "
                              "shapes are not known when the function is traced")
        chosen = compressor.plan([(n, c, d.size) for n, c, d in zip(names, counts, dtypes)],
                                 rt.size)
        compressors = [chosen.get(n, Compression.none) for n in names]
    else:
        compressors = [compressor] * len(names)
    if priorities is None:
        priorities = [0] * len(names)
    specs = []
    for n, d, c, p, comp in zip(names, dtypes, counts, priorities, compressors):
        _check_compressor(api, n, d, comp)
        specs.append(_Spec(n, d, c, average, p, comp))
    return specs


def check_fusion_bytes(api, fusion_bytes):
    """fusion_bytes as given (None: DEFAULT_FUSION_BYTES), or CortadoError."""
    if fusion_bytes is None:
        return DEFAULT_FUSION_BYTES
    if isinstance(fusion_bytes, bool) or not isinstance(fusion_bytes, int) or fusion_bytes < 0:
        raise _error(api, f"fusion_bytes must be a number of bytes (0: every gradient on its "
                          f"own), got {fusion_bytes!r}")
    return fusion_bytes


def fusion_groups(specs, order, fusion_bytes):
    """The fused groups of one reduction: consecutive specs in `order` (the
    backward order) of one dtype, compression and averaging whose element
    counts are known, each group closed at the spec that brings it to
    `fusion_bytes` or more (cortado.fusion.consecutive_groups). A group of
    one is no group; fusion_bytes 0 makes none. A list of groups, each a
    list of indices into `specs` in `order`."""
    return consecutive_groups(
        order, fusion_bytes,
        lambda i: (specs[i].dtype, specs[i].compressor, specs[i].average),
        lambda i: specs[i].count * specs[i].dtype.size,
        lambda i: not specs[i].count)  # a size unknown when traced, or empty: on its own


def _group_spec(specs, members):
    """The engine tensor of a fused group: named after its first gradient,
    its size and a digest of its members (so that two reductions that group
    other gradients under one prefix never share a name), with their dtype,
    compression and the highest of their priorities."""
    first = specs[members[0]]
    digest = hashlib.sha1("\n".join(f"{specs[i].name}:{specs[i].count}"
                                     for i in members).encode()).hexdigest()[:12]
    return _Spec(f"{first.name}.group{len(members)}.{digest}", first.dtype,
                 sum(specs[i].count for i in members), first.average,
                 max(specs[i].priority for i in members), first.compressor)


class Reduction:
    """What one reduction pushes: `units`, in start order, each (spec,
    members) for a fused group (its engine tensor and its gradients'
    indices, in the order they are concatenated) or a gradient on its own
    (its spec and [its index]); `declared`, the units' specs in the order
    every worker declares them (by their first gradient's index)."""

    def __init__(self, specs, order=None, fusion_bytes=0):
        order = list(range(len(specs))) if order is None else list(order)
        groups = fusion_groups(specs, order, fusion_bytes)
        group_of = {m[0]: m for m in groups}
        grouped = {i for m in groups for i in m}
        self.units = []
        for i in order:
            if i in group_of:
                self.units.append((_group_spec(specs, group_of[i]), group_of[i]))
            elif i not in grouped:
                self.units.append((specs[i], [i]))
        self.declared = [u[0] for u in sorted(self.units, key=lambda u: min(u[1]))]
        self.groups = groups
        self._buffers = {}  # unit index -> its result array, reused from step to step
        self._busy = set()  # units whose array a push_pull in flight is using
        self._lock = threading.Lock()

    def result_array(self, unit, count, dtype):
        """A flat array of `count` elements of `dtype` into which unit's
        push_pull writes its result (a fused group's also starts in it: the
        group's push_pull runs in place). The unit's own array, kept from
        step to step, so that a step writes into memory the last one
        already touched instead of a new model-sized allocation whose pages
        the kernel must fault in and zero; a new array where TensorFlow
        would share the results' memory instead of copying them
        (_tf_copies_arrays), or while the unit's array is still in use (a
        second call of the same reduction before the first one's results
        were taken)."""
        if not _tf_copies_arrays():
            return np.empty(count, dtype)
        with self._lock:
            buf = self._buffers.get(unit)
            if unit in self._busy:
                return np.empty(count, dtype)
            if buf is None or buf.size != count or buf.dtype != dtype:
                buf = self._buffers[unit] = np.empty(count, dtype)
            self._busy.add(unit)
            return buf

    def results_taken(self, unit):
        """Unit's results were copied out of its array (into tf.Tensors):
        the next step may write into it. (A step whose push_pull failed
        never says so: its array stays in use, and later steps take new
        ones, as a push_pull still in flight may write into it.)"""
        with self._lock:
            self._busy.discard(unit)


_declare_lock = threading.Lock()


def declare_all(specs):
    """Declares every spec that is not declared yet, in the order given (the
    same on every worker). Specs of unknown size are declared by their first
    push_pull instead; empty ones never (nothing is sent for them)."""
    rt = _runtime.require("tensorflow.push_pull")
    with _declare_lock:
        for s in specs:
            if not s.count or rt.is_declared(s.name):
                continue
            sent, _ = s.compressor.compress(np.empty(0, dtype=s.dtype.as_numpy_dtype))
            _runtime.declare(rt, s.name, sent.dtype.name, s.count, s.compressor.engine_codec)


def _submit(api, spec, array, output=None):
    """Starts the push_pull of `array` (NumPy) as `spec` says; a Handle whose
    result is `output` (an array of the same shape and dtype, `array` itself
    to run in place; None: a new one)."""
    array = np.ascontiguousarray(array)
    output = np.empty_like(array) if output is None else output
    compressor = spec.compressor
    sent, ctx = compressor.compress(array)
    if sent is array:
        inp, out = array, output

        def finish():
            return output
    else:
        inp = out = sent

        def finish():
            output[...] = compressor.decompress(out, ctx).reshape(output.shape)
            return output
    dtype = inp.dtype.name
    if dtype not in ENGINE_DTYPES:
        raise _error(api, f"tensor '{spec.name}' has dtype {dtype}, which Cortado does not sum")
    return _runtime.submit(f"tensorflow.{api}", spec.name, dtype, inp.size, inp.ctypes.data,
                           out.ctypes.data, spec.average, spec.priority,
                           (inp, out, array, output), finish, compressor.engine_codec)


class _Started:
    """A unit's push_pull in flight: its handle, the Reduction and unit
    whose result array it writes, and for a fused group the shapes of its
    gradients, into which results() splits the sum."""

    __slots__ = ("handle", "reduction", "unit", "shapes")

    def __init__(self, handle, reduction, unit, shapes=None):
        self.handle = handle
        self.reduction = reduction
        self.unit = unit
        self.shapes = shapes

    def results(self):
        """The unit's results: views into its result array, valid until
        taken() (the caller copies them into tf.Tensors first)."""
        out = synchronize(self.handle)
        if self.shapes is None:
            return [out]
        parts, at = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape))
            parts.append(out[at:at + n].reshape(shape))
            at += n
        return parts

    def taken(self):
        self.reduction.results_taken(self.unit)


def _start_unit(api, reduction, unit, arrays):
    """Starts the push_pull of one unit of `reduction`: a gradient's array
    into the unit's result array, or a fused group's arrays concatenated
    into the unit's result array and reduced there, in place."""
    spec = reduction.units[unit][0]
    if len(arrays) == 1:
        array = np.ascontiguousarray(arrays[0])
        output = reduction.result_array(unit, array.size, array.dtype).reshape(array.shape)
        return _Started(_submit(api, spec, array, output), reduction, unit)
    flats = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    buf = reduction.result_array(unit, sum(f.size for f in flats), flats[0].dtype)
    np.concatenate(flats, out=buf)
    return _Started(_submit(api, spec, buf, buf), reduction, unit, [a.shape for a in arrays])


class _Inflight:
    """Handles of started push_pulls by token, from a start op to its wait op."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._handles = {}

    def put(self, handle):
        with self._lock:
            token = next(self._tokens)
            self._handles[token] = handle
        return token

    def take(self, token):
        with self._lock:
            handle = self._handles.pop(int(token), None)
        if handle is None:
            raise _error("push_pull", f"no push_pull in flight has token {int(token)} (its "
                                      f"start op did not run in this process)", "internal")
        return handle


_inflight = _Inflight()


def _start_op(api, reduction, unit, *tensors):
    declare_all(reduction.declared)
    return np.int64(_inflight.put(_start_unit(api, reduction, unit,
                                              [_as_array(t) for t in tensors])))


def _wait_op(*tokens):
    # TensorFlow copies the arrays returned into its tensors when this
    # returns (_tf_copies_arrays); the next step's start ops, which write
    # into the same arrays, depend on those tensors through the update.
    started = [_inflight.take(t) for t in tokens]
    results = [r for s in started for r in s.results()]
    for s in started:
        s.taken()
    return results


def reduce_tensors(api, tensors, specs, order=None, reduction=None):
    """push_pulls `tensors` (dense tf.Tensors, one per spec) and returns the
    results, in the same order. `order` is the order in which to start them
    (indices; default: as given): the gradient-ready order for gradients.
    `reduction` (a Reduction of these specs) fuses groups of them; default
    none, each tensor on its own."""
    if not tensors:
        return []
    if reduction is None:
        reduction = Reduction(specs, order)
    if tf.executing_eagerly():
        declare_all(reduction.declared)
        started = [_start_unit(api, reduction, u, [_as_array(tensors[i]) for i in members])
                   for u, (_, members) in enumerate(reduction.units)]
        out = [None] * len(tensors)
        for (_, members), s in zip(reduction.units, started):
            for i, r in zip(members, s.results()):
                out[i] = tf.convert_to_tensor(r, dtype=specs[i].dtype)
            s.taken()
        return out
    check_not_xla(api)
    tokens = [tf.py_function(functools.partial(_start_op, api, reduction, u),
                             [tensors[i] for i in members], Tout=tf.int64, name="CortadoStart")
              for u, (_, members) in enumerate(reduction.units)]
    flat = [i for _, members in reduction.units for i in members]
    outputs = tf.py_function(_wait_op, tokens, Tout=[specs[i].dtype for i in flat],
                             name="CortadoWait")
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    out = [None] * len(tensors)
    for i, o in zip(flat, outputs):
        o.set_shape(tensors[i].shape)
        out[i] = o
    return out


def _single(api, tensor, name, average, priority, compression):
    tensor = tf.convert_to_tensor(tensor)
    name = name if name is not None else _runtime.auto_name(api)
    if not isinstance(name, str):
        raise _error(api, f"name must be a string or None, got {type(name).__name__} {name!r}")
    specs = make_specs(api, [name], [tensor.dtype], [tensor.shape], bool(average), compression,
                       [int(priority)])
    if not tensor.dtype.is_floating:
        return reduce_tensors(api, [tensor], specs)[0]

    # Differentiable as Horovod's allreduce: every worker's loss depends on
    # the one result, so the gradient of a sum (average) is the sum
    # (average) of the workers' gradients: a push_pull of its own, named
    # `<name>.grad`, which every worker runs when it takes the gradient.
    @tf.custom_gradient
    def reduced(x):
        def grad(dy):
            dy = tf.convert_to_tensor(dy)
            grad_specs = make_specs(api, [f"{name}.grad"], [dy.dtype], [dy.shape],
                                    bool(average), compression, [int(priority)])
            return reduce_tensors(api, [dy], grad_specs)[0]
        return reduce_tensors(api, [x], specs)[0], grad

    return reduced(tensor)


def push_pull(tensor, name=None, average=True, priority=0, compression=None):
    """Sums (average=False) or averages `tensor` over all workers (BytePS's name).

    Works in eager mode and inside tf.function (not under XLA). Every worker
    must use the same `name` for the same tensor (dtype and element count);
    an unnamed call is named by call order when it runs eagerly, or when it
    is traced inside a tf.function (one name per op, reused on every run).
    `compression`: as cortado.Compression (none, fp16, the engine codecs,
    "auto"). Higher `priority` is sent first. For floating-point tensors the
    op has a gradient: the push_pull (sum or average) of the workers'
    gradients, as a tensor named `<name>.grad`.
    """
    return _single("push_pull", tensor, name, average, priority, compression)


def allreduce(tensor, average=None, name=None, compression=None, op=None, priority=0):
    """Horovod's name for push_pull: op=Average (the default) or Sum;
    `average` is Horovod's older spelling of the same choice."""
    if op is not None and average is not None:
        raise _error("allreduce", "pass op= or average=, not both")
    if op is None:
        op = Sum if average is False else Average
    if op not in (Average, Sum):
        raise _error("allreduce", f"op {op!r} is not supported: cortado.tensorflow reduces "
                                  f"with Average or Sum")
    return _single("allreduce", tensor, name, op == Average, priority, compression)


# -- broadcast ---------------------------------------------------------------

def _broadcast_submit(api, name, array, root_rank):
    """Starts the broadcast of `array`: a sum in which the workers other than
    root_rank contribute zeros (exact for every dtype). A dtype the engine does
    not sum travels as its bytes (uint8)."""
    rt = _runtime.require(f"tensorflow.{api}")
    array = np.ascontiguousarray(array)
    carrier = array if array.dtype.name in ENGINE_DTYPES else array.reshape(-1).view(np.uint8)
    source = carrier if rt.rank == root_rank else np.zeros_like(carrier)
    spec = _Spec(name, None, carrier.size, False, 0, Compression.none)
    handle = _submit(api, spec, source)

    def finish():
        out = synchronize(handle)
        return out if carrier is array else out.view(array.dtype).reshape(array.shape)
    return finish


def _check_root(api, root_rank):
    rt = _runtime.require(f"tensorflow.{api}")
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < rt.size:
        raise _error(api, f"root_rank {root_rank!r} is out of range for {rt.size} workers")


def _broadcast_arrays(api, names, arrays, root_rank):
    finishes = [_broadcast_submit(api, n, a, root_rank) for n, a in zip(names, arrays)]
    return [f() for f in finishes]


def broadcast(tensor, root_rank, name=None):
    """Returns root_rank's `tensor` on every worker (eager or inside tf.function)."""
    api = "broadcast"
    _check_root(api, root_rank)
    tensor = tf.convert_to_tensor(tensor)
    name = name if name is not None else _runtime.auto_name(api)
    if tf.executing_eagerly():
        return tf.convert_to_tensor(
            _broadcast_arrays(api, [name], [_as_array(tensor)], root_rank)[0], dtype=tensor.dtype)
    check_not_xla(api)
    out = tf.py_function(lambda t: _broadcast_arrays(api, [name], [_as_array(t)], root_rank)[0],
                         [tensor], Tout=tensor.dtype, name="CortadoBroadcast")
    out.set_shape(tensor.shape)
    return out


def variable_name(variable, index):
    """A variable's name for its tensors: its position and its Keras path (or
    its TensorFlow name), the same on every worker that built the same model."""
    label = getattr(variable, "path", None) or getattr(variable, "name", None) or "variable"
    return f"{index}.{label}"


def broadcast_variables(variables, root_rank, prefix="broadcast.variables"):
    """Overwrites every worker's `variables` (tf.Variable or Keras variables)
    with root_rank's. Eagerly it returns once all arrived; inside a
    tf.function it returns the op that assigns them. Every worker must pass the
    same variables (same names, shapes and dtypes, in the same order)."""
    api = "broadcast_variables"
    _check_root(api, root_rank)
    variables = list(variables)
    names = [f"{prefix}.{variable_name(v, i)}" for i, v in enumerate(variables)]
    if tf.executing_eagerly():
        values = _broadcast_arrays(api, names, [_as_array(tf.convert_to_tensor(v))
                                                for v in variables], root_rank)
        for v, value in zip(variables, values):
            v.assign(value)
        return None
    check_not_xla(api)
    if not variables:
        return tf.no_op()
    dtypes = [_tf_dtype(v.dtype) for v in variables]
    values = tf.py_function(
        lambda *ts: _broadcast_arrays(api, names, [_as_array(t) for t in ts], root_rank),
        [tf.convert_to_tensor(v) for v in variables], Tout=dtypes, name="CortadoBroadcast")
    if not isinstance(values, (list, tuple)):
        values = [values]
    assigns = []
    for v, value in zip(variables, values):
        value.set_shape(v.shape)
        assigns.append(v.assign(value))
    return tf.group(*assigns)


# -- gradients ---------------------------------------------------------------

# The reductions that GradientReducers made, by everything that decides
# them, the most recently used last: a script that wraps a new tape every
# step (as Horovod's eager examples do) gets the same Reduction, its groups
# planned once ("auto" included) and its result arrays reused. A traced
# function keeps its own reference, so that dropping one from here loses
# nothing but the reuse.
_reductions = collections.OrderedDict()
_reductions_lock = threading.Lock()
_REDUCTIONS_KEPT = 16


class GradientReducer:
    """Averages (or sums) a list of gradients over all workers: the common
    part of DistributedGradientTape and DistributedOptimizer.

    Gradients are named `<prefix>.<index>.<variable path>`; None gradients stay
    None (every worker has the same graph, so the same ones are None); sparse
    gradients (tf.IndexedSlices, from embeddings) are made dense first.
    Priorities follow the variables' order (the first highest: the next
    forward pass needs it first), and the start ops are made in the reverse
    order, in which backward produces the gradients. Consecutive gradients
    in that order travel in fused groups of about `fusion_bytes` (None:
    DEFAULT_FUSION_BYTES; 0: each on its own), one engine tensor each.
    """

    def __init__(self, api, compression=None, average=True, prefix="grad", fusion_bytes=None):
        self.api = api
        Compression.lookup(compression)  # a bad name fails here, before any step
        self.compression = compression
        self.average = bool(average)
        self.prefix = prefix
        self.fusion_bytes = check_fusion_bytes(api, fusion_bytes)
        self.last_reduction = None  # the Reduction of the last reduce() (its groups)

    def reduce(self, grads, variables):
        grads = list(grads)
        variables = list(variables)
        if len(grads) != len(variables):
            raise _error(self.api, f"{len(grads)} gradients for {len(variables)} variables")
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        dense = []
        for i in present:
            g = grads[i]
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            dense.append(tf.convert_to_tensor(g))
        names = [f"{self.prefix}.{variable_name(variables[i], i)}" for i in present]
        dtypes = [g.dtype for g in dense]
        shapes = [g.shape for g in dense]
        key = (self.api, Compression.lookup(self.compression), self.average, self.fusion_bytes,
               _runtime.require(f"tensorflow.{self.api}").size, tuple(names),
               tuple(d.name for d in dtypes), tuple(str(s) for s in shapes))
        with _reductions_lock:
            cached = _reductions.pop(key, None)
            if cached is None:
                specs = make_specs(self.api, names, dtypes, shapes, self.average,
                                   self.compression, [-i for i in present])
                cached = (specs, Reduction(specs, reversed(range(len(dense))),
                                           self.fusion_bytes))
            _reductions[key] = cached
            while len(_reductions) > _REDUCTIONS_KEPT:
                _reductions.popitem(last=False)
        specs, reduction = cached
        self.last_reduction = reduction
        reduced = reduce_tensors(self.api, dense, specs, reduction=reduction)
        out = list(grads)
        for i, r in zip(present, reduced):
            out[i] = r
        return out
