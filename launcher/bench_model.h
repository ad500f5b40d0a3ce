// `cortado bench model`: replays a model profile through the plan executor
// under several strategies and compares each measured iteration time with
// the planner's prediction for the same strategy.
//
// It is a worker command: run it under `cortado launch --mpi` (one machine)
// or `cortado launch --hosts` (emulated or real machines). Every worker
//  1. measures, at the model's own sizes, every collective the executor may
//     run inside and across machines, push/pull through the servers, the
//     codec's encode and decode-and-add and the CPU's sum rate
//     (bench_model_probe.h; again before every later round unless
//     --probe-once), and rank 0 builds the planner's cost models from them;
//  2. rank 0 computes each strategy's plan and predicted iteration time with
//     the simulator and sends the plans to every worker;
//  3. for each strategy, replays the profile: after the forward time, the
//     gradients of the profile's sizes become ready at the profile's backward
//     times (both scaled by --compute-scale), each is summed across the
//     workers through its plan as soon as it is ready and the previous one is
//     done, and the iteration ends when the last one is. "Compute" is a timed
//     wait; the gradients are real data (seeded, integer-valued) and every
//     result of a lossless path is checked against the exact sum.
//
// The gradients live on the job's device (CORTADO_DEVICE, core/backends.h's
// makeDevice): host memory, or with CORTADO_DEVICE=cuda CUDA buffers that
// the executor runs as it runs a CUDA framework's (NCCL inside and across
// machines for uncompressed steps, the CUDA codecs where the plan says gpu,
// the CPU codecs after a copy to pinned memory where it says cpu, push/pull
// from pinned memory); they are filled and read back through copies outside
// the timed iteration. On such a device the probes also measure the uncompressed
// collectives on the device's groups, the device's codec and the copies,
// and the predictions price "gpu" steps and copies with them.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/planner/cost_model.h"

namespace cortado::launcher {

struct ModelBenchOptions {
  std::string profile;  // a bundled profile name or a profile .json
  std::vector<std::string> strategies = {"none", "gpu", "cpu", "plan"};
  std::string codec = "dgc:ratio=0.01";
  // The gravac strategy's settings ("codec=topk,window=5,min_ratio=10";
  // launcher/bench_model_gravac.h): GraVAC in the executor, re-planned by
  // the planner with the measured costs when its CF moves 2x.
  std::string gravac;
  int iterations = 10;
  int warmup = 2;
  // Every strategy runs this many times (warmup + iterations each time), the
  // order reversed every other round; the results are over all rounds.
  int rounds = 1;
  // Measure the links and the codec once, before the first round, instead
  // of again before every round (whose strategies are then predicted from
  // their round's costs too, the prediction their mean).
  bool probeOnce = false;
  double computeScale = 1.0;
  // Every gradient in a buffer of its own, instead of one flat buffer in
  // gradient-ready order (as cortado.torch and DDP's bucket views lay them
  // out): a fused group is then gathered into a buffer and scattered back,
  // and the predictions count those copies (ModelProfile::contiguousGradients).
  bool separateBuffers = false;
  // With the host device (CORTADO_DEVICE=host): its queued streams
  // (device::host::Options::queued), so that the replay takes the path a
  // CUDA device's buffers take (gradients in device buffers, copied in and
  // out; the device probes) on a machine without a GPU.
  bool queuedStreams = false;
  bool json = false;
  bool progress = false;  // force the progress bar (default: when stderr is a terminal)
  int cpuCores = 0;       // per machine, for the cost model; 0: this host's cores / machines
  std::string dataDir;    // planner data (profiles/, costs/); empty: built in
  std::string planOut;    // rank 0 writes the "plan" strategy's plan here
  // Rank 0 writes the plan strategy's predicted timeline (with the measured
  // costs) here, in the format of `cortado plan --trace`.
  std::string predictedTrace;
  // The workers' skew at each synchronizing step (planner::SyncSkew):
  // "auto" measures it at start-up (measureSkewChain, bench_model_probe.h)
  // and the predictions model it; "off" leaves it out (the timeline has every
  // worker alike); "US,FRACTION" (e.g. "0,0.6") sets it.
  std::string syncSkew = "auto";
};

// --sync-skew: the value it sets ("auto": nothing, measured; "off": 0, 0).
// Throws Error(kInvalidArgument) naming what is wrong.
std::optional<planner::SyncSkew> parseSyncSkew(const std::string& arg);

// The strategies this build can run, in order.
std::vector<std::string> modelBenchStrategies();

// Checks the options without starting anything (unknown profile, unknown or
// unavailable strategy, bad scale, counts, codec); throws
// Error(kInvalidArgument) saying what is wrong and what to use instead.
void validateModelBench(const ModelBenchOptions& opts);

// The codec probe's per-size times at `elements` (ascending, 4x apart but
// the last), made robust against a worker descheduled through one size's
// calls: an encode size more than 3x both its neighbours is taken at the
// larger neighbour; then an encode or decode size measured more than 3x the
// size below it scaled by their elements is taken at that scaled time; and a
// decode size dearer than a larger one is capped at it.
void smoothCodecProbes(const std::vector<uint64_t>& elements, std::vector<double>& encodeUs,
                       std::vector<double>& decodeUs);
// The decode rules above for one pass's times (a decode-and-add, the zeroing
// of a decode's region): a size more than 3x the size below it scaled is
// taken at the scaled time, and a size dearer than a larger one is capped.
void smoothPassProbes(const std::vector<uint64_t>& elements, std::vector<double>& us);

// One link probe size's figure from its calls (us, each the slowest rank's
// call): their mean, less strays. A stray is a call more than 3x the calls'
// median and 10 ms beyond it: a stall of the shared machine (a descheduled
// process through many time slices, a lost segment's retransmission) that
// the replay's steps do not meet every few calls. In one run a 4096-byte
// compressed allgather's 9 calls averaged 6.2 ms between 0.6 ms at 1024
// bytes and 3.1 ms at 16384, which priced every compressed allgather up to
// 64 KiB at 6.2 ms (run Z, `git show bb48d3c:docs/benchmarks.md`).
// Throws kInvalidArgument on no calls.
struct ProbeMean {
  double us = 0;
  int calls = 0;   // the calls in the mean
  int strays = 0;  // the calls left out
};
ProbeMean meanLessStrays(std::vector<double> callsUs);

// Runs as a worker of a job started by `cortado launch --mpi|--hosts`.
// Returns 0, or 1 when a checked result was wrong.
int runModelBench(const ModelBenchOptions& opts);

}  // namespace cortado::launcher
