// CPU/CUDA cross-decoding: a GPU encode decodes on the CPU and the reverse;
// deterministic codecs (and QSGD with the same seed) give identical bytes.
// Skips, saying why, when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>

#include "compressor/cuda/cuda_codecs.h"
#include "compressor/error_feedback.h"
#include "compressor/payload.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::randomTensor;

Registry& cudaRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    registerCudaCodecs(*reg);
    return reg;
  }();
  return *r;
}

#define SKIP_WITHOUT_GPU()                                                             \
  if (cuda::deviceCount() == 0)                                                        \
  GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount() == 0): the CPU/CUDA " \
                  "cross-decoding tests need a GPU"

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess); }
  Dev(const std::vector<T>& v) : Dev(v.size()) { cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  ~Dev() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  std::span<std::byte> bytes() { return {reinterpret_cast<std::byte*>(p), n * sizeof(T)}; }
};

TEST(CudaRegistry, RegistersTheCudaCodecs) {
  std::vector<std::string> want = {"bf16", "dgc", "efsignsgd", "fp16", "onebit", "qsgd", "randomk", "topk"};
  EXPECT_EQ(cudaRegistry().names(Device::kCuda), want);
  EXPECT_EQ(cudaRegistry().create("topk:ratio=0.2", Device::kCuda)->spec(), "topk:ratio=0.2");
  // Their payloads are device memory: validate() (host payloads) is refused.
  std::vector<std::byte> payload(64);
  try {
    cudaRegistry().create("fp16", Device::kCuda)->validate(payload, 8);
    ADD_FAILURE() << "a CUDA codec validated a host payload";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("decode()"), std::string::npos) << e.what();
  }
}

class CrossDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(CrossDecode, BytesMatchAndBothSidesDecodeTheOther) {
  SKIP_WITHOUT_GPU();
  auto cpu = cpuRegistry().create(GetParam(), Device::kCpu);
  auto gpu = cudaRegistry().create(GetParam(), Device::kCuda);
  for (size_t n : {1, 9, 2049, 100003, (1 << 20) + 13}) {
    SCOPED_TRACE(n);
    auto x = randomTensor(n, n);
    EncodeContext ctx;
    ctx.seed = 77;
    std::vector<std::byte> cpuPayload(cpu->payloadBytes(n));
    ASSERT_EQ(cpu->encode(x.data(), n, cpuPayload, ctx), cpuPayload.size());
    ASSERT_EQ(gpu->payloadBytes(n), cpuPayload.size());
    Dev<float> dx(x);
    Dev<std::byte> dp(cpuPayload.size());
    ASSERT_EQ(gpu->encode(dx.p, n, dp.bytes(), ctx), cpuPayload.size());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto gpuPayload = dp.host();
    ASSERT_TRUE(gpuPayload == cpuPayload) << "payload bytes differ: " << describe(parseHeader(gpuPayload))
                                          << " vs " << describe(parseHeader(cpuPayload));
    // CPU decodes the GPU's payload; the GPU decodes the CPU's.
    std::vector<float> a(n);
    cpu->decode(gpuPayload, a.data(), n);
    Dev<std::byte> dcpu(cpuPayload);
    Dev<float> dout(n);
    gpu->decode(std::span<const std::byte>(dcpu.p, cpuPayload.size()), dout.p, n, ctx);
    auto b = dout.host();
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::fabs(a[i]))) << i;
    // decompressAdd on the GPU: out += 0.5 * decoded.
    gpu->decompressAdd(std::span<const std::byte>(dcpu.p, cpuPayload.size()), dout.p, n, 0.5f, ctx);
    auto c = dout.host();
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(c[i], 1.5f * a[i], 1e-5f * (1 + std::fabs(a[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CrossDecode,
                         ::testing::Values("fp16", "bf16", "onebit", "efsignsgd", "qsgd:levels=1",
                                           "qsgd:levels=7", "qsgd:levels=127", "topk:ratio=0.01",
                                           "topk:ratio=0.3", "dgc:ratio=0.001", "randomk:ratio=0.05"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// Sparse inputs (what the alltoall path re-encodes: a sum of the workers'
// sparse chunks) at sizes where the GPU samples a threshold: with fewer
// non-zeros than k the sampled threshold is zero and the rest of the payload
// is the lowest-index zeros; with more, only non-zeros are candidates. The
// CPU codec is the reference (tested against a brute-force sort), byte for
// byte; -0.0 counts as zero on both.
TEST(CudaSparseInput, TopKAndDgcMatchTheCpuByteForByte) {
  SKIP_WITHOUT_GPU();
  const size_t n = (size_t{1} << 20) + 13;
  auto dense = randomTensor(n, 5);
  for (double nonzero : {0.002, 0.005, 0.05}) {
    std::vector<float> x(n, 0.0f);
    const size_t every = static_cast<size_t>(1.0 / nonzero);
    for (size_t b = 0; b * every < n; ++b) {  // one non-zero per block of `every`, at varying places
      const size_t i = b * every + (b * 7) % every;
      if (i < n) x[i] = dense[i];
    }
    for (size_t i = 3; i < n; i += 4096) x[i] = -0.0f;
    for (const char* spec : {"topk:ratio=0.01", "dgc:ratio=0.01", "topk:ratio=0.001"}) {
      SCOPED_TRACE(std::string(spec) + ", non-zero fraction " + std::to_string(nonzero));
      auto cpu = cpuRegistry().create(spec, Device::kCpu);
      auto gpu = cudaRegistry().create(spec, Device::kCuda);
      std::vector<std::byte> cpuPayload(cpu->payloadBytes(n));
      ASSERT_EQ(cpu->encode(x.data(), n, cpuPayload, {}), cpuPayload.size());
      Dev<float> dx(x);
      Dev<std::byte> dp(cpuPayload.size());
      ASSERT_EQ(gpu->encode(dx.p, n, dp.bytes(), {}), cpuPayload.size());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto gpuPayload = dp.host();
      ASSERT_TRUE(gpuPayload == cpuPayload) << "payload bytes differ";
    }
  }
}

TEST(CudaMalformed, RejectedBeforeTheOutputIsTouched) {
  SKIP_WITHOUT_GPU();
  auto cpu = cpuRegistry().create("topk:ratio=0.1");
  auto gpu = cudaRegistry().create("topk:ratio=0.1", Device::kCuda);
  auto x = randomTensor(100, 1);
  std::vector<std::byte> p(cpu->payloadBytes(100));
  cpu->encode(x.data(), 100, p, {});
  storeLe<uint32_t>(p.data() + kHeaderBytes, 100);  // index out of range
  Dev<std::byte> dp(p);
  Dev<float> out(std::vector<float>(100, 3.0f));
  try {
    gpu->decompressAdd(std::span<const std::byte>(dp.p, p.size()), out.p, 100);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
  }
  for (float v : out.host()) EXPECT_EQ(v, 3.0f);
  EXPECT_THROW(gpu->decode(std::span<const std::byte>(dp.p, 40), out.p, 100), Error);  // truncated
}

TEST(CudaErrorFeedback, MatchesTheCpuWrapper) {
  SKIP_WITHOUT_GPU();
  for (auto spec : {"topk:ratio=0.01", "efsignsgd", "dgc:ratio=0.01"}) {
    SCOPED_TRACE(spec);
    ErrorFeedback cpuEf(cpuRegistry().create(spec));
    cuda::CudaErrorFeedback gpuEf(cudaRegistry().create(spec, Device::kCuda));
    size_t n = 50000;
    for (int step = 0; step < 3; ++step) {
      auto g = randomTensor(n, step);
      std::vector<std::byte> pc(cpuEf.payloadBytes(n));
      cpuEf.encode(1, g.data(), n, pc);
      Dev<float> dg(g);
      Dev<std::byte> dp(pc.size());
      gpuEf.encode(1, dg.p, n, dp.bytes());
      auto pg = dp.host();
      ASSERT_TRUE(pg == pc) << "step " << step;
      std::vector<float> res(n);
      cudaMemcpy(res.data(), gpuEf.residual(1), n * 4, cudaMemcpyDeviceToHost);
      auto want = cpuEf.residual(1);
      for (size_t i = 0; i < n; ++i) ASSERT_NEAR(res[i], want[i], 1e-6f * (1 + std::fabs(want[i])));
    }
  }
}

}  // namespace
}  // namespace cortado::compressor
