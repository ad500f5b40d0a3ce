// Runs a shell command for the multi-process tests with a hard deadline,
// capturing its output; the whole process group is killed at the deadline.
#pragma once

#include <string>

namespace cortado::test {

struct CommandResult {
  int exitCode = -1;     // -1: killed at the deadline
  bool timedOut = false;
  double seconds = 0;
  std::string output;    // stdout and stderr together
};

CommandResult runCommand(const std::string& command, double timeoutSeconds);

// A free TCP port on 127.0.0.1 (bound and released).
int freePort();

}  // namespace cortado::test
