// The CUDA device's vector kernels: grid-stride loops over 64-bit indices.
#include "core/device/cuda/kernels.h"

namespace cortado::device::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocksFor(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? (b ? b : 1) : 4096);
}

__global__ void fillKernel(float* x, float value, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

__global__ void scaleKernel(float* x, float factor, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] *= factor;
}

__global__ void addKernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

}  // namespace

cudaError_t launchFill(float* x, float value, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  fillKernel<<<blocksFor(n), kThreads, 0, s>>>(x, value, n);
  return cudaGetLastError();
}

cudaError_t launchScale(float* x, float factor, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  scaleKernel<<<blocksFor(n), kThreads, 0, s>>>(x, factor, n);
  return cudaGetLastError();
}

cudaError_t launchAdd(float* dst, const float* src, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  addKernel<<<blocksFor(n), kThreads, 0, s>>>(dst, src, n);
  return cudaGetLastError();
}

}  // namespace cortado::device::cuda
