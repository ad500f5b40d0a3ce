// Helpers shared by the re-planner's fits (replan_fit.cc) and its decision
// (replan.cc); private to scheduler/.
#pragma once

#include <vector>

#include "core/plan/profile_report.h"
#include "scheduler/planner/cost_model.h"

namespace cortado::scheduler::detail {

// A communication entry as a point of its curve: (group size, bytes as
// commTimeUs takes them, us per call). A push is the round trip: half of it
// is the push, at the machine's bytes times the chunks' spread over the
// servers (planner::Cluster::oneTensorAtATime).
struct CurvePoint {
  int p;
  double bytes, us;
};
CurvePoint curvePoint(const plan::ProfileReport& r, const plan::CommTiming& c);

// The median (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> v);

// A timing with calls, bytes and a positive, finite time.
bool usable(const plan::CommTiming& c);

}  // namespace cortado::scheduler::detail
