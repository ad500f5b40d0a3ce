// Helpers shared by the codec tests: a registry with the CPU codecs, random
// tensors, and encode-to-vector.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "compressor/codec.h"
#include "compressor/registry.h"

namespace cortado::compressor::testing {

inline Registry& cpuRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    registerCpuCodecs(*reg);
    return reg;
  }();
  return *r;
}

inline std::vector<float> randomTensor(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<std::byte> encodeToVector(const Codec& c, const std::vector<float>& x,
                                             const EncodeContext& ctx = {}) {
  std::vector<std::byte> out(ctx.rows ? c.payloadBytes(x.size(), ctx.rows)
                                      : c.payloadBytes(x.size()));
  size_t n = c.encode(x.data(), x.size(), out, ctx);
  out.resize(n);
  return out;
}

inline std::vector<float> decodeToVector(const Codec& c, const std::vector<std::byte>& p,
                                         size_t n) {
  std::vector<float> out(n, -12345.0f);
  c.decode(p, out.data(), n);
  return out;
}

}  // namespace cortado::compressor::testing
