"""The model, data and replay steps that the GraVAC worker scripts share
(gravac_check.py, gravac_exec_check.py): W workers train one small model,
each on its own rows of every batch with its loss scaled by 1 + rank, so
that the workers' gradients differ; the replay feeds W GraVAC cores
(cortado._C.Gravac) each worker's gradient and decodes their messages."""

import torch

PER_WORKER = 6


class Model(torch.nn.Module):
    """Three layers, and an idle one whose gradient is exactly zero on every
    worker at every step: its top-k and DGC payloads hold only zeros, so
    through Zen (5 KiB of weights, past a 4 KiB chunk) a worker hands it an
    empty pair list."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(),
                                       torch.nn.Linear(64, 48), torch.nn.Tanh(),
                                       torch.nn.Linear(48, 5))
        self.idle = torch.nn.Linear(20, 64)

    def forward(self, x):
        return self.net(x) + 0.0 * self.idle(x).sum()


def make_model():
    torch.manual_seed(77)
    return Model()


def batches(world, steps):
    g = torch.Generator().manual_seed(9)
    for _ in range(steps):
        x = torch.randn(world * PER_WORKER, 20, generator=g)
        y = torch.randint(0, 5, (world * PER_WORKER,), generator=g)
        yield x, y


def rows(rank):
    return slice(rank * PER_WORKER, (rank + 1) * PER_WORKER)


def loss_of(model, x, y, rank):
    """Worker `rank`'s loss: its own rows, scaled per rank."""
    return torch.nn.functional.cross_entropy(model(x[rows(rank)]) * (1 + rank), y[rows(rank)])


def prepare_cores(model, params, cores, x, y, step):
    """Every simulated worker's gradient into its core; returns the energies
    summed over the cores (what the job agrees on)."""
    world = len(cores)
    grads = []
    for r in range(world):
        model.zero_grad()
        loss_of(model, x, y, r).backward()
        grads.append([p.grad.detach().reshape(-1).clone() for p in params])
    for r in range(world):
        for key, g in enumerate(grads[r]):
            cores[r].prepare(key, g.data_ptr(), g.numel(), step)
    return [sum(c.local_sums()[i] for c in cores) for i in range(3)]


def decompress_add(core, key, out, scale):
    """Adds `scale` times the core's decoded message of `key` into `out`."""
    nbytes = core.message_bytes(key)
    msg = torch.empty(nbytes, dtype=torch.uint8)
    core.copy_message(key, msg.data_ptr(), nbytes)
    core.decompress_add(key, msg.data_ptr(), nbytes, out.data_ptr(), scale)
