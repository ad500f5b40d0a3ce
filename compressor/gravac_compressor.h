// GraVAC on a worker: error feedback per tensor, the two-level encode of
// every tensor, the energies the controller needs, and the commit of what
// was sent. gravac.h has the controller; multi_level.h the encodings.
//
// One iteration, on every worker:
//   for each tensor: prepare(key, grad)   // g_ef = grad + residual; encode
//                                         // g_min at theta_min and g_c from it
//   sums = localSums()                    // reduce over the workers (sum)
//   step = decide(reducedSums, seconds)   // same on every worker; commits
//   for each tensor: send message(key), receive, decompressAdd(...)
//
// Error feedback commits only what was sent: after decide(), for the level
// chosen, residual = g_ef - decode(sent); a dense iteration sends g_ef and
// clears the residual. So decode(sent) + residual_new == grad + residual_old
// for every tensor and every level (exactly: sparse levels send copies of
// g_ef's elements and leave them zero in the residual). With DGC's momentum
// correction (m > 0), g_ef is DGC's v: u = m u + grad; v = v + u; and u is
// cleared wherever something was sent (everywhere on a dense iteration).
//
// Threads: prepare() for different keys may run concurrently; the other
// calls must not overlap prepare() or each other. CPU, host memory.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "compressor/gravac.h"
#include "compressor/multi_level.h"

namespace cortado::compressor {

class GravacCompressor {
 public:
  GravacCompressor(const Registry& registry, GravacOptions options, int workers,
                   double samplesPerIteration = 1.0);

  const GravacController& controller() const { return controller_; }
  const MultiLevelCodec& codec() const { return codec_; }
  float momentum() const { return momentum_; }

  // Folds grad into the key's error feedback and encodes both levels at the
  // controller's current CFs. ctx.seed is the round seed: the same on every
  // worker for the same iteration (random-k's indices). A key's n must not
  // change; each key at most once per iteration.
  void prepare(uint64_t key, const float* grad, size_t n, const EncodeContext& ctx = {});
  // This worker's energies, summed over the tensors prepared this iteration.
  GravacSums localSums() const;
  // The controller's step on the sums reduced over all workers and the
  // previous iteration's agreed duration; then commits every prepared
  // tensor's error feedback for the level chosen.
  GravacStep decide(const GravacSums& agreed, double previousSeconds);
  // The level decided last (dense before the first decide()).
  GravacLevel level() const { return level_; }

  // What the key sends this iteration, valid until its next prepare(): the
  // payload of the level chosen, or the n floats of g_ef (dense).
  std::span<const std::byte> message(uint64_t key) const;
  // sum += alpha * the decoded message (one worker's, or a sum of random-k
  // or dense messages) for the key's n elements.
  void decompressAdd(uint64_t key, std::span<const std::byte> message, float* sum,
                     float alpha = 1.0f) const;

  // Adds `values` (the key's n elements) to its residual (with DGC, to v):
  // mass that another part of the job held back (a plan switch's encode
  // residuals) joins what the key's next iteration sends or keeps. Between
  // decide() and the next prepare(); throws kInvalidArgument for a key never
  // prepared or a size other than its n.
  void addResidual(uint64_t key, std::span<const float> values);

  // Error-feedback state (empty spans for an unknown key).
  std::span<const float> residual(uint64_t key) const;
  std::span<const float> velocity(uint64_t key) const;
  size_t elements(uint64_t key) const;

 private:
  struct State {
    size_t n = 0;
    bool prepared = false;        // encoded, not yet decided
    bool ready = false;           // decided: message() is this iteration's
    std::vector<float> residual;  // e, or DGC's v
    std::vector<float> velocity;  // DGC's u; empty without momentum
    std::vector<float> dense;     // g_ef of a dense iteration
    std::vector<std::byte> minimum;
    std::vector<std::byte> candidate;
    double energy = 0, energyMin = 0, energyCandidate = 0;
  };
  State& stateFor(uint64_t key, size_t n);
  const State& existing(uint64_t key, const char* what) const;
  void commit(State& s);

  MultiLevelCodec codec_;
  GravacController controller_;
  float momentum_;
  GravacLevel level_ = GravacLevel::kDense;
  bool decided_ = false;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<State>> states_;
};

}  // namespace cortado::compressor
