"""GraVAC's exchange for DistributedOptimizer (cortado.gravac has the settings).

At each synchronize(), for the optimizer's gradients in model order:
1. every gradient is prepared: folded into its error feedback and encoded at
   the minimum and the candidate ratio (the core, without the GIL);
2. one push_pull of five float64 numbers sums the workers' energies, step
   times and pause marks, so every worker's controller sees the same inputs
   and takes the same decision (level and ratio) for this step;
3. every gradient's message goes out: a dense gradient or a random-k
   payload's values are averaged by push_pull (random-k payloads of one
   step and ratio are summable); a top-k or DGC payload (indices differ per
   worker) travels as the engine's top-k codec at the same ratio, without
   error feedback, which encodes exactly the payload's k elements again
   (the only non-zeros of its decoded tensor): one payload pushed per
   worker, the servers answer the lossless sparse sum. A tensor larger
   than one engine chunk (CORTADO_PARTITION_BYTES) would be encoded per
   chunk, k each, so its payload's (index, value) pairs go through Zen
   instead (docs/zen.md): the servers sum the pairs, as lossless. Either
   way zero values stay home: the engine's compact form and the pairs
   given to Zen leave them out, so a worker sends min(k, non-zeros);
4. the decoded average replaces p.grad.

The step time the controller sees is the time between two synchronize()
calls, averaged over the workers. pause() (DistributedOptimizer's
exclude_pause()) marks the time up to the next synchronize() as not a
step's (an evaluation, a checkpoint): the flag travels in the sums, and
when any worker set it every worker passes the controller no time for
that step, so its throughput leaves it out on every worker alike.

A ratio change takes effect at the next step's encode; the error feedback
keeps what a step did not send, whatever the ratios.
"""

import logging
import os
import re
import time

import numpy as np
import torch

from .. import _runtime
from ..compression import Codec
from .ops import push_pull_async
from .._runtime import synchronize

HEADER_BYTES = 48  # compressor/payload.h
# Each change of the ratios (at a window boundary) is logged at INFO here.
log = logging.getLogger("cortado.gravac")


def _chunk_bytes():
    """The engine's chunk size (core/config.cc's default and syntax); 0 when unreadable."""
    text = os.environ.get("CORTADO_PARTITION_BYTES") or \
        os.environ.get("BYTEPS_PARTITION_BYTES") or "4MiB"
    m = re.fullmatch(r"(\d+)([KMG]?)(I?B)?", text.strip().upper())
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)] if m else 0


class GravacSync:
    def __init__(self, compression, ordered, names, average):
        rt = _runtime.require("DistributedOptimizer")
        for _, p in ordered:
            if p.dtype != torch.float32:
                raise _runtime.error(
                    "invalid_argument",
                    f"DistributedOptimizer: compression gravac encodes float32 gradients; "
                    f"parameter '{names[p]}' is {p.dtype}")
        self.compression = compression
        self.size = rt.size
        self.rank = rt.rank
        self.average = average
        self.core = compression.make(rt.size)
        self.params = [p for _, p in ordered]
        self.names = names
        self.iteration = 0
        self.last_sync = None
        self.chunk_bytes = _chunk_bytes()
        self.codecs = {}  # CF -> the engine's top-k Codec that carries a payload of that CF
        self.paused = False  # pause(): the time up to the next synchronize() is not a step's

    def pause(self):
        """The time from now to the next synchronize() is not a step's time."""
        self.paused = True

    def _topk_at(self, ratio):
        if ratio not in self.codecs:
            self.codecs[ratio] = Codec(f"topk:ratio={1.0 / ratio!r}", error_feedback=False)
        return self.codecs[ratio]

    def _grad(self, p):
        g = p.grad
        if g is None:
            g = p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if g.layout != torch.strided:
            raise _runtime.error(
                "invalid_argument",
                f"DistributedOptimizer: compression gravac takes dense gradients; "
                f"'{self.names[p]}' has a {g.layout} gradient (use sparse_as_dense or "
                f"another compression)")
        return g

    def synchronize(self):
        now = time.monotonic()
        previous = now - self.last_sync if self.last_sync is not None else 0.0
        self.last_sync = now
        seed = self.iteration
        self.iteration += 1
        hosts = []
        for key, p in enumerate(self.params):
            g = self._grad(p).detach()
            host = g.reshape(-1).to("cpu", torch.float32).contiguous()
            hosts.append(host)
            self.core.prepare(key, host.data_ptr(), host.numel(), seed)

        # One decision for all workers: the sums of their energies and times,
        # and how many of them marked the time since the last step a pause.
        paused, self.paused = self.paused, False
        sums = torch.tensor(list(self.core.local_sums()) + [previous, 1.0 if paused else 0.0],
                            dtype=torch.float64)
        sums = synchronize(push_pull_async(sums, name="gravac.sums", average=False))
        agreed = sums.tolist()
        timed = previous > 0 and agreed[4] == 0
        seconds = agreed[3] / self.size if timed else 0.0
        step = self.core.decide(agreed[0], agreed[1], agreed[2], seconds)
        level = step["level"]

        # What this step's messages put on the wire (the engine counts it:
        # top-k payloads go compact where that is smaller).
        pending, pushed_before, message_bytes = [], _runtime.pushed_bytes(), 0
        for key, p in enumerate(self.params):
            nbytes = self.core.message_bytes(key)
            message_bytes += nbytes
            name = f"gravac.{self.names[p]}.{level}.{nbytes}"
            if level == "dense":
                msg = torch.empty(nbytes // 4, dtype=torch.float32)
                self.core.copy_message(key, msg.data_ptr(), nbytes)
                pending.append((key, p, "dense", msg, push_pull_async(
                    msg, name=name, average=self.average)))
            elif self.core.summable:
                msg = torch.empty(nbytes, dtype=torch.uint8)
                self.core.copy_message(key, msg.data_ptr(), nbytes)
                values = msg[HEADER_BYTES:].view(torch.float32)
                pending.append((key, p, "summable", msg, push_pull_async(
                    values, name=name, average=self.average)))
            elif p.numel() * 4 <= self.chunk_bytes:
                msg = torch.empty(nbytes, dtype=torch.uint8)
                self.core.copy_message(key, msg.data_ptr(), nbytes)
                sent = torch.zeros(p.numel(), dtype=torch.float32)
                self.core.decompress_add(key, msg.data_ptr(), nbytes, sent.data_ptr(), 1.0)
                name = f"gravac.{self.names[p]}.topk.{step['ratio']!r}"  # one codec per name
                pending.append((key, p, "dense", sent, push_pull_async(
                    sent, name=name, average=self.average,
                    compression=self._topk_at(step["ratio"]))))
            else:
                # The payload's k ascending u32 indices, then its k f32
                # values, after the 48-byte header: Zen's pairs as they are.
                msg = torch.empty(nbytes, dtype=torch.uint8)
                self.core.copy_message(key, msg.data_ptr(), nbytes)
                k = (nbytes - HEADER_BYTES) // 8
                if HEADER_BYTES + 8 * k != nbytes:
                    raise _runtime.error(
                        "internal", f"DistributedOptimizer: gravac's {level} payload of "
                        f"'{self.names[p]}' is {nbytes} bytes, not a 48-byte header and pairs")
                indices = msg[HEADER_BYTES:HEADER_BYTES + 4 * k].view(torch.int32)
                values = msg[HEADER_BYTES + 4 * k:].view(torch.float32)
                # Zeros add nothing to the sum: where the tensor has fewer
                # non-zeros than k the payload is filled up with them, and
                # they stay home (min(k, non-zeros) pairs go out).
                keep = values != 0
                indices = np.ascontiguousarray(indices[keep].numpy().view(np.uint32))
                values = values[keep].contiguous()
                out = torch.empty(p.numel(), dtype=torch.float32)
                handle = _runtime.submit_sparse(
                    "DistributedOptimizer", f"gravac.{self.names[p]}.zen", p.numel(), indices,
                    values, out, self.average, 0, lambda out=out: out)
                pending.append((key, p, "dense", out, handle))

        for key, p, kind, msg, handle in pending:
            result = synchronize(handle)
            if kind == "dense":
                out = result
            else:
                out = torch.zeros(p.numel(), dtype=torch.float32)
                msg[HEADER_BYTES:].view(torch.float32).copy_(result)
                self.core.decompress_add(key, msg.data_ptr(), msg.numel(), out.data_ptr(), 1.0)
            with torch.no_grad():
                p.grad.copy_(out.view_as(p.grad))
        if (step["next_min_ratio"], step["next_candidate_ratio"]) != \
                (step["min_ratio"], step["candidate_ratio"]):
            log.info("rank %d step %d: gains %.3f (min %gx), %.3f (candidate %gx): next min %gx, "
                     "candidate %gx%s", self.rank, step["iteration"], step["gain_min"],
                     step["min_ratio"], step["gain_candidate"], step["candidate_ratio"],
                     step["next_min_ratio"], step["next_candidate_ratio"],
                     " (saturated)" if step["saturated"] else "")
        record = dict(step)
        record["bytes"] = _runtime.pushed_bytes() - pushed_before
        record["message_bytes"] = message_bytes  # the messages' plain size, headers included
        record["previous_seconds"] = seconds  # 0: not timed (the first step, or a pause)
        record["paused"] = agreed[4] > 0
        self.compression.history.append(record)
        return record
