#!/usr/bin/env python3
"""Train a small Keras CNN on scikit-learn's handwritten digits with Cortado.

    cortado launch -w 4 -s 2 -- .venv/bin/python bindings/python/examples/train_digits_keras.py

The TensorFlow version of train_digits.py: each worker fits its shard of the
training set with model.fit; DistributedOptimizer averages the gradients over
the workers, BroadcastGlobalVariablesCallback starts every worker from rank
0's weights, and MetricAverageCallback averages each epoch's metrics. Rank 0
prints, per epoch, the training loss and accuracy (averaged over the
workers) and the held-out accuracy. The data set ships with python3-sklearn,
so this runs offline; TensorFlow and Keras come from the project's virtual
environment (scripts/install_deps.sh).

The lines a Horovod user changes are marked "Cortado:".
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import cortado.tensorflow as ct  # noqa: E402  (Cortado: the import)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.025,
                   help="per worker; scaled by the worker count")
    p.add_argument("--compression", default="none",
                   help="none, fp16, auto, or an engine codec: topk:ratio=0.01, dgc, efsignsgd, ...")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load(seed):
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    test = len(x) // 5
    return (x[test:], y[test:]), (x[:test], y[:test])


def main():
    args = parse_args()
    ct.init()  # Cortado: join the job that `cortado launch` started
    rank, world = ct.rank(), ct.size()
    (x_train, y_train), (x_test, y_test) = load(args.seed)
    x_shard, y_shard = x_train[rank::world], y_train[rank::world]

    keras.utils.set_random_seed(args.seed + rank)  # different on purpose: the callback aligns them
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.SGD(args.lr * world, momentum=0.9)
    # Cortado: average the gradients over the workers (jit_compile=False: XLA
    # cannot compile Cortado's op).
    optimizer = ct.DistributedOptimizer(optimizer, compression=args.compression)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if rank == 0:
                _, acc = self.model.evaluate(x_test, y_test, verbose=0)
                print(f"epoch {epoch + 1}/{args.epochs}  loss {logs['loss']:.4f}  "
                      f"train-acc {logs['accuracy']:.4f}  test-acc {acc:.4f}", flush=True)

    callbacks = [
        ct.BroadcastGlobalVariablesCallback(0),  # Cortado: rank 0's initial weights
        ct.MetricAverageCallback(),              # Cortado: metrics averaged over the workers
        Report(),
    ]
    model.fit(x_shard, y_shard, epochs=args.epochs, batch_size=args.batch_size, verbose=0,
              shuffle=True, callbacks=callbacks)
    ct.shutdown()


if __name__ == "__main__":
    main()
