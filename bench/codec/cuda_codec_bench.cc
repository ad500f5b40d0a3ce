// CUDA codec throughput on the GPU, next to two peers measured in the same
// run: the same GPU's device-to-device copy of the input (its memory
// bandwidth), and the codec's CPU twin on the same tensor with every core.
// This is what the planner weighs when it puts an encode on the GPU or on a
// CPU (scheduler/planner), so the ratios are printed, not only the times.
//
//   cortado_cuda_codec_bench [benchmark flags] [--threads=T]
//   cortado_cuda_codec_bench --export_costs=gpu_costs.json [--cost_max_elements=N]
//                            [--cost_reps=R] [--cost_codecs='fp16;dgc:ratio=0.01']
//
// --export_costs writes the GPU's measured fits in the format that
// `cortado plan --codec-costs FILE` reads (device "gpu"), as
// cortado_codec_bench does for the CPU codecs.
//
// GB/s is input bytes (fp32) per second. GPU times come from CUDA events on
// the codec's stream and include what the call itself waits for (top-k's
// candidate count, a decode's header and index checks). Without a GPU it says
// so and exits with status 2.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "compressor/cuda/cuda_codecs.h"
#include "compressor/error_feedback.h"
#include "compressor/registry.h"
#include "core/common/thread_pool.h"
#include "cost_export.h"

namespace cortado::bench {
namespace {

using compressor::EncodeContext;
using Clock = std::chrono::steady_clock;

void cudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) {
    cudaOk(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::span<std::byte> bytes() { return {reinterpret_cast<std::byte*>(p), n * sizeof(T)}; }
};

std::vector<float> normalTensor(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Gpu {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Gpu() {
    cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaOk(cudaEventCreate(&start), "cudaEventCreate");
    cudaOk(cudaEventCreate(&stop), "cudaEventCreate");
  }
  ~Gpu() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
  }
  // Seconds that fn's work took on the stream.
  template <typename Fn>
  double time(Fn&& fn) {
    cudaOk(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    cudaOk(cudaEventRecord(stop, stream), "cudaEventRecord");
    cudaOk(cudaEventSynchronize(stop), "cudaEventSynchronize");
    cudaOk(cudaGetLastError(), "kernel launch");
    float ms = 0;
    cudaOk(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms / 1e3;
  }
};

// Median of `reps` host-timed runs (after one warm-up run).
template <typename Fn>
double cpuSeconds(int reps, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

struct Size {
  std::string name;
  size_t n;
};

struct Context {
  compressor::Registry cpu, cuda;
  std::unique_ptr<ThreadPool> pool;
  size_t threads = 1;
  Gpu gpu;
  std::map<size_t, std::vector<float>> host;                 // by element count
  std::map<size_t, std::unique_ptr<DeviceArray<float>>> dev;  // the same tensors on the GPU
  std::map<size_t, double> d2dGBs;                            // copy bandwidth by size
};

// Registers a GPU benchmark of `n` fp32 elements with its peers' counters.
template <typename Fn>
void addGpu(Context& c, const std::string& name, size_t n, double cpuSec, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(), [&c, n, cpuSec, fn](benchmark::State& st) {
    double total = 0;
    for (auto _ : st) {
      double dt = c.gpu.time(fn);
      st.SetIterationTime(dt);
      total += dt;
    }
    const double per = total / st.iterations();
    const double gbs = 4.0 * n / per / 1e9;
    st.counters["GB/s"] = gbs;
    st.counters["pct_d2d"] = 100.0 * gbs / c.d2dGBs.at(n);
    if (cpuSec > 0) {
      st.counters["cpu_ms"] = cpuSec * 1e3;
      st.counters["x_vs_cpu"] = cpuSec / per;
    }
  })->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
}

void registerAll(Context& c, const std::vector<Size>& sizes) {
  for (const Size& s : sizes) {
    float* x = c.dev.at(s.n)->p;
    auto dst = std::make_shared<DeviceArray<float>>(s.n);
    addGpu(c, "d2d_copy/" + s.name, s.n, 0, [&c, x, dst, n = s.n] {
      cudaOk(cudaMemcpyAsync(dst->p, x, n * 4, cudaMemcpyDeviceToDevice, c.gpu.stream), "copy");
    });
  }
  const std::vector<std::string> specs = {"fp16",          "bf16",           "onebit",
                                          "efsignsgd",     "qsgd:levels=7",  "topk:ratio=0.01",
                                          "dgc:ratio=0.01", "dgc:ratio=0.001", "randomk:ratio=0.01"};
  for (const Size& s : sizes) {
    const size_t n = s.n;
    float* x = c.dev.at(n)->p;
    const std::vector<float>& hx = c.host.at(n);
    for (const std::string& spec : specs) {
      compressor::CodecPtr gpuCodec = c.cuda.create(spec, compressor::Device::kCuda);
      compressor::CodecPtr cpuCodec = c.cpu.create(spec);
      EncodeContext gctx;
      gctx.stream = c.gpu.stream;
      gctx.seed = 1;
      EncodeContext hctx;
      hctx.pool = c.pool.get();
      hctx.seed = 1;
      auto payload = std::make_shared<DeviceArray<std::byte>>(gpuCodec->payloadBytes(n));
      std::vector<std::byte> hostPayload(cpuCodec->payloadBytes(n));
      const double cpuEncode =
          cpuSeconds(3, [&] { cpuCodec->encode(hx.data(), n, hostPayload, hctx); });
      addGpu(c, "encode/" + spec + "/" + s.name, n, cpuEncode, [gpuCodec, payload, x, n, gctx] {
        gpuCodec->encode(x, n, payload->bytes(), gctx);
      });
      // Decode side: decompress-add the payload into an fp32 sum (what a
      // receiver of a pull, or a server, does with each payload).
      auto sum = std::make_shared<DeviceArray<float>>(n);
      cudaOk(cudaMemsetAsync(sum->p, 0, n * 4, c.gpu.stream), "memset");
      gpuCodec->encode(x, n, payload->bytes(), gctx);
      cudaOk(cudaStreamSynchronize(c.gpu.stream), "sync");
      std::vector<float> hostSum(n, 0.0f);
      const double cpuAdd = cpuSeconds(
          3, [&] { cpuCodec->decompressAdd(hostPayload, hostSum.data(), n, 1.0f, hctx); });
      addGpu(c, "decompress_add/" + spec + "/" + s.name, n, cpuAdd, [gpuCodec, payload, sum, n, gctx] {
        gpuCodec->decompressAdd(std::span<const std::byte>(payload->p, payload->n), sum->p, n, 1.0f, gctx);
      });
    }
    if (s.n == 25'000'000) {
      // What the alltoall path re-encodes: a sum of 4 workers' 1% chunks,
      // 1% non-zero when they chose the same indices (the sampled threshold
      // is then zero; docs/benchmarks.md).
      auto sparseHost = std::make_shared<std::vector<float>>(n, 0.0f);
      for (size_t i = 0; i < n; i += 100) (*sparseHost)[i + (i / 100) * 37 % 100] = hx[i];
      auto sparse = std::make_shared<DeviceArray<float>>(n);
      cudaOk(cudaMemcpy(sparse->p, sparseHost->data(), n * 4, cudaMemcpyHostToDevice), "upload");
      for (const std::string spec : {"topk:ratio=0.01", "dgc:ratio=0.01"}) {
        compressor::CodecPtr gpuCodec = c.cuda.create(spec, compressor::Device::kCuda);
        compressor::CodecPtr cpuCodec = c.cpu.create(spec);
        EncodeContext gctx;
        gctx.stream = c.gpu.stream;
        EncodeContext hctx;
        hctx.pool = c.pool.get();
        auto payload = std::make_shared<DeviceArray<std::byte>>(gpuCodec->payloadBytes(n));
        std::vector<std::byte> hostPayload(cpuCodec->payloadBytes(n));
        const double cpuSec =
            cpuSeconds(3, [&] { cpuCodec->encode(sparseHost->data(), n, hostPayload, hctx); });
        addGpu(c, "encode/" + spec + "/25M-sparse1%", n, cpuSec, [gpuCodec, payload, sparse, n, gctx] {
          gpuCodec->encode(sparse->p, n, payload->bytes(), gctx);
        });
      }
    }
    // The worker's whole error-feedback step (residual add, encode, residual
    // update), on the GPU and on the CPU.
    for (const std::string spec : {"efsignsgd", "dgc:ratio=0.01"}) {
      auto gef = std::make_shared<compressor::cuda::CudaErrorFeedback>(
          c.cuda.create(spec, compressor::Device::kCuda));
      compressor::ErrorFeedback cef(c.cpu.create(spec));
      EncodeContext gctx;
      gctx.stream = c.gpu.stream;
      EncodeContext hctx;
      hctx.pool = c.pool.get();
      auto payload = std::make_shared<DeviceArray<std::byte>>(gef->codec().payloadBytes(n));
      std::vector<std::byte> hostPayload(cef.payloadBytes(n));
      const double cpuSec = cpuSeconds(3, [&] { cef.encode(0, hx.data(), n, hostPayload, hctx); });
      addGpu(c, "ef_encode/" + spec + "/" + s.name, n, cpuSec,
             [gef, payload, x, n, gctx] { gef->encode(0, x, n, payload->bytes(), gctx); });
    }
  }
}

// The CUDA codecs on device buffers, timed with events on one stream.
CostMeasure cudaMeasure(size_t maxElements) {
  auto registry = std::make_shared<compressor::Registry>();
  compressor::registerCudaCodecs(*registry);
  auto gpu = std::make_shared<Gpu>();
  auto x = std::make_shared<DeviceArray<float>>(maxElements);
  auto out = std::make_shared<DeviceArray<float>>(maxElements);
  std::vector<float> host = normalTensor(maxElements, 1);
  cudaOk(cudaMemcpy(x->p, host.data(), maxElements * 4, cudaMemcpyHostToDevice), "upload");
  return [registry, gpu, x, out](const std::string& spec, size_t n, int reps) {
    compressor::CodecPtr codec = registry->create(spec, compressor::Device::kCuda);
    EncodeContext ctx;
    ctx.stream = gpu->stream;
    ctx.seed = 1;
    DeviceArray<std::byte> payload(codec->payloadBytes(n));
    const std::span<const std::byte> sent(payload.p, payload.n);
    CostPoint p;
    p.spec = codec->spec();
    p.payloadBytes = payload.n;
    p.encode = medianOf(reps, [&] { return gpu->time([&] { codec->encode(x->p, n, payload.bytes(), ctx); }); });
    p.decode = medianOf(reps, [&] { return gpu->time([&] { codec->decode(sent, out->p, n, ctx); }); });
    p.decompressAdd =
        medianOf(reps, [&] { return gpu->time([&] { codec->decompressAdd(sent, out->p, n, 1.0f, ctx); }); });
    return p;
  };
}

}  // namespace
}  // namespace cortado::bench

int main(int argc, char** argv) {
  using namespace cortado::bench;
  const size_t threads = takeThreadsFlag(argc, argv);
  std::string costs;
  const bool exportCosts = takeFlag(argc, argv, "--export_costs", &costs);
  if (cortado::compressor::cuda::deviceCount() == 0) {
    std::cerr << "cortado_cuda_codec_bench: no CUDA device visible (cudaGetDeviceCount() == 0); "
                 "run it on a machine with an NVIDIA GPU and its driver\n";
    return 2;
  }
  try {
    if (exportCosts) {
      CostExportOptions o;
      o.path = costs;
      o.device = "gpu";
      cudaDeviceProp prop{};
      cudaOk(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      o.machine = std::string(prop.name) + " (" + std::to_string(prop.multiProcessorCount) + " SMs)";
      takeCostFlags(argc, argv, o,
                    {"fp16", "bf16", "onebit", "efsignsgd", "topk:ratio=0.01", "topk:ratio=0.001",
                     "dgc:ratio=0.01", "dgc:ratio=0.001", "randomk:ratio=0.01", "qsgd:levels=7"});
      if (argc > 1) {
        std::cerr << "cortado_cuda_codec_bench: unknown option '" << argv[1] << "' with --export_costs\n";
        return 1;
      }
      o.measure = cudaMeasure(o.maxElements);
      return runCostExport(o);
    }
  } catch (const std::exception& e) {
    std::cerr << "cortado_cuda_codec_bench: " << e.what() << "\n";
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    Context c;
    cortado::compressor::registerCpuCodecs(c.cpu);
    cortado::compressor::registerCudaCodecs(c.cuda);
    c.threads = threads;
    if (threads > 1) c.pool = std::make_unique<cortado::ThreadPool>(threads - 1);
    // A partition chunk (4 MiB, the default), a large layer (64 MiB), and a
    // BERT-sized embedding (25M floats).
    const std::vector<Size> sizes = {{"4MiB", size_t{1} << 20}, {"64MiB", size_t{16} << 20}, {"25M", 25'000'000}};
    for (const Size& s : sizes) {
      c.host[s.n] = normalTensor(s.n, s.n);
      c.dev[s.n] = std::make_unique<DeviceArray<float>>(s.n);
      cudaOk(cudaMemcpy(c.dev[s.n]->p, c.host[s.n].data(), s.n * 4, cudaMemcpyHostToDevice), "upload");
      // The copy yardstick: best of 20 device-to-device copies.
      DeviceArray<float> dst(s.n);
      double best = 1e9;
      for (int r = 0; r < 20; ++r)
        best = std::min(best, c.gpu.time([&] {
          cudaOk(cudaMemcpyAsync(dst.p, c.dev[s.n]->p, s.n * 4, cudaMemcpyDeviceToDevice, c.gpu.stream), "copy");
        }));
      c.d2dGBs[s.n] = 4.0 * s.n / best / 1e9;
    }
    cudaDeviceProp prop{};
    cudaOk(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::cerr << "GPU: " << prop.name << " (" << prop.multiProcessorCount << " SMs); device-to-device copy: ";
    for (const Size& s : sizes) std::cerr << s.name << " " << c.d2dGBs[s.n] << " GB/s  ";
    std::cerr << "\nCPU twins: " << threads << " threads\n";
    registerAll(c, sizes);
    benchmark::RunSpecifiedBenchmarks();
    // The registered lambdas own device buffers: free them while CUDA is up.
    benchmark::ClearRegisteredBenchmarks();
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::cerr << "cortado_cuda_codec_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
