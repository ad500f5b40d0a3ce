// float16/bfloat16 <-> float32 conversions on a stream, so that the NCCL
// backend sums those dtypes in float32 as the MPI backend does. C++17, no fmt:
// shared with nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace cortado::collective::nccl {

// bf16 == false: IEEE float16; true: bfloat16. Round to nearest even.
cudaError_t launchToFloat(bool bf16, const void* in, float* out, size_t n, cudaStream_t stream);
cudaError_t launchFromFloat(bool bf16, const float* in, void* out, size_t n, cudaStream_t stream);

}  // namespace cortado::collective::nccl
