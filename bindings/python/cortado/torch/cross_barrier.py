"""Cross-barrier updates for DistributedOptimizer (cross_barrier=model;
docs/python.md, "Cross-barrier updates").

Without it, step() waits for every gradient's push_pull and then updates all
parameters, so the next forward pass starts only once the last byte is back.
With it, step() returns once it has started what the hooks did not, and each
parameter is updated once the push_pull that carries its gradient (its own,
or its group's) has completed, in the next forward pass: each module's
forward pre-hook applies every update whose push_pull has completed by then,
and waits for those of the module's own parameters alone, so that a module
runs once its own parameters are updated, possibly while later layers'
gradients are still in flight.

What keeps it equal to the normal step:
- the update is the wrapped optimizer's own step(), run on the completed
  parameters alone (its param_groups cut down to them for the call), with
  the hyper-parameters (lr, momentum, ...) that step() saw: a learning-rate
  scheduler that changes lr after step() does not reach the pending ones;
- a group (or gradient) with a parameter whose module's pre-hook did not
  run in the forward pass of the step (one held by a module that is never
  called, read by another) is updated in step() itself, after waiting for
  it;
- everything still pending is applied when the model's own forward returns
  (a forward hook on the model), before the loss and backward; in step() and
  synchronize() if the model did not run; and by state_dict() (the
  optimizer's, and the model's through a state-dict hook) and wait_updates();
- zero_grad() while updates are pending zeroes the others at once and each
  pending one right after its update.
Every wait is a handle's wait, bounded by the job's CORTADO_TIMEOUT_MS.
"""

import time
import weakref

import torch

from .. import _runtime


class _Unit:
    """The parameters that one completion updates: a group's members (its
    handle, plus the sparse gradients that keep their own way) or one
    parameter. `waits` holds (handle or None, tmp, param) as the optimizer's
    _handles do."""

    __slots__ = ("params", "waits")

    def __init__(self, params, waits):
        self.params = params
        self.waits = waits

    def ready(self):
        return all(h is None or h.poll() for h, _, _ in self.waits)


def _pre_hook(ref, params):
    def hook(module, inputs):
        cb = ref()
        if cb is not None:
            cb.before_module(params)
    return hook


def _post_hook(ref):
    def hook(module, inputs, output):
        cb = ref()
        if cb is not None:
            cb.finish()
    return hook


def _state_dict_hook(ref):
    # The state dict's tensors share the parameters' storage, and the
    # updates are in place: applying them here shows in the dict.
    def hook(module, state_dict, prefix, local_metadata):
        cb = ref()
        if cb is not None:
            cb.finish()
    return hook


class CrossBarrier:
    """The pending updates of one DistributedOptimizer and the hooks on its
    model. Owned by the optimizer (optimizer._cross); the hooks hold it
    weakly, so that a model outliving its optimizer does nothing more."""

    def __init__(self, optimizer, model):
        self._opt = weakref.ref(optimizer)
        self.pending = []        # _Unit, not yet applied
        self.unit_of = {}        # param -> its pending _Unit
        self.reached = set()     # params whose module's pre-hook ran since step()
        self.hparams = None      # the param_groups' settings at step()
        self.zero = None         # (args, kwargs) of a zero_grad() deferred for the pending
        self.steps = 0           # steps taken (the first is the normal one)
        self.deferred_steps = 0  # steps that left updates to the forward pass
        self.applied_in_forward = 0  # units applied by a pre-hook, over all steps
        self.forward_wait_s = 0.0    # seconds pre-hooks spent on units not yet complete
        self.waits = {}              # first parameter of a unit -> those seconds, its own
        self._hooks = []
        owned = {id(p) for _, p in optimizer._ordered}
        ref = weakref.ref(self)
        hooked = 0
        for module in model.modules():
            mine = [p for p in module.parameters(recurse=False) if id(p) in owned]
            if not mine:
                continue
            self._hooks.append(module.register_forward_pre_hook(_pre_hook(ref, mine)))
            hooked += 1
        self._hooks.append(model.register_forward_hook(_post_hook(ref)))
        if hasattr(model, "_register_state_dict_hook"):
            self._hooks.append(model._register_state_dict_hook(_state_dict_hook(ref)))
        self.hooked_modules = hooked

    def remove(self):
        """Takes the hooks off the model (after applying what is pending)."""
        self.finish()
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- called by the optimizer -------------------------------------------

    def defer(self, units, hparams):
        """step(): units whose parameters all ran under a pre-hook in this
        step's forward pass wait for the next forward pass (the first
        pre-hook applies every one that has completed by then, each later
        one what has completed since and its own); the others are applied
        now, after waiting for them."""
        self.hparams = hparams
        self.zero = None
        now = []
        for u in units:
            if all(p in self.reached for p in u.params):
                self.pending.append(u)
                for p in u.params:
                    self.unit_of[p] = u
            else:
                now.append(u)
        self.reached = set()
        self.steps += 1
        if self.pending:
            self.deferred_steps += 1
        for u in now:
            self._apply(u)

    def defer_zero(self, args, kwargs):
        """zero_grad() with updates pending: the others' gradients now, the
        pending ones' after their update."""
        opt = self._opt()
        pending = set(self.unit_of)
        others = [p for g in opt.param_groups for p in g["params"] if p not in pending]
        with opt._only(others):
            opt._base_zero_grad(*args, **kwargs)
        self.zero = (args, kwargs)

    def finish(self):
        """Applies every pending update, waiting for each."""
        while self.pending:
            self._apply(self._take(self.pending[0]))

    # -- hooks -------------------------------------------------------------

    def before_module(self, params):
        self.reached.update(params)
        if not self.pending:
            return
        # Whatever has completed meanwhile, then this module's own.
        for u in [u for u in self.pending if u.ready()]:
            self._apply(self._take(u))
            self.applied_in_forward += 1
        for p in params:
            u = self.unit_of.get(p)
            if u is not None:
                start = time.perf_counter()
                self._apply(self._take(u))
                self.applied_in_forward += 1
                spent = time.perf_counter() - start
                self.forward_wait_s += spent
                self.waits[u.params[0]] = self.waits.get(u.params[0], 0.0) + spent

    # -- one update ----------------------------------------------------------

    def _take(self, u):
        self.pending.remove(u)
        for p in u.params:
            self.unit_of.pop(p, None)
        return u

    def _apply(self, u):
        """Waits for u's push_pulls, finishes its gradients and runs the
        wrapped optimizer's step on its parameters alone."""
        opt = self._opt()
        if opt is None:
            return
        for handle, tmp, p in u.waits:
            if handle is not None:
                _runtime.synchronize(handle)  # bounded by CORTADO_TIMEOUT_MS
            if callable(tmp):
                tmp()
            elif tmp is not None:
                with torch.no_grad():
                    p.grad.copy_(tmp)
        opt._finish_grads(u.params)
        with opt._only(u.params, self.hparams):
            opt._base_step()
        if self.zero is not None:
            args, kwargs = self.zero
            with opt._only(u.params):
                opt._base_zero_grad(*args, **kwargs)
