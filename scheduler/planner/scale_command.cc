// `cortado bench scale`: the simulator's predicted times of one large tensor's
// synchronization at cluster sizes this machine cannot run (16 to 1024 GPUs,
// 8 per machine, 25 and 100 Gbit/s), next to the alpha-beta formulas a
// reader can check by hand. Three uncompressed ways: a flat ring allreduce
// over every GPU, NCCL's hierarchical allreduce (intra reduce-scatter, inter
// allreduce, intra allgather) and BytePS's push/pull (intra reduce-scatter,
// push to and pull from a server on every machine, intra allgather).
//
// The formulas are written here from the textbook, independently of
// compile.cc's step costs (NCCL's performance notes; BytePS, OSDI'20,
// section 3): with N GPUs on M machines of G, a tensor of S bytes, per link
// alpha a and time per byte b (intra: i, inter: e),
//   ring:          2 (N-1) a_e + 2 (N-1)/N S b_e
//   hierarchical:  2 [(G-1) a_i + (G-1)/G S b_i] + 2 (M-1) a_e + 2 (M-1)/M S b_e
//                  (the G GPUs' inter rings share the machine's NIC)
//   push/pull:     2 [(G-1) a_i + (G-1)/G S b_i] + 2 [a_e + (M-1)/M S b_e]
//                  + the copies of S/G to and from the host
//                  + the server's sum of M copies of S/M, in partitions of
//                    the chunk size (4 MB) spread over the machine's cores
// The simulator prices the same steps from the hardware model; where the
// two disagree, the table shows by how much.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include "core/common/error.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/option_tree.h"
#include "scheduler/planner/plan_command.h"
#include "scheduler/planner/report.h"
#include "scheduler/planner/simulator.h"

namespace cortado::planner {
namespace {

using plan::CommOp;
using plan::Scope;
using plan::Step;

// The index of the uncompressed option with exactly these steps.
int findOption(const std::vector<plan::TensorOption>& options, const std::vector<Step>& steps,
               const char* what) {
  for (size_t o = 0; o < options.size(); ++o)
    if (!options[o].compressed() && options[o].steps == steps) return int(o);
  throw Error(ErrorCode::kInternal, fmt::format("the option tree has no {} option", what));
}

constexpr double kTolerance = 0.01;

struct Formulas {
  double ring, hierarchical, pushPull;
};

Formulas formulas(const Cluster& c, double S) {
  const double N = c.gpus(), M = c.machines, G = c.gpusPerMachine;
  const AlphaBeta& ri = c.intra.forOp(CommOp::kReduceScatter);
  const AlphaBeta& gi = c.intra.forOp(CommOp::kAllgather);
  const AlphaBeta& ae = c.inter.forOp(CommOp::kAllreduce);
  const AlphaBeta& pe = c.inter.forOp(CommOp::kPush);
  const AlphaBeta& le = c.inter.forOp(CommOp::kPull);
  const double intra = (G - 1) * ri.alphaUs + (G - 1) / G * S * ri.betaUsPerByte() +
                       (G - 1) * gi.alphaUs + (G - 1) / G * S * gi.betaUsPerByte();
  Formulas f;
  f.ring = 2 * (N - 1) * ae.alphaUs + 2 * (N - 1) / N * S * ae.betaUsPerByte();
  f.hierarchical = intra + 2 * (M - 1) * ae.alphaUs + 2 * (M - 1) / M * S * ae.betaUsPerByte();
  const double copies = c.d2h.us(S / G) + c.h2d.us(S / G);
  const double parts = std::max(1.0, std::ceil(S / M / c.chunkBytes));
  const double serverSum =
      std::ceil(parts / c.cpuCores) * M * (S / M / parts) * 8.0 / (c.cpuSumGbps * 1000.0);
  f.pushPull = intra + pe.alphaUs + (M - 1) / M * S * pe.betaUsPerByte() + le.alphaUs +
               (M - 1) / M * S * le.betaUsPerByte() + copies + serverSum;
  return f;
}

}  // namespace

void addScaleBenchCommand(CLI::App& benchApp) {
  auto* sub = benchApp.add_subcommand(
      "scale",
      "predicted allreduce and push/pull times from 16 to 1024 GPUs next to the "
      "alpha-beta formulas (the simulator at sizes this machine cannot run)");
  auto megabytes = std::make_shared<double>(100);
  auto links =
      std::make_shared<std::vector<std::string>>(std::vector<std::string>{"25gbit", "100gbit"});
  auto gpus = std::make_shared<std::vector<int>>(std::vector<int>{16, 32, 64, 128, 256, 512, 1024});
  auto perMachine = std::make_shared<int>(8);
  auto intra = std::make_shared<std::string>("nvlink");
  auto dataDir = std::make_shared<std::string>();
  sub->add_option("--megabytes", *megabytes, "tensor size in MB (10^6 bytes, float32)")
      ->check(CLI::Range(0.001, 100000.0))
      ->capture_default_str();
  sub->add_option("--inter", *links, "inter-machine links of the hardware model")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--gpus", *gpus, "GPU counts, multiples of --gpus-per-machine")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--gpus-per-machine", *perMachine, "GPUs per machine")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--intra", *intra, "intra-machine link")->capture_default_str();
  sub->add_option("--data-dir", *dataDir, "folder with costs/ (default: built in)");
  sub->callback([=] {
    const std::string dir = resolveDataDir(*dataDir);
    HardwareModel hw = HardwareModel::load(dir + "/costs/hardware.json");
    CodecModel codecs = CodecModel::load(dir + "/costs/codecs.json");
    const ResolvedCodec codec = codecs.resolve("fp16");  // unused: nothing is compressed
    const double S = *megabytes * 1e6;
    ModelProfile profile;
    profile.model = "one tensor";
    profile.tensors.push_back(TensorProfile{"grad", int64_t(S / 4), 4, 0});
    TreeConfig tree;
    tree.compression = false;
    tree.parameterServer = true;
    const auto options = enumerateOptions(tree);
    const int ring = findOption(options, {Step::comm(Scope::kFlat, CommOp::kAllreduce, false)},
                                "flat allreduce");
    const int hier = findOption(options,
                                {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
                                 Step::comm(Scope::kInter, CommOp::kAllreduce, false),
                                 Step::comm(Scope::kIntra, CommOp::kAllgather, false)},
                                "hierarchical allreduce");
    const int ps = findOption(options,
                              {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
                               Step::comm(Scope::kInter, CommOp::kPush, false),
                               Step::comm(Scope::kInter, CommOp::kPull, false),
                               Step::comm(Scope::kIntra, CommOp::kAllgather, false)},
                              "push/pull");
    std::cout << fmt::format(
        "one float32 tensor of {:g} MB, {} GPUs per machine, intra {}, uncompressed; times in "
        "ms, predicted by the simulator (sim) and by the alpha-beta formulas of "
        "scheduler/planner/scale_command.cc (formula); hardware model: {}\n\n",
        *megabytes, *perMachine, *intra, hw.source);
    std::cout << "| inter | GPUs | machines | ring sim | ring formula | hierarchical sim | "
                 "hierarchical formula | push/pull sim | push/pull formula | max sim/formula - 1 | "
                 "ring / push-pull (sim) | hierarchical / push-pull (sim) |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    std::string departures;
    for (const std::string& inter : *links) {
      for (int n : *gpus) {
        CORTADO_ENFORCE(n % *perMachine == 0 && n >= *perMachine, ErrorCode::kInvalidArgument,
                        "--gpus {} is not a multiple of --gpus-per-machine {}", n, *perMachine);
        Cluster c;
        c.machines = n / *perMachine;
        c.gpusPerMachine = *perMachine;
        c.intra = hw.link(*intra);
        c.inter = hw.link(inter);
        c.d2h = hw.d2h;
        c.h2d = hw.h2d;
        c.cpuSumGbps = hw.cpuSumGbps;
        c.cpuFillGbps = hw.cpuFillGbps;
        c.cpuCores = 16;
        c.parameterServer = true;
        Simulator sim(c, codec, profile, options);
        const int64_t e = profile.tensors[0].elements;
        const double r = sim.runAlone(0, e, ring) / 1000, h = sim.runAlone(0, e, hier) / 1000,
                     p = sim.runAlone(0, e, ps) / 1000;
        const Formulas f = formulas(c, S);
        const double worst =
            std::max({std::abs(r * 1000 / f.ring - 1), std::abs(h * 1000 / f.hierarchical - 1),
                      std::abs(p * 1000 / f.pushPull - 1)});
        std::cout << fmt::format(
            "| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.1f}% | "
            "{:.2f}x | {:.2f}x |\n",
            inter, n, c.machines, r, f.ring / 1000, h, f.hierarchical / 1000, p, f.pushPull / 1000,
            100 * worst, r / p, h / p);
        if (worst > kTolerance && departures.empty())
          departures = fmt::format("{} GPUs at {}: {:.1f}%", n, inter, 100 * worst);
      }
    }
    // The simulator composes the same per-step costs: a departure means that
    // one of the two changed without the other (ctest's bench_scale).
    CORTADO_ENFORCE(departures.empty(), ErrorCode::kInternal,
                    "the simulator departs from the alpha-beta formulas by more than {:.0f}%, "
                    "first at {}: update scale_command.cc's formulas or find the simulator's "
                    "change",
                    100 * kTolerance, departures);
  });
}

}  // namespace cortado::planner
