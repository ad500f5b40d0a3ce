// Runs a shell command for the multi-process tests with a hard deadline,
// capturing its output; the whole process group is killed at the deadline.
#pragma once

#include <functional>
#include <string>

namespace cortado::test {

struct CommandResult {
  int exitCode = -1;     // -1: killed at the deadline
  bool timedOut = false;
  double seconds = 0;
  std::string output;    // stdout and stderr together
};

CommandResult runCommand(const std::string& command, double timeoutSeconds);

// Whether `hay` (a command's output) holds `needle`.
inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A free TCP port on 127.0.0.1 (bound and released), chosen at random below
// the kernel's ephemeral range (ip_local_port_range), so that the outgoing
// connections of tests running beside this one cannot be handed the same port
// between the check and the use. Another test may still pick it: a test that
// starts a listener on it retries with withFreePort.
int freePort();

// Runs attempt(port) with a fresh free port, up to three times while its
// output says the port was taken ("Address already in use").
CommandResult withFreePort(const std::function<CommandResult(int port)>& attempt);

}  // namespace cortado::test
