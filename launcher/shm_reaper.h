// The job's shared-memory janitor. Every role unlinks the segments it created
// when it exits cleanly, and `cortado launch` removes what a killed role left
// once the job is over. When the launcher itself is killed (kill -9), its
// roles die with it (PR_SET_PDEATHSIG) and neither of those runs: the reaper
// is a small process of its own that outlives the launcher for that moment.
//
// startShmReaper() forks and execs `cortado shm-reaper --fd N --prefix P` in
// a session of its own (a signal to the launcher's process group does not
// reach it), with stdin, stdout and stderr on /dev/null (so nobody reading
// the launcher's output waits for it). It holds the read end of a pipe whose
// write end only the launcher has: the end of the launcher, however it ends,
// is the pipe's end of file. A launcher that ends the job itself (and has
// removed the segments) first writes one byte, and the reaper exits at once;
// at end of file without it, the reaper removes the job's segments and sweeps
// again until it has found none for a second (a dying role may still have
// been creating one), at most 15 s, and exits. The byte keeps a reaper from
// sweeping the segments of a next job started at once with the same token.
#pragma once

#include <string>

namespace cortado::launcher {

// The launcher's end of the pipe. Destroyed without jobCleanedUp() (an
// exception left runLaunch), the reaper sweeps.
class ShmReaper {
 public:
  // Starts the reaper for the job's segment prefix (shm::jobPrefix). Best
  // effort: when it cannot start, it logs why, and the launcher runs without
  // it (its own cleanup at the end of the job still runs).
  explicit ShmReaper(const std::string& prefix);
  ~ShmReaper();
  ShmReaper(const ShmReaper&) = delete;
  ShmReaper& operator=(const ShmReaper&) = delete;
  // The launcher removed the job's segments itself: the reaper exits.
  void jobCleanedUp();

 private:
  int fd_ = -1;
};

// `cortado shm-reaper`: waits for end of file on `fd`, then sweeps. Returns
// the exit code.
int runShmReaper(int fd, const std::string& prefix);

}  // namespace cortado::launcher
