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
//
// The job's own threads (look() given `jobThreads`, CORTADO_SHM_YIELD_POLLS):
// when the runnable threads are more than the CPUs but every one of them
// is a thread of the job (the job's awake threads on this machine, counted
// in shared memory: core/shm/job_threads.h, at least the runnable count),
// the gate says kJobOnly: no thread outside the job wants a CPU, so the
// job's waiting threads may go on polling if they yield the CPU between
// looks, which lets a role of the job that has work run first. As soon as
// one outside thread is runnable, the gate closes as without it. A kJobOnly
// read holds for `holdJobOnly` (100 us) without a read: the polls it lets
// go on yield at every look, so an outside thread that comes meanwhile gets
// the CPU at the poller's next look, and the read (a system call) would
// otherwise cost the job's threads more than the polls (about a
// microsecond a read, several per round trip).
#pragma once

#include <chrono>
#include <functional>

namespace cortado {

class IdleCpus {
 public:
  // Opens /proc/loadavg; `cpus` 0: the CPUs online (get_nprocs()).
  explicit IdleCpus(int cpus = 0,
                    std::chrono::microseconds holdClosed = std::chrono::microseconds(250),
                    std::chrono::microseconds holdJobOnly = std::chrono::microseconds(100));
  ~IdleCpus();
  IdleCpus(const IdleCpus&) = delete;
  IdleCpus& operator=(const IdleCpus&) = delete;

  enum class Verdict {
    kClosed,   // a thread outside the job waits for a CPU (or nothing is known)
    kSpare,    // no thread waits for a CPU
    kJobOnly,  // threads wait for a CPU, but all are the job's
  };
  // The gate for `runnable` threads (the caller included) on `cpus` CPUs,
  // `jobThreads` of them (at most) the job's own (-1: not counted).
  static Verdict judge(int runnable, int cpus, int jobThreads);
  // The gate now: kSpare when the runnable threads, the caller included,
  // are at most the CPUs; kJobOnly when they are more but `jobThreads()`
  // (called only then) says at least as many are the job's; kClosed
  // otherwise, and when /proc/loadavg cannot be read (no /proc: never
  // poll). One pread() system call, none while a closed or kJobOnly one
  // holds (above).
  Verdict look(const std::function<int()>& jobThreads = nullptr);
  // look() == kSpare.
  bool spare() { return look() == Verdict::kSpare; }
  // The runnable threads at the last read (-1: not read).
  int lastRunnable() const { return lastRunnable_; }
  // The job's threads at the last read (-1: not counted).
  int lastJob() const { return lastJob_; }
  int cpus() const { return cpus_; }
  // The reads of /proc/loadavg so far, and how many said each verdict.
  unsigned long reads() const { return reads_; }
  unsigned long said(Verdict v) const { return said_[static_cast<int>(v)]; }

  // The runnable count in a /proc/loadavg line ("0.52 0.58 0.59 3/467
  // 12345"), or -1 when the line has no such field.
  static int parseRunnable(const char* line, int len);

 private:
  int fd_ = -1;
  int cpus_ = 1;
  int lastRunnable_ = -1;
  int lastJob_ = -1;
  unsigned long reads_ = 0;
  unsigned long said_[3] = {0, 0, 0};
  std::chrono::microseconds holdClosed_;
  std::chrono::microseconds holdJobOnly_;
  std::chrono::microseconds hold_{0};  // the next closed read's
  std::chrono::steady_clock::time_point closedUntil_{};
  std::chrono::steady_clock::time_point jobOnlyUntil_{};
};

// The back-off of a waiting thread's polls (core/transport/shmring): polls
// that keep finding nothing (the CPUs wanted by the other roles of a round,
// more workers than CPUs) are given up for a while: after the k-th miss in
// a row the next 2^k - 1 waits (at most 2^kMaxMisses - 1 = 63) sleep at
// once without a poll; a poll that finds its message starts over.
class PollBackoff {
 public:
  static constexpr int kMaxMisses = 6;
  // Whether this wait polls; false uses up one of the waits that sleep at once.
  bool shouldPoll() {
    if (skip_ > 0) {
      --skip_;
      return false;
    }
    return true;
  }
  // The poll found nothing.
  void missed() {
    misses_ = misses_ < kMaxMisses ? misses_ + 1 : kMaxMisses;
    skip_ = (1 << misses_) - 1;
  }
  // The poll found its message.
  void hit() { misses_ = 0; }
  int misses() const { return misses_; }
  int skipsLeft() const { return skip_; }

 private:
  int misses_ = 0;  // polls in a row that found nothing
  int skip_ = 0;    // waits left that sleep without a poll
};

}  // namespace cortado
