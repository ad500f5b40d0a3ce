// The CUDA device's small vector kernels (kernels.cu), launched on a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace cortado::device::cuda {

cudaError_t launchFill(float* x, float value, size_t n, cudaStream_t s);
cudaError_t launchScale(float* x, float factor, size_t n, cudaStream_t s);
cudaError_t launchAdd(float* dst, const float* src, size_t n, cudaStream_t s);

}  // namespace cortado::device::cuda
