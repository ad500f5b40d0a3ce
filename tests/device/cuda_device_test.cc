// The device conformance suite on the CUDA device. Without a GPU every case
// skips, saying so.
#include "core/common/error.h"
#include "core/device/cuda/factory.h"
#include "tests/device/device_test.h"

namespace cortado::device::testing {
namespace {

Backend cudaBackend() {
  Backend b;
  b.name = "Cuda";
  b.skipReason = [] {
    return cuda::deviceCount() == 0
               ? std::string(
                     "no CUDA device visible (cudaGetDeviceCount() == 0): the CUDA "
                     "device's conformance tests need a GPU")
               : std::string();
  };
  b.make = [] { return cuda::create(cuda::Options{}); };
  return b;
}

CORTADO_DEVICE_CONFORMANCE(Cuda, cudaBackend());

TEST(CudaDevice, WithoutAGpuCreateSaysSo) {
  if (cuda::deviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  try {
    cuda::create(cuda::Options{});
    ADD_FAILURE() << "a CUDA device was made without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("CORTADO_DEVICE=host"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado::device::testing
