"""SyncBatchNorm for cortado.torch: batch normalization over the whole
global batch (every worker's samples), as Horovod's hvd.SyncBatchNorm.

In training, each forward pass sums three per-channel statistics over the
workers in one push_pull (float64): the sample count, count*mean and
count*(mean^2 + variance) of this worker's batch, from which every worker
gets the global mean and (biased) variance; workers may have different
batch sizes. The backward pass sums the per-channel sums of dy and
dy*x_hat the same way, so the input gradient is that of normalizing the
global batch. The weight and bias gradients stay this worker's own (the
DistributedOptimizer averages them, as any gradient). Running statistics
are updated with the global mean and unbiased variance. In eval mode, or
with one worker, it is torch's BatchNorm.

Each module's engine tensors are named at its first training forward pass
("syncbn.<k>", k in the order of first use), so workers must run their
SyncBatchNorm modules in the same order, as they run the model.
"""

import itertools

import torch

from .. import _runtime
from . import ops

_order = itertools.count()


def _sum(values, name):
    """Sums a float64 vector over the workers (push_pull, blocking)."""
    values = values.contiguous()
    return _runtime.synchronize(ops.submit("SyncBatchNorm", values, values, False, name, 0, None))


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, name):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        count = x.numel() // c
        if count > 0:
            var, mean = torch.var_mean(x.detach().double(), dim=dims, unbiased=False)
        else:
            var = mean = torch.zeros(c, dtype=torch.float64, device=x.device)
        stats = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device),
                           count * mean, count * (mean * mean + var)])
        total = _sum(stats.cpu() if x.is_cuda else stats, f"{name}.forward").to(x.device)
        n = total[0].item()
        if n < 1:
            raise _runtime.error("invalid_argument",
                                 "cortado.torch.SyncBatchNorm: the global batch is empty "
                                 "(every worker passed 0 samples)")
        g_mean = total[1:c + 1] / n
        g_var = (total[c + 1:] / n - g_mean * g_mean).clamp_(min=0)
        invstd = torch.rsqrt(g_var + eps)
        shape = [1, c] + [1] * (x.dim() - 2)
        mean_x = g_mean.to(x.dtype).view(shape)
        invstd_x = invstd.to(x.dtype).view(shape)
        xhat = (x - mean_x) * invstd_x
        y = xhat
        if weight is not None:
            y = y * weight.view(shape)
        if bias is not None:
            y = y + bias.view(shape)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = g_var * (n / (n - 1)) if n > 1 else g_var
                running_mean.mul_(1 - factor).add_(g_mean.to(running_mean.dtype), alpha=factor)
                running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        ctx.save_for_backward(xhat, weight, invstd_x)
        ctx.n, ctx.name, ctx.dims, ctx.shape = n, name, dims, shape
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        c = xhat.shape[1]
        dy = dy.contiguous()
        sum_dy = dy.sum(dims, dtype=torch.float64)
        sum_dy_xhat = (dy * xhat).sum(dims, dtype=torch.float64)
        local = torch.cat([sum_dy, sum_dy_xhat])
        total = _sum(local.cpu() if dy.is_cuda else local, f"{ctx.name}.backward").to(dy.device)
        mean_dy = (total[:c] / ctx.n).to(dy.dtype).view(shape)
        mean_dy_xhat = (total[c:] / ctx.n).to(dy.dtype).view(shape)
        scale = invstd if weight is None else invstd * weight.view(shape)
        dx = (dy - mean_dy - xhat * mean_dy_xhat) * scale
        dw = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        db = sum_dy.to(dy.dtype) if ctx.has_bias else None
        return dx, dw, db, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization over the global batch of all workers (see the
    module docstring); a drop-in for torch.nn.BatchNorm1d/2d/3d with the
    same arguments and state_dict."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self._cortado_name = None

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2-D input (batch, channels, ...), "
                             f"got {input.dim()}-D")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or _runtime.size() == 1:
            return super().forward(input)
        factor = 0.0
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        if self._cortado_name is None:
            self._cortado_name = f"syncbn.{next(_order)}"
        running = self.track_running_stats
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if running else None,
                                      self.running_var if running else None,
                                      self.eps, factor, self._cortado_name)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """`module` with every torch.nn BatchNorm layer replaced by a
        SyncBatchNorm holding the same parameters and running statistics."""
        out = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
                not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for child_name, child in module.named_children():
            out.add_module(child_name, cls.convert_sync_batchnorm(child))
        return out
