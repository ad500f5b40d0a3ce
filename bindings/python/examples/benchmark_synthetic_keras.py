#!/usr/bin/env python3
"""Synthetic training benchmark for the TensorFlow binding: a
keras.applications model trained on random images with a custom loop
(a tf.function step), reporting images per second, as
benchmark_synthetic.py does for cortado.torch.

    # Cortado, 4 workers and 2 servers (the Python of the project's virtual
    # environment, where scripts/install_deps.sh installs TensorFlow):
    cortado launch -w 4 -s 2 -- .venv/bin/python bindings/python/examples/benchmark_synthetic_keras.py
    # The same, one push_pull per gradient:
    cortado launch -w 4 -s 2 -- .venv/bin/python .../benchmark_synthetic_keras.py --fusion-bytes 0
    # TensorFlow's own MultiWorkerMirroredStrategy (ring all-reduce over gRPC),
    # one process per worker, each given the cluster:
    RANK=0 WORLD_SIZE=2 WORKER_ADDRS=127.0.0.1:23456,127.0.0.1:23457 \\
        .venv/bin/python .../benchmark_synthetic_keras.py --backend mwms &
    RANK=1 WORLD_SIZE=2 WORKER_ADDRS=127.0.0.1:23456,127.0.0.1:23457 \\
        .venv/bin/python .../benchmark_synthetic_keras.py --backend mwms

bench/train.sh --framework tensorflow runs these on emulated hosts, one
after the other, and prints the table.

Every backend runs the same step: the loss of the worker's batch, its
gradients, their mean over the workers, SGD. With cortado the tape is a
cortado.tensorflow.DistributedGradientTape (--compression, --fusion-bytes);
with mwms the step runs under the strategy, whose Keras optimizer sums the
replicas' gradients (the loss is divided by the number of workers, so the
sum is the mean); with none each process trains alone (the compute bound
when WORLD_SIZE of them start together, --start-barrier). The model starts
from --seed on every worker; each worker trains on --data-batches fixed
random batches of its own (seeded from --seed and its rank), in turn, so
the loss after the last step compares the backends' training.
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got '{text}'")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Synthetic Keras benchmark (images/sec)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", choices=["cortado", "mwms", "none"], default="cortado",
                   help="cortado (under cortado launch), mwms (tf.distribute."
                        "MultiWorkerMirroredStrategy with ring all-reduce; RANK, WORLD_SIZE and "
                        "WORKER_ADDRS, the workers' host:port in rank order, from the "
                        "environment), none (no communication; RANK and WORLD_SIZE only name "
                        "the process)")
    p.add_argument("--start-barrier", default=None, metavar="DIR",
                   help="--backend none: write DIR/ready.RANK and wait (up to --run-timeout) "
                        "until WORLD_SIZE processes did before the warmup")
    p.add_argument("--run-timeout", type=positive_int, default=900,
                   help="seconds --start-barrier waits at most")
    p.add_argument("--model", default="ResNet50", help="a keras.applications model name")
    p.add_argument("--batch-size", type=positive_int, default=8, help="per worker")
    p.add_argument("--image-size", type=positive_int, default=32)
    p.add_argument("--num-classes", type=positive_int, default=10)
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=positive_int, default=2)
    p.add_argument("--num-iters", type=positive_int, default=5)
    p.add_argument("--compression", default="none",
                   help="cortado: none, fp16, auto, or an engine codec (dgc:ratio=0.01, ...)")
    p.add_argument("--fusion-bytes", type=int, default=None,
                   help="cortado: DistributedGradientTape(fusion_bytes=...), the fused groups' "
                        "size (0: one push_pull per gradient; default: the binding's, 4 MiB)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed")
    p.add_argument("--data-batches", type=positive_int, default=4,
                   help="fixed random batches per worker, trained on in turn")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="TensorFlow's intra-op threads per worker")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (times the workers)")
    p.add_argument("--label", default=None, help="a name for this run in the JSON line")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line at the end")
    args = p.parse_args(argv)
    if args.fusion_bytes is not None and args.fusion_bytes < 0:
        p.error(f"--fusion-bytes must be 0 or more, got {args.fusion_bytes}")
    if args.num_warmup_batches < 0:
        p.error(f"--num-warmup-batches must be 0 or more, got {args.num_warmup_batches}")
    return args


def log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


def make_model(args, keras):
    try:
        build = getattr(keras.applications, args.model)
    except AttributeError:
        raise SystemExit(f"benchmark_synthetic_keras: keras.applications has no model "
                         f"'{args.model}' (e.g. ResNet50, MobileNetV2, DenseNet121)") from None
    keras.utils.set_random_seed(args.seed)
    return build(weights=None, input_shape=(args.image_size, args.image_size, 3),
                 classes=args.num_classes)


def worker_batches(args, rank):
    rng = np.random.default_rng(args.seed * 100003 + rank + 1)
    return [(rng.standard_normal((args.batch_size, args.image_size, args.image_size, 3),
                                 dtype=np.float32),
             rng.integers(0, args.num_classes, args.batch_size).astype(np.int64))
            for _ in range(args.data_batches)]


def main():
    args = parse_args()
    import tensorflow as tf
    import keras
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    average = None
    strategy = None
    if args.backend == "cortado":
        import cortado.tensorflow as ct
        ct.init()
        rank, size = ct.rank(), ct.size()
        average = lambda x: float(ct.push_pull(tf.constant([x]), name="bench.loss").numpy()[0])  # noqa: E731
    else:
        rank = int(os.environ.get("RANK", "0"))
        size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.backend == "mwms":
        addrs = [a for a in os.environ.get("WORKER_ADDRS", "").split(",") if a]
        if len(addrs) != size:
            raise SystemExit(f"benchmark_synthetic_keras: --backend mwms needs WORKER_ADDRS with "
                             f"WORLD_SIZE={size} host:port entries, got {addrs}")
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addrs},
                                              "task": {"type": "worker", "index": rank}})
        impl = tf.distribute.experimental.CommunicationImplementation.RING
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=impl, timeout_seconds=float(args.run_timeout)))

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    if strategy is not None:
        with strategy.scope():
            model = make_model(args, keras)
            optimizer = keras.optimizers.SGD(args.lr * size)
    else:
        model = make_model(args, keras)
        optimizer = keras.optimizers.SGD(args.lr * size)
    batches = worker_batches(args, rank)

    if args.backend == "cortado":
        ct.broadcast_variables(model.variables, root_rank=0, prefix="bench.init")

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = ct.DistributedGradientTape(tape, compression=args.compression,
                                              fusion_bytes=args.fusion_bytes)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
    elif strategy is not None:
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                scaled = loss / strategy.num_replicas_in_sync  # summed over the replicas
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def step(x, y):
            return strategy.run(replica_step, args=(x, y))

        def average(x):  # noqa: F811
            return float(strategy.reduce(tf.distribute.ReduceOp.MEAN,
                                         strategy.run(lambda: tf.constant(x)), axis=None))
    else:
        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

    losses = []

    def run(n):
        for _ in range(n):
            x, y = batches[len(losses) % len(batches)]
            losses.append(float(step(tf.constant(x), tf.constant(y))))

    log(rank, f"Model: {args.model} ({len(model.trainable_variables)} gradients, "
              f"{sum(int(np.prod(v.shape)) for v in model.trainable_variables)} parameters), "
              f"batch size {args.batch_size} per worker, image {args.image_size}x"
              f"{args.image_size}, {size} workers, backend {args.backend}"
              + (f", compression {args.compression}, fusion_bytes {args.fusion_bytes}"
                 if args.backend == "cortado" else "")
              + f", {args.threads} threads per worker")
    if args.start_barrier is not None:
        folder = pathlib.Path(args.start_barrier)
        (folder / f"ready.{rank}").touch()
        deadline = time.monotonic() + args.run_timeout
        while len(list(folder.glob("ready.*"))) < size:
            if time.monotonic() > deadline:
                raise SystemExit(f"--start-barrier {folder}: not every one of WORLD_SIZE={size} "
                                 f"processes arrived within {args.run_timeout} s")
            time.sleep(0.05)
    log(rank, "Running warmup...")
    run(max(1, args.num_warmup_batches))  # the first step traces the function
    log(rank, "Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        t0 = time.perf_counter()
        run(args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - t0)
        log(rank, f"Iter #{i}: {img_sec:.1f} img/sec per worker, loss {losses[-1]:.4f}")
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    last_mean = average(losses[-1]) if average is not None else losses[-1]
    log(rank, f"Img/sec per worker: {mean:.1f} +-{conf:.1f}")
    log(rank, f"Total img/sec on {size} worker(s): {size * mean:.1f} +-{size * conf:.1f}")
    log(rank, f"Loss after {len(losses)} steps: {losses[-1]:.4f} (rank 0), {last_mean:.4f} "
              f"(mean over workers); first step {losses[0]:.4f}")
    fusion = args.fusion_bytes
    if args.backend == "cortado" and fusion is None:
        fusion = ct.DEFAULT_FUSION_BYTES
    result = {"backend": args.backend, "label": args.label, "framework": "tensorflow",
              "model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
              "workers": size, "threads_per_worker": args.threads,
              "compression": args.compression if args.backend == "cortado" else "none",
              "fusion_bytes": fusion if args.backend == "cortado" else None,
              "seed": args.seed, "data_batches": args.data_batches, "steps": len(losses),
              "loss_first": losses[0], "loss_last": losses[-1], "loss_last_mean": last_mean,
              "img_sec_per_worker": mean, "img_sec_total": size * mean,
              "conf95_total": size * conf}
    if args.json and rank == 0:
        print(json.dumps(result), flush=True)
    if args.backend == "cortado":
        ct.shutdown()


if __name__ == "__main__":
    main()
