// Helpers shared by the codec tests: a registry with the CPU codecs, random
// tensors, error feedback's update by plain loops, and encode-to-vector.
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

// Error feedback's update by plain loops, the reference for the passes that
// fold it into an encode: with momentum u = m u + g, e += u; else e += g.
inline void referenceUpdate(std::vector<float>& e, std::vector<float>& u,
                            const std::vector<float>& g, float m, bool momentum) {
  for (size_t i = 0; i < e.size(); ++i) {
    if (momentum) {
      u[i] = m * u[i] + g[i];
      e[i] += u[i];
    } else {
      e[i] += g[i];
    }
  }
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
