#!/usr/bin/env python3
"""A training script written the way Horovod's PyTorch examples are, run by
Cortado: only the import differs from a Horovod script.

    cortado launch -w 2 -s 1 -- /usr/bin/python3 bindings/python/examples/horovod_style.py

A small CNN with SyncBatchNorm on scikit-learn's handwritten digits (shipped
with python3-sklearn, so this runs offline); each worker trains on its shard
(DistributedSampler), the optimizer averages gradients (op=hvd.Average), rank
0's weights and optimizer state are broadcast at the start, and the test
metrics are averaged over the workers with allreduce. At the end each worker
prints a checksum of its weights: they are the same on every worker.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits

import cortado.torch as hvd  # with Horovod: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="digits with SyncBatchNorm, Horovod-style")
parser.add_argument("--batch-size", type=int, default=32, help="training samples per worker and step")
parser.add_argument("--test-batch-size", type=int, default=100, help="evaluation batch")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.02, help="per worker; scaled by hvd.size()")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=10, help="steps between loss lines")
parser.add_argument("--fp16-allreduce", action="store_true",
                    help="gradients travel as fp16 (hvd.Compression.fp16)")
parser.add_argument("--use-adasum", action="store_true",
                    help="op=hvd.Adasum (Cortado refuses it and says what to use)")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="the optimizer's gradient_predivide_factor")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.bn1 = hvd.SyncBatchNorm(16)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.bn2 = hvd.SyncBatchNorm(32)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def datasets():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    split = int(0.8 * len(y))
    return (torch.utils.data.TensorDataset(x[:split], y[:split]),
            torch.utils.data.TensorDataset(x[split:], y[split:]))


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(f"epoch {epoch} step {batch_idx}/{len(train_loader)} loss {loss.item():.4f}")


def averaged(value, name):
    # The mean over the workers (allreduce's default op is Average).
    return hvd.allreduce(torch.tensor(value), name=name).item()


def test():
    model.eval()
    test_loss = 0.
    test_accuracy = 0.
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).float().sum().item()
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    test_loss = averaged(test_loss, "test.loss")
    test_accuracy = averaged(test_accuracy, "test.accuracy")
    if hvd.rank() == 0:
        print(f"Test set: loss {test_loss:.4f}, Accuracy: {100 * test_accuracy:.2f}%", flush=True)


if __name__ == "__main__":
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset, test_dataset = datasets()
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    # The averaged gradient of size() workers' batches: a size()-times larger lr
    # (Adasum would keep it).
    scale = 1 if args.use_adasum else hvd.size()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * scale, momentum=args.momentum)

    # Every worker starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()

    checksum = sum(float(t.double().sum()) for t in model.state_dict().values())
    print(f"weights checksum {checksum!r}", flush=True)
