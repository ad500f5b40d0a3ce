// The role commands: `cortado scheduler` and `cortado server`. Each reads the
// job's configuration (environment plus flags) and returns an exit code.
#pragma once

#include "core/config.h"
#include "scheduler/scheduler.h"

namespace cortado::launcher {

int runSchedulerRole(const JobConfig& job);
int runServerRole(const JobConfig& job);
// SchedulerOptions::replanner from the job's CORTADO_PROFILE_WINDOW and
// CORTADO_REPLAN_* settings: empty when online re-planning is off. Throws
// kInvalidArgument for an unknown codec.
scheduler::Replanner replannerFor(const JobConfig& job);

}  // namespace cortado::launcher
