// The role commands: `cortado scheduler` and `cortado server`. Each reads the
// job's configuration (environment plus flags) and returns an exit code.
#pragma once

#include "core/config.h"

namespace cortado::launcher {

int runSchedulerRole(const JobConfig& job);
int runServerRole(const JobConfig& job);

}  // namespace cortado::launcher
