// Whether this machine has a CPU to spare now: the gate of the bounded
// polls that replace a sleep on the latency path (a server's ring thread
// while a worker waits for its answer: core/transport/shmring). A poll on a
// CPU that no other thread wants costs nobody anything, and spares the
// wake-up of a sleeping thread (on a virtual machine whose idle CPUs halt,
// an interrupt through the hypervisor); a poll on a CPU that another thread
// waits for delays that thread, which may be the one whose message the
// poll waits for. So a poll goes on only while the kernel's count of
// runnable threads on the whole machine (the fourth field of
// /proc/loadavg, "runnable/total", the polling thread included) is at most
// the CPUs online.
//
// The read costs a system call of a few microseconds, on the path of the
// thread that is about to sleep: after the gate was found closed it stays
// closed without a read for a while, 8 us after the first closed read and
// twice as long after each further one, up to `holdClosed` (250 us); an
// open read starts over. So on a busy machine a thread soon pays one read
// per quarter millisecond at most, not one per message, while on a quiet
// one a moment of contention (the other roles of a round running) closes
// the gate only for that moment.
#pragma once

#include <chrono>

namespace cortado {

class IdleCpus {
 public:
  // Opens /proc/loadavg; `cpus` 0: the CPUs online (get_nprocs()).
  explicit IdleCpus(int cpus = 0,
                    std::chrono::microseconds holdClosed = std::chrono::microseconds(250));
  ~IdleCpus();
  IdleCpus(const IdleCpus&) = delete;
  IdleCpus& operator=(const IdleCpus&) = delete;

  // True when the runnable threads, the caller included, are at most the
  // CPUs: no thread waits for one. False as well when /proc/loadavg cannot
  // be read (no /proc: never poll). One pread() system call, none while a
  // false one holds (above).
  bool spare();
  // The runnable threads at the last read (-1: not read).
  int lastRunnable() const { return lastRunnable_; }
  int cpus() const { return cpus_; }
  // The reads of /proc/loadavg so far.
  unsigned long reads() const { return reads_; }

  // The runnable count in a /proc/loadavg line ("0.52 0.58 0.59 3/467
  // 12345"), or -1 when the line has no such field.
  static int parseRunnable(const char* line, int len);

 private:
  int fd_ = -1;
  int cpus_ = 1;
  int lastRunnable_ = -1;
  unsigned long reads_ = 0;
  std::chrono::microseconds holdClosed_;
  std::chrono::microseconds hold_{0};  // the next closed read's
  std::chrono::steady_clock::time_point closedUntil_{};
};

}  // namespace cortado
