// The planner's cost model of Zen's two schemes for sparse tensors
// (docs/zen.md, specs/zen.md §2), as core/zen_collective runs them over the
// world collective group: balanced parallelism (an alltoall of byte counts,
// one alltoallv of every rank's pairs to their owners, an allgather of the
// answers' sizes, one allgatherv of every owner's summed share) and
// hierarchical centralization (per stage of recursive doubling an alltoall of
// byte counts and one exchange of the partial sum with the partner).
//
// The bytes are the spec's equations (1) and (2): with E elements, n ranks, d
// one rank's density, gamma(k) the density of the sum of k ranks over d,
// and B = d E (index + value bytes) what one rank's pairs take,
//   BP: push (n-1)/n B, pull (n-1)/n gamma(n) B        (equation 1)
//   HC: stage i sends gamma(2^(i-1)) B, i = 1..log2 n  (equation 2)
// except that an owner's answer is not its pairs but what the code sends
// (compressor/zen/zen_payload.h): the values plus either the hash bitmap
// (E/(8n) bytes) or the index list (a varint gap per non-zero, priced at
// the length of the mean gap: indexListGapBytes), whichever is smaller.
// Each collective is priced with the link's alpha-beta model as the
// planner prices the others (commTimeUs: the alltoall and allgather
// formulas with the link's per-operation fits; an HC exchange as one
// message, alpha + bytes beta), so the latency terms are
// counted too. CPU work on the calling thread: a scan of the dense input and
// a pass writing the dense output (at Cluster::cpuSumGbps), and every pair
// placed, summed, merged or decoded (Cluster::zenNsPerPair each).
#pragma once

#include <cstdint>
#include <string>

#include "compressor/zen/zen_scheme.h"
#include "core/plan/plan.h"
#include "scheduler/planner/cost_model.h"

namespace cortado::planner {

// A tensor's sparsity as the planner knows it (profile.h: "density",
// "overlap"). density 0: unknown, priced as a dense tensor (density 1).
struct Sparsity {
  double density = 0;
  double overlap = 0;  // 0: the density (uniform, independent indices)
  bool operator==(const Sparsity&) const = default;
  auto operator<=>(const Sparsity&) const = default;
};

struct ZenCost {
  double scanUs = 0;     // CPU before the communication: the dense scan, the placement
  double commUs = 0;     // every collective of the scheme
  double sumUs = 0;      // CPU after it: sums, merges, the decode into the dense output
  double pushBytes = 0;  // what one rank sends (BP: its pairs to the owners; HC: all stages)
  double pullBytes = 0;  // BP: what one rank receives of the others' answers; HC: 0
  double totalUs() const { return scanUs + commUs + sumUs; }
};

// The ranks a Zen step spans (all GPUs), the link it crosses, and how many
// ranks share a NIC (gpusPerMachine when the step crosses machines).
struct ZenPath {
  int ranks = 1;
  const LinkCost* link = nullptr;
  int perNic = 1;
};
ZenPath zenPath(const Cluster& c);

// The cost of one Zen round of `scheme` for a tensor of `elements` elements
// of `dtypeBytes` (u32 indices) on `c`, over `path` (default zenPath(c): all
// GPUs). Throws kInvalidArgument for a density or overlap out of range.
ZenCost zenCost(const Cluster& c, compressor::zen::Scheme scheme, int64_t elements, int dtypeBytes,
                const Sparsity& sparsity, const ZenPath* path = nullptr);

// Bytes of one gap of an index-list answer when the sum of `ranks` ranks
// has density sumDensity: the varint length (1 to 5) of the mean gap
// between a share's non-zeros, ranks / sumDensity - 1 indices.
double indexListGapBytes(int ranks, double sumDensity);

// The sparsity of the sum of `workers` tensors of `s` under the overlap
// model (a hierarchical Zen option's shards after the intra-machine
// reduce-scatter): density (d / f)(1 - (1 - f)^k), overlap 1 - (1 - f)^k.
// Unknown stays unknown.
Sparsity sumOf(const Sparsity& s, int workers);

// The Zen scheme a plan step runs (CommOp::kZenBalanced, kZenCentralized).
compressor::zen::Scheme zenScheme(plan::CommOp op);

}  // namespace cortado::planner
