"""DistributedOptimizer and broadcast_optimizer_state for cortado.torch.

The optimizer wraps the user's: a hook on each parameter's gradient
accumulator starts that gradient's push_pull as soon as backward has produced
it, so communication overlaps the rest of the backward pass; step() waits for
all of them and then runs the wrapped optimizer's step. Priorities follow the
layer order of `named_parameters` (the first layer highest), so the gradients
that the next forward pass needs first are sent first.
"""

import contextlib
import json
import logging
import os
import queue
import threading
import warnings

import torch

from .. import _C, _runtime
from ..compression import (AutoCompression, Compression, Compressor, dgc_momentum,
                           warn_momentum_twice)
from ..gravac import GravacCompression
from . import zen
from .cross_barrier import CrossBarrier, _Unit
from .fusion import size_groups
from .gravac_sync import GravacSync
from .horovod import allgather_async
from .horovod_basics import Average, Sum, _check_process_set, global_process_set, resolve_op
from .ops import DTYPES, broadcast_async_, check_tensor, submit


# The executor path's default group size: DDP's default bucket (25 MiB).
DEFAULT_FUSION_BYTES = 25 << 20
# The default path's (no executor) group size: about one server partition
# (CORTADO_PARTITION_BYTES' default), small enough that the first group of
# the backward pass leaves early (docs/python.md, "Fused gradients").
DEFAULT_ENGINE_FUSION_BYTES = 4 << 20


def _check_fusion_bytes(fusion_bytes):
    if not isinstance(fusion_bytes, int) or isinstance(fusion_bytes, bool) or fusion_bytes < 0:
        raise _runtime.error("invalid_argument",
                             f"DistributedOptimizer: fusion_bytes must be a number of bytes "
                             f"(0: no groups), got {fusion_bytes!r}")
    return fusion_bytes


CODEC_DEVICES = ("gpu", "cpu")
# What DistributedOptimizer's fusion_search dict may hold (executor.md,
# "Fusion search"; codec_devices: the devices whose codec is tried).
FUSION_SEARCH_SETTINGS = ("warmup", "window", "settle", "step", "min_gain", "max_groups",
                          "finalists", "searched", "codec_devices")


def push_pull_option(codec=None, device="cpu"):
    """BytePS's path as a plan option (JSON dict): push/pull through the
    servers, with the gradient encoded on this worker and the servers'
    answer decoded there when `codec` (a codec spec) is given, by `device`:
    "cpu" (the CPU codec, on a host copy of a CUDA gradient) or "gpu" (the
    codec on the device that holds the gradient, its payload copied; on
    host memory the CPU codec). The intra steps do nothing for a worker
    that is its machine's only one (Python workers have no MPI groups)."""
    if device not in CODEC_DEVICES:
        raise _runtime.error("invalid_argument",
                             f"push_pull_option: device must be one of {CODEC_DEVICES}, "
                             f"got {device!r}")
    steps = [{"op": "reduce_scatter", "scope": "intra", "compressed": False}]
    if codec:
        steps += [{"op": "encode", "device": device},
                  {"op": "push", "scope": "inter", "compressed": True},
                  {"op": "pull", "scope": "inter", "compressed": True},
                  {"op": "decode", "device": device}]
    else:
        steps += [{"op": "push", "scope": "inter", "compressed": False},
                  {"op": "pull", "scope": "inter", "compressed": False}]
    steps.append({"op": "allgather", "scope": "intra", "compressed": False})
    option = {"scheme": "hierarchical", "steps": steps}
    if codec:
        option["codec"] = codec
    return option


def fused_plan(tensors, codec=None, fusion_bytes=DEFAULT_FUSION_BYTES, groups=None,
               device="cpu"):
    """A plan (dict) for `tensors`, (name, bytes) in gradient-ready order:
    every tensor on push_pull_option(codec, device), cut into groups of
    consecutive tensors, each closed once it holds `fusion_bytes` or more
    (0: no groups), or into `groups` (lists of names) when given. A group of
    one is no group."""
    option = push_pull_option(codec, device)
    if groups is None:
        groups, cur, size = [], [], 0
        for name, nbytes in tensors:
            cur.append(name)
            size += nbytes
            if fusion_bytes and size >= fusion_bytes:
                groups.append(cur)
                cur, size = [], 0
        if cur:
            groups.append(cur)
        if not fusion_bytes:
            groups = []
    # Version 0, as the default plan: the scheduler's re-plans (1, 2, ...) replace it.
    plan = {"format": "cortado-plan", "version": 0,
            "tensors": {name: option for name, _ in tensors}}
    if groups:
        plan["groups"] = [list(g) for g in groups if len(g) > 1]
    return plan


def _compressor_for(compression, name, param):
    if callable(compression) and not isinstance(compression, (Compressor, str)):
        return Compression.lookup(compression(name, param))
    if isinstance(compression, dict):
        return Compression.lookup(compression.get(name, Compression.none))
    return Compression.lookup(compression)


def _resolve_auto(compressors, ordered, names, world):
    """Replaces every "auto" by the planner's choice, planning all such
    parameters together (in model order), as one model."""
    autos = {}
    for _, p in ordered:
        c = compressors[p]
        if isinstance(c, AutoCompression):
            autos.setdefault(id(c), (c, []))[1].append(p)
    for auto, params in autos.values():
        chosen = auto.plan([(names[p], p.numel(), p.element_size()) for p in params], world)
        for p in params:
            compressors[p] = chosen[names[p]]


class _DistributedOptimizer(torch.optim.Optimizer):
    # Mixed into the wrapped optimizer's class by DistributedOptimizer(); its
    # __init__ runs the wrapped class's __init__ on the same param_groups.
    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 name_prefix, executor=False, plan=None, fusion_bytes=None,
                 fusion_search=None, op=Average, predivide=1.0, groups=None,
                 sparse_as_dense=False, sparse_threshold=zen.DEFAULT_SPARSE_THRESHOLD,
                 cross_barrier=None):
        super(self.__class__, self).__init__(params)
        self._cross = None  # cross_barrier's CrossBarrier, made last
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"param.{i}", p) for i, p in enumerate(all_params)]
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer: named_parameters must be (name, tensor) "
                                 "pairs, as model.named_parameters() gives")
        names = [n for n, _ in named_parameters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise _runtime.error("invalid_argument",
                                 f"DistributedOptimizer: parameter names must be unique; "
                                 f"repeated: {', '.join(duplicates)}")
        known = {id(p) for _, p in named_parameters}
        unnamed = [i for i, p in enumerate(all_params) if id(p) not in known]
        if unnamed:
            raise _runtime.error("invalid_argument",
                                 f"DistributedOptimizer: {len(unnamed)} of the optimizer's "
                                 f"parameters are missing from named_parameters")
        if backward_passes_per_step < 1:
            raise _runtime.error("invalid_argument",
                                 f"DistributedOptimizer: backward_passes_per_step must be at "
                                 f"least 1, got {backward_passes_per_step}")

        in_optimizer = {id(p) for p in all_params}
        # Model order, as named_parameters gives it: index 0 is the first layer.
        self._ordered = [(n, p) for n, p in named_parameters
                         if id(p) in in_optimizer and p.requires_grad]
        self._names = {p: f"{name_prefix}.{n}" for n, p in self._ordered}
        self._priority = {p: -i for i, (_, p) in enumerate(self._ordered)}
        self._compressors = {p: _compressor_for(compression, n, p) for n, p in self._ordered}
        for _, p in self._ordered:
            check_tensor(p, "DistributedOptimizer", "parameter")
        rt = _runtime.require("DistributedOptimizer")
        self._average = op is Average
        self._predivide = float(predivide)
        self._sparse_as_dense = bool(sparse_as_dense)
        # GraVAC: one ratio for all gradients per step, decided at synchronize().
        self._gravac = None
        self._gravac_executor = None
        if isinstance(compression, GravacCompression):
            if groups or self._predivide != 1.0:
                raise _runtime.error("invalid_argument",
                                     "DistributedOptimizer: compression gravac decides one ratio "
                                     "for every gradient; it takes no groups or "
                                     "gradient_predivide_factor")
            if executor:
                # The plan executor runs GraVAC itself (Executor::setGravac).
                self._gravac_executor = compression
            else:
                self._gravac = GravacSync(compression, self._ordered, self._names, self._average)
            self._compressors = {p: Compression.none for _, p in self._ordered}
        # DGC's momentum correction and the optimizer's own (compression.py).
        warn_momentum_twice(
            "DistributedOptimizer",
            max([dgc_momentum(compression) if isinstance(compression, GravacCompression) else 0.0]
                + [dgc_momentum(c) for c in self._compressors.values()]),
            max((float(g.get("momentum", 0) or 0) for g in self.param_groups), default=0.0),
            stacklevel=3)
        # Sparse gradients go through Zen where it can carry them
        # (zen.usable), else they are gathered.
        self._zen = True
        self._groups = self._make_groups(groups)
        # Groups made here by size (fusion_bytes) rather than given: a sparse
        # gradient in one travels on its own (_push_pull_group_async), and
        # the groups are made again once Zen's candidates are decided
        # (_regroup). _fusion_bytes is their size, 0 where there are none.
        self._default_groups = False
        self._fusion_bytes = 0
        self.executor = None
        if executor:
            self._start_executor(rt, compression, plan, fusion_bytes, fusion_search)
        elif plan is not None:
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer: plan= needs executor=True (the plan "
                                 "executor runs plans)")
        else:
            _resolve_auto(self._compressors, self._ordered, self._names, rt.size)
            fusion_bytes = _check_fusion_bytes(
                DEFAULT_ENGINE_FUSION_BYTES if fusion_bytes is None else fusion_bytes)
            if not self._groups and self._gravac is None and fusion_bytes:
                self._fusion_bytes = fusion_bytes
                self._default_groups = True
                # Until the first step's densities are agreed on, Zen's
                # candidates travel on their own (their density is measured
                # on the gradient alone).
                self._groups = size_groups(
                    self._ordered, self._compressors, fusion_bytes,
                    lambda p: sparse_threshold > 0 and zen.dense_candidate(p, self._compressors[p]))
        self._backward_passes_per_step = backward_passes_per_step
        self._delay = {p: backward_passes_per_step for _, p in self._ordered}
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self._grad_accs = []
        # Every worker declares every gradient (and group) up front, in the
        # same order, so that hooks firing in any order never wait on one another.
        self._group_of = {}
        self._group_bufs = {}
        if self.executor is None:
            for g, members in enumerate(self._groups):
                for q in members:
                    self._group_of[q] = g
                self._declare_group(rt, g, members)
        for _, p in ([] if self.executor is not None or self._gravac is not None else self._ordered):
            if p in self._group_of:
                continue
            c = self._compressors[p]
            sent, _ = c.compress(torch.empty(0, dtype=p.dtype))
            if c.engine_codec is not None and p.dtype != torch.float32:
                raise _runtime.error(
                    "invalid_argument",
                    f"DistributedOptimizer: parameter '{self._names[p]}' is {p.dtype}, but "
                    f"compression '{c.engine_codec[0]}' encodes float32 gradients; give it "
                    f"compression none or fp16 (a dict or a function of (name, param))")
            if not _runtime.usable(rt, self._names[p]):
                _runtime.declare(rt, self._names[p], DTYPES[sent.dtype], p.numel(),
                                 c.engine_codec)
        # Dense gradients that are mostly zeros go through Zen (zen.py): the
        # candidates' densities are measured at the first step and agreed on
        # at its synchronize(); p -> True (Zen) or False once decided.
        self._sparse_threshold = float(sparse_threshold)
        self._dense_zen = {}
        self._density = {}
        self._zen_candidates = {
            p: True for _, p in self._ordered
            if self._sparse_threshold > 0 and self.executor is None and self._gravac is None
            and p not in self._group_of and zen.dense_candidate(p, self._compressors[p])}
        self.sparse_densities = {}
        self._register_hooks()
        if cross_barrier is not None:
            if self.executor is not None:
                raise _runtime.error("invalid_argument",
                                     "DistributedOptimizer: cross_barrier runs on the default "
                                     "path; the plan executor (executor=True) waits for every "
                                     "gradient in step(): pass one of them")
            if self._gravac is not None:
                raise _runtime.error("invalid_argument",
                                     "DistributedOptimizer: compression gravac decides one "
                                     "ratio from all gradients at synchronize(); it does not "
                                     "run with cross_barrier")
            self._cross = CrossBarrier(self, cross_barrier)
            if not self._cross.hooked_modules:
                self._cross.remove()
                self._cross = None
                raise _runtime.error("invalid_argument",
                                     "DistributedOptimizer: the model given as cross_barrier "
                                     "holds none of the optimizer's parameters: pass the model "
                                     "that the optimizer trains")

    def _start_executor(self, rt, compression, plan, fusion_bytes, fusion_search):
        """The plan executor runs every gradient. The plan decides the path
        and the compression of each: `plan`, else CORTADO_PLAN, else a plan
        made here from `compression` (one codec for every gradient) with the
        gradients fused into groups of about `fusion_bytes` (and with
        CORTADO_PROFILE_WINDOW, the scheduler's re-plans later)."""
        gravac = self._gravac_executor
        if gravac is not None:
            # The plan's compressed steps carry GraVAC's messages as top-k at
            # its CF (the executor sets the ratio); fusion search and online
            # re-planning would change the plan under it.
            if fusion_search is True or isinstance(fusion_search, dict):
                raise _runtime.error("invalid_argument",
                                     "DistributedOptimizer: compression gravac re-plans when its "
                                     "ratio moves; it takes no fusion_search")
            fusion_search = False
            compression = "topk:ratio=0.1"
        per_tensor = isinstance(compression, dict) or (
            callable(compression) and not isinstance(compression, (Compressor, str)))
        c = None if per_tensor else Compression.lookup(compression)
        if per_tensor or isinstance(c, AutoCompression):
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer: with executor=True one compression "
                                 "applies to every gradient (none, fp16 or an engine codec); "
                                 "per-gradient choices are the plan's: pass plan= (cortado plan "
                                 "--json) or set CORTADO_PROFILE_WINDOW for the scheduler's")
        if (plan is not None or os.environ.get("CORTADO_PLAN")) and c is not Compression.none \
                and gravac is None:
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer: a plan (plan= or CORTADO_PLAN) chooses "
                                 "each gradient's compression; leave compression none")
        fusion_bytes = _check_fusion_bytes(
            DEFAULT_FUSION_BYTES if fusion_bytes is None else fusion_bytes)
        # CORTADO_DEVICE says where the executor's buffers live: host memory,
        # or CUDA memory (the workers under `cortado launch --mpi`).
        cuda = os.environ.get("CORTADO_DEVICE", "host").strip().lower() == "cuda"
        for _, p in self._ordered:
            if p.dtype != torch.float32 or p.device.type != ("cuda" if cuda else "cpu"):
                raise _runtime.error(
                    "invalid_argument",
                    f"DistributedOptimizer: executor=True runs float32 "
                    f"{'CUDA' if cuda else 'CPU'} gradients"
                    f"{' (CORTADO_DEVICE=cuda)' if cuda else ''}; parameter "
                    f"'{self._names[p]}' is {p.dtype} on {p.device}"
                    + ("" if cuda or p.device.type != "cuda" else
                       ": for CUDA parameters start the workers with `cortado launch --mpi` "
                       "and CORTADO_DEVICE=cuda"))
        own_plan = plan is None and not os.environ.get("CORTADO_PLAN")
        codec = None
        if own_plan:
            codec = None if c is Compression.none else ("fp16" if c is Compression.fp16 else c.spec)
        if fusion_search is None:  # on where a codec is named and nothing else
            fusion_search = bool(codec) and \
                os.environ.get("CORTADO_PROFILE_WINDOW", "0") in ("", "0")
        if not isinstance(fusion_search, (bool, dict)):
            raise _runtime.error("invalid_argument",
                                 f"DistributedOptimizer: fusion_search must be True, False or a "
                                 f"dict of its settings (warmup, window, settle, step, min_gain, "
                                 f"max_groups, finalists, searched, codec_devices), got "
                                 f"{fusion_search!r}")
        # A dict of settings turns the search on, an empty one with defaults.
        search_on = fusion_search is True or isinstance(fusion_search, dict)
        search_settings = dict(fusion_search) if isinstance(fusion_search, dict) else {}
        unknown = sorted(set(search_settings) - set(FUSION_SEARCH_SETTINGS))
        if unknown:
            raise _runtime.error("invalid_argument",
                                 f"DistributedOptimizer: fusion_search has no setting "
                                 f"{', '.join(map(repr, unknown))}; it takes "
                                 f"{', '.join(FUSION_SEARCH_SETTINGS)}")
        # The search's alternatives: the codec on each of codec_devices (by
        # default "gpu" and "cpu" for CUDA gradients, where the two differ),
        # each searched over the groups, the fastest kept.
        devices = search_settings.pop("codec_devices", None)
        if devices is not None and not (own_plan and codec):
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer: fusion_search codec_devices chooses where "
                                 "the codec runs; it needs compression naming a codec and no plan")
        if devices is None and search_on and own_plan and codec and cuda:
            devices = list(CODEC_DEVICES)
        if devices is not None:
            if isinstance(devices, str) or not isinstance(devices, (list, tuple)) or not devices \
                    or any(d not in CODEC_DEVICES for d in devices) or len(set(devices)) < len(devices):
                raise _runtime.error("invalid_argument",
                                     f"DistributedOptimizer: fusion_search codec_devices must be "
                                     f"a list of distinct values from {list(CODEC_DEVICES)}, got "
                                     f"{devices!r}")
        if own_plan:
            explicit = None if not self._groups else \
                [[self._names[q] for q in members] for members in self._groups]
            tensors = [(self._names[p], p.numel() * p.element_size())
                       for _, p in reversed(self._ordered)]
            plan = fused_plan(tensors, codec, fusion_bytes, explicit,
                              device=devices[0] if devices else "cpu")
            if search_on and devices:
                search_settings["alternatives"] = [
                    json.dumps(fused_plan(tensors, codec, fusion_bytes, explicit, device=d))
                    for d in devices]
        elif self._groups:
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer: groups= with a plan (plan= or "
                                 "CORTADO_PLAN): the plan's groups decide; pass one of them")
        ex = _C.Executor(rt)
        for _, p in self._ordered:
            ex.declare(self._names[p], p.numel())
        if plan is not None:
            if isinstance(plan, dict):
                text = json.dumps(plan)
            elif isinstance(plan, (str, os.PathLike)) and os.path.isfile(plan):
                with open(plan, encoding="utf-8") as f:
                    text = f.read()
            elif isinstance(plan, str) and plan.lstrip().startswith("{"):
                text = plan
            else:
                raise _runtime.error("invalid_argument",
                                     f"DistributedOptimizer: plan must be a plan dict, its JSON "
                                     f"text or a file holding it; got {plan!r}")
            ex.set_plan(text)
        if gravac is None:
            ex.enable_online()
        else:
            ex.enable_gravac(samples_per_iteration=float(rt.size) * float(gravac.batch_size),
                             **gravac.settings)
            gravac.install_planner(ex, [(self._names[p], p.numel(), p.element_size())
                                        for _, p in self._ordered], rt.size)
            if rt.rank == 0:
                logging.getLogger("cortado.gravac").info(
                    "GraVAC in the plan executor: re-plans by %s", ex.gravac_replanner)
        if search_on:
            try:
                ex.enable_fusion_search(**search_settings)
            except TypeError as e:
                raise _runtime.error("invalid_argument",
                                     f"DistributedOptimizer: fusion_search settings: {e}") from None
        self.executor = ex
        self._iteration = 0
        self._cuda_submitter = _CudaSubmitter(ex) if ex.device == "cuda" else None
        self._flatten_grads()
        ex.begin_iteration(0)

    def _flatten_grads(self):
        """Every gradient becomes a view into one flat buffer, in
        gradient-ready order (the model's order reversed, as the hooks fire
        and as fused_plan groups them), as DDP's gradient_as_bucket_view: a
        group of consecutive gradients then runs in place, with no copy into
        a group buffer and back (the executor's in_place_group_runs). Backward
        accumulates into the views; zero_grad() zeroes them in place. A
        gradient that no longer is its view (zero_grad(set_to_none=True), an
        assignment) is copied back into it when it is submitted."""
        ready = [p for _, p in reversed(self._ordered)]
        device = ready[0].device if ready else torch.device("cpu")
        self._flat_grads = torch.zeros(sum(p.numel() for p in ready), dtype=torch.float32,
                                       device=device)
        self._grad_views = {}
        at = 0
        with torch.no_grad():
            for p in ready:
                view = self._flat_grads[at:at + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                self._grad_views[p] = view
                at += p.numel()

    def _register_hooks(self):
        for _, p in self._ordered:
            # The AccumulateGrad node of p: its hook runs once p.grad holds
            # this backward pass's gradient.
            p_tmp = p.expand_as(p)
            grad_acc = p_tmp.grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(p))
            self._grad_accs.append(grad_acc)

    def _make_hook(self, p):
        def hook(*_):
            if self._cross is not None and p in self._cross.unit_of:
                raise _runtime.error(
                    "invalid_argument",
                    f"DistributedOptimizer(cross_barrier=...): the gradient of "
                    f"'{self._names[p]}' was computed while its update from the last step "
                    f"was still pending; run the model given as cross_barrier (its forward "
                    f"applies the updates), or call optimizer.wait_updates() before backward")
            if p in self._handles and self._delay[p] <= 0:
                raise _runtime.error(
                    "invalid_argument",
                    f"DistributedOptimizer: the gradient of '{self._names[p]}' was computed "
                    f"more than backward_passes_per_step={self._backward_passes_per_step} "
                    f"times before step() or synchronize(); raise backward_passes_per_step or "
                    f"call step() after each backward pass")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._grad_ready(p)
        return hook

    def _dense_grad(self, p):
        """p.grad, made a dense tensor (zeros when backward left it None)."""
        grad = p.grad
        if grad is None:
            grad = p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif grad.layout != torch.strided:
            # A sparse gradient reduced dense (sparse_as_dense=True, a
            # group, or the plan executor).
            grad = p.grad = grad.to_dense()
        return grad

    def _push_pull_sparse_async(self, p):
        """A sparse gradient, reduced as Horovod reduces one: every worker's
        indices and values gathered (allgather; the row counts may differ),
        then added up (and averaged) into a sparse gradient. The sizes are
        exchanged here (blocking); the gathers complete in synchronize()."""
        g = p.grad.coalesce()
        if self._zen and zen.usable(g, p):
            # Zen (docs/zen.md): the pairs through the servers, hash-balanced.
            handle, result = zen.push_pull_async(g, self._names[p] + ".zen", self._average,
                                                 self._priority[p], 1.0 / self._predivide)

            def write_back_zen():
                p.grad = result()
            return handle, write_back_zen
        values = g.values().contiguous()
        if self._predivide != 1.0:
            values = values * (1.0 / self._predivide)
        indices = g.indices().t().contiguous()  # (nnz, sparse dims)
        gathered_values = allgather_async(values)
        gathered_indices = allgather_async(indices)

        def write_back():
            all_values = _runtime.synchronize(gathered_values)
            all_indices = _runtime.synchronize(gathered_indices)
            total = torch.sparse_coo_tensor(all_indices.t(), all_values, g.shape).coalesce()
            p.grad = total / _runtime.size() if self._average else total
        return None, write_back

    def _decide_dense_zen(self):
        """After the first step: the workers average the densities measured
        for the candidates (one small push_pull, in the same place on every
        worker), and those below sparse_threshold go through Zen from now on
        (their Zen tensors declared here, in model order)."""
        undecided = [p for p in self._zen_candidates if p not in self._dense_zen]
        if not undecided:
            return
        local = torch.tensor([self._density.get(p, 0.0) for p in undecided], dtype=torch.float64)
        name = f"{self._names[undecided[0]]}.zen_density{len(undecided)}"
        handle = submit("DistributedOptimizer", local, local, True, name, 0, Compression.none)
        _runtime.synchronize(handle)
        rt = _runtime.require("DistributedOptimizer")
        before = self._engine_names()
        for p, d in zip(undecided, local.tolist()):
            self._dense_zen[p] = d < self._sparse_threshold
            self.sparse_densities[self._names[p]] = (d, self._dense_zen[p])
            if self._dense_zen[p]:
                zen.declare_dense(self._names[p] + ".zen", p.numel())
        self._release_unused(rt, before)
        self._regroup()

    def _regroup(self):
        """Once Zen's candidates are decided: the groups by size are made
        again with the candidates measured dense in them, so that without
        compression the large gradients travel fused too; only those that
        go through Zen stay on their own. Every worker decides from the same
        averaged densities, so every worker makes the same groups; the new
        group tensors are declared here, in the same order on every worker.
        A group's gradients become views into its buffer at its first push."""
        if not self._fusion_bytes:
            return
        groups = size_groups(self._ordered, self._compressors, self._fusion_bytes,
                             lambda p: self._dense_zen.get(p, p in self._zen_candidates))
        if [[id(q) for q in m] for m in groups] == [[id(q) for q in m] for m in self._groups]:
            return
        rt = _runtime.require("DistributedOptimizer")
        before = self._engine_names()
        self._groups = groups
        self._group_of = {}
        self._group_bufs = {}
        for g, members in enumerate(groups):
            for q in members:
                self._group_of[q] = g
        self._release_unused(rt, before)
        for g, members in enumerate(groups):
            self._declare_group(rt, g, members)

    def _engine_names(self):
        """The dense engine tensors the default path pushes, in model order:
        each group's, and each lone gradient's that does not go through Zen."""
        names = [self._group_name(g) for g in range(len(self._groups))]
        names += [self._names[p] for _, p in self._ordered
                  if p not in self._group_of and not self._dense_zen.get(p)]
        return names

    def _release_unused(self, rt, before):
        """Releases the engine tensors of `before` that no step pushes any
        more (a gradient now in a group, a group that was split or merged, a
        gradient now on Zen), so that the servers free their sums. Every
        worker releases the same names in the same order; all rounds of the
        step have completed (synchronize() waited for them)."""
        after = set(self._engine_names())
        for name in before:
            if name not in after and _runtime.usable(rt, name):
                rt.release(name)

    def _grad_ready(self, p):
        """p's gradient is final for this step: push it, or, in a group, push
        the group once all its gradients are final."""
        g = self._group_of.get(p)
        if self._gravac is not None:
            self._handles[p] = (None, None)  # all of them at synchronize()
            return
        if g is None:
            self._handles[p] = self._push_pull_grad_async(p)
            return
        self._handles[p] = (None, None)
        members = self._groups[g]
        if all(q in self._handles for q in members):
            self._handles[members[0]] = self._push_pull_group_async(g)

    def _make_groups(self, groups):
        """Horovod's groups: a number of groups (parameters in model order,
        split evenly), or lists of parameters. Each becomes one fused engine
        tensor per dtype (or a plan group, with executor=True)."""
        if groups is None or groups == 0:
            return []
        order = [p for _, p in self._ordered]
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups < 0:
                raise _runtime.error("invalid_argument",
                                     f"DistributedOptimizer: groups={groups} must be positive")
            n = min(groups, len(order))
            bounds = [round(i * len(order) / n) for i in range(n + 1)] if n else []
            lists = [order[bounds[i]:bounds[i + 1]] for i in range(n)]
        elif isinstance(groups, (list, tuple)):
            known = {id(p) for p in order}
            seen = set()
            lists = []
            for i, g in enumerate(groups):
                members = [p for p in g if id(p) in known]
                if any(not isinstance(p, torch.Tensor) for p in g):
                    raise _runtime.error("invalid_argument",
                                         f"DistributedOptimizer: groups[{i}] must hold "
                                         f"parameters (tensors)")
                for p in members:
                    if id(p) in seen:
                        raise _runtime.error("invalid_argument",
                                             f"DistributedOptimizer: parameter "
                                             f"'{self._names[p]}' is in two groups")
                    seen.add(id(p))
                lists.append(sorted(members, key=lambda p: -self._priority[p]))
        else:
            raise _runtime.error("invalid_argument",
                                 f"DistributedOptimizer: groups must be a number of groups or a "
                                 f"list of lists of parameters, got {type(groups).__name__}")
        out = []
        for members in lists:
            # One engine tensor per dtype and compression in a group.
            kinds = {}
            for p in members:
                kinds.setdefault((p.dtype, self._compressors[p]), []).append(p)
            out += [m for m in kinds.values() if len(m) > 1]
        return out

    def _group_name(self, g):
        first = self._groups[g][0]
        return f"{self._names[first]}.group{len(self._groups[g])}"

    def _declare_group(self, rt, g, members):
        name = self._group_name(g)
        c = self._compressors[members[0]]
        if c.engine_codec is not None and members[0].dtype != torch.float32:
            raise _runtime.error(
                "invalid_argument",
                f"DistributedOptimizer: group of '{self._names[members[0]]}' is "
                f"{members[0].dtype}, but compression '{c.engine_codec[0]}' encodes float32")
        sent, _ = c.compress(torch.empty(0, dtype=members[0].dtype))
        if not _runtime.usable(rt, name):
            _runtime.declare(rt, name, DTYPES[sent.dtype], sum(q.numel() for q in members),
                             c.engine_codec)

    def _push_pull_group_async(self, g):
        members = self._groups[g]
        # In a group made by size, a sparse gradient (nn.Embedding(sparse=True))
        # keeps its own way (Zen or the gather) and its slot carries zeros;
        # in a group the user gave, it is reduced dense (Horovod's groups).
        sparse = set()
        if self._default_groups and not self._sparse_as_dense:
            sparse = {q for q in members
                      if q.grad is not None and q.grad.layout != torch.strided}
        # The group's gradients are views into one flat buffer kept across
        # steps, as DDP's gradient_as_bucket_view: backward accumulates into
        # them (zero_grad() zeroes them in place), the push/pull runs in place
        # on the buffer, and the engine sees the same memory every step. A
        # gradient that is not its view (the first step, zero_grad(set_to_none
        # =True), an assignment, a sparse one reduced dense) is copied in.
        if g not in self._group_bufs:
            flat = torch.zeros(sum(q.numel() for q in members), dtype=members[0].dtype,
                               device=members[0].device)
            views, at = [], 0
            for q in members:
                views.append(flat[at:at + q.numel()].view_as(q))
                at += q.numel()
            self._group_bufs[g] = (flat, views)
        flat, views = self._group_bufs[g]
        with torch.no_grad():
            for q, view in zip(members, views):
                grad = q.grad
                if q in sparse or grad is None:
                    view.zero_()
                    if grad is None:
                        q.grad = view
                elif grad.data_ptr() != view.data_ptr():
                    view.copy_(grad.to_dense() if grad.layout != torch.strided else grad)
                    q.grad = view
            if self._predivide != 1.0:
                flat.mul_(1.0 / self._predivide)
        handle = submit("DistributedOptimizer", flat, flat, self._average, self._group_name(g),
                        max(self._priority[q] for q in members), self._compressors[members[0]])
        for q in members:
            if q in sparse:
                self._handles[("sparse", q)] = self._push_pull_sparse_async(q)
        return handle, None

    def _push_pull_grad_async(self, p):
        if p.grad is not None and p.grad.layout == torch.sparse_coo and \
                not self._sparse_as_dense and self.executor is None:
            return self._push_pull_sparse_async(p)
        grad = self._dense_grad(p)
        if self._predivide != 1.0:
            with torch.no_grad():
                grad.mul_(1.0 / self._predivide)
        if self._dense_zen.get(p):
            return zen.push_pull_dense_async(grad, self._names[p] + ".zen", self._average,
                                             self._priority[p])
        if p in self._zen_candidates and p not in self._dense_zen:
            self._density[p] = zen.density(grad)
        if self.executor is not None:
            # On the executor's thread, in the order the hooks fire, while the
            # backward pass goes on; synchronize() waits for it. The handle
            # slot keeps the buffer alive until then.
            view = self._grad_views[p]
            if grad.data_ptr() != view.data_ptr():
                # Not its view any more (zero_grad(set_to_none=True), an
                # assignment): back into the flat buffer.
                with torch.no_grad():
                    view.copy_(grad)
                p.grad = view
            if self._cuda_submitter is not None:
                self._cuda_submitter.submit(self._names[p], view, self._average)
            else:
                self.executor.submit(self._names[p], view.numel(), view.data_ptr(),
                                     view.data_ptr(), self._average)
            return view, None
        if grad.is_contiguous():
            handle = submit("DistributedOptimizer", grad, grad, self._average, self._names[p],
                             self._priority[p], self._compressors[p])
            return handle, None
        tmp = grad.contiguous()
        handle = submit("DistributedOptimizer", tmp, tmp, self._average, self._names[p],
                         self._priority[p], self._compressors[p])
        return handle, tmp

    def synchronize(self):
        """Waits for every gradient's push_pull (starting those whose hooks did
        not fire, e.g. parameters unused in this pass) and writes the averaged
        gradients into p.grad."""
        if self._cross is not None:
            self._cross.finish()
        for _, p in self._ordered:
            if p not in self._handles:
                self._grad_ready(p)
        try:
            if self._gravac is not None:
                self._gravac.synchronize()
            if self.executor is not None:
                if self._cuda_submitter is not None:
                    self._cuda_submitter.flush()
                self.executor.wait()
            for p, (handle, tmp) in list(self._handles.items()):
                if handle is not None and self.executor is None:
                    _runtime.synchronize(handle)
                if callable(tmp):
                    tmp()
                elif tmp is not None:
                    with torch.no_grad():
                        p.grad.copy_(tmp)
            if self._predivide != 1.0:
                with torch.no_grad():
                    for _, p in self._ordered:
                        if p.grad is not None:
                            p.grad.mul_(self._predivide)
            self._decide_dense_zen()
        finally:
            self._handles.clear()
            for p in self._delay:
                self._delay[p] = self._backward_passes_per_step
        self._synchronized = True

    @property
    def compression_ratio_history(self):
        """compression gravac: the ratio each step sent (1.0: dense); None otherwise.
        `optimizer.gravac_history` has the full record of each step."""
        if self._gravac_executor is not None:
            return [h["ratio"] for h in self.executor.gravac_history]
        return None if self._gravac is None else self._gravac.compression.ratio_history

    def exclude_pause(self):
        """compression gravac: the time from now to the next step is not a
        step's time (an evaluation, a checkpoint, logging). GraVAC's
        controller compares the compression throughput of its ratios from the
        time between steps; a pause would count as the next step's time. The
        mark is summed with the workers' energies, so when any worker marks
        a pause every worker leaves that step's time out and all take the
        same decisions. Call it after step() and before the pause (or right
        after it, before the next backward). Does nothing without GraVAC."""
        if self._gravac_executor is not None:
            self.executor.gravac_exclude_pause()
        elif self._gravac is not None:
            self._gravac.pause()

    @property
    def gravac_history(self):
        if self._gravac_executor is not None:
            return self.executor.gravac_history
        return None if self._gravac is None else self._gravac.compression.history

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For step() after an explicit synchronize() (e.g. to clip gradients):

            optimizer.synchronize(); clip_grad_norm_(...)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        cb = self._cross
        if cb is not None:
            cb.finish()  # what the model's forward did not apply since the last step
            undecided = any(p not in self._dense_zen for p in self._zen_candidates)
            if closure is None and self._should_synchronize and not self._synchronized \
                    and cb.steps > 0 and not undecided:
                self._cross_step()
                return None
            cb.steps += 1
            cb.reached = set()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() after optimizer.synchronize() without "
                              "optimizer.skip_synchronize(): gradients are pushed twice")
            self.synchronize()
        self._synchronized = False
        result = super(self.__class__, self).step(closure)
        if self.executor is not None:
            # The next iteration begins: a profiling window may close here, and
            # a plan the scheduler made takes effect at its iteration.
            self._iteration += 1
            self.executor.begin_iteration(self._iteration)
        return result

    def _cross_step(self):
        """step() with cross_barrier: starts what the hooks did not, then hands
        every group (or single gradient) to the CrossBarrier, which updates
        its parameters once its push_pull has completed (cross_barrier.py)."""
        for _, p in self._ordered:
            if p not in self._handles:
                self._grad_ready(p)
        handles = self._handles
        units = []
        try:
            for members in self._groups:
                waits = []
                for q in members:
                    for key in (q, ("sparse", q)):
                        h, tmp = handles.get(key, (None, None))
                        if h is not None or tmp is not None:
                            waits.append((h, tmp, q))
                units.append(_Unit(list(members), waits))
            for _, p in self._ordered:
                if p not in self._group_of:
                    h, tmp = handles.get(p, (None, None))
                    units.append(_Unit([p], [(h, tmp, p)]))
        finally:
            self._handles = {}
            for p in self._delay:
                self._delay[p] = self._backward_passes_per_step
        self._synchronized = False
        hparams = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        self._cross.defer(units, hparams)

    @contextlib.contextmanager
    def _only(self, params, hparams=None):
        """The wrapped optimizer's param_groups cut down to `params` (and
        their settings set to `hparams`, one dict per group) for the time of
        the block."""
        keep = set(params)
        saved = []
        for i, g in enumerate(self.param_groups):
            saved.append((g["params"], {k: g[k] for k in hparams[i]} if hparams else None))
            g["params"] = [p for p in g["params"] if p in keep]
            if hparams:
                g.update(hparams[i])
        try:
            yield
        finally:
            for g, (ps, hp) in zip(self.param_groups, saved):
                g["params"] = ps
                if hp is not None:
                    g.update(hp)

    def _base_step(self):
        return super(self.__class__, self).step()

    def _base_zero_grad(self, *args, **kwargs):
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def _finish_grads(self, params):
        """A completed gradient's last touch before the update (as
        synchronize() does for all): undo gradient_predivide_factor."""
        if self._predivide != 1.0:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(self._predivide)

    @property
    def pending_updates(self):
        """cross_barrier: how many groups (or single gradients) of the last
        step are still waiting for their push_pull; 0 otherwise."""
        return 0 if self._cross is None else len(self._cross.pending)

    def wait_updates(self):
        """cross_barrier: applies every update still pending from the last
        step() (waiting for its push_pull, within CORTADO_TIMEOUT_MS), as the
        model's forward does; call it before reading the parameters outside
        the model's forward (evaluating them by hand, saving them with
        torch.save(list(model.parameters())), ...). Nothing to do otherwise."""
        if self._cross is not None:
            self._cross.finish()

    def state_dict(self, *args, **kwargs):
        self.wait_updates()
        return super(self.__class__, self).state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self.wait_updates()
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def __del__(self):
        # The executor's thread may still be writing into a gradient buffer
        # that only _handles holds: drop the executor first (its destructor
        # waits for the run in progress), then the rest.
        self.__dict__.pop("executor", None)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise _runtime.error("invalid_argument",
                                 "DistributedOptimizer.zero_grad() while gradients are being "
                                 "pushed: call step() or synchronize() first")
        if self._cross is not None and self._cross.pending:
            self._cross.defer_zero(args, kwargs)
            return None
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _CudaSubmitter:
    """Hands CUDA gradients to the plan executor once they are computed: the
    hook records an event on the gradient's current stream (after the
    kernels that wrote it) and returns at once; this thread waits for the
    event (torch releases the GIL meanwhile) and submits, in the order of
    the hooks, so the executor's own streams read finished gradients.
    flush() returns when every gradient handed over is submitted, and
    raises the first error."""

    def __init__(self, executor):
        self._executor = executor
        self._queue = queue.Queue()
        self._error = None
        threading.Thread(target=self._run, name="cortado-executor-cuda", daemon=True).start()

    def submit(self, name, view, average):
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(view.device))
        self._queue.put((name, view, average, ready))

    def _run(self):
        while True:
            name, view, average, ready = self._queue.get()
            try:
                if self._error is None:
                    ready.synchronize()
                    self._executor.submit(name, view.numel(), view.data_ptr(), view.data_ptr(),
                                          average)
            except Exception as e:  # raised by flush(), on the optimizer's thread
                self._error = e
            finally:
                self._queue.task_done()

    def flush(self):
        self._queue.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, name_prefix="grad", executor=None,
                         plan=None, fusion_bytes=None, fusion_search=None, *, op=Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set,
                         sparse_threshold=zen.DEFAULT_SPARSE_THRESHOLD, cross_barrier=None):
    """Wraps `optimizer` so that step() applies gradients averaged over all workers.

    - named_parameters: model.named_parameters(); its order is the layer order
      that sets priorities, and its names name the tensors (every worker must
      use the same model). Without it, parameters are named by position.
    - compression: a cortado.Compression member or name for every gradient
      (none, fp16, topk(0.01), dgc(0.01), efsignsgd(), ... or "auto": the
      planner chooses per parameter), a dict {parameter name: compression}, or
      a function (name, param) -> compression. Engine codecs keep their error
      feedback residuals on this worker, per gradient. Compression.gravac(...)
      (one for all gradients) adapts the ratio every step, the same on every
      worker; optimizer.compression_ratio_history has the ratios sent.
    - backward_passes_per_step: gradients accumulate locally (summed, as
      autograd does) over this many backward passes before they are pushed.
    - fusion_bytes: without executor=True, consecutive gradients in backward
      order of one dtype, device and compression travel as one engine
      tensor, a group closed at the gradient that brings it to fusion_bytes
      or more (default DEFAULT_ENGINE_FUSION_BYTES, 4 MiB; 0: every
      gradient on its own), as Horovod's fusion buffer. Zen's candidates
      (sparse_threshold) travel on their own at the first step and join
      the groups from the second on where it measured them dense (the
      groups are made again then, the same on every worker); a sparse
      gradient in a group keeps its own way, its slot carrying zeros.
      groups= replaces them.
    - executor: run every gradient through the plan executor (float32 CPU
      parameters, or CUDA ones with CORTADO_DEVICE=cuda under `cortado
      launch --mpi`): each tensor follows its plan option. Default: on
      where CORTADO_DEVICE=cuda (the gradients stay on the GPU: NCCL inside
      the machine, the CUDA codecs where the plan says gpu, the servers
      from pinned memory), off otherwise. The plan is `plan`
      (a plan dict, its JSON text, or a file, as `cortado plan --json`
      writes it; compression then stays none), or CORTADO_PLAN, or else one
      made from `compression` (none, fp16 or an engine codec for every
      gradient, with error feedback at the encode) over BytePS's path
      (push/pull through the servers), with the gradients fused into
      groups: consecutive gradients in backward order (the reverse of
      named_parameters) of about `fusion_bytes` bytes each (default
      DEFAULT_FUSION_BYTES, 25 MiB as DDP's buckets; 0: no groups). A group
      is one encode, one server key and one decode for all its gradients
      (Cupcake's fused compression); it runs once its last gradient is
      ready. fusion_search: MergeComp's search for the groups by timing real
      iterations (the plan's groups change every few steps until it ends,
      `optimizer.executor.fusion_search` tells where it stands); on by
      default where `compression` names a codec and no plan is given
      (and CORTADO_PROFILE_WINDOW is not set); True, False, or a dict of its
      settings (warmup, window, settle, step, min_gain, max_groups,
      finalists, searched, codec_devices: where the codec runs, each of
      "gpu" and "cpu" searched in turn and the fastest kept; by default
      both for CUDA gradients, "cpu" on host memory). With CORTADO_PROFILE_WINDOW set
      for the job, the workers profile each window and switch to the
      scheduler's plans at the same iteration (online re-planning); each
      step() begins the next iteration. Python workers have no MPI groups, so
      plans use push/pull (compressed or not). Each gradient's hook hands it
      to the executor's own thread, which runs what is queued whenever it is
      free as one batch, in that order, while the backward pass goes on;
      step() (or synchronize()) waits for them and raises the first failure.
      `optimizer.executor` has plan_version, plan_json, last_report and
      pending.
    Horovod's arguments (keywords; Horovod's positional order from the
    fifth argument on, op first, is recognized too):
    - op: Average (default) or Sum over the workers; Adasum is refused.
    - gradient_predivide_factor: gradients are divided by it before the
      sum and multiplied by it after the average (op=Average only).
    - groups (or num_groups): a number of groups (the parameters in model
      order, split evenly), or lists of parameters: each group's gradients
      travel fused, as one engine tensor per dtype, once all of them are
      ready (with executor=True, as the plan's fused groups).
    - sparse_as_dense: reduce sparse gradients (nn.Embedding(sparse=True))
      as dense tensors; without it (the default), as Horovod, every worker's
      indices and values are gathered and added up into a sparse gradient
      (in a group or with executor=True they are always reduced dense).
    - process_set: the global one only.
    - sparse_threshold: dense gradients whose density (non-zeros over
      elements, averaged over the workers at the first step) is below it go
      through Zen from the second step on (docs/zen.md): their non-zeros
      travel as (index, value) pairs to the servers that the tensor's hash
      names, and the sum comes back into the dense gradient. Default
      zen.DEFAULT_SPARSE_THRESHOLD (1%); 0 turns it off. It applies to
      float32 CPU gradients of more than zen.MIN_DENSE_ELEMENTS elements
      without compression, outside groups given by groups= and without
      executor=True;
      optimizer.sparse_densities has the measured densities and the choice.
    - cross_barrier: the model (a torch.nn.Module holding the parameters),
      to cross the barrier between step() and the next forward pass, as
      BytePS's cross-barrier does: from the second step on, step() returns
      without waiting, and each group's (or gradient's) parameters are
      updated by the wrapped optimizer's own step once its push_pull has
      completed, at the latest just before the first module that owns them
      runs in the next forward pass (forward pre-hooks on the model's
      modules), so that the first layers' forward overlaps the rest of the
      communication. Parameters whose module did not run in the step's
      forward pass are updated in step(); everything pending is applied when
      the model's forward returns, and by optimizer.wait_updates(),
      state_dict() (the optimizer's and the model's), zero_grad() defers
      the pending ones' zeroing to after their update. Not with
      executor=True or compression gravac; default path only (None: off).
    Call cortado.torch.init() first. The wrapped optimizer's state is not
    carried over: wrap a freshly made optimizer.
    """
    if not isinstance(name_prefix, str) and isinstance(name_prefix, (int, float)):
        # Horovod's order: (optimizer, named_parameters, compression,
        # backward_passes_per_step, op, gradient_predivide_factor, num_groups,
        # groups, sparse_as_dense).
        horovod = [name_prefix, executor, plan, fusion_bytes, fusion_search]
        defaults = [Average, None, None, None, None]
        name_prefix, executor, plan, fusion_bytes, fusion_search = "grad", None, None, None, None
        op = horovod[0]
        if horovod[1] is not defaults[1]:
            gradient_predivide_factor = horovod[1]
        if horovod[2] is not None:
            num_groups = horovod[2]
        if horovod[3] is not None:
            groups = horovod[3]
        if horovod[4] is not None:
            sparse_as_dense = horovod[4]
    # CUDA buffers are the executor's (CORTADO_DEVICE=cuda): the job's
    # gradients stay on the GPUs, NCCL inside the machines.
    implicit_executor = executor is None and \
        os.environ.get("CORTADO_DEVICE", "host").strip().lower() == "cuda"
    if executor is None:
        executor = implicit_executor
    op = resolve_op(op, None, "DistributedOptimizer", allowed=(Average, Sum))
    _check_process_set(process_set, "DistributedOptimizer")
    if not isinstance(gradient_predivide_factor, (int, float)) or gradient_predivide_factor <= 0:
        raise _runtime.error("invalid_argument",
                             f"DistributedOptimizer: gradient_predivide_factor must be a "
                             f"positive number, got {gradient_predivide_factor!r}")
    if gradient_predivide_factor != 1.0 and op is not Average:
        raise _runtime.error("invalid_argument",
                             "DistributedOptimizer: gradient_predivide_factor applies to "
                             "op=Average only")
    if isinstance(sparse_threshold, bool) or not isinstance(sparse_threshold, (int, float)) \
            or not 0 <= sparse_threshold <= 1:
        raise _runtime.error("invalid_argument",
                             f"DistributedOptimizer: sparse_threshold must be a density "
                             f"between 0 and 1 (0: off), got {sparse_threshold!r}")
    if num_groups and groups is not None:
        raise _runtime.error("invalid_argument",
                             "DistributedOptimizer: pass groups= or the deprecated num_groups=, "
                             "not both")
    if num_groups:
        groups = num_groups
    # Validate the compression first, so that a bad name is the error the
    # user sees, even before init().
    if isinstance(compression, dict):
        for spec in compression.values():
            Compression.lookup(spec)
    elif not callable(compression) or isinstance(compression, (Compressor, str)):
        Compression.lookup(compression)
    names = list(named_parameters) if named_parameters is not None else None
    _runtime.require("DistributedOptimizer")
    if cross_barrier is not None and not isinstance(cross_barrier, torch.nn.Module):
        raise _runtime.error("invalid_argument",
                             f"DistributedOptimizer: cross_barrier must be the model (a "
                             f"torch.nn.Module whose forward uses the parameters), got "
                             f"{type(cross_barrier).__name__}: pass cross_barrier=model")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    try:
        return cls(optimizer.param_groups, names, compression, backward_passes_per_step,
                   name_prefix, executor, plan, fusion_bytes, fusion_search, op,
                   gradient_predivide_factor, groups, sparse_as_dense, sparse_threshold,
                   cross_barrier)
    except _runtime.CortadoError as e:
        if not implicit_executor or getattr(e, "code", None) != "invalid_argument":
            raise
        raise _runtime.error(
            "invalid_argument",
            f"{e} (the plan executor runs here because CORTADO_DEVICE=cuda; pass "
            f"executor=False for the default path, which stages CUDA gradients in host "
            f"memory)") from e


def _scalar_tensor(value):
    # Numbers travel as float64 (exact for ints below 2**53), so that 1 and
    # 1.0 on different workers still name the same tensor type.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return torch.tensor([float(value)], dtype=torch.float64)


def broadcast_optimizer_state(optimizer, root_rank, prefix="broadcast.optimizer"):
    """Overwrites every worker's optimizer state (and numeric hyper-parameters
    such as lr and momentum) with root_rank's.

    When this worker's state is still empty (no step taken yet, as on the
    workers that did not load a checkpoint), it is first created by one step
    with zero gradients, with the parameters and gradients restored after it,
    so that every worker holds the same structure.
    """
    _runtime.require("broadcast_optimizer_state")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if params and len(optimizer.state) == 0:
        saved = [(p, p.detach().clone(), p.grad) for p in params]
        with torch.no_grad():
            for p in params:
                p.grad = torch.zeros_like(p)
        # Bypass the distributed step: this one is local.
        base = optimizer.__class__
        if hasattr(optimizer, "_handles"):  # a DistributedOptimizer: its wrapped class
            base = base.__mro__[1]
        base.step(optimizer)
        with torch.no_grad():
            for p, value, grad in saved:
                p.copy_(value)
                p.grad = grad

    handles = []
    fixups = []
    index = {id(p): i for i, p in enumerate(params)}
    for gi, group in enumerate(optimizer.param_groups):
        for key in sorted(k for k in group if k != "params"):
            value = group[key]
            items = list(value) if isinstance(value, tuple) else [value]
            carriers = [_scalar_tensor(v) for v in items]
            if any(c is None for c in carriers):
                continue
            for j, c in enumerate(carriers):
                handles.append(broadcast_async_(c, root_rank, f"{prefix}.group{gi}.{key}.{j}"))
            fixups.append((group, key, isinstance(value, tuple), carriers))
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                value = state[key]
                name = f"{prefix}.p{index[id(p)]}.{key}"
                if isinstance(value, torch.Tensor):
                    if value.is_contiguous():
                        handles.append(broadcast_async_(value, root_rank, name))
                    else:
                        tmp = value.contiguous()
                        handles.append(broadcast_async_(tmp, root_rank, name))
                        fixups.append((state, key, None, tmp))
                else:
                    c = _scalar_tensor(value)
                    if c is not None:
                        handles.append(broadcast_async_(c, root_rank, name))
                        fixups.append((state, key, False, [c]))
    for h in handles:
        _runtime.synchronize(h)
    for container, key, is_tuple, carriers in fixups:
        if is_tuple is None:
            with torch.no_grad():
                container[key].copy_(carriers)
        else:
            old = container[key]
            olds = list(old) if is_tuple else [old]
            values = [type(o)(c.item()) for o, c in zip(olds, carriers)]
            container[key] = tuple(values) if is_tuple else values[0]
