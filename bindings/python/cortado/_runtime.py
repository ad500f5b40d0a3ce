"""The process's one Cortado worker, shared by `cortado` (NumPy) and `cortado.torch`.

A training process joins one job once: `init()` reads the CORTADO_* environment
that `cortado launch` sets, registers with the scheduler and connects to the
servers; `shutdown()` tells the scheduler this worker is done and waits for the
others. The state lives in one `_Context` object; the C++ core (`cortado._C`)
does the work and releases the GIL whenever it blocks.
"""

import atexit
import itertools
import sys
import threading

from . import _C

CortadoError = _C.CortadoError


def error(code, message):
    """A CortadoError with `code` (invalid_argument, timeout, ...) and `message`."""
    e = CortadoError(message)
    e.code = code
    return e


class _Context:
    def __init__(self):
        self.lock = threading.Lock()
        self.runtime = None
        self.shut_down = False
        self.uncaught_exception = False
        self.hooks_installed = False
        self.counters = {}
        self.codecs = {}       # name -> (spec, error feedback) or None, as declared here
        self.auto_codecs = {}  # name -> Compressor chosen by "auto" for a lone push_pull

    def next_name(self, prefix):
        counter = self.counters.setdefault(prefix, itertools.count())
        return f"{prefix}.noname.{next(counter)}"


_ctx = _Context()


def init(connect_timeout=None):
    """Joins the job that `cortado launch` (or the CORTADO_* variables) describes.

    Blocks until every worker and server registered, or raises CortadoError
    after `connect_timeout` seconds (default: CORTADO_CONNECT_TIMEOUT_MS).
    Calling it again in the same process does nothing.
    """
    with _ctx.lock:
        if _ctx.runtime is not None:
            return
        if _ctx.shut_down:
            raise error("closed", "cortado.init() after cortado.shutdown(): a process joins "
                                  "one job once; start a new process for a new job")
        _ctx.runtime = _C.Runtime.start(connect_timeout)
        _install_exit_hooks()


def shutdown(timeout=None):
    """Tells the scheduler this worker is done and waits for the job to end.

    Pending push_pulls of this worker should have been synchronized first.
    Safe to call twice; after it, every call raises CortadoError.
    """
    with _ctx.lock:
        rt = _ctx.runtime
        if rt is None:
            return
        _ctx.runtime = None
        _ctx.shut_down = True
    if rt.failure() is not None:
        rt.close()
    else:
        rt.shutdown(timeout)


def is_initialized():
    return _ctx.runtime is not None


def require(api):
    """The running core, or CortadoError naming `api` when init() was not called."""
    rt = _ctx.runtime
    if rt is None:
        if _ctx.shut_down:
            raise error("closed", f"cortado.{api}() after cortado.shutdown()")
        raise error("invalid_argument",
                    f"cortado.{api}() was called before cortado.init(): call init() first "
                    f"(in a process started by `cortado launch -w W -s S -- CMD`)")
    return rt


def rank():
    """This worker's rank, 0..size()-1."""
    return require("rank").rank


def size():
    """The number of workers in the job."""
    return require("size").size


def local_rank():
    """The rank among the workers on this machine (CORTADO_LOCAL_RANK, else rank())."""
    return require("local_rank").local_rank


def local_size():
    """The number of workers on this machine (CORTADO_LOCAL_SIZE, else size())."""
    return require("local_size").local_size


def num_servers():
    return require("num_servers").num_servers


def pushed_bytes():
    """Bytes of tensor data this worker pushed to the servers so far, as they
    went on the wire: raw elements, codec payloads (top-k and DGC in their
    compact form where it was sent), Zen's pair lists; not the messages'
    framing. Everything that goes through the servers counts (push_pull, the
    broadcasts and Horovod-style operations built on it, the plan executor's
    push/pull steps); MPI or NCCL collectives of a C++ worker do not."""
    return require("pushed_bytes").pushed_bytes


def pulled_bytes():
    """Bytes of tensor data this worker received in the servers' answers so far."""
    return require("pulled_bytes").pulled_bytes


def barrier(timeout=None):
    """Returns when every worker entered the barrier."""
    require("barrier").barrier(timeout)


def auto_name(prefix):
    """A name for an unnamed tensor. Workers must make their unnamed calls in the
    same order, or pass names."""
    return _ctx.next_name(prefix)


class Handle:
    """One push_pull in flight. Use poll(handle) and synchronize(handle)."""

    __slots__ = ("name", "_core", "_finish", "_result", "_done")

    def __init__(self, name, core, finish):
        self.name = name
        self._core = core          # cortado._C.Handle, or None when nothing was sent
        self._finish = finish      # runs once on success; its value is the result
        self._result = None
        self._done = False

    def poll(self):
        """True once the operation completed (successfully or not)."""
        return self._done or self._core is None or self._core.poll()

    def wait(self, timeout=None):
        """The result, once the operation completed; raises CortadoError when it
        failed, or with code 'timeout' after `timeout` seconds (None: the job's
        CORTADO_TIMEOUT_MS). The GIL is released while waiting."""
        if not self._done:
            if self._core is not None:
                self._core.wait(timeout)
            self._result = self._finish() if self._finish is not None else None
            self._finish = None
            self._done = True
        return self._result

    def __repr__(self):
        state = "done" if self._done else ("completed" if self.poll() else "in flight")
        return f"<cortado.Handle '{self.name}' {state}>"


def submit(api, name, dtype, count, input_ptr, output_ptr, average, priority, keepalive,
           finish, codec=None):
    """Declares `name` on first use (every worker must), then starts the push_pull.

    `codec` is (spec, error feedback) for a tensor that the engine compresses,
    or None. `keepalive` owns the memory behind the pointers; the core holds
    it until the operation completed. `finish` runs when the caller
    synchronizes.
    """
    rt = require(api)
    if count == 0:
        return Handle(name, None, finish)
    if codec is not None and dtype != "float32":
        raise error("invalid_argument",
                    f"cortado.{api}: tensor '{name}' is {dtype}, but compression "
                    f"'{codec[0]}' encodes float32 tensors: cast it with .float(), or use "
                    f"compression none or fp16 for it")
    if not rt.is_declared(name):
        declare(rt, name, dtype, count, codec)
    elif _ctx.codecs.get(name) != codec:
        def show(c):
            return "none" if c is None else f"'{c[0]}'" + (" with error feedback" if c[1] else "")
        raise error("invalid_argument",
                    f"cortado.{api}: tensor '{name}' was declared with compression "
                    f"{show(_ctx.codecs.get(name))}, and this call asks for {show(codec)}: a "
                    f"name keeps the compression it was first pushed with; use another name")
    core = rt.push_pull(name, dtype, count, input_ptr, output_ptr, bool(average), int(priority),
                        keepalive)
    return Handle(name, core, finish)


def submit_sparse(api, name, count, indices, values, output, average, priority, finish):
    """Declares `name` as a sparse (Zen) float32 tensor of `count` elements on
    first use (every worker must), then starts summing the pairs: `indices`
    (a numpy uint32 array) and `values` (a contiguous float32 CPU tensor of as
    many elements) into `output` (a contiguous float32 CPU tensor of `count`
    elements). `finish` runs when the caller synchronizes."""
    rt = require(api)
    if not rt.is_declared(name):
        rt.declare(name, "float32", count, sparse=True)
        _ctx.codecs[name] = None
    core = rt.push_pull_sparse(name, indices.ctypes.data, values.data_ptr(), int(indices.size),
                               output.data_ptr(), bool(average), int(priority),
                               (indices, values, output))
    return Handle(name, core, finish)


def usable(rt, name):
    """Whether `name` is declared and not released since: a released name
    (Runtime.release) must be declared again, as a new tensor, before an
    owner that declares its tensors up front (an optimizer) pushes it."""
    return rt.is_declared(name) and not rt.is_released(name)


def declare(rt, name, dtype, count, codec=None):
    """Declares `name` (a collective step) with its codec, and remembers the codec."""
    if codec is None:
        rt.declare(name, dtype, count)
    else:
        rt.declare(name, dtype, count, codec=codec[0], error_feedback=codec[1])
    _ctx.codecs[name] = codec


def auto_choice(name, choose):
    """The compression "auto" chose for `name` (choose() plans it the first time)."""
    if name not in _ctx.auto_codecs:
        _ctx.auto_codecs[name] = choose()
    return _ctx.auto_codecs[name]


def poll(handle):
    """True once `handle`'s operation completed."""
    _check_handle(handle, "poll")
    return handle.poll()


def synchronize(handle, timeout=None):
    """Waits for `handle` and returns its result (the reduced array or tensor)."""
    _check_handle(handle, "synchronize")
    return handle.wait(timeout)


def _check_handle(handle, api):
    if not isinstance(handle, Handle):
        raise error("invalid_argument",
                    f"cortado.{api}() takes a handle from push_pull_async, got {type(handle).__name__}")


def _install_exit_hooks():
    # An uncaught exception ends this worker abruptly (the others learn of it
    # at once and fail, naming it); a normal exit finishes in order, so that a
    # script that forgets shutdown() does not look like a crash to the job.
    if _ctx.hooks_installed:
        return
    _ctx.hooks_installed = True
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        _ctx.uncaught_exception = True
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    atexit.register(_at_exit)


def _at_exit():
    with _ctx.lock:
        rt = _ctx.runtime
        _ctx.runtime = None
        _ctx.shut_down = True
    if rt is None:
        return
    if _ctx.uncaught_exception or rt.failure() is not None:
        rt.close()
    else:
        rt.shutdown()
