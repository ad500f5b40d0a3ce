// The host implementation of the device interface (core/device/device.h):
// device memory is host memory, copies are memcpy, the codecs are the CPU
// codecs, and the collective groups are the ones given (MPI). It is the
// CPU-only build's real path, not a stand-in: the plan executor runs the
// same steps, copies and event waits on it as on CUDA.
//
// Streams: by default each stream's work runs at once on the thread that
// enqueues it (ordered trivially; an event completes when recorded). With
// `queued`, each stream has a thread of its own that runs its work in order
// after the call returns, as a GPU stream does, and events complete when
// that thread reaches them: work that the caller forgot to order (a host read
// of a copy's destination before waiting for its event) reads stale data, so
// tests catch it. Releasing memory waits for every stream's queued work
// first, as cudaFree does.
#pragma once

#include <memory>

#include "core/device/device.h"

namespace cortado::device::host {

struct Options {
  bool queued = false;
  // The groups whose buffers are host memory (the MPI groups); may be null.
  // Not owned: keep them alive longer than the device.
  const collective::Groups* groups = nullptr;
  // The codecs (must hold the CPU codecs); nullptr: a registry of the CPU
  // codecs of its own.
  std::shared_ptr<const compressor::Registry> codecs = nullptr;
};

std::shared_ptr<Device> create(const Options& options);

}  // namespace cortado::device::host
