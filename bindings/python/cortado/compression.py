"""Gradient compression for push_pull and DistributedOptimizer.

Three kinds:
- `Compression.none` and `Compression.fp16`: applied here, on NumPy arrays and
  torch tensors alike. fp16 casts floating-point tensors to half precision
  before the push_pull and back after it (as Horovod's FP16Compressor does);
  other dtypes pass through. The servers sum fp16 in fp32 and round once.
- Engine codecs (`Compression.topk(0.01)`, `.randomk`, `.onebit`, `.signsgd`,
  `.efsignsgd`, `.dgc`, `.qsgd`, `.terngrad`, `.natural`, `.bf16`, or any
  registry spec with `Compression.codec("topk:ratio=0.001")`): the tensor is
  declared with the codec, the worker engine encodes each chunk before the
  push (with error feedback kept on the worker, when asked), the servers
  decompress, sum and re-compress, and the engine decodes the result. Float32
  tensors only.
- `Compression.auto` (or "auto"): the Espresso planner (scheduler/planner)
  decides per tensor whether to compress and with which codec; see
  AutoCompression.
- `Compression.gravac(...)` (or "gravac:codec=topk,window=50"): GraVAC, a
  sparsifier whose ratio adapts every step, the same on every worker; for
  DistributedOptimizer only (cortado/gravac.py).
"""

import json
import os
import tempfile
import warnings

from . import _C, paths
from ._runtime import error


class Compressor:
    """Turns a tensor into what is pushed, and the pulled result back."""

    name = "none"
    # (codec spec, error feedback) for the engine, or None: nothing to declare.
    engine_codec = None

    def compress(self, tensor):
        """Returns (tensor to push, context for decompress)."""
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor

    def __repr__(self):
        return f"cortado.Compression.{self.name}"


class NoneCompressor(Compressor):
    name = "none"


def _is_torch(t):
    return hasattr(t, "data_ptr") and hasattr(t, "half")


class FP16Compressor(Compressor):
    name = "fp16"

    def compress(self, tensor):
        if _is_torch(tensor):
            import torch
            if tensor.dtype in (torch.float32, torch.float64):
                return tensor.to(torch.float16).contiguous(), tensor.dtype
            return tensor, None
        import numpy as np
        if tensor.dtype in (np.float32, np.float64):
            return np.ascontiguousarray(tensor, dtype=np.float16), tensor.dtype
        return tensor, None

    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        if _is_torch(tensor):
            return tensor.to(ctx)
        return tensor.astype(ctx)


# Engine codecs and whether error feedback is on by default: on for the
# biased ones (what they drop or distort is carried into the next round), off
# for the unbiased quantizers and the casts.
ENGINE_CODECS = {
    "topk": True, "randomk": True, "dgc": True, "onebit": True, "signsgd": True,
    "efsignsgd": True, "qsgd": False, "terngrad": False, "natural": False, "bf16": False,
}
# In the registry but not carried by push-pull (two reductions per round).
REFUSED = {"powersgd": "PowerSGD needs two reductions per round (P, then Q), which one push-pull "
                       "does not carry; use topk, dgc or efsignsgd with error feedback instead"}
LOCAL = ("none", "fp16")


def engine_has_codecs():
    """True when this build's worker engine compresses in push-pull."""
    return bool(getattr(_C, "engine_codecs", False))


def _valid_names():
    return ", ".join(LOCAL + ("auto",) + tuple(ENGINE_CODECS) + ("gravac",))


class Codec(Compressor):
    """An engine codec: `spec` as the registry reads it ("topk:ratio=0.01"),
    with or without error feedback on the worker."""

    def __init__(self, spec, error_feedback=None):
        name = spec.strip().lower().split(":", 1)[0]
        if name in REFUSED:
            raise error("invalid_argument", f"compression '{spec}': {REFUSED[name]}")
        if name not in ENGINE_CODECS:
            raise error("invalid_argument",
                        f"unknown compression '{spec}': valid are {_valid_names()}")
        if not engine_has_codecs():
            raise error("unavailable",
                        f"compression '{spec}' needs a worker engine that compresses in "
                        f"push-pull, and this build's does not: rebuild from a tree with the "
                        f"codec integration, or use none or fp16")
        self.spec = _C.canonical_codec(spec.strip().lower())  # raises naming the valid params
        self.name = name
        self.error_feedback = ENGINE_CODECS[name] if error_feedback is None \
            else bool(error_feedback)
        self.engine_codec = (self.spec, self.error_feedback)

    def __repr__(self):
        return f"cortado.Compression.codec('{self.spec}', error_feedback={self.error_feedback})"

    def __eq__(self, other):
        return isinstance(other, Codec) and self.engine_codec == other.engine_codec

    def __hash__(self):
        return hash(self.engine_codec)


# The codecs "auto" chooses from: each is planned for the whole model, and
# the one with the shortest simulated iteration wins.
AUTO_CANDIDATES = ("topk:ratio=0.01", "dgc:ratio=0.01", "efsignsgd", "fp16")


class AutoCompression(Compressor):
    """Per-tensor compression chosen by the Espresso planner.

    For a list of tensors (name, element count, bytes per element, in model
    order) it writes a model profile (gradient-ready order: the last layer
    first; backward time estimated as `ns_per_element` per element, since the
    tensors are planned before the first step), runs the planner once per
    candidate codec for a cluster of W one-device machines with CPU servers
    (the parameter-server path this runtime executes), keeps the codec with the
    shortest simulated iteration, and compresses exactly the tensors whose
    plan carries compressed data. The links come from the planner's hardware
    model (scheduler/planner/costs/hardware.json): `inter` names one.
    """

    name = "auto"

    def __init__(self, candidates=AUTO_CANDIDATES, inter="10gbit", intra="pcie", cpu_cores=None,
                 ns_per_element=2.0):
        self.candidates = tuple(candidates)
        self.inter = inter
        self.intra = intra
        self.cpu_cores = cpu_cores or os.cpu_count() or 1
        self.ns_per_element = float(ns_per_element)
        self.last_report = None

    def __call__(self, candidates=AUTO_CANDIDATES, inter="10gbit", intra="pcie", cpu_cores=None,
                 ns_per_element=2.0):
        """Compression.auto(inter="25gbit", ...): the same with other settings."""
        return AutoCompression(candidates, inter, intra, cpu_cores, ns_per_element)

    def engine_ready(self):
        if not engine_has_codecs():
            raise error("unavailable",
                        "compression 'auto' applies the planner's per-tensor codecs, but this "
                        "build's worker engine does not compress in push-pull: use none or fp16")

    def plan(self, tensors, workers):
        """{name: Compressor} for `tensors`, a list of (name, elements, dtype
        bytes) in model order. Tensors that are not float32 stay uncompressed."""
        self.engine_ready()
        tensors = [(n, int(e), int(b)) for n, e, b in tensors if int(e) > 0]
        if not tensors:
            return {}
        profile = {
            "format": "cortado-profile", "model": "cortado.torch",
            "source": f"parameters of the training script; backward time estimated at "
                      f"{self.ns_per_element} ns per element",
            "forward_us": 0.0,
            "tensors": [{"name": n, "elements": e, "dtype_bytes": b,
                         "backward_us": e * self.ns_per_element / 1000.0}
                        for n, e, b in reversed(tensors)],
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="cortado-profile-",
                                         delete=False) as f:
            json.dump(profile, f)
            path = f.name
        try:
            runs = []
            data_dir = paths.planner_data() or ""
            for codec in self.candidates:
                r = _C.plan_model(path, codec, max(1, int(workers)), 1, self.intra, self.inter,
                                  int(self.cpu_cores), True, data_dir)
                runs.append((r["iter_us"], codec, r))
        finally:
            os.unlink(path)
        best_us, best_codec, best = min(runs, key=lambda x: x[0])
        plan = json.loads(best["plan"])["tensors"]
        chosen = {}
        for n, e, b in tensors:
            option = plan.get(n, {})
            compressed = any(s.get("compressed") for s in option.get("steps", []))
            chosen[n] = Compression.lookup(option.get("codec", best_codec)) \
                if compressed and b == 4 else Compression.none
        self.last_report = {
            "codec": best_codec, "iter_us": best_us,
            "no_compression_us": best["no_compression_us"],
            "candidates": {c: r["iter_us"] for _, c, r in runs},
            "compressed": sorted(n for n, c in chosen.items() if c is not Compression.none),
        }
        return chosen


def _gravac_from_text(text):
    """"gravac" or "gravac:codec=topk,min_ratio=10,window=50,..."."""
    _, _, rest = text.partition(":")
    kwargs = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise error("invalid_argument",
                        f"compression '{text}': '{item}' is not key=value (e.g. "
                        f"gravac:codec=topk,min_ratio=10,max_ratio=1000,window=500)")
        key = key.strip()
        value = value.strip()
        if key not in ("codec", "policy", "replan", "inter"):
            try:
                value = int(value) if key in ("window", "seed") else float(value)
            except ValueError:
                raise error("invalid_argument",
                            f"compression '{text}': {key}={value} is not a number") from None
        kwargs[key] = value
    try:
        return Compression.gravac(**kwargs)
    except TypeError:
        raise error("invalid_argument",
                    f"compression '{text}': unknown setting; gravac takes codec, min_ratio, "
                    f"max_ratio, window, epsilon, omega, policy, step, alpha, seed, "
                    f"batch_size, replan, inter, ns_per_element") from None


def dgc_momentum(compression):
    """DGC's momentum-correction factor in `compression` (a Compressor, a
    name or spec such as "dgc:ratio=0.01", or GraVAC's over DGC); 0 where
    it has none. An optimizer's own momentum on top counts it twice."""
    if isinstance(compression, str):
        if compression.strip().lower() in ("none", "fp16", "auto", ""):
            return 0.0
        compression = Compression.lookup(compression)
    settings = getattr(compression, "settings", None)  # GraVAC's (cortado.gravac)
    spec = settings["codec"] if settings else getattr(compression, "spec", None)
    if not spec:
        return 0.0
    name, _, params = _C.canonical_codec(spec).partition(":")
    if name != "dgc":
        return 0.0
    values = dict(kv.split("=", 1) for kv in params.split(",") if "=" in kv)
    return float(values.get("momentum", 0))


def warn_momentum_twice(where, dgc, own, stacklevel):
    """The warning that DGC's momentum correction (factor `dgc`) meets an
    optimizer's own momentum (`own`), when both are on: momentum then counts
    twice, which makes training unstable at high ratios. It runs, since the
    combination may be meant."""
    if dgc > 0 and own > 0:
        warnings.warn(f"{where}: DGC's momentum correction (momentum={dgc:g}) already adds "
                      f"momentum to the gradients, and the optimizer adds its own "
                      f"(momentum={own:g}): momentum counts twice, which makes training "
                      f"unstable at high compression ratios. Give the optimizer momentum=0 "
                      f"(DGC's correction takes its place, as in the DGC paper), or compress "
                      f"with dgc:momentum=0 to keep the optimizer's.", RuntimeWarning,
                      stacklevel=stacklevel + 1)


class Compression:
    """Choose with `compression=cortado.Compression.topk(0.01)` (or the string
    "topk:ratio=0.01").

    none, fp16: applied by the binding. topk(ratio), randomk(ratio), dgc(ratio),
    onebit(), signsgd(), efsignsgd(), qsgd(levels), terngrad(), natural(),
    bf16(), codec(spec): applied by the engine and the servers (float32), with
    error feedback where `error_feedback` (default: on for the biased codecs).
    auto: the planner decides per tensor. gravac(codec, min_ratio, max_ratio,
    window, epsilon, omega, policy): an adaptive ratio (DistributedOptimizer).
    """

    none = NoneCompressor()
    fp16 = FP16Compressor()
    auto = AutoCompression()

    @staticmethod
    def codec(spec, error_feedback=None):
        """Any engine codec by registry spec, e.g. "qsgd:levels=15"."""
        return Codec(spec, error_feedback)

    @staticmethod
    def topk(ratio=0.01, error_feedback=True):
        return Codec(f"topk:ratio={float(ratio)!r}", error_feedback)

    @staticmethod
    def randomk(ratio=0.01, error_feedback=True, seed=0):
        return Codec(f"randomk:ratio={float(ratio)!r},seed={int(seed)}", error_feedback)

    @staticmethod
    def dgc(ratio=0.01, error_feedback=True):
        return Codec(f"dgc:ratio={float(ratio)!r}", error_feedback)

    @staticmethod
    def onebit(error_feedback=True):
        return Codec("onebit", error_feedback)

    @staticmethod
    def signsgd(error_feedback=True):
        return Codec("signsgd", error_feedback)

    @staticmethod
    def efsignsgd(error_feedback=True):
        return Codec("efsignsgd", error_feedback)

    @staticmethod
    def qsgd(levels=7, error_feedback=False):
        return Codec(f"qsgd:levels={int(levels)}", error_feedback)

    @staticmethod
    def terngrad(error_feedback=False):
        return Codec("terngrad", error_feedback)

    @staticmethod
    def natural(error_feedback=False):
        return Codec("natural", error_feedback)

    @staticmethod
    def bf16():
        return Codec("bf16", False)

    @staticmethod
    def gravac(codec="dgc", min_ratio=10.0, max_ratio=1000.0, window=500, epsilon=0.9,
               omega=0.01, policy="exponential", **kwargs):
        """GraVAC: a ratio in [min_ratio, max_ratio] (compression factors: 10
        keeps 10%) chosen every step from the compression gain, the same on
        every worker; for DistributedOptimizer (cortado.gravac has the details)."""
        from .gravac import GravacCompression
        return GravacCompression(codec, min_ratio, max_ratio, window, epsilon, omega, policy,
                                 **kwargs)

    @staticmethod
    def powersgd(rank=4):
        raise error("invalid_argument", f"compression 'powersgd': {REFUSED['powersgd']}")

    @staticmethod
    def lookup(spec):
        """A Compressor from a Compressor, None, or a name ("none", "fp16",
        "auto", "topk", "topk:ratio=0.01", ...). Raises CortadoError for
        unknown names and bad parameters, listing the valid ones."""
        if spec is None:
            return Compression.none
        if isinstance(spec, Compressor):
            return spec
        if isinstance(spec, str):
            text = spec.strip().lower()
            name = text.split(":", 1)[0].split("(", 1)[0]
            if name in ("", "none"):
                return Compression.none
            if name in ("fp16", "float16", "half"):
                return Compression.fp16
            if name == "auto":
                return Compression.auto
            if name == "gravac":
                return _gravac_from_text(text)
            return Codec(text)
        raise error("invalid_argument",
                    f"compression must be a cortado.Compression member or a name, got "
                    f"{type(spec).__name__}: valid names are {_valid_names()}")
