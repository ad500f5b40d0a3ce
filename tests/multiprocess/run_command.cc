#include "tests/multiprocess/run_command.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

namespace cortado::test {

CommandResult runCommand(const std::string& command, double timeoutSeconds) {
  CommandResult r;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return r;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execl("/bin/sh", "sh", "-c", command.c_str(), (char*)nullptr);
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  auto deadline = t0 + std::chrono::milliseconds(int64_t(timeoutSeconds * 1000));
  char buf[65536];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      r.timedOut = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = poll(&p, 1, int(std::min<int64_t>(left, 1000)));
    if (n > 0) {
      ssize_t got = read(fds[0], buf, sizeof(buf));
      if (got <= 0) break;  // EOF: every writer is gone
      r.output.append(buf, size_t(got));
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  kill(-pid, SIGKILL);  // anything left in the group
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.timedOut) r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

namespace {

bool bindable(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(s);
  return ok;
}

int ephemeralLow() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  f >> low;
  return low;
}

}  // namespace

int freePort() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  int high = std::min(ephemeralLow(), 65536) - 1;
  int low = std::min(20000, high - 1000);
  std::uniform_int_distribution<int> pick(low, high);
  for (int i = 0; i < 200; ++i) {
    int port = pick(rng);
    if (bindable(port)) return port;
  }
  // Every try taken: let the kernel choose (an ephemeral port).
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  if (s >= 0) close(s);
  if (!ok) throw std::runtime_error(std::string("no free loopback port: ") + std::strerror(err));
  return ntohs(a.sin_port);
}

CommandResult withFreePort(const std::function<CommandResult(int port)>& attempt) {
  CommandResult r;
  for (int i = 0; i < 3; ++i) {
    r = attempt(freePort());
    if (r.output.find("Address already in use") == std::string::npos) break;
  }
  return r;
}

}  // namespace cortado::test
