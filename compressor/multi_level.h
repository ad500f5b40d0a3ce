// Multi-level compression for GraVAC: a sparsifier at any compression factor
// (CF = n / k, 10 keeps 10%), and a second level that compresses a first-level
// payload further instead of encoding the full tensor again. The full tensor
// is read once per iteration, however many CFs are tried.
//
// The second level, by codec:
// - topk, dgc: the k2 largest magnitudes among the first level's k1 values
//   (ties to the lower index, as top-k). The k1 values are the k1 largest of
//   the tensor, so this is exactly top-k of the tensor at the product CF; the
//   payload is an ordinary top-k (or DGC) payload that the registry's codec
//   decodes. (DGC selects exactly k too; its sampled threshold only speeds
//   the first level up.)
// - randomk: random-k over the first level's k1 values, with the same round
//   seed: a genuine random-k payload of a k1-element tensor. Every worker
//   that used the same round seed picks the same k1 and then the same k2
//   positions, so second-level payloads stay summable (Codec::addPayload,
//   or a plain sum of the value bodies). Random-k here sends plain values
//   (unbiased=0), as error feedback needs.
//
// k at a CF is format::kFromRatio(n, 1 / CF), at least 1: what the registry
// codec built with ratio = 1 / CF keeps.
//
// Threads: every method is const and may run concurrently (the per-CF codec
// cache has its own lock). CPU codecs, host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "compressor/codec.h"
#include "compressor/payload.h"
#include "compressor/registry.h"

namespace cortado::compressor {

class MultiLevelCodec {
 public:
  // codec: topk, dgc or randomk; seed: random-k's codec seed. Throws
  // kInvalidArgument for any other codec.
  MultiLevelCodec(const Registry& registry, std::string_view codec, uint64_t seed = 0);

  CodecId id() const { return id_; }
  const std::string& name() const { return name_; }
  // Random-k: payloads of one round and CF add up in compressed form.
  bool summable() const { return id_ == CodecId::kRandomK; }
  // DGC's momentum correction (0 for topk and randomk).
  float momentumCorrection() const;

  // The registry codec that keeps 1 / cf of a tensor (cached per CF).
  CodecPtr at(double cf) const;
  // Elements kept of an n-element tensor at CF cf.
  static size_t keptAt(size_t n, double cf);
  // Payload bytes at CF cf, first or second level alike.
  size_t payloadBytes(size_t n, double cf) const;

  // First level: encodes n elements at CF cf (as at(cf)->encode).
  size_t encode(const float* in, size_t n, double cf, std::span<std::byte> out,
                const EncodeContext& ctx = {}) const;
  // Second level: from `first`, a first-level payload of an n-element
  // tensor, the payload at CF `cf` (>= the first level's CF).
  size_t recompress(std::span<const std::byte> first, size_t n, double cf, std::span<std::byte> out,
                    const EncodeContext& ctx = {}) const;
  // sum[i] += alpha * decoded[i] for a first- or second-level payload of an
  // n-element tensor (or a sum of such random-k payloads). Validates first.
  void decompressAdd(std::span<const std::byte> payload, size_t n, float* sum,
                     float alpha = 1.0f) const;
  // buf[i] = 0 wherever the payload carries element i (DGC's momentum).
  void zeroSent(std::span<const std::byte> payload, size_t n, float* buf) const;
  // Sum of the squares of the values the payload carries: |C(x)|^2.
  static double energy(std::span<const std::byte> payload);

 private:
  std::string spec(double cf) const;
  // Whether `payload` (header h) is a random-k second level nested in the
  // first (fewer values than n), checked and validated; false for a payload
  // the base codec decodes as it is.
  bool nested(std::span<const std::byte> payload, const PayloadHeader& h, size_t n) const;

  const Registry& registry_;
  std::string name_;
  CodecId id_;
  uint64_t seed_;
  CodecPtr base_;  // decodes any payload of the codec, whatever its k
  mutable std::mutex mu_;
  mutable std::map<double, CodecPtr> byRatio_;
};

}  // namespace cortado::compressor
