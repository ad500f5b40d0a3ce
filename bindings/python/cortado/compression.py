"""Gradient compression as the bindings apply it today.

`Compression.none` and `Compression.fp16` work now, on NumPy arrays and torch
tensors alike: fp16 casts floating-point tensors to half precision before the
push_pull and back after it (as Horovod's FP16Compressor does); other dtypes
pass through unchanged. The servers sum fp16 in fp32 and round once.

The codec library (compressor/: top-k, random-k, onebit, signSGD, DGC, QSGD,
TernGrad, natural compression, PowerSGD, error feedback) and the planner's
per-tensor plans ("auto") are not yet wired into push-pull. Asking for them
raises CortadoError that says so, instead of silently sending dense data.
"""

from ._runtime import error


class Compressor:
    """Turns a tensor into what is pushed, and the pulled result back."""

    name = "none"

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


# Codecs that exist in the design (DESIGN.md, "Compression") but that
# push-pull cannot carry yet.
PLANNED = ("auto", "bf16", "topk", "randomk", "onebit", "signsgd", "efsignsgd", "dgc", "qsgd",
           "terngrad", "natural", "powersgd")
AVAILABLE = ("none", "fp16")


def _not_yet(name):
    return error("unavailable",
                 f"compression '{name}' is not available in this build yet: the codec library "
                 f"is not integrated into push-pull (nor the planner's 'auto' plans). Available "
                 f"now: {', '.join(AVAILABLE)}")


class Compression:
    """Choose with `compression=cortado.Compression.fp16` (or the string "fp16").

    Valid now: none, fp16. Named for later (they raise CortadoError today):
    auto, bf16, topk(ratio), randomk(ratio), onebit(), signsgd(), efsignsgd(),
    dgc(ratio), qsgd(levels), terngrad(), natural(), powersgd(rank).
    """

    none = NoneCompressor()
    fp16 = FP16Compressor()

    @staticmethod
    def topk(ratio=0.01, error_feedback=True):
        raise _not_yet("topk")

    @staticmethod
    def randomk(ratio=0.01, error_feedback=True):
        raise _not_yet("randomk")

    @staticmethod
    def onebit(scaling=True):
        raise _not_yet("onebit")

    @staticmethod
    def signsgd():
        raise _not_yet("signsgd")

    @staticmethod
    def efsignsgd():
        raise _not_yet("efsignsgd")

    @staticmethod
    def dgc(ratio=0.01):
        raise _not_yet("dgc")

    @staticmethod
    def qsgd(levels=256):
        raise _not_yet("qsgd")

    @staticmethod
    def terngrad():
        raise _not_yet("terngrad")

    @staticmethod
    def natural():
        raise _not_yet("natural")

    @staticmethod
    def powersgd(rank=4):
        raise _not_yet("powersgd")

    @staticmethod
    def bf16():
        raise _not_yet("bf16")

    @staticmethod
    def lookup(spec):
        """A Compressor from a Compressor, None, or a name ("none", "fp16",
        "topk:ratio=0.01", ...). Raises CortadoError for unknown names, listing
        the valid ones."""
        if spec is None:
            return Compression.none
        if isinstance(spec, Compressor):
            return spec
        if isinstance(spec, str):
            name = spec.strip().lower().split(":", 1)[0].split("(", 1)[0]
            if name in ("", "none"):
                return Compression.none
            if name in ("fp16", "float16", "half"):
                return Compression.fp16
            if name in PLANNED:
                raise _not_yet(name)
            raise error("invalid_argument",
                        f"unknown compression '{spec}': valid are {', '.join(AVAILABLE)} "
                        f"(and, once the codec library is integrated: {', '.join(PLANNED)})")
        raise error("invalid_argument",
                    f"compression must be a cortado.Compression member or a name, got "
                    f"{type(spec).__name__}: valid names are {', '.join(AVAILABLE)}")
