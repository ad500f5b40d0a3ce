"""GraVAC: a compression ratio that adapts while the job trains.

`Compression.gravac(codec="dgc", min_ratio=10, max_ratio=1000, ...)` returns a
GravacCompression for `cortado.torch.DistributedOptimizer(compression=...)`.
Each step, every worker folds its gradients into their error feedback,
encodes them at the minimum ratio and, from that payload, at the candidate
ratio (multi-level compression), and the workers add up three numbers (the
energies of the compensated, the minimum and the candidate gradients) and
their step times. From those sums, identical everywhere, the controller in
the core (compressor/gravac.h) picks what this step sends (the candidate,
the minimum or the dense gradient) and, every `window` steps, the next
ratios. docs/codecs.md explains the settings.

Ratios are compression factors: 10 sends 10% of the elements, 1000 sends 0.1%.
"""

import json
import os
import tempfile

from . import _C, paths
from ._runtime import error
from .compression import Compressor

CODECS = ("dgc", "topk", "randomk")
POLICIES = ("exponential", "geometric")
REPLANS = ("keep", "planner")


class GravacCompression(Compressor):
    """GraVAC's settings, and (once an optimizer runs it) its record.

    - codec: the sparsifier, "dgc" (momentum correction), "topk" or
      "randomk" (summable: workers add their payloads).
    - min_ratio, max_ratio: the range of compression factors (the paper:
      10 to 1000).
    - window: steps between scale-ups (the paper: 500 exponential, 2000
      geometric).
    - epsilon: the least smoothed compression gain a ratio may send, in
      (0, 1]; below it the step falls back to the minimum, then to dense.
    - omega: the relative tolerance of the gain and saturation tests (1%).
    - policy: "exponential" (the step factor squared: 2, 4, 16, 256) or
      "geometric" (doubled: 2, 4, 8, ...).
    - step: the first step factor (candidate = min_ratio x step).
    - alpha: the EWMA weight of the newest gain; 0 (default): workers / 100.
    - batch_size: samples per worker and step, for the throughputs it logs
      (any constant gives the same decisions).
    - replan (executor=True only): what happens to the plan when the ratio
      moves 2x: "keep" (default) keeps the plan's options at the new ratio;
      "planner" asks the Espresso planner for the plan at the new ratio,
      on a profile of the parameters (backward time estimated at
      `ns_per_element`), one-worker machines on the `inter` link of the
      planner's hardware model.

    `history` holds one dict per step (iteration, level, ratio, min_ratio,
    candidate_ratio, gain_min, gain_candidate, saturated, bytes: what this
    worker pushed); `ratio_history` the ratio sent at each step (1.0: dense).
    """

    name = "gravac"
    engine_codec = None

    def __init__(self, codec="dgc", min_ratio=10.0, max_ratio=1000.0, window=500, epsilon=0.9,
                 omega=0.01, policy="exponential", step=2.0, alpha=0.0, seed=0, batch_size=1,
                 replan="keep", inter="10gbit", ns_per_element=2.0):
        codec = str(codec).strip().lower()
        replan = str(replan).strip().lower()
        if replan not in REPLANS:
            raise error("invalid_argument",
                        f"Compression.gravac: replan '{replan}' is unknown; use keep (the plan's "
                        f"options at the new ratio) or planner (the Espresso planner's plan)")
        self.replan = replan
        self.inter = str(inter)
        self.ns_per_element = float(ns_per_element)
        policy = str(policy).strip().lower()
        if codec not in CODECS:
            raise error("invalid_argument",
                        f"Compression.gravac: codec '{codec}' cannot be compressed in two "
                        f"levels; use one of {', '.join(CODECS)}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise error("invalid_argument",
                        f"Compression.gravac: window must be a positive number of steps, got "
                        f"{window!r}")
        if not isinstance(batch_size, (int, float)) or batch_size <= 0:
            raise error("invalid_argument",
                        f"Compression.gravac: batch_size must be positive, got {batch_size!r}")
        self.settings = dict(codec=codec, min_ratio=float(min_ratio), max_ratio=float(max_ratio),
                             step=float(step), policy=policy, window=int(window),
                             epsilon=float(epsilon), omega=float(omega), alpha=float(alpha),
                             seed=int(seed))
        self.batch_size = batch_size
        self.make(1)  # the core checks the rest and names what is wrong
        self.history = []

    def make(self, workers):
        """The core's per-worker compressor (cortado._C.Gravac) for `workers`."""
        return _C.Gravac(workers=int(workers),
                         samples_per_iteration=float(workers) * float(self.batch_size),
                         **self.settings)

    def install_planner(self, executor, tensors, workers):
        """replan="planner": the executor's re-planner is the Espresso planner
        on a profile of `tensors` ((name, elements, dtype bytes) in model
        order; gradient-ready order is the reverse) for `workers` machines."""
        if self.replan != "planner":
            return
        profile = {
            "format": "cortado-profile", "model": "cortado.torch",
            "source": f"parameters of the training script; backward time estimated at "
                      f"{self.ns_per_element} ns per element",
            "forward_us": 0.0,
            "tensors": [{"name": n, "elements": int(e), "dtype_bytes": int(b),
                         "backward_us": int(e) * self.ns_per_element / 1000.0}
                        for n, e, b in reversed(tensors)],
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="cortado-gravac-profile-",
                                         delete=False) as f:
            json.dump(profile, f)
            path = f.name
        try:
            # Every worker plans alike: the same profile, links and cores.
            executor.set_gravac_planner(path, max(1, int(workers)), "pcie", self.inter, 1,
                                        paths.planner_data() or "")
        finally:
            os.unlink(path)

    @property
    def ratio_history(self):
        return [h["ratio"] for h in self.history]

    def compress(self, tensor):
        raise error("invalid_argument",
                    "Compression.gravac chooses one ratio for all of a model's gradients each "
                    "step: pass it to cortado.torch.DistributedOptimizer(compression=...), not "
                    "to a single push_pull")

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"cortado.Compression.gravac({args})"
