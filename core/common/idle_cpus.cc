#include "core/common/idle_cpus.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/sysinfo.h>
#include <unistd.h>

namespace cortado {

IdleCpus::IdleCpus(int cpus, std::chrono::microseconds holdClosed,
                   std::chrono::microseconds holdJobOnly)
    : holdClosed_(holdClosed), holdJobOnly_(holdJobOnly) {
  cpus_ = cpus > 0 ? cpus : get_nprocs();
  if (cpus_ < 1) cpus_ = 1;
  fd_ = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
}

IdleCpus::~IdleCpus() {
  if (fd_ >= 0) ::close(fd_);
}

int IdleCpus::parseRunnable(const char* line, int len) {
  // Three load averages, then "runnable/total".
  int field = 0, i = 0;
  while (i < len && field < 3) {
    while (i < len && line[i] != ' ') ++i;
    while (i < len && line[i] == ' ') ++i;
    ++field;
  }
  if (field < 3 || i >= len || line[i] < '0' || line[i] > '9') return -1;
  int n = 0;
  while (i < len && line[i] >= '0' && line[i] <= '9') {
    if (n > 100000000) return -1;
    n = n * 10 + (line[i++] - '0');
  }
  if (i >= len || line[i] != '/') return -1;
  return n;
}

IdleCpus::Verdict IdleCpus::judge(int runnable, int cpus, int jobThreads) {
  if (runnable < 1) return Verdict::kClosed;  // unread or malformed
  if (runnable <= cpus) return Verdict::kSpare;
  if (jobThreads >= 0 && runnable <= jobThreads) return Verdict::kJobOnly;
  return Verdict::kClosed;
}

IdleCpus::Verdict IdleCpus::look(const std::function<int()>& jobThreads) {
  if (fd_ < 0) return Verdict::kClosed;
  const auto now = std::chrono::steady_clock::now();
  if (now < closedUntil_) return Verdict::kClosed;
  if (now < jobOnlyUntil_) return Verdict::kJobOnly;
  char buf[128];
  const ssize_t n = ::pread(fd_, buf, sizeof(buf), 0);
  ++reads_;
  lastRunnable_ = n > 0 ? parseRunnable(buf, int(n)) : -1;
  int job = -1;
  if (jobThreads && lastRunnable_ > cpus_) job = jobThreads();
  lastJob_ = job;
  const Verdict v = judge(lastRunnable_, cpus_, job);
  ++said_[static_cast<int>(v)];
  if (v == Verdict::kJobOnly) jobOnlyUntil_ = now + holdJobOnly_;
  if (v != Verdict::kClosed) {
    hold_ = std::chrono::microseconds(0);
  } else {
    hold_ = std::min(holdClosed_, std::max(hold_ * 2, std::chrono::microseconds(8)));
    closedUntil_ = now + hold_;
  }
  return v;
}

}  // namespace cortado
