// Online re-planning in the scheduler (docs/planner.md, "Online re-planning"):
// from every worker's report of one profiling window it refits the cost
// models, re-plans with the Espresso planner and hands out a versioned plan
// with the iteration at which every worker switches.
//  - Links: alpha-beta per operation and link (intra: intra-machine steps;
//    inter: inter-machine and flat steps, push/pull) by weighted least squares
//    over the measured sizes, inverting the simulator's own formulas
//    (commTimeUs is linear in alpha and beta). The link's base is the fit over
//    all of its operations.
//  - Codecs: encode and decode cost per codec spec on the CPU, fixed +
//    per-element, by least squares over element counts.
//  - Ready times: the mean over workers, sorted, become the profile's
//    backward times.
// Fits weight each entry by calls / time^2 (relative error), so that noise
// proportional to the time does not let the largest messages drown alpha.
// A push/pull round trip counts half as the push and half as the pull; the
// servers' summing inside it is counted as link time (a rate fitted from
// push/pull alone is a little low).
// The first complete window always plans; a later window is skipped while it
// began before the last plan's switch iteration (one plan pending at a time),
// and plans again only when a link's fitted rate moved by more than `threshold` (relative) from
// the rate the current plan was made with.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/control/control_client.h"
#include "core/plan/plan.h"
#include "core/plan/profile_report.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/scheduler.h"

namespace cortado::scheduler {

struct ReplanOptions {
  std::string codec;            // codec spec the planner may compress with (CORTADO_REPLAN_CODEC)
  uint64_t ahead = 10;          // switch this many iterations after the window's end
  double threshold = 0.25;      // relative change of a link's rate that re-plans
  // After the first plan, a new plan is sent only when the simulator, with
  // the refitted costs, predicts it at least this much faster (relative) than
  // the plan the workers run: noisy fits do not switch plans for nothing.
  double minGain = 0.05;
  std::string intra = "pcie";   // hardware.json links used until measured
  std::string inter = "10gbit";
  int cpuCores = 8;
  std::string dataDir;          // planner data (empty: built-in)
};

// A link's fit: the prior with what the window measured for it; `points` is
// the number of distinct (operation, group, size) entries fitted (0: nothing
// measured, the prior stands).
struct LinkFit {
  planner::LinkCost link;
  int points = 0;
};

// A CPU codec's fitted cost for one direction (encode, or decode-and-add).
struct CodecFit {
  std::string codec;  // canonical spec as the workers report it
  bool encode = true;
  planner::LinearCost cost;  // fixedUs + nsPerElement * elements
  int points = 0;
};

class OnlineReplanner {
 public:
  // Throws kInvalidArgument for an unknown codec or link name.
  explicit OnlineReplanner(ReplanOptions opts);
  std::optional<control::PlanUpdate> onWindow(const std::vector<plan::ProfileReport>& reports);

  // The pieces, for tests.
  static LinkFit fitLink(const std::vector<plan::ProfileReport>& reports, bool intra,
                         const planner::LinkCost& prior);
  static std::vector<CodecFit> fitCodecs(const std::vector<plan::ProfileReport>& reports);
  uint64_t version() const { return version_; }
  double plannedInterGbps() const { return plannedInter_; }
  double plannedIntraGbps() const { return plannedIntra_; }
  const std::string& lastReason() const { return reason_; }

 private:
  ReplanOptions opts_;
  planner::HardwareModel hw_;
  planner::CodecModel codecs_;
  uint64_t version_ = 0;
  uint64_t switchAt_ = 0;  // the last plan's switch iteration
  double plannedInter_ = 0, plannedIntra_ = 0;
  std::string reason_;
  std::optional<plan::Plan> current_;  // the last plan handed out
};

// The hook for SchedulerOptions::replanner: one OnlineReplanner shared by the
// calls (all on the scheduler's io thread). Throws like the constructor, so a
// bad setting fails the job at start, not at the first window.
Replanner makeReplanner(ReplanOptions opts);

}  // namespace cortado::scheduler
