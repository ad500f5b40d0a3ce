"""cortado.tensorflow under `cortado launch`, checked against references
computed here without Cortado.

--mode ops: push_pull/allreduce sums (eager and inside tf.function) against
NumPy sums of every worker's inputs (each worker makes all of them from
seeds); broadcast and broadcast_variables of variables that start different
on every worker; DistributedGradientTape against a plain tape on the batch
of every worker together, eager and traced, over a few SGD steps, its
gradients fused into groups in three ways (the same gradients bit for bit);
the XLA
refusal (tf.function(jit_compile=True)).

--mode fit: model.fit with DistributedOptimizer, BroadcastGlobalVariablesCallback
and MetricAverageCallback for 2 epochs on this worker's shard, from initial
weights that differ by rank; reports the final weights (the test compares
the workers'); first, model.fit with jit_compile=True must be refused; then
short runs of model.fit run eagerly, with top-k and with fp16 compression,
and a custom loop through DistributedOptimizer.apply_gradients, each checked
for the same weights on every worker; and the fitted model saved and loaded
back with cortado.tensorflow.keras.load_model, training on.
"""

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import cortado.tensorflow as ct  # noqa: E402
from common import parse_args, write_result  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)


def values(rank, salt, shape, dtype):
    """Small integers (exact in every dtype, sums included; non-negative for
    uint8) as a NumPy array of `dtype` (bfloat16: ml_dtypes', as TensorFlow's)."""
    rng = np.random.default_rng(1000003 * rank + 7919 * salt)
    low = 0 if np.dtype(dtype) == np.uint8 else -8
    return rng.integers(low, 9, size=shape).astype(dtype)


def check_sums(rank, world, report):
    checked = 0
    dtypes = [np.float32, np.float64, np.float16, tf.bfloat16.as_numpy_dtype, np.int32,
              np.int64, np.uint8, np.int8]
    for salt, dtype in enumerate(dtypes):
        for shape in ((1,), (3, 11), (20_000,)):
            x = tf.constant(values(rank, salt, shape, dtype))
            want = sum(values(r, salt, shape, dtype).astype(np.float64) for r in range(world))
            got = ct.push_pull(x, name=f"eager.{np.dtype(dtype).name}.{shape}", average=False)
            assert got.dtype == x.dtype and got.shape == x.shape, (got, x)
            np.testing.assert_array_equal(got.numpy().astype(np.float64), want)
            got = ct.allreduce(x, name=f"eager.avg.{np.dtype(dtype).name}.{shape}")
            if dtype in (np.float32, np.float64):
                np.testing.assert_allclose(got.numpy(), want / world, rtol=1e-6)
            checked += 2

    # Inside a tf.function: traced once, run three times with new inputs.
    @tf.function
    def step(a, b):
        s = ct.push_pull(a * 2.0, name="graph.a", average=False)
        m = ct.allreduce(b, op=ct.Average, name="graph.b")
        return s + 1.0, m

    for it in range(3):
        a = values(rank, 100 + it, (5, 7), np.float32)
        b = values(rank, 200 + it, (1000,), np.float32)
        s, m = step(tf.constant(a), tf.constant(b))
        assert s.shape == (5, 7) and m.shape == (1000,)
        want_s = sum(2.0 * values(r, 100 + it, (5, 7), np.float32) for r in range(world)) + 1.0
        want_m = sum(values(r, 200 + it, (1000,), np.float32) for r in range(world)) / world
        np.testing.assert_allclose(s.numpy(), want_s, rtol=1e-6)
        np.testing.assert_allclose(m.numpy(), want_m, rtol=1e-6)
        checked += 2
    report["graph_traces"] = step.experimental_get_tracing_count()
    assert report["graph_traces"] == 1, report

    # Compression as in the torch binding: fp16 (exact on these small integers).
    # pushed_bytes/pulled_bytes count the tensor data as it went on the wire:
    # 64 halves each way, then 300 float32s each way.
    pushed, pulled = ct.pushed_bytes(), ct.pulled_bytes()
    x = tf.constant(values(rank, 300, (64,), np.float32))
    got = ct.push_pull(x, name="eager.fp16", average=False, compression=ct.Compression.fp16)
    want = sum(values(r, 300, (64,), np.float32) for r in range(world))
    np.testing.assert_array_equal(got.numpy(), want)
    assert (ct.pushed_bytes() - pushed, ct.pulled_bytes() - pulled) == (128, 128), (
        ct.pushed_bytes() - pushed, ct.pulled_bytes() - pulled)
    ct.push_pull(tf.zeros(300), name="eager.bytes", average=False)
    assert (ct.pushed_bytes() - pushed, ct.pulled_bytes() - pulled) == (1328, 1328), (
        ct.pushed_bytes() - pushed, ct.pulled_bytes() - pulled)
    checked += 1
    # The gradient of a push_pull: d/dx of sum_r loss_r(push_pull(x)) is the
    # push_pull of the workers' upstream gradients (Horovod's allreduce
    # gradient), eagerly and traced.
    x = tf.constant(values(rank, 600, (4,), np.float32))
    scale = float(rank + 1)

    def grad_of(average, name):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(ct.push_pull(x, name=name, average=average) * scale)
        return tape.gradient(loss, x)

    every = sum(float(r + 1) for r in range(world))
    for traced in (False, True):
        f = tf.function(grad_of) if traced else grad_of
        g_sum = f(False, f"grad.sum.{traced}")
        g_avg = f(True, f"grad.avg.{traced}")
        np.testing.assert_allclose(g_sum.numpy(), np.full(4, every), rtol=1e-6)
        np.testing.assert_allclose(g_avg.numpy(), np.full(4, every / world), rtol=1e-6)
        checked += 2
    report["sums_checked"] = checked


def check_broadcast(rank, world, report):
    root = world - 1
    x = tf.constant(values(rank, 400, (6,), np.float32))
    got = ct.broadcast(x, root_rank=root, name="bcast.x")
    np.testing.assert_array_equal(got.numpy(), values(root, 400, (6,), np.float32))

    # Variables that start different on every worker, of several dtypes
    # (uint32 travels as bytes), eagerly and inside a tf.function.
    def make():
        return [tf.Variable(values(rank, 500, (4, 3), np.float32)),
                tf.Variable(values(rank, 501, (7,), np.int64)),
                tf.Variable(values(rank, 502, (2,), np.float64).astype(np.uint32))]
    vs = make()
    ct.broadcast_variables(vs, root_rank=0)
    for v, want in zip(vs, [values(0, 500, (4, 3), np.float32), values(0, 501, (7,), np.int64),
                            values(0, 502, (2,), np.float64).astype(np.uint32)]):
        np.testing.assert_array_equal(v.numpy(), want)
    vs = make()

    @tf.function
    def bcast():
        ct.broadcast_variables(vs, root_rank=root, prefix="broadcast.graph")

    bcast()
    np.testing.assert_array_equal(vs[0].numpy(), values(root, 500, (4, 3), np.float32))
    np.testing.assert_array_equal(vs[1].numpy(), values(root, 501, (7,), np.int64))
    report["broadcast"] = "ok"


def make_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(4)])
    return model


def batch(rank, it):
    rng = np.random.default_rng(7 * rank + 1000 * it)
    return (rng.normal(size=(12, 8)).astype(np.float32),
            rng.normal(size=(12, 4)).astype(np.float32))


# The fused groups of make_model()'s gradients, as indices into
# trainable_variables (kernel 8x16: 512 bytes, bias 64, kernel 16x4: 256,
# bias 16) in backward order, for each fusion_bytes the tape checks: the
# default (4 MiB) fuses all four; 300 closes a group at the first kernel's
# bias (16 + 256 + 64 = 336 bytes) and leaves the first kernel on its own;
# 0 fuses none.
FUSION_CASES = ((None, [[3, 2, 1, 0]]), (300, [[3, 2, 1]]), (0, []))


def check_tape(rank, world, report):
    """DistributedGradientTape against a plain tape on every worker's batch
    together, eager and traced, fused in each of FUSION_CASES' ways; the
    fused and unfused runs' gradients equal bit for bit (2 workers: each
    element's sum is one addition, whichever engine tensor carries it)."""
    grads_of = {}
    for mode in ("eager", "graph"):
        for fusion_bytes, groups in FUSION_CASES:
            label = f"{mode}.{fusion_bytes}"
            grads_of[label] = _check_tape_once(rank, world, report, mode, fusion_bytes, groups)
        for label in (f"{mode}.None", f"{mode}.300"):
            for a, b in zip(grads_of[label], grads_of[f"{mode}.0"]):
                np.testing.assert_array_equal(a, b)
    report["tape_fusion_cases"] = len(FUSION_CASES)


def _check_tape_once(rank, world, report, mode, fusion_bytes, groups):
    loss_fn = keras.losses.MeanSquaredError()
    model = make_model(11)       # the same weights on every worker
    ref = make_model(11)         # the one-process reference
    opt, ref_opt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    reducers = []

    def dist_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        tape = ct.DistributedGradientTape(tape, name_prefix=f"tape.{mode}.{fusion_bytes}",
                                          fusion_bytes=fusion_bytes)
        reducers.append(tape._cortado_reducer)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return grads

    def ref_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, ref(x))
        grads = tape.gradient(loss, ref.trainable_variables)
        ref_opt.apply_gradients(zip(grads, ref.trainable_variables))
        return grads

    if mode == "graph":
        dist_step, ref_step = tf.function(dist_step), tf.function(ref_step)
    worst = 0.0
    every_grad = []
    steps = []
    arrays = []
    for it in range(3):
        x, y = batch(rank, it)
        grads = dist_step(tf.constant(x), tf.constant(y))
        every_grad += [g.numpy() for g in grads]
        every = [batch(r, it) for r in range(world)]
        xs = np.concatenate([b[0] for b in every])
        ys = np.concatenate([b[1] for b in every])
        ref_grads = ref_step(tf.constant(xs), tf.constant(ys))
        for g, rg in zip(grads, ref_grads):
            np.testing.assert_allclose(g.numpy(), rg.numpy(), rtol=1e-4, atol=1e-6)
            worst = max(worst, float(np.max(np.abs(g.numpy() - rg.numpy()))))
        steps.append((grads, ref_grads))
        reduction = reducers[-1].last_reduction
        arrays.append(sorted((u, b.ctypes.data) for u, b in reduction._buffers.items()))
    # Every step's push_pulls wrote into the same arrays (one per unit), and
    # the gradients an earlier step returned still hold that step's sums.
    assert len(arrays[0]) == len(reduction.units) and arrays[1:] == arrays[:-1], arrays
    for grads, ref_grads in steps:
        for g, rg in zip(grads, ref_grads):
            np.testing.assert_allclose(g.numpy(), rg.numpy(), rtol=1e-4, atol=1e-6)
    for w, rw in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(w, rw, rtol=1e-4, atol=1e-6)
    # The groups it pushed, one engine tensor each.
    made = reduction.groups
    assert made == groups, (mode, fusion_bytes, made, groups)
    report[f"tape_{mode}_{fusion_bytes}_max_diff"] = worst
    return every_grad


def check_xla(rank, world, report):
    @tf.function(jit_compile=True)
    def compiled(x):
        return ct.push_pull(x, name="xla.x")

    try:
        compiled(tf.ones(3))
    except ct.CortadoError as e:
        assert "jit_compile" in str(e) and "XLA" in str(e), str(e)
        report["xla_refusal"] = str(e)
    else:
        raise AssertionError("push_pull inside tf.function(jit_compile=True) was not refused")

    # Misuse raises CortadoError before anything is sent, eagerly and when traced.
    def refused(call, needle):
        try:
            call()
        except ct.CortadoError as e:
            assert needle in str(e), (needle, str(e))
            return str(e).split("\n")[-2 if str(e).endswith("\n") else -1]
        raise AssertionError(f"not refused: expected an error with {needle!r}")

    @tf.function
    def traced_codec_on_int64():
        return ct.push_pull(tf.ones(2, tf.int64), name="e.g", compression="dgc")

    report["errors"] = [
        refused(lambda: ct.push_pull(tf.ones(2, tf.int32), name="e.int", compression="topk"),
                "encodes float32 tensors"),
        refused(lambda: ct.allreduce(tf.ones(2), op="max", name="e.max"), "is not supported"),
        refused(lambda: ct.push_pull(tf.constant([True]), name="e.bool"), "does not sum"),
        refused(traced_codec_on_int64, "encodes float32 tensors"),
        refused(lambda: ct.broadcast(tf.ones(2), root_rank=world, name="e.root"),
                "out of range"),
        refused(lambda: ct.DistributedOptimizer(object()), "Keras 3 optimizer"),
    ]


def run_fit(rank, world, report, args_out):
    # Refused under XLA, at the train step's trace, before anything moved.
    model = make_model(100 + rank)
    model.compile(optimizer=ct.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                    name_prefix="xla"),
                  loss="mse", jit_compile=True)
    x, y = batch(rank, 0)
    try:
        model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    except ct.CortadoError as e:
        assert "jit_compile" in str(e), str(e)
        report["fit_xla_refusal"] = str(e)
    else:
        raise AssertionError("model.fit(jit_compile=True) with DistributedOptimizer was not "
                             "refused")

    # Different initial weights on every worker: the callback broadcasts rank 0's.
    model = make_model(100 + rank)
    initial = [w.copy() for w in model.get_weights()]
    rank0 = make_model(100).get_weights()
    model = make_model(100 + rank)
    model.compile(optimizer=ct.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="mse", metrics=["mae"], jit_compile=False)
    rng = np.random.default_rng(5)
    xs = rng.normal(size=(64 * world, 8)).astype(np.float32)
    ys = (xs @ rng.normal(size=(8, 4))).astype(np.float32)
    shard = slice(rank * 64, (rank + 1) * 64)

    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.after_broadcast = None
            self.losses = []

        def on_train_batch_begin(self, batch_index, logs=None):
            if self.after_broadcast is None:
                self.after_broadcast = [w.copy() for w in self.model.get_weights()]

        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(logs["loss"])

    record = Record()
    history = model.fit(xs[shard], ys[shard], epochs=2, batch_size=8, verbose=0, shuffle=False,
                        callbacks=[ct.BroadcastGlobalVariablesCallback(0),
                                   ct.MetricAverageCallback(), record])
    assert any(not np.array_equal(a, b) for a, b in zip(initial, rank0)) or rank == 0
    for got, want in zip(record.after_broadcast, rank0):
        np.testing.assert_array_equal(got, want)
    report["epochs"] = len(history.history["loss"])
    report["losses"] = record.losses
    report["weights"] = [w.ravel().tolist() for w in model.get_weights()]
    report["optimizer_iterations"] = int(model.optimizer.iterations.numpy())

    # Saved with its DistributedOptimizer, loaded back with ct.keras.load_model:
    # the same weights and optimizer state, training on in step.
    path = os.path.join(args_out, f"model.{rank}.keras")
    model.save(path)
    loaded = ct.keras.load_model(path)
    assert type(loaded.optimizer).__module__ == "cortado.tensorflow.keras.optimizer", \
        type(loaded.optimizer)
    assert int(loaded.optimizer.iterations.numpy()) == 16
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    loaded.fit(xs[shard][:16], ys[shard][:16], epochs=1, batch_size=8, verbose=0)
    report["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())

    # The other ways in, one short run each, every worker ending on the same
    # weights: model.fit run eagerly; compression (top-k with error feedback,
    # an engine codec, over the fused group of the four gradients and over
    # each on its own; fp16, cast in the binding) through
    # DistributedOptimizer in model.fit; a custom loop calling
    # DistributedOptimizer.apply_gradients eagerly. (Adam: every variable
    # moves, whatever the gradient's scale.)
    same = {}
    for label, run_eagerly, compression, fusion in (
            ("eager", True, ct.Compression.none, None),
            ("topk", False, ct.Compression.topk(0.25), None),
            ("topk_unfused", False, ct.Compression.topk(0.25), 0),
            ("fp16", False, ct.Compression.fp16, None)):
        model = make_model(200 + rank)
        model.compile(optimizer=ct.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                        compression=compression,
                                                        name_prefix=label, fusion_bytes=fusion),
                      loss="mse", jit_compile=False, run_eagerly=run_eagerly)
        model.fit(xs[shard][:32], ys[shard][:32], epochs=1, batch_size=8, verbose=0,
                  callbacks=[ct.BroadcastGlobalVariablesCallback(0)])
        same[label] = _same_everywhere(model, f"check.{label}")
    model = make_model(300 + rank)
    ct.broadcast_variables(model.variables, 0, prefix="broadcast.loop")
    optimizer = ct.DistributedOptimizer(keras.optimizers.SGD(0.1), name_prefix="loop")
    for i in range(2):
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(ys[shard][:8], model(xs[shard][:8]))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    same["loop"] = _same_everywhere(model, "check.loop")
    same["loaded"] = _same_everywhere(loaded, "check.loaded")
    report["same_weights"] = same
    check_accumulation(rank, world, report, xs, ys)


def check_accumulation(rank, world, report, xs, ys):
    """backward_passes_per_step=2 in model.fit: 4 batches of 8 per worker are
    2 updates, each from the gradients of 2 batches, summed over the passes
    (Horovod's default) or averaged, and averaged over the workers. The
    reference is one plain SGD step per update on the union of those batches
    (every worker's 2 batches: the mean loss's gradient is the mean of the
    batches' gradients), with the learning rate times 2 for the sum."""
    for average_aggregated in (False, True):
        label = "accumulate_mean" if average_aggregated else "accumulate_sum"
        model = make_model(400)
        model.compile(optimizer=ct.DistributedOptimizer(
            keras.optimizers.SGD(0.05), name_prefix=label, backward_passes_per_step=2,
            average_aggregated_gradients=average_aggregated), loss="mse", jit_compile=False)
        shard = slice(rank * 64, rank * 64 + 32)
        model.fit(xs[shard], ys[shard], epochs=1, batch_size=8, verbose=0, shuffle=False)
        reference = make_model(400)
        reference.compile(optimizer=keras.optimizers.SGD(0.05 if average_aggregated else 0.1),
                          loss="mse", jit_compile=False)
        for update in range(2):
            rows = np.concatenate([np.arange(r * 64 + 16 * update, r * 64 + 16 * update + 16)
                                   for r in range(world)])
            reference.train_on_batch(xs[rows], ys[rows])
        diff = max(float(np.max(np.abs(a - b)))
                   for a, b in zip(model.get_weights(), reference.get_weights()))
        moved = max(float(np.max(np.abs(a - b)))
                    for a, b in zip(model.get_weights(), make_model(400).get_weights()))
        report[f"{label}_max_diff"] = diff
        report[f"{label}_moved"] = moved
    # Refused: a bad count, accumulation asked twice, a bad fusion size.
    for bad, needle in ((lambda: ct.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                         backward_passes_per_step=0),
                         "backward_passes_per_step must be an integer of at least 1"),
                        (lambda: ct.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                         fusion_bytes="4MB"),
                         "fusion_bytes must be a number of bytes (0: every gradient on its own), "
                         "got '4MB'"),
                        (lambda: ct.DistributedGradientTape(tf.GradientTape(), fusion_bytes=-1),
                         "fusion_bytes must be a number of bytes"),
                        (lambda: ct.DistributedOptimizer(
                            keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                            backward_passes_per_step=3), "not both")):
        try:
            bad()
        except ct.CortadoError as e:
            assert needle in str(e), str(e)
        else:
            raise AssertionError(f"not refused: {needle}")
    report["accumulation_refusals"] = 4
    # DGC's momentum correction and SGD's momentum: warned, only when both are on.
    for momentum, comp, warns in ((0.9, "dgc:ratio=0.01", True), (0.0, "dgc:ratio=0.01", False),
                                  (0.9, "dgc:ratio=0.01,momentum=0", False),
                                  (0.9, "topk:ratio=0.01", False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ct.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=momentum),
                                    compression=comp, name_prefix=f"mom{len(caught)}")
        hits = [str(w.message) for w in caught if "momentum counts twice" in str(w.message)]
        assert bool(hits) == warns, (momentum, comp, [str(w.message) for w in caught])
    report["momentum_twice_warned"] = True


def _same_everywhere(model, name):
    """True when every worker holds the same weights as this one: the sum of
    every worker's weights equals size() times this worker's."""
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    total = ct.push_pull(tf.constant(flat), name=name, average=False).numpy()
    return bool(np.array_equal(total, flat * ct.size()))


def main():
    args = parse_args(lambda p: p.add_argument("--mode", choices=("ops", "fit"), required=True))
    ct.init()
    rank, world = ct.rank(), ct.size()
    report = {}
    if args.mode == "ops":
        check_sums(rank, world, report)
        check_broadcast(rank, world, report)
        check_tape(rank, world, report)
        check_xla(rank, world, report)
    else:
        run_fit(rank, world, report, args.out)
    ct.shutdown()
    write_result(args.out, rank, ok=True, report=report)


if __name__ == "__main__":
    main()
