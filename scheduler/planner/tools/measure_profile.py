#!/usr/bin/python3
"""Measures a model profile for the planner from a real run of the model.

Runs forward and backward passes of a torchvision model with a hook on every
parameter's gradient, and writes the gradient-ready order and the backward
time between consecutive gradients (median over the timed iterations) in the
planner's profile format ("cortado-profile", docs/planner.md). The times are
this machine's, on the device given (CPU unless --device cuda), so a profile
measured on the training GPU replaces the bundled FLOPs-based estimates:

  /usr/bin/python3 measure_profile.py --model resnet50 --batch 32 --out resnet50.json
  cortado plan --model resnet50.json ...
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torchvision


def build(name, image_size):
    ctor = getattr(torchvision.models, name, None)
    if ctor is None or not callable(ctor):
        if hasattr(torchvision.models, "list_models"):
            valid = sorted(torchvision.models.list_models(module=torchvision.models))
        else:
            valid = sorted(n for n in dir(torchvision.models)
                           if not n.startswith("_") and n.islower() and callable(getattr(torchvision.models, n)))
        sys.exit(f"measure_profile.py: unknown model '{name}' (torchvision models: {', '.join(valid)})")
    return ctor(), (3, image_size, image_size)


def measure(model, shape, batch, iters, warmup, device):
    model = model.to(device).train()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    ready = {}

    def hook_for(name):
        def hook(grad):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ready[name] = time.perf_counter()
        return hook

    for n, p in params:
        p.register_hook(hook_for(n))
    x = torch.randn(batch, *shape, device=device)
    forward, per_tensor, order = [], {n: [] for n, _ in params}, None
    for it in range(warmup + iters):
        ready.clear()
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = model(x).float().square().mean()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        loss.backward()
        missing = [n for n, _ in params if n not in ready]
        if missing:
            sys.exit(f"measure_profile.py: no gradient for {', '.join(missing[:5])}; "
                     "is every parameter used in the forward pass?")
        this_order = sorted((ready[n], i, n) for i, (n, _) in enumerate(params))
        if it < warmup:
            continue
        forward.append((t1 - t0) * 1e6)
        if order is None:
            order = [n for _, _, n in this_order]
        prev = t1
        for t, _, n in this_order:
            per_tensor[n].append(max(0.0, (t - prev) * 1e6))
            prev = max(prev, t)
    sizes = dict((n, p.numel()) for n, p in params)
    dtype = dict((n, p.element_size()) for n, p in params)
    tensors = [{"name": n, "elements": int(sizes[n]), "dtype_bytes": int(dtype[n]),
                "backward_us": round(statistics.median(per_tensor[n]), 3)} for n in order]
    return statistics.median(forward), tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a torchvision model name, e.g. resnet50")
    ap.add_argument("--batch", type=int, default=8, help="batch per GPU")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (median kept)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--out", required=True, help="profile JSON to write")
    a = ap.parse_args()
    if a.batch < 1 or a.iters < 1 or a.image_size < 16:
        sys.exit("measure_profile.py: --batch and --iters must be >= 1 and --image-size >= 16")
    if a.device not in ("cpu", "cuda"):
        sys.exit(f"measure_profile.py: --device must be cpu or cuda, got '{a.device}'")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("measure_profile.py: --device cuda, but torch sees no GPU")
    torch.manual_seed(0)
    model, shape = build(a.model, a.image_size)
    device = torch.device(a.device)
    forward_us, tensors = measure(model, shape, a.batch, a.iters, a.warmup, device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    doc = {"format": "cortado-profile", "model": a.model,
           "source": (f"measured: torchvision {torchvision.__version__} {a.model}, batch {a.batch}, "
                      f"{a.image_size}x{a.image_size}, on {where} with torch {torch.__version__}; "
                      f"median of {a.iters} iterations of gradient-ready times"),
           "forward_us": round(forward_us, 3), "tensors": tensors}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{a.model}: {len(tensors)} tensors, {sum(t['elements'] for t in tensors) / 1e6:.2f} M "
          f"parameters, backward {sum(t['backward_us'] for t in tensors) / 1000:.1f} ms, "
          f"forward {forward_us / 1000:.1f} ms -> {a.out}")


if __name__ == "__main__":
    main()
