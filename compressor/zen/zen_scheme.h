// Zen's choice of scheme (specs/zen.md §2): Balanced Parallelism (BP: every
// worker pushes each server the non-zeros it owns, each server answers with
// its part of the sum; Cortado's servers run it, zen_sum.h) or Hierarchical
// Centralization (HC: log2 n stages of pairwise exchange, each worker
// summing what its partner holds, so that every worker ends with the whole
// sum; SparCML's recursive doubling). With M dense elements, d the mean
// density of one worker's tensor, gamma(k) = (density of the sum of k
// workers' tensors) / d, n workers and bandwidth b, per worker (COO: index
// and value, hence the 2):
//
//   T_bp = (n - 1) / n * (gamma(n) + 1) * 2 M d / b                  (1)
//   T_hc = sum_{i = 1 .. log2 n} gamma(2^(i-1)) * 2 M d / b           (2)
//
// (1) wins unless the tensors barely overlap (gamma grows like k). The
// profile (d and gamma at 1, 2, 4, ..., n) comes from the first iterations:
// measured exactly from every worker's index set where they are at hand
// (profileFromIndexSets), or, where only d and the union density at n are
// known (a worker sees its own non-zeros and the servers' answers), with
// gamma at the intermediate stages from an overlap model (profileFromUnion).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace cortado::compressor::zen {

enum class Scheme { kBalancedParallelism, kHierarchicalCentralization };
const char* schemeName(Scheme s);

struct SparsityProfile {
  uint64_t numElements = 0;  // M
  int workers = 1;           // n
  double density = 0;        // d: mean non-zeros of one worker / M
  // gamma(k) for k = 1, 2, 4, ..., and n last (when n is no power of 2);
  // groups[i] is the k of gamma[i].
  std::vector<int> groups;
  std::vector<double> gamma;
  bool modelled = false;  // gamma between 1 and n from the overlap model

  // gamma(k) for a group size k: the entry of the largest group <= k.
  double gammaAt(int k) const;
};

// Exact: density of each worker and of the union of the first 2^i workers.
SparsityProfile profileFromIndexSets(uint64_t numElements,
                                     const std::vector<std::vector<uint32_t>>& perWorker);
// From d and the density of the sum of all n (d_n): each worker is taken to
// hold a share f of the union's indices, drawn independently, f chosen so
// that n workers cover the union; gamma(k) = (d_n / d) (1 - (1 - f)^k)
// scaled so that gamma(1) = 1 and gamma(n) = d_n / d.
SparsityProfile profileFromUnion(uint64_t numElements, int workers, double density,
                                 double unionDensity);
// From d and an overlap f in [d, 1] that does not depend on n (the
// planner's profiles, docs/planner.md): each worker's non-zeros are a share f
// of a hot set of d / f of the tensor, drawn independently, so
// gamma(k) = (1 - (1 - f)^k) / f. f = 1: identical index sets (gamma 1);
// f = d: uniform over the tensor; f -> 0: disjoint (gamma(k) -> k).
// Throws kInvalidArgument outside those ranges.
SparsityProfile profileFromOverlap(uint64_t numElements, int workers, double density,
                                   double overlap);

struct SchemeChoice {
  Scheme scheme = Scheme::kBalancedParallelism;
  double bpSeconds = 0, hcSeconds = 0;  // equations (1) and (2)
  std::string figures;                  // the profile and both times, for the log
};

double balancedParallelismSeconds(const SparsityProfile& p, double bytesPerSecond);
double hierarchicalCentralizationSeconds(const SparsityProfile& p, double bytesPerSecond);
// The scheme with the smaller time; ties go to BP (the servers' scheme).
SchemeChoice chooseScheme(const SparsityProfile& p, double bytesPerSecond);

// Hierarchical Centralization for one rank of `size`: `exchange(peer, mine)`
// sends this rank's current COO list to `peer` and returns the peer's (the
// caller's transport: MPI sendrecv, sockets, or threads in the tests).
// Recursive doubling over the largest power of two p <= size; ranks >= p
// first hand their list to rank - p and get the result from it at the end.
// Input: this rank's pairs (unique indices); output: the sum of every rank's
// pairs, ascending by index, exact zeros left out.
struct CooList {
  std::vector<uint32_t> index;
  std::vector<float> value;
};
using PairExchange = std::function<CooList(int peer, const CooList& mine)>;
struct HcOptions {
  // Every rank calls `exchange` once per stage, with peer -1 (and an empty
  // list, whose answer is ignored) in the stages it sits out: the fold-in and
  // fold-out when size is no power of two, the doubling stages for ranks >=
  // p. A caller whose exchange is a collective that every member must enter
  // (core/zen_collective.h: an alltoallv per stage) needs this.
  bool everyStage = false;
  // Where given: this rank's list size (duplicates merged, zeros left out),
  // then on ranks < p its size after each doubling stage (log2 p more
  // entries): what 1, 2, 4, ..., p ranks summed, the gamma profile of
  // equation (2) measured (with the folded-in ranks counted in when size is
  // no power of two).
  std::vector<uint64_t>* stageSizes = nullptr;
};
CooList hierarchicalCentralization(int rank, int size, CooList mine, const PairExchange& exchange,
                                   const HcOptions& options = {});
// The exchanges each rank makes with everyStage: log2 p for the largest
// power of two p <= size, plus the fold-in and fold-out when size > p.
int hierarchicalCentralizationStages(int size);
// The sum of two ascending lists, ascending (sparse + sparse).
CooList mergeSum(const CooList& a, const CooList& b);

// A list as one stage of hierarchical centralization carries it between
// ranks (core/zen_collective.h): n u32 indices, then n f32 values,
// little-endian. parseStageList checks the whole list first (a whole
// number of pairs, indices strictly ascending and below numElements) and
// throws Error(kProtocol) saying what is wrong; it never reads past the end.
std::vector<std::byte> encodeStageList(const CooList& list);
CooList parseStageList(std::span<const std::byte> bytes, uint64_t numElements);

}  // namespace cortado::compressor::zen
