// The CUDA implementation of the device interface (core/device/device.h):
// cudaMalloc and cudaMallocHost, cudaMemcpyAsync, CUDA streams and events,
// the CUDA codecs (compressor/cuda) with their error feedback in device
// memory, and NCCL groups for the collectives. Built when CUDA and NCCL are
// (CORTADO_WITH_CUDA, CORTADO_WITH_NCCL).
//
// Codecs without a CUDA implementation (terngrad, natural, signsgd,
// powersgd) are not in codecs(): the plan executor runs such a step on the
// CPU, after a copy into pinned memory, as it runs a step placed there.
#pragma once

#include <memory>
#include <string>

#include "core/device/device.h"

namespace cortado::device::cuda {

struct Options {
  int device = 0;  // the CUDA device of this process
  // The NCCL groups (collective/nccl/factory.h) on that device, owned by the
  // device from here on; may be empty (no collectives).
  collective::Groups groups;
};

// CUDA devices visible to this process; 0 without a GPU or a driver.
int deviceCount();

// The 16 bytes of CUDA device `device`'s UUID (cudaDeviceProp::uuid): the
// same for every process that sees that GPU, whatever its index there.
// Error(kUnavailable) when the device cannot be queried.
std::string deviceUuid(int device);

// Error(kUnavailable) when no CUDA device is visible or `device` is out of range.
std::shared_ptr<Device> create(Options options);

}  // namespace cortado::device::cuda
