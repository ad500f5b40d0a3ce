// The plan executor's check, modes fusion, pipeline and phased (exec_check.cc
// describes them): batches, fused or run in phases, and the encode pipeline.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tests/multiprocess/exec_check.h"

namespace exec_check {

void Check::runFusion() {
  auto options = treeOptions();
  std::vector<size_t> fusible, compressed;
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i].fusible()) fusible.push_back(i);
    else if (options[i].compressed()) compressed.push_back(i);
  }
  if (fusible.empty() || compressed.empty())
    throw Error(ErrorCode::kInternal, "the option tree has no fusible or no compressed option");
  struct T {
    std::string name;
    uint64_t len;
    size_t seed;
  };
  std::vector<T> ts;
  plan::Plan p;
  p.version = 1;
  const uint64_t sizes[3] = {n, n + 5, 1};
  for (size_t k = 0; k < fusible.size(); ++k) {
    for (int m = 0; m < 3; ++m) {
      T t{fmt::format("f{}_{}", k, m), sizes[m], ts.size()};
      p.tensors[t.name] = options[fusible[k]];
      ts.push_back(t);
    }
    // Between two groups a tensor that runs alone (push/pull or compressed),
    // or every third one on the first group's option, which fuses with that
    // group although it is not its neighbour.
    T t{fmt::format("s{}", k), n + 2, ts.size()};
    p.tensors[t.name] = k % 3 == 2   ? options[fusible[0]]
                        : k % 2 == 0 ? executor::defaultOption()
                                     : options[compressed[(k * 7) % compressed.size()]];
    ts.push_back(t);
  }
  for (const T& t : ts) ex.declare(t.name, DType::kFloat32, t.len);
  ex.setPlan(p, opDeadline());
  executor::OnlineOptions on;
  on.window = 1;
  on.warmup = 0;
  on.exchange = false;  // reports stay local: lastReport()
  ex.setOnline(on);
  const uint64_t tripleBytes = (sizes[0] + sizes[1] + sizes[2]) * sizeof(float);
  const uint64_t pairBytes = (sizes[0] + sizes[1]) * sizeof(float);
  struct Case {
    const char* what;
    uint64_t threshold;
    uint64_t fusedBytes;  // a comm entry of this size must appear (0: none fused)
  };
  const Case cases[] = {{"default threshold", executor::kDefaultFusionBytes, tripleBytes},
                        {"off (0)", 0, 0},
                        {"below one tensor", sizes[0] * sizeof(float) - 1, 0},
                        {"exactly two tensors", pairBytes, pairBytes}};
  if (me == 0)
    std::printf("fusion: %zu fusible options, %zu tensors, %d ranks on %d machines\n",
                fusible.size(), ts.size(), W, topo.numMachines);
  std::vector<std::vector<float>> in(ts.size()), out(ts.size());
  uint64_t iteration = 0;
  for (const Case& c : cases) {
    ex.setFusionBytes(c.threshold);
    for (int iter = 0; iter < iters; ++iter, ++iteration) {
      ex.beginIteration(iteration, opDeadline());  // closes the last iteration's window
      if (iter == 1) {  // the report of this case's first iteration
        std::set<uint64_t> sizesSeen;
        for (const auto& e : ex.lastReport()->comms) sizesSeen.insert(e.bytes);
        const bool sawTriple = sizesSeen.count(tripleBytes) > 0, sawPair = sizesSeen.count(pairBytes) > 0;
        if (c.fusedBytes == tripleBytes && !sawTriple)
          fail(fmt::format("{}: no communication of {} bytes (a fused triple) in the profile",
                           c.what, tripleBytes));
        if (c.fusedBytes == pairBytes && (!sawPair || sawTriple))
          fail(fmt::format("{}: expected pairs of {} bytes and no triple of {}: pair {}, triple {}",
                           c.what, pairBytes, tripleBytes, sawPair, sawTriple));
        if (c.fusedBytes == 0 && (sawPair || sawTriple))
          fail(fmt::format("{}: a fused size in the profile (pair {}, triple {})", c.what, sawPair,
                           sawTriple));
        // The report tells the re-planner the threshold its batches ran with.
        if (ex.lastReport()->fusionBytes != c.threshold)
          fail(fmt::format("{}: the report says fusion threshold {}, the executor ran {}", c.what,
                           ex.lastReport()->fusionBytes, c.threshold));
      }
      std::vector<executor::BatchItem> batch;
      for (size_t k = 0; k < ts.size(); ++k) {
        const T& t = ts[k];
        in[k].resize(t.len);
        out[k].assign(t.len, -1000.0f);
        for (uint64_t i = 0; i < t.len; ++i) in[k][i] = exactInput(me, t.seed, int(iteration), i);
        // Half of them in place, as bench model runs them.
        float* o = k % 2 ? in[k].data() : out[k].data();
        batch.push_back({t.name, in[k].data(), o, t.len});
      }
      try {
        runBatchOn(ex, batch, ReduceOp::kSum, opDeadline(batch.size()));
      } catch (const Error& e) {
        fail(fmt::format("{}: {}", c.what, e.what()));
        continue;
      }
      for (size_t k = 0; k < ts.size(); ++k) {
        const T& t = ts[k];
        const float* o = batch[k].output;
        for (uint64_t i = 0; i < t.len; ++i) {
          float ref = 0;
          for (int w = 0; w < W; ++w) ref += exactInput(w, t.seed, int(iteration), i);
          if (o[i] != ref) {
            fail(fmt::format("{}: tensor {} ({}), iteration {}, element {}: {} != reference {}",
                             c.what, t.name, p.tensors[t.name].describe(), iteration, i, o[i], ref));
            break;
          }
        }
      }
    }
    if (me == 0) std::printf("fusion, %s (%llu bytes): %s\n", c.what,
                             (unsigned long long)c.threshold, failures ? "FAILED" : "exact");
  }
  // Tensors handed over one at a time (run(): a batch of one) never fuse,
  // and the window's report says so.
  ex.setFusionBytes(executor::kDefaultFusionBytes);
  for (int k = 0; k < 2; ++k, ++iteration) {
    ex.beginIteration(iteration, opDeadline());
    for (size_t j = 0; j < ts.size(); ++j) {
      for (uint64_t i = 0; i < ts[j].len; ++i) in[j][i] = exactInput(me, ts[j].seed, int(iteration), i);
      runOn(ex, ts[j].name, in[j].data(), out[j].data(), ts[j].len, ReduceOp::kSum, opDeadline());
    }
  }
  if (ex.lastReport()->fusionBytes != 0)
    fail(fmt::format("run() one tensor at a time: the report says fusion threshold {}, expected 0",
                     ex.lastReport()->fusionBytes));
  // A batch with an undeclared item is refused before anything runs.
  std::vector<float> x(n, 1.0f);
  std::vector<executor::BatchItem> bad{{ts[0].name, x.data(), x.data(), ts[0].len},
                                       {"nope", x.data(), x.data(), n}};
  expectThrow("runBatch with an undeclared tensor", "'nope'",
              [&] { runBatchOn(ex, bad, ReduceOp::kSum, opDeadline()); });
  if (x[0] != 1.0f) fail("the refused batch ran its first item");
}

void Check::runPipeline() {
  // The encode pipeline (Executor::setPipeline): every option of the tree
  // that compresses (its leading encode runs beside the previous item's
  // communication) and the default push/pull between them, as one batch
  // per iteration; with fp16 on these inputs every result is exact.
  const TreeTensors t = withDefaults(
      treeOptions(), [](const plan::TensorOption& o) { return o.compressed(); }, "p", n);
  uint64_t expectStarts = 0;  // per batch: items after the first whose option starts with an encode
  for (size_t k = 1; k < t.names.size(); ++k)
    if (t.plan.tensors.at(t.names[k]).steps.front().kind != plan::StepKind::kComm) ++expectStarts;
  for (size_t k = 0; k < t.names.size(); ++k) ex.declare(t.names[k], DType::kFloat32, t.lens[k]);
  ex.setPlan(t.plan, opDeadline());
  ex.setPipeline(true);
  if (me == 0)
    std::printf("pipeline: %zu tensors (%llu leading encodes pipelined a batch), %d ranks on %d machines\n",
                t.names.size(), (unsigned long long)expectStarts, W, topo.numMachines);
  std::vector<size_t> order(t.names.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::vector<std::vector<float>> in, out;
  for (int iter = 0; iter < iters; ++iter) {
    const auto batch = exactBatch(t, order, me, iter, in, out);
    const uint64_t before = ex.pipelinedStarts();
    try {
      runBatchOn(ex, batch, ReduceOp::kSum, opDeadline(batch.size()));
    } catch (const Error& e) {
      fail(fmt::format("pipeline, iteration {}: {}", iter, e.what()));
      continue;
    }
    if (ex.pipelinedStarts() - before != expectStarts)
      fail(fmt::format("pipeline, iteration {}: {} leading encodes ran beside another item, expected {}",
                       iter, ex.pipelinedStarts() - before, expectStarts));
    for (const std::string& m : exactMismatches(t, order, batch, W, iter))
      fail(fmt::format("pipeline, iteration {}: {}", iter, m));
  }
  if (me == 0) std::printf("pipeline: %s\n", failures ? "FAILED" : "exact");
}

void Check::runThreads() {
  // Codec threads (Executor::setCodecThreads): every stride-th compressed
  // option of the tree without a push, on this check's executor with one codec thread and
  // on a second executor (the same worker and device, its own tensors) with
  // three, the same lossy inputs for `iters` iterations. The codecs split
  // an encode or decode of 512 Ki elements or more over the threads and
  // write the same bytes, so every output must be bit for bit the same,
  // error feedback's residuals carried from one iteration to the next
  // included; and it must have been compressed (not the plain sum).
  ex.setCodecThreads(1);
  executor::Executor three(*worker, noMpi ? nullptr : &groups, nullptr, "", dev);
  three.setCompactSparse(job.compactSparse);
  three.setCodecThreads(3);
  if (three.codecThreads() != 3) fail("setCodecThreads(3) did not take");
  expectThrow("setCodecThreads(0)", "out of range", [&] { three.setCodecThreads(0); });
  // Options without a push: the servers sum the machines' payloads in the
  // order they arrive, so two runs of an option with a push may round
  // differently (one codec thread against one differed in the last bit at
  // times); the lossy and groups modes check those against their bounds.
  const auto options = treeOptions();
  auto pushes = [](const plan::TensorOption& o) {
    return std::any_of(o.steps.begin(), o.steps.end(), [](const plan::Step& s) {
      return s.kind == plan::StepKind::kComm && s.op == plan::CommOp::kPush;
    });
  };
  std::vector<size_t> picked;
  size_t seen = 0;
  for (size_t i = 0; i < options.size(); ++i)
    if (options[i].compressed() && !pushes(options[i]) && seen++ % size_t(stride) == 0)
      picked.push_back(i);
  if (picked.empty()) throw Error(ErrorCode::kInternal, "no compressed option picked");
  plan::Plan one, other;
  one.version = other.version = 1;
  for (size_t k = 0; k < picked.size(); ++k) {
    one.tensors[fmt::format("a{}", k)] = options[picked[k]];
    other.tensors[fmt::format("b{}", k)] = options[picked[k]];
    ex.declare(fmt::format("a{}", k), DType::kFloat32, n);
    three.declare(fmt::format("b{}", k), DType::kFloat32, n);
  }
  ex.setPlan(one, opDeadline());
  three.setPlan(other, opDeadline());
  if (me == 0)
    std::printf("threads: %zu compressed options of %llu elements, codec %s, 1 and 3 codec threads, "
                "%d ranks on %d machines\n",
                picked.size(), (unsigned long long)n, codec.c_str(), W, topo.numMachines);
  std::vector<float> in(n), a(n), b(n);
  for (int iter = 0; iter < iters; ++iter) {
    for (size_t k = 0; k < picked.size(); ++k) {
      for (uint64_t i = 0; i < n; ++i) in[i] = lossyInput(me, picked[k], iter, i);
      try {
        runOn(ex, fmt::format("a{}", k), in.data(), a.data(), n, ReduceOp::kSum, opDeadline());
        runOn(three, fmt::format("b{}", k), in.data(), b.data(), n, ReduceOp::kSum, opDeadline());
      } catch (const Error& e) {
        fail(fmt::format("threads, option {} ({}), iteration {}: {}", picked[k],
                         options[picked[k]].describe(), iter, e.what()));
        continue;
      }
      uint64_t differ = 0, first = n;
      for (uint64_t i = 0; i < n; ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
          if (first == n) first = i;
          ++differ;
        }
      if (differ)
        fail(fmt::format("threads, option {} ({}), iteration {}: {} elements differ between 1 and 3 "
                         "codec threads, the first at {}: {} != {}",
                         picked[k], options[picked[k]].describe(), iter, differ, first, a[first],
                         b[first]));
      // A plain sum of the inputs would mean nothing was compressed.
      double off = 0;
      for (uint64_t i = 0; i < n; i += 97) {
        double sum = 0;
        for (int r = 0; r < W; ++r) sum += lossyInput(r, picked[k], iter, i);
        off = std::max(off, std::abs(double(a[i]) - sum));
      }
      if (off == 0 && codec != "fp16")
        fail(fmt::format("threads, option {} ({}): the output is the plain sum, nothing lossy ran",
                         picked[k], options[picked[k]].describe()));
    }
  }
  if (me == 0) std::printf("threads: %s\n", failures ? "FAILED" : "bit for bit");
}

void Check::runPhased() {
  // Phases (Executor::setPhaseBytes): every option of the tree that does
  // not fuse, compressed (fp16: exact on these inputs) or with push/pull,
  // each beside the default push/pull, as one batch per iteration with a
  // push/pull tensor in it twice (its two rounds cannot share a phase).
  // Under four phase sizes: 0 (one item after the other), phases of about
  // three items, the default, and one phase for everything; against a
  // plain sum.
  const auto options = treeOptions();
  // Fused options run in groups, not in phases.
  const TreeTensors t = withDefaults(
      options, [](const plan::TensorOption& o) { return !o.fusible(); }, "q", n);
  for (size_t k = 0; k < t.names.size(); ++k) ex.declare(t.names[k], DType::kFloat32, t.lens[k]);
  ex.setPlan(t.plan, opDeadline());
  std::vector<size_t> order(t.names.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  order.insert(order.begin() + 2, 1);  // q1 (push/pull: a key's two rounds) twice in a row
  const uint64_t three = 3 * (n + 4) * sizeof(float);
  const std::vector<uint64_t> sizes = {0, three, executor::kDefaultPhaseBytes, uint64_t(1) << 40};
  if (me == 0)
    std::printf("phased: %zu tensors of %zu options in batches of %zu, %d ranks on %d machines\n",
                t.names.size(), options.size(), order.size(), W, topo.numMachines);
  std::vector<std::vector<float>> in, out;
  int iter = 0;
  for (uint64_t size : sizes) {
    ex.setPhaseBytes(size);
    for (int rep = 0; rep < iters; ++rep, ++iter) {
      // Item b's own data, so that a mix-up between q1's two rounds shows.
      const auto batch = exactBatch(t, order, me, iter, in, out);
      const uint64_t before = ex.phasedSteps();
      try {
        runBatchOn(ex, batch, ReduceOp::kSum, opDeadline(batch.size()));
      } catch (const Error& e) {
        fail(fmt::format("phased, phases of {} bytes, iteration {}: {}", size, iter, e.what()));
        continue;
      }
      const uint64_t phased = ex.phasedSteps() - before;
      if ((size == 0) != (phased == 0))
        fail(fmt::format("phased, phases of {} bytes, iteration {}: {} communication steps ran for several "
                         "items in a row",
                         size, iter, phased));
      for (const std::string& m : exactMismatches(t, order, batch, W, iter))
        fail(fmt::format("phased, phases of {} bytes, iteration {}: {}", size, iter, m));
    }
  }
  if (me == 0) std::printf("phased: %s\n", failures ? "FAILED" : "exact");
}

}  // namespace exec_check
