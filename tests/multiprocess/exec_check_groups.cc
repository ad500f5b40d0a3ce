// The plan executor's check, modes groups and search (exec_check.cc
// describes them): the plan's fused groups (plan::Plan::groups) on every
// option of the tree, compressed and push/pull included, with group
// boundaries that change from one iteration to the next; and MergeComp's
// search for the groups by timing iterations.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "tests/multiprocess/exec_check.h"

namespace exec_check {

namespace {

// How an iteration hands its tensors over. Whole: every group's members in
// one batch (each group runs as one execution). Split: each group's first
// two members in one batch, its third in the next (every member on its own:
// the group is incomplete in both). Reversed: one batch, each group's members
// backwards (the group still runs, at the place of its last member). Single:
// one batch per tensor. Awaited: as whole, through runBatch with an
// AwaitItem, every input written only when the executor awaits its item
// (with and without the encode pipeline).
enum class Pattern { kWhole, kSplit, kReversed, kSingle, kAwaited };
constexpr Pattern kPatterns[] = {Pattern::kWhole,   Pattern::kSplit,  Pattern::kReversed,
                                 Pattern::kAwaited, Pattern::kSingle, Pattern::kAwaited};
const char* patternName(Pattern p) {
  switch (p) {
    case Pattern::kWhole: return "whole groups";
    case Pattern::kSplit: return "groups split over two batches";
    case Pattern::kReversed: return "whole groups, members reversed";
    case Pattern::kSingle: return "one tensor a batch";
    case Pattern::kAwaited: return "whole groups, inputs awaited";
  }
  return "?";
}

// Where an iteration's tensors live. Separate: a buffer each, half of them
// in place (input = output), half with an output of their own (each group
// is gathered into a buffer and scattered back). Flat: one buffer for all,
// in declaration order, in place, as a framework's flat gradient buffer
// (each group runs in place). Flat outputs: the outputs in one buffer, the
// inputs apart (copied into the outputs, then in place).
enum class Layout { kSeparate, kFlat, kFlatOutputs };
Layout layoutOf(int iter) { return Layout((iter / 2) % 3); }
const char* layoutName(Layout l) {
  switch (l) {
    case Layout::kSeparate: return "separate buffers";
    case Layout::kFlat: return "one flat buffer";
    case Layout::kFlatOutputs: return "flat outputs";
  }
  return "?";
}

}  // namespace

void Check::runGroups() {
  const bool exact = codec == "fp16";  // integer inputs: every sum exact
  auto options = treeOptions();
  std::vector<size_t> chosen;
  for (size_t i = 0; i < options.size(); ++i) {
    if (int(i % shards) != shard) continue;
    if (!exact && (!options[i].compressed() || (i / shards) % stride != 0)) continue;
    chosen.push_back(i);
  }
  // Per option a group of three tensors of different sizes; the third is
  // small, so that a codec's per-group statistics differ from its own.
  const uint64_t sizes[3] = {n, n + 5, 3};
  plan::Plan p;
  p.version = 1;
  std::vector<std::string> names;
  std::vector<uint64_t> lens;
  std::vector<size_t> optionOf;
  for (size_t o : chosen) {
    std::vector<std::string> group;
    for (int m = 0; m < 3; ++m) {
      names.push_back(fmt::format("g{}_{}", o, m));
      lens.push_back(sizes[m]);
      optionOf.push_back(o);
      p.tensors[names.back()] = options[o];
      group.push_back(names.back());
    }
    p.groups.push_back(std::move(group));
  }
  for (size_t k = 0; k < names.size(); ++k) ex.declare(names[k], DType::kFloat32, lens[k]);
  ex.setPlan(p, opDeadline(names.size()));
  if (me == 0)
    std::printf(
        "groups: %zu options (shard %d of %d), %zu tensors in %zu groups, codec %s, %d ranks "
        "on %d machines, %d iterations\n",
        chosen.size(), shard, shards, names.size(), p.groups.size(), codec.c_str(), W,
        topo.numMachines, iters);
  // The lossy bound: derivedBound's, with the servers' points counted twice.
  // A compressed pull's residual stays on the key that last carried it: the
  // group's key while members run alone, a member's own key while the group
  // runs, until that key's next round.
  std::vector<double> bounds(chosen.size(), bound);
  if (!exact && bound <= 0)
    for (size_t c = 0; c < chosen.size(); ++c) {
      bounds[c] = derivedBound(options[chosen[c]], codec, W, 2);
      if (bounds[c] <= 0) {
        fail(fmt::format("no derived bound for codec '{}': pass --bound", codec));
        bounds[c] = 1e30;
      }
    }
  auto input = [&](int rank, size_t k, int iter, uint64_t i) {
    return exact ? exactInput(rank, k, iter, i) : lossyInput(rank, k, iter, i);
  };
  std::vector<std::vector<float>> in(names.size()), out(names.size());
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (uint64_t len : lens) offsets.push_back(total), total += len;
  std::vector<float> flat(total);
  std::vector<const float*> inAt(names.size());
  std::vector<float*> outAt(names.size());
  std::vector<std::vector<double>> runOut(names.size()), runRef(names.size());
  double worstRatio = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < iters; ++iter) {
    if (me == 0 && iter > 0) progress(iter, iters, p.groups.size(), "group", start);
    const Pattern pat = kPatterns[iter % std::size(kPatterns)];
    const Layout lay = layoutOf(iter);
    std::fill(flat.begin(), flat.end(), -1000.0f);
    for (size_t k = 0; k < names.size(); ++k) {
      in[k].resize(lens[k]);
      out[k].assign(lens[k], -1000.0f);
      for (uint64_t i = 0; i < lens[k]; ++i) in[k][i] = input(me, k, iter, i);
      inAt[k] = in[k].data();
      outAt[k] = k % 2 ? in[k].data() : out[k].data();
      if (lay == Layout::kFlat) {
        std::copy(in[k].begin(), in[k].end(), flat.begin() + int64_t(offsets[k]));
        inAt[k] = outAt[k] = flat.data() + offsets[k];
      } else if (lay == Layout::kFlatOutputs) {
        outAt[k] = flat.data() + offsets[k];
      }
    }
    // The batches of this iteration, as indices into names.
    std::vector<std::vector<size_t>> batches;
    const size_t G = p.groups.size();
    if (pat == Pattern::kWhole || pat == Pattern::kReversed || pat == Pattern::kAwaited) {
      batches.emplace_back();
      for (size_t g = 0; g < G; ++g)
        for (int m = 0; m < 3; ++m)
          batches.back().push_back(3 * g + (pat == Pattern::kReversed ? 2 - m : m));
    } else if (pat == Pattern::kSplit) {
      batches.resize(2);
      for (size_t g = 0; g < G; ++g) {
        batches[0].push_back(3 * g);
        batches[0].push_back(3 * g + 1);
        batches[1].push_back(3 * g + 2);
      }
    } else {
      for (size_t k = 0; k < names.size(); ++k) batches.push_back({k});
    }
    // With and without the encode pipeline (awaited: on at the first, off
    // at the second of each cycle).
    const bool pipelined =
        pat == Pattern::kAwaited ? iter % std::size(kPatterns) == 3 : iter % 2 == 1;
    ex.setPipeline(pipelined);
    const uint64_t before = ex.groupRuns(), beforeInPlace = ex.inPlaceGroupRuns();
    const uint64_t beforePipelined = ex.pipelinedStarts();
    // Awaited on the host device (a mirrored one copies the inputs first):
    // every input holds garbage until the executor awaits its item.
    const bool awaited = pat == Pattern::kAwaited && ex.device().kind() == device::Kind::kHost &&
                         !mirrorAlways;
    std::vector<std::vector<float>> truth;
    if (awaited) {
      for (size_t k = 0; k < names.size(); ++k) {
        truth.emplace_back(inAt[k], inAt[k] + lens[k]);
        std::fill(const_cast<float*>(inAt[k]), const_cast<float*>(inAt[k]) + lens[k], 7777.0f);
      }
    }
    std::vector<size_t> awaitOrder;
    size_t awaitedOffThread = 0;
    const auto caller = std::this_thread::get_id();
    for (const auto& b : batches) {
      std::vector<executor::BatchItem> batch;
      for (size_t k : b) batch.push_back({names[k], inAt[k], outAt[k], lens[k]});
      try {
        if (awaited) {
          ex.runBatch(batch, ReduceOp::kSum, opDeadline(batch.size()), [&](size_t i) {
            const size_t k = b.at(i);
            awaitOrder.push_back(i);
            awaitedOffThread += std::this_thread::get_id() != caller;
            std::copy(truth[k].begin(), truth[k].end(), const_cast<float*>(inAt[k]));
          });
        } else {
          runBatchOn(ex, batch, ReduceOp::kSum, opDeadline(batch.size()));
        }
      } catch (const Error& e) {
        fail(fmt::format("groups, iteration {} ({}): {}", iter, patternName(pat), e.what()));
        return;
      }
    }
    if (awaited) {
      // Each item awaited once, in the order of the executions (groups in
      // order, members in order), and with the pipeline every execution
      // after the first whose first step is local started on the second
      // thread (its items awaited there).
      size_t wrong = 0;
      while (wrong < awaitOrder.size() && awaitOrder[wrong] == wrong) ++wrong;
      if (wrong != names.size() || awaitOrder.size() != names.size())
        fail(fmt::format("groups, iteration {} ({}): {} awaits of {} items, the {}th of item {}, "
                         "expected each once in order",
                         iter, patternName(pat), awaitOrder.size(), names.size(), wrong,
                         wrong < awaitOrder.size() ? int64_t(awaitOrder[wrong]) : -1));
      uint64_t ahead = 0;
      for (size_t g = 1; g < G; ++g)
        ahead += options[chosen[g]].steps.front().kind != plan::StepKind::kComm;
      const uint64_t started = ex.pipelinedStarts() - beforePipelined;
      if (started != (pipelined ? ahead : 0) || awaitedOffThread != (pipelined ? 3 * ahead : 0))
        fail(fmt::format(
            "groups, iteration {} ({}, pipeline {}): {} executions started ahead with {} items "
            "awaited on the second thread, expected {} and {}",
            iter, patternName(pat), pipelined ? "on" : "off", started, awaitedOffThread,
            pipelined ? ahead : 0, pipelined ? 3 * ahead : 0));
    }
    // Every group ran as one execution exactly when the batch held it whole.
    const uint64_t fused = ex.groupRuns() - before;
    const uint64_t expected =
        pat == Pattern::kWhole || pat == Pattern::kReversed || pat == Pattern::kAwaited ? G : 0;
    if (fused != expected)
      fail(fmt::format("groups, iteration {} ({}): {} group executions, expected {}", iter,
                       patternName(pat), fused, expected));
    // ... and in place exactly when its outputs were consecutive.
    const uint64_t inPlace = ex.inPlaceGroupRuns() - beforeInPlace;
    const uint64_t expectedInPlace = lay == Layout::kSeparate ? 0 : expected;
    if (inPlace != expectedInPlace)
      fail(fmt::format("groups, iteration {} ({}, {}): {} group executions in place, expected {}",
                       iter, patternName(pat), layoutName(lay), inPlace, expectedInPlace));
    for (size_t k = 0; k < names.size(); ++k) {
      const float* o = outAt[k];
      const size_t c = k / 3;
      runOut[k].resize(lens[k], 0.0);
      runRef[k].resize(lens[k], 0.0);
      for (uint64_t i = 0; i < lens[k]; ++i) {
        double ref = 0;
        for (int w = 0; w < W; ++w) ref += input(w, k, iter, i);
        if (exact && o[i] != float(ref)) {
          fail(
              fmt::format("groups, iteration {} ({}, {}): tensor {} of option {} ({}), element {}: {} "
                          "!= reference {}",
                          iter, patternName(pat), layoutName(lay), names[k], optionOf[k],
                          options[optionOf[k]].describe(), i, o[i], ref));
          break;
        }
        // Error feedback: the running sum of the outputs tracks the running
        // sum of the true sums within the residuals still held.
        runOut[k][i] += o[i];
        runRef[k][i] += ref;
        const double err = std::abs(runOut[k][i] - runRef[k][i]);
        if (!exact) worstRatio = std::max(worstRatio, err / bounds[c]);
        if (!exact && err > bounds[c]) {
          fail(fmt::format(
              "groups, iteration {} ({}, {}): tensor {} of option {} ({}), element {}: running "
              "sum {} vs reference {}: error {} > bound {}",
              iter, patternName(pat), layoutName(lay), names[k], optionOf[k], options[optionOf[k]].describe(), i,
              runOut[k][i], runRef[k][i], err, bounds[c]));
          break;
        }
      }
    }
  }
  ex.setPipeline(false);
  if (me == 0) {
    if (exact)
      std::printf("groups: %s\n", failures ? "FAILED" : "exact");
    else
      std::printf("groups: %s, worst running-sum error/bound %.3f\n",
                  failures ? "FAILED" : "within the bound", worstRatio);
  }
}

void Check::runSearch() {
  // --tensors tensors of mixed sizes on one compressed option (fp16 with
  // integer inputs: exact), and every fourth a default push/pull tensor
  // (forced cuts around it).
  auto options = treeOptions();
  size_t compressed = options.size();
  for (size_t i = 0; i < options.size() && compressed == options.size(); ++i)
    if (options[i].compressed() && options[i].hierarchical) compressed = i;
  if (compressed == options.size())
    throw Error(ErrorCode::kInternal, "no compressed option in the tree");
  plan::Plan p;
  p.version = 1;
  std::vector<std::string> names;
  std::vector<uint64_t> lens;
  for (int k = 0; k < tensors; ++k) {
    names.push_back(fmt::format("s{:02d}", k));
    lens.push_back(k % 3 == 0 ? n * 4 : n + uint64_t(k));
    p.tensors[names.back()] = k % 4 == 3 ? executor::defaultOption() : options[compressed];
    ex.declare(names.back(), DType::kFloat32, lens.back());
  }
  ex.setPlan(p, opDeadline(names.size()));
  executor::FusionSearchOptions so;
  so.warmup = 1;
  so.window = 2;
  so.settle = 0;
  so.step = 1;
  ex.setFusionSearch(so);
  // Online re-planning beside it is refused (both change the plan).
  executor::OnlineOptions on;
  on.window = 2;
  on.exchange = false;
  expectThrow("online re-planning beside the fusion search", "fusion search", [&] { ex.setOnline(on); });
  if (me == 0)
    std::printf("search: %zu tensors (option %zu: %s), %d ranks on %d machines, rank 1 slower\n",
                names.size(), compressed, options[compressed].describe().c_str(), W,
                topo.numMachines);
  std::vector<std::vector<float>> in(names.size());
  // One iteration of every tensor, checked against the plain sum; false
  // (after fail()) when the run throws.
  // `bufs[k]` holds tensor k (lens[k] floats); none given: a vector each (in).
  auto runChecked = [&](const char* what, int iter, std::vector<float*> bufs = {}) {
    if (bufs.empty())
      for (size_t k = 0; k < names.size(); ++k) {
        in[k].resize(lens[k]);
        bufs.push_back(in[k].data());
      }
    std::vector<executor::BatchItem> batch;
    for (size_t k = 0; k < names.size(); ++k) {
      for (uint64_t i = 0; i < lens[k]; ++i) bufs[k][i] = exactInput(me, k, iter, i);
      batch.push_back({names[k], bufs[k], bufs[k], lens[k]});
    }
    try {
      runBatchOn(ex, batch, ReduceOp::kSum, opDeadline(batch.size()));
    } catch (const Error& e) {
      fail(fmt::format("{}, iteration {}: {}", what, iter, e.what()));
      return false;
    }
    for (size_t k = 0; k < names.size(); ++k)
      for (uint64_t i = 0; i < lens[k]; ++i) {
        float ref = 0;
        for (int w = 0; w < W; ++w) ref += exactInput(w, k, iter, i);
        if (bufs[k][i] != ref) {
          fail(fmt::format("{}, iteration {}: tensor {}, element {}: {} != reference {}", what,
                           iter, names[k], i, bufs[k][i], ref));
          break;
        }
      }
    return true;
  };
  // Every rank ends on the same cuts and the same plan: `what` names the
  // search in the failure, with the first rank that differs.
  auto sameOnEveryRank = [&](const char* what, const executor::FusionSearch::Cuts& cuts) {
    const std::string mine = fmt::format("{}", fmt::join(cuts, ","));
    const uint64_t h[2] = {std::hash<std::string>{}(mine),
                           std::hash<std::string>{}(plan::toJsonString(ex.currentPlan(), -1))};
    std::vector<uint64_t> all(2 * size_t(W));
    groups.world->allgather(h, 2, all.data(), DType::kInt64, opDeadline());
    for (int w = 0; w < W; ++w)
      if (all[2 * size_t(w)] != h[0] || all[2 * size_t(w) + 1] != h[1])
        fail(fmt::format("{}: rank {} ended on other cuts or another plan than rank {} ({})", what,
                         w, me, mine));
  };
  int iter = 0;
  // Iterations from `from` on, at most `limit`, until the search has ended
  // and the plan it kept is in force; `each` runs one (false: it failed,
  // stop the check). Returns what the search kept, or nullopt after fail()
  // (`what` names the search) where it had not ended or `each` failed. iter
  // is the last iteration begun.
  using Kept = std::optional<std::pair<size_t, executor::FusionSearch::Cuts>>;
  auto searchUntilDone = [&](const char* what, int from, int limit,
                             const std::function<bool(int)>& each) -> Kept {
    for (iter = from; iter < from + limit; ++iter) {
      ex.beginIteration(uint64_t(iter), opDeadline());
      if (ex.fusionSearchInForce()) break;
      if (!each(iter)) return std::nullopt;
    }
    const Kept kept = ex.fusionSearchResult();
    if (!kept)
      fail(fmt::format("{}: not done after {} iterations ({})", what, iter - from,
                       ex.fusionSearchSummary()));
    return kept;
  };
  const auto result = searchUntilDone("search", 0, 400, [&](int it) {
    if (me == 1) ::usleep(20000);  // a slower worker: its own times differ
    return runChecked("search", it);
  });
  if (!result) return;
  const executor::FusionSearch* s = ex.fusionSearch();
  if (!s || !s->done()) {
    fail(fmt::format("search: not done after {} iterations", iter));
    return;
  }
  // Every rank ends on the same groups (the final round's): compare each
  // rank's cuts and plan.
  const executor::FusionSearch::Cuts best = result->second;
  if (ex.fusionSearchSummary().find("final round over 2") == std::string::npos)
    fail("search: the summary gives no final round over the search's 2 fastest candidates");
  sameOnEveryRank("search", best);
  const std::string mine = fmt::format("{}", fmt::join(best, ","));
  if (s->history().size() < 3)
    fail(fmt::format("search: only {} candidates timed", s->history().size()));
  for (uint64_t c = 3; c < names.size(); c += 4) {  // the default tensors stay apart
    if (!best.count(c) || (c + 1 < names.size() && !best.count(c + 1)))
      fail(
          fmt::format("search: the cuts {} do not keep tensor {} (another option) apart", mine, c));
  }
  if (me == 0)
    std::printf("search: %s after %d iterations; %s\n",
                failures ? "FAILED" : "same groups on every rank", iter, s->summary().c_str());
  if (failures) return;

  // Alternatives (MergeComp over several paths): A, the options above, and
  // B, every compressed tensor on another option, which this loop makes
  // slower (every rank sleeps while B runs). Both are searched in turn; A
  // must stay, with its options, on every rank, also after the switch back
  // from B's last candidate.
  size_t other = options.size();
  for (size_t i = 0; i < options.size() && other == options.size(); ++i)
    if (i != compressed && options[i].compressed() && !(options[i] == options[compressed]))
      other = i;
  if (other == options.size()) throw Error(ErrorCode::kInternal, "no second compressed option");
  plan::Plan a = ex.currentPlan(), b = ex.currentPlan();
  a.groups.clear();
  b.groups.clear();
  for (size_t k = 0; k < names.size(); ++k)
    if (k % 4 != 3) b.tensors[names[k]] = options[other];
  // An alternative that misses a declared tensor is refused, naming it.
  plan::Plan missing = b;
  missing.tensors.erase(names[0]);
  expectThrow("an alternative without a declared tensor", "alternative 2 of 2", [&] {
    ex.setFusionSearch(so, {a, missing});
  });
  ex.setFusionSearch(so, {a, b});
  const int from = ++iter;  // the first search's last beginIteration was iter
  const auto kept = searchUntilDone("search with alternatives", from, 800, [&](int it) {
    if (ex.currentPlan().tensors.at(names[0]) == options[other]) ::usleep(30000);
    return runChecked("search with alternatives", it);
  });
  if (!kept) return;
  if (kept->first != 0)
    fail(fmt::format("search with alternatives: kept alternative {}, the slower one ({})",
                     kept->first + 1, ex.fusionSearchSummary()));
  for (size_t k = 0; k < names.size(); ++k)
    if (!(ex.currentPlan().tensors.at(names[k]) == a.tensors.at(names[k])))
      fail(fmt::format("search with alternatives: tensor {} does not run alternative 1's option",
                       names[k]));
  sameOnEveryRank("search with alternatives", kept->second);
  if (ex.fusionSearchSummary().find("; 2 (") == std::string::npos ||
      ex.fusionSearchSummary().find("kept 1") == std::string::npos)
    fail("search with alternatives: the summary does not give both alternatives and the kept one");
  if (me == 0)
    std::printf("search with alternatives: %s after %d iterations; %s\n",
                failures ? "FAILED" : "alternative 1 kept on every rank", iter - from,
                ex.fusionSearchSummary().c_str());
  if (failures) return;

  // Screening: three alternatives, only the fastest searched on
  // (FusionSearchOptions::searched = 1). B (30 ms slower an iteration), C
  // (a third option, 60 ms slower), then A: every tensor on its own is timed
  // on each, and A, the last, must be the one searched and kept, the others
  // left out after their one window.
  size_t third = options.size();
  for (size_t i = 0; i < options.size() && third == options.size(); ++i)
    if (i != compressed && i != other && options[i].compressed() &&
        !(options[i] == options[compressed]) && !(options[i] == options[other]))
      third = i;
  if (third == options.size()) throw Error(ErrorCode::kInternal, "no third compressed option");
  plan::Plan c = b;
  for (size_t k = 0; k < names.size(); ++k)
    if (k % 4 != 3) c.tensors[names[k]] = options[third];
  executor::FusionSearchOptions one = so;
  one.searched = 1;
  ex.setFusionSearch(one, {b, c, a});
  const int from3 = ++iter;
  const auto kept3 = searchUntilDone("screened search", from3, 800, [&](int it) {
    const plan::TensorOption& now = ex.currentPlan().tensors.at(names[0]);
    if (now == options[other]) ::usleep(30000);
    if (now == options[third]) ::usleep(60000);
    return runChecked("screened search", it);
  });
  if (!kept3) return;
  const std::string sum3 = ex.fusionSearchSummary();
  if (kept3->first != 2)
    fail(fmt::format("screened search: kept alternative {}, not 3, the fastest ({})",
                     kept3->first + 1, sum3));
  for (size_t k = 0; k < names.size(); ++k)
    if (!(ex.currentPlan().tensors.at(names[k]) == a.tensors.at(names[k])))
      fail(fmt::format("screened search: tensor {} does not run alternative 3's option", names[k]));
  // Left out after one window each: B and C timed once, A searched on.
  const std::string times3 = ex.fusionSearchTimes();
  if (sum3.find("the 1 fastest searched") == std::string::npos ||
      sum3.find("1 (" + b.tensors.begin()->second.describe() + "): left out") == std::string::npos ||
      sum3.find("2 (" + c.tensors.begin()->second.describe() + "): left out") == std::string::npos ||
      sum3.find("kept 3") == std::string::npos)
    fail("screened search: the summary does not say which alternatives were left out and which "
         "was kept (" + sum3 + ")");
  if (times3.rfind("1: ", 0) != 0 || times3.find("; 2: ") == std::string::npos ||
      times3.find("; 3: ") == std::string::npos)
    fail("screened search: the times do not give each alternative's (" + times3 + ")");
  sameOnEveryRank("screened search", kept3->second);
  if (me == 0)
    std::printf("screened search: %s after %d iterations; %s\n",
                failures ? "FAILED" : "alternative 3 kept on every rank", iter - from3, sum3.c_str());
  if (failures) return;

  // The groups the job starts with join the final round: a grouping the
  // search's candidates would not make ({s00, s01} and {s04, s05, s06}),
  // and every other grouping 30 ms slower an iteration, so the search must
  // end on the starting groups, on every rank.
  plan::Plan start = a;
  start.groups = {{names[0], names[1]}, {names[4], names[5], names[6]}};
  start.version = ex.currentPlan().version + 1;
  ex.setPlan(start, opDeadline(names.size()));
  const auto startCuts = executor::FusionSearch::cutsOf(names, start.groups);
  ex.setFusionSearch(so);
  const int from4 = ++iter;
  const auto kept4 = searchUntilDone("search from groups", from4, 800, [&](int it) {
    if (executor::FusionSearch::cutsOf(names, ex.currentPlan().groups) != startCuts)
      ::usleep(30000);
    return runChecked("search from groups", it);
  });
  if (!kept4) return;
  const std::string sum4 = ex.fusionSearchSummary();
  if (executor::FusionSearch::cutsOf(names, ex.currentPlan().groups) != startCuts ||
      kept4->second != *startCuts)
    fail(fmt::format("search from groups: the starting groups, the fastest, were not kept ({})",
                     sum4));
  if (sum4.find("(the starting ones)") == std::string::npos)
    fail("search from groups: the final round does not name the starting groups (" + sum4 + ")");
  sameOnEveryRank("search from groups", kept4->second);
  if (me == 0)
    std::printf("search from groups: %s after %d iterations; %s\n",
                failures ? "FAILED" : "the starting groups kept on every rank", iter - from4,
                sum4.c_str());
  if (failures) return;

  // One flat buffer laid out in another order than the tensors run (the
  // first two of each run of compressed tensors swapped, as a BatchNorm's
  // weight and bias lie weight first and become ready bias first), starting
  // from groups listed in ready order ({s00, s01, s02}, {s04, s05}), which
  // therefore run copied into a group buffer; every other grouping is 30 ms
  // slower. The search keeps those groups and lists their tensors in the
  // buffer's order (the same on every rank), so they then run in place.
  plan::Plan flatPlan = a;
  flatPlan.groups = {{names[0], names[1], names[2]}, {names[4], names[5]}};
  flatPlan.version = ex.currentPlan().version + 1;
  ex.setPlan(flatPlan, opDeadline(names.size()));
  const auto flatCuts = executor::FusionSearch::cutsOf(names, flatPlan.groups);
  std::vector<size_t> layout;  // the tensors' indices in the buffer's order
  for (size_t k = 0; k < names.size(); ++k)
    layout.push_back(k % 4 == 0 ? k + 1 : k % 4 == 1 ? k - 1 : k);
  std::vector<uint64_t> offset(names.size());
  uint64_t total = 0;
  for (size_t j : layout) {
    offset[j] = total;
    total += lens[j];
  }
  std::vector<float> flat(total);
  auto runFlat = [&](int it) {
    std::vector<float*> bufs;
    for (size_t k = 0; k < names.size(); ++k) bufs.push_back(flat.data() + offset[k]);
    return runChecked("search over a flat buffer", it, bufs);
  };
  ex.setFusionSearch(so);
  const int from5 = ++iter;
  const uint64_t inPlaceAtStart = ex.inPlaceGroupRuns();
  const auto kept5 = searchUntilDone("search over a flat buffer", from5, 800, [&](int it) {
    if (it == from5 + 1 && ex.inPlaceGroupRuns() != inPlaceAtStart)
      fail("search over a flat buffer: the starting groups, listed in ready order, ran in place");
    if (executor::FusionSearch::cutsOf(names, ex.currentPlan().groups) != flatCuts) ::usleep(30000);
    return runFlat(it);
  });
  if (!kept5) return;
  if (kept5->second != *flatCuts) {
    fail(
        fmt::format("search over a flat buffer: the starting groups, the fastest, were not kept "
                    "({})",
                    ex.fusionSearchSummary()));
    return;
  }
  const uint64_t groupsBefore = ex.groupRuns(), inPlaceBefore = ex.inPlaceGroupRuns();
  for (int more = 0; more < 3; ++more) {
    ex.beginIteration(uint64_t(++iter), opDeadline());
    if (!runFlat(iter)) return;
  }
  const uint64_t ran = ex.groupRuns() - groupsBefore,
                 inPlace = ex.inPlaceGroupRuns() - inPlaceBefore;
  if (ran != 6 || inPlace != ran)
    fail(
        fmt::format("search over a flat buffer: {} of {} executions of the kept groups in place, "
                    "want 6 of 6 (groups {})",
                    inPlace, ran, plan::toJsonString(ex.currentPlan(), -1)));
  if (me == 0)
    std::printf("search over a flat buffer: %s after %d iterations\n",
                failures ? "FAILED" : "the kept groups in place", iter - from5);
  if (failures) return;

  // The same with the buffer laid out in ready order on every rank but rank
  // 0: the ranks' layouts differ, so the groups keep the ready order on
  // every rank (a group's order is the order its tensors are summed in) and
  // the sums stay exact.
  if (me != 0) {
    total = 0;
    for (size_t k = 0; k < names.size(); ++k) {
      offset[k] = total;
      total += lens[k];
    }
  }
  flatPlan.version = ex.currentPlan().version + 1;
  ex.setPlan(flatPlan, opDeadline(names.size()));
  ex.setFusionSearch(so);
  const int from6 = ++iter;
  const auto kept6 = searchUntilDone("search over layouts that differ", from6, 800, [&](int it) {
    if (executor::FusionSearch::cutsOf(names, ex.currentPlan().groups) != flatCuts) ::usleep(30000);
    return runFlat(it);
  });
  if (!kept6) return;
  if (ex.currentPlan().groups != flatPlan.groups)
    fail(fmt::format("search over layouts that differ: not the starting groups in ready order ({})",
                     plan::toJsonString(ex.currentPlan(), -1)));
  sameOnEveryRank("search over layouts that differ", kept6->second);
  if (me == 0)
    std::printf("search over layouts that differ: %s after %d iterations\n",
                failures ? "FAILED" : "ready order kept, sums exact", iter - from6);
}

}  // namespace exec_check
