// Conversion kernels of the NCCL backend (see nccl_kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/collective/nccl/nccl_kernels.h"

namespace cortado::collective::nccl {

namespace {

template <typename T>
__device__ float toF(T v);
template <>
__device__ float toF<__half>(__half v) { return __half2float(v); }
template <>
__device__ float toF<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ T fromF(float v);
template <>
__device__ __half fromF<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __nv_bfloat16 fromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void toFloatKernel(const T* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = toF<T>(in[i]);
}

template <typename T>
__global__ void fromFloatKernel(const float* in, T* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = fromF<T>(in[i]);
}

unsigned blocksFor(size_t n) {
  size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b ? b : 1) : 4096);
}

}  // namespace

cudaError_t launchToFloat(bool bf16, const void* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16)
    toFloatKernel<<<blocksFor(n), 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), out, n);
  else
    toFloatKernel<<<blocksFor(n), 256, 0, stream>>>(static_cast<const __half*>(in), out, n);
  return cudaGetLastError();
}

cudaError_t launchFromFloat(bool bf16, const float* in, void* out, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16)
    fromFloatKernel<<<blocksFor(n), 256, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
  else
    fromFloatKernel<<<blocksFor(n), 256, 0, stream>>>(in, static_cast<__half*>(out), n);
  return cudaGetLastError();
}

}  // namespace cortado::collective::nccl
