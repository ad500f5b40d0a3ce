#include "launcher/shm_reaper.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/common/logging.h"
#include "core/shm/shm_segment.h"
#include "launcher/launch.h"

namespace cortado::launcher {

ShmReaper::ShmReaper(const std::string& prefix) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    CORTADO_LOG_WARN(
        "cannot start the shared-memory reaper (pipe: {}): a kill -9 of the "
        "launcher would leave the job's segments in /dev/shm",
        strerror(errno));
    return;
  }
  // Everything the child needs is built before fork(): between fork and exec
  // it only calls async-signal-safe functions.
  const std::string self = selfExecutable();
  const std::string fdArg = std::to_string(fds[0]);
  const char* argv[] = {self.c_str(), "shm-reaper",   "--fd", fdArg.c_str(),
                        "--prefix",   prefix.c_str(), nullptr};
  pid_t pid = fork();
  if (pid < 0) {
    CORTADO_LOG_WARN("cannot start the shared-memory reaper (fork: {})", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return;
  }
  if (pid == 0) {
    setsid();
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
    }
    // The read end stays open across exec; the write end is closed by it.
    fcntl(fds[0], F_SETFD, 0);
    execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  close(fds[0]);
  // The write end stays open, close-on-exec, for the launcher's whole life.
  // The reaper is not waited for: it is reparented when the launcher exits.
  fd_ = fds[1];
}

ShmReaper::~ShmReaper() {
  if (fd_ >= 0) close(fd_);
}

void ShmReaper::jobCleanedUp() {
  if (fd_ < 0) return;
  const char done = 1;
  while (write(fd_, &done, 1) < 0 && errno == EINTR) {
  }
  close(fd_);
  fd_ = -1;
}

int runShmReaper(int fd, const std::string& prefix) {
  char c;
  for (;;) {
    ssize_t n = read(fd, &c, 1);
    if (n == 1) return 0;                // the launcher cleaned up itself
    if (n == 0) break;                   // the launcher is gone
    if (n < 0 && errno != EINTR) break;  // nothing to wait on: sweep now
  }
  close(fd);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  auto quietSince = Clock::now();
  while (Clock::now() < deadline) {
    if (shm::removeJobSegments(prefix) > 0) quietSince = Clock::now();
    if (Clock::now() - quietSince >= std::chrono::seconds(1)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return 0;
}

}  // namespace cortado::launcher
