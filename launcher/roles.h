// The role commands: `cortado scheduler` and `cortado server`. Each reads the
// job's configuration (environment plus flags) and returns an exit code.
#pragma once

#include "core/config.h"
#include "scheduler/scheduler.h"

namespace cortado::launcher {

int runSchedulerRole(const JobConfig& job);
int runServerRole(const JobConfig& job);
// The scheduler of `job` (port, token, role counts, timeouts, and the
// replanner from CORTADO_PROFILE_WINDOW and CORTADO_REPLAN_*: empty when
// online re-planning is off), listening on `bindHost`. Throws
// kInvalidArgument for an unknown re-planning codec.
scheduler::SchedulerOptions schedulerOptions(const JobConfig& job, const std::string& bindHost);

}  // namespace cortado::launcher
