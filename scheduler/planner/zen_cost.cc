#include "scheduler/planner/zen_cost.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"

namespace cortado::planner {

namespace zen = compressor::zen;
using plan::CommOp;

namespace {

// core/zen_collective.cc: the counts are int64 per peer, every COO list and
// answer starts with the 48-byte payload header (compressor/zen/zen_payload.h).
constexpr double kCountBytes = 8;
constexpr double kHeaderBytes = 48;

}  // namespace

double indexListGapBytes(int ranks, double sumDensity) {
  if (sumDensity <= 0) return 1;
  // A share's non-zeros lie about ranks / sumDensity indices apart.
  const double gap = std::max(0.0, double(ranks) / sumDensity - 1);
  return gap < 0x1p7 ? 1 : gap < 0x1p14 ? 2 : gap < 0x1p21 ? 3 : gap < 0x1p28 ? 4 : 5;
}

ZenPath zenPath(const Cluster& c) {
  ZenPath p;
  p.ranks = c.machines * c.gpusPerMachine;
  p.link = c.machines > 1 ? &c.inter : &c.intra;
  p.perNic = c.machines > 1 ? c.gpusPerMachine : 1;
  return p;
}

zen::Scheme zenScheme(CommOp op) {
  CORTADO_ENFORCE(op == CommOp::kZenBalanced || op == CommOp::kZenCentralized,
                  ErrorCode::kInvalidArgument, "'{}' is not a Zen step", plan::toString(op));
  return op == CommOp::kZenBalanced ? zen::Scheme::kBalancedParallelism
                                    : zen::Scheme::kHierarchicalCentralization;
}

Sparsity sumOf(const Sparsity& s, int workers) {
  if (s.density <= 0 || workers <= 1) return s;
  const double f = s.overlap > 0 ? s.overlap : s.density;
  const double covered = f >= 1 ? 1.0 : -std::expm1(double(workers) * std::log1p(-f));
  Sparsity out;
  out.density = std::min(1.0, s.density / f * covered);
  out.overlap = std::max(out.density, std::min(1.0, covered));
  return out;
}

ZenCost zenCost(const Cluster& c, zen::Scheme scheme, int64_t elements, int dtypeBytes,
                const Sparsity& s, const ZenPath* given) {
  CORTADO_ENFORCE(elements > 0 && dtypeBytes > 0, ErrorCode::kInvalidArgument,
                  "Zen cost of {} elements of {} bytes", elements, dtypeBytes);
  CORTADO_ENFORCE(s.density >= 0 && s.density <= 1 && (s.overlap == 0 || s.density > 0),
                  ErrorCode::kInvalidArgument,
                  "Zen cost: density {} must be in (0, 1] (0: unknown, priced dense), and an "
                  "overlap ({}) needs a density",
                  s.density, s.overlap);
  const ZenPath path = given ? *given : zenPath(c);
  const int n = path.ranks;
  const double E = double(elements);
  const double d = s.density > 0 ? s.density : 1.0;
  const double f = s.overlap > 0 ? s.overlap : d;
  const zen::SparsityProfile prof = zen::profileFromOverlap(uint64_t(elements), n, d, f);
  const double pairBytes = 4.0 + dtypeBytes;
  const double pairs = d * E;  // one rank's
  const double sumDensity = std::min(1.0, d * prof.gammaAt(n));
  const double nsPerPair = c.zenNsPerPair;
  const double passUs =
      E * dtypeBytes * 8.0 / (c.cpuSumGbps * 1000.0);  // one pass over the dense tensor
  const LinkCost& link = *path.link;
  const double nic = path.perNic;

  ZenCost out;
  if (scheme == zen::Scheme::kBalancedParallelism) {
    // The lists go delta-coded (ZenCollectiveOptions::compact): a value and
    // the gap to the previous index of the same owner, about n / d indices
    // apart, where that is fewer than COO's 4 index bytes.
    const double push =
        pairs * (dtypeBytes + std::min(4.0, indexListGapBytes(n, d))) + kHeaderBytes * n;
    const double shareNonzeros = sumDensity * E / n;
    const double answer = kHeaderBytes + dtypeBytes * shareNonzeros +
                          std::min(E / (8.0 * n), indexListGapBytes(n, sumDensity) * shareNonzeros);
    out.commUs = commTimeUs(link, CommOp::kAlltoall, n, kCountBytes * n) +
                 commTimeUs(link, CommOp::kAlltoall, n, push * nic) +
                 commTimeUs(link, CommOp::kAllgather, n, kCountBytes) +
                 commTimeUs(link, CommOp::kAllgather, n, answer * nic);
    out.pushBytes = n > 1 ? push * (n - 1) / n : 0;
    out.pullBytes = answer * (n - 1);
    out.scanUs = passUs + pairs * nsPerPair / 1000.0;  // scan, place
    // Sum what this rank owns (about one rank's worth of pairs from all),
    // decode every share's non-zeros into the zeroed dense output.
    out.sumUs = passUs + (pairs + sumDensity * E) * nsPerPair / 1000.0;
    return out;
  }
  // Hierarchical centralization: recursive doubling over the largest power
  // of two q <= n; the ranks past it fold in first and get the sum last.
  int q = 1;
  while (q * 2 <= n) q *= 2;
  const AlphaBeta& message = link.forOp(CommOp::kAlltoall);
  const int stages = zen::hierarchicalCentralizationStages(n);
  double mergedPairs = 0;
  auto send = [&](double listPairs) {
    const double bytes = listPairs * pairBytes;
    out.commUs += message.us(bytes * nic);
    out.pushBytes += bytes;
  };
  if (n > q) send(pairs);  // fold-in
  for (int k = 1; k < q; k *= 2) {
    const double list = std::min(1.0, d * prof.gammaAt(k)) * E;
    send(list);
    mergedPairs += 2 * list;  // own list and the partner's
  }
  if (n > q) send(sumDensity * E);  // fold-out
  if (n > 1) out.commUs += stages * commTimeUs(link, CommOp::kAlltoall, n, kCountBytes * n);
  out.scanUs = passUs;  // the scan lists the pairs in ascending order: no placement
  out.sumUs = passUs + (mergedPairs + sumDensity * E) * nsPerPair / 1000.0;
  return out;
}

}  // namespace cortado::planner
