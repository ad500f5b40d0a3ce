#!/usr/bin/env python3
"""Train a small CNN on scikit-learn's handwritten digits with Cortado.

    cortado launch -w 4 -s 2 -- /usr/bin/python3 bindings/python/examples/train_digits.py

Each worker trains on its shard of the training set; DistributedOptimizer
averages the gradients over the workers (their push_pulls overlap the backward
pass). Rank 0 shows a progress bar and prints, per epoch, the training loss and
accuracy and the held-out accuracy, all averaged over the workers. The data set
(1797 8x8 images) ships with python3-sklearn, so this runs offline.

--model mlp trains a one-hidden-layer perceptron of --hidden units instead
(64 x H + H + H x 10 + 10 parameters: 1.8M at the default 24576), a model
whose step moves 7.4 MB, so that communication and compression matter on
a slow network; the CNN (38K parameters) moves 153 KB a step.

The three lines a Horovod/BytePS user changes are marked "Cortado:".
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from tqdm import tqdm

import cortado.torch as ct
from cortado.compression import dgc_momentum


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class WideMlp(nn.Module):
    """64 pixels -> hidden (ReLU) -> 10. Wide, so its first layer dominates the
    parameters; the zero pixels at the digits' borders leave its gradient's
    columns for them zero."""

    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def int_at_least(minimum, bound):
    """An argparse type: a whole number of at least `minimum` (`bound` says
    so in the error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


positive_int = int_at_least(1, "at least 1")
whole_number = int_at_least(0, "0 or more")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                   help="cnn: the small CNN (38K parameters); mlp: 64-hidden-10 perceptron")
    p.add_argument("--hidden", type=positive_int, default=24576,
                   help="--model mlp: hidden units (default %(default)s: 1.8M parameters)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.025,
                   help="per worker; scaled by the worker count, then decayed (cosine) to 0")
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD's momentum (default 0.9; 0 with DGC, whose momentum correction "
                        "takes its place, as in the DGC paper)")
    p.add_argument("--compression", default="none",
                   help="none, fp16, auto, an engine codec (topk:ratio=0.01, dgc, efsignsgd, ...), "
                        "or gravac (adaptive ratio; settings as gravac:codec=topk,window=50)")
    p.add_argument("--executor", action="store_true",
                   help="run the gradients through the plan executor (executor=True); with "
                        "gravac the executor decides the ratio and re-plans when it moves")
    p.add_argument("--fusion-bytes", type=whole_number,
                   help="DistributedOptimizer's fusion_bytes: with --executor, gradients fused "
                        "into groups of about this many bytes (0: one option per gradient; "
                        "default: the optimizer's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", help="rank 0 writes the per-epoch accuracies, times and the bytes "
                                  "it pushed for the gradients (as sent) to this file")
    p.add_argument("--eval-every", type=whole_number, default=0, metavar="K",
                   help="also measure the test accuracy every K steps (rank 0, the whole test "
                        "set; the workers' models are the same after every step), for --json's "
                        "time to a target at step resolution; 0 (default): only at each epoch's "
                        "end. Evaluation time is left out of every reported time")
    return p.parse_args()


def load(seed):
    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = len(y) // 5
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def main():
    args = parse_args()
    compression = ct.Compression.lookup(args.compression)  # a bad name fails before the job
    ct.init()                                                            # Cortado: 1
    rank, size = ct.rank(), ct.size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ct.local_size()))
    torch.manual_seed(args.seed)

    (x_train, y_train), (x_test, y_test) = load(args.seed)
    # Equal shards, so every worker takes the same number of steps.
    shard = len(y_train) // size
    x_train = x_train[rank * shard:(rank + 1) * shard]
    y_train = y_train[rank * shard:(rank + 1) * shard]
    x_test_all, y_test_all = x_test, y_test
    x_test, y_test = x_test[rank::size], y_test[rank::size]
    steps = math.ceil(shard / args.batch_size)

    model = Net() if args.model == "cnn" else WideMlp(args.hidden)
    if rank == 0:
        print(f"model {args.model}: {sum(p.numel() for p in model.parameters())} parameters",
              flush=True)
    momentum = args.momentum
    if momentum is None:
        momentum = 0.0 if dgc_momentum(compression) > 0 else 0.9
        if rank == 0 and momentum == 0.0:
            print("SGD without momentum: DGC's momentum correction takes its place "
                  "(--momentum sets it)", flush=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=momentum)
    optimizer = ct.DistributedOptimizer(optimizer, model.named_parameters(),  # Cortado: 2
                                        compression=compression,
                                        executor=args.executor,
                                        fusion_bytes=args.fusion_bytes)
    ct.broadcast_parameters(model.state_dict(), root_rank=0)                 # Cortado: 3
    report = getattr(compression, "last_report", None)
    if rank == 0 and report:
        print(f"auto: the planner chose {report['codec']} for "
              f"{', '.join(report['compressed']) or 'no tensor'} (simulated iteration "
              f"{report['iter_us']:.0f} us, {report['no_compression_us']:.0f} us uncompressed)",
              flush=True)
    ct.broadcast_optimizer_state(optimizer, root_rank=0)
    # Cosine decay to zero over the run: the last epochs settle, with or
    # without compression.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * steps)

    record = {"compression": args.compression, "workers": size, "model": args.model,
              "parameters": sum(p.numel() for p in model.parameters()),
              "eval_every": args.eval_every, "epochs": [], "evals": [], "step_seconds": []}
    began = time.monotonic()
    # Evaluation time, left out of every time reported (the training clock).
    paused = 0.0

    def clock():
        return time.monotonic() - began - paused

    def evaluate_all():
        """Rank 0's accuracy on the whole test set, off the training clock.
        Synchronous data parallel: every worker holds the same model after a
        step, so one worker's evaluation is the job's, and it needs no
        communication (the others wait in their next push_pull)."""
        nonlocal paused
        t0 = time.monotonic()
        was_training = model.training
        model.eval()
        with torch.no_grad():
            acc = (model(x_test_all).argmax(1) == y_test_all).sum().item() / len(y_test_all)
        model.train(was_training)
        paused += time.monotonic() - t0
        return acc
    # The bytes this worker puts on the wire for the gradients (the engine
    # counts them as sent: compact top-k and DGC payloads where smaller),
    # without the broadcasts above and the metrics' push_pulls below.
    pushed_at_start, metrics_bytes = ct.pushed_bytes(), 0
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        model.train()
        perm = torch.randperm(shard, generator=torch.Generator().manual_seed(epoch * 1000 + rank))
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
        bar = tqdm(range(steps), desc=f"epoch {epoch}/{args.epochs}", unit="batch",
                   disable=rank != 0 or args.no_progress, leave=False)
        for step in bar:
            step_start = time.monotonic()
            idx = perm[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            logits = model(x_train[idx])
            loss = F.cross_entropy(logits, y_train[idx])
            loss.backward()
            optimizer.step()
            schedule.step()
            record["step_seconds"].append(time.monotonic() - step_start)
            done = (epoch - 1) * steps + step + 1
            evaluating = args.eval_every and done % args.eval_every == 0
            if evaluating:
                # Rank 0 evaluates, the others wait for it in their next
                # push_pull: not a step's time for GraVAC's controller.
                optimizer.exclude_pause()
            if rank == 0 and evaluating:
                record["evals"].append({"step": done, "test_acc": evaluate_all(),
                                        "seconds": clock()})
            totals += torch.tensor([loss.item() * len(idx),
                                    (logits.argmax(1) == y_train[idx]).sum().item(), len(idx)],
                                   dtype=torch.float64)
            bar.set_postfix(loss=f"{totals[0].item() / totals[2].item():.4f}")
        bar.close()

        metrics_start = time.monotonic()
        model.eval()
        with torch.no_grad():
            correct = (model(x_test).argmax(1) == y_test).sum().item()
        test = torch.tensor([correct, len(y_test)], dtype=torch.float64)
        pushed = ct.pushed_bytes() - pushed_at_start - metrics_bytes
        totals = ct.push_pull(totals, average=False, name="metrics.train")
        test = ct.push_pull(test, average=False, name="metrics.test")
        metrics_bytes = ct.pushed_bytes() - pushed_at_start - pushed
        paused += time.monotonic() - metrics_start
        optimizer.exclude_pause()  # the epoch's metrics are not a step for GraVAC either
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}  loss {totals[0] / totals[2]:.4f}  "
                  f"train-acc {totals[1] / totals[2]:.4f}  test-acc {test[0] / test[1]:.4f}  "
                  f"({time.monotonic() - start:.1f} s, {size} workers)", flush=True)
            record["epochs"].append({"epoch": epoch, "loss": float(totals[0] / totals[2]),
                                     "test_acc": float(test[0] / test[1]),
                                     "seconds": clock(), "pushed": pushed})
            ratios = optimizer.compression_ratio_history  # GraVAC: the ratio of every step
            if ratios:
                recent = ratios[-steps:]
                print(f"  gravac: ratios this epoch {min(recent):g}x-{max(recent):g}x, last "
                      f"{recent[-1]:g}x, {sum(r == 1.0 for r in recent)} dense steps", flush=True)
    if rank == 0 and args.json:
        record["history"] = optimizer.gravac_history
        with open(args.json, "w") as f:
            json.dump(record, f)
    ct.shutdown()


if __name__ == "__main__":
    main()
