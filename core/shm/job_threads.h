// The job's own awake threads on this machine, counted in shared memory:
// what lets the polls' gate (core/common/idle_cpus.h) tell the runnable
// threads of other programs from the job's own (core/transport/shmring,
// CORTADO_SHM_YIELD_POLLS).
//
// One segment per job and machine (named after the job's prefix, so the
// launcher's and the reaper's cleanup removes it with the others) holds
// kSlots slots. A thread of a role that may poll claims one on its first
// use (its pid and thread id) and keeps in it a time stamp (CLOCK_MONOTONIC,
// the same clock in every process): set when the thread is awake (it woke
// from a sleep, it polls: refreshed at every look at the gate), cleared just
// before it sleeps. count() is the slots whose stamp is younger than
// `grace`: the job's threads that are runnable now, or were a moment ago
// and have not said that they sleep (a worker's caller that took its answer
// and runs on). So a thread that stops refreshing its stamp without
// clearing it (it blocks elsewhere, or its process is killed with kill -9)
// counts for at most `grace`; a stale count only ever makes the gate think
// fewer outside threads want a CPU, for that long.
//
// Slots are claimed with a compare-and-swap of the pid; a slot whose
// process is gone, or whose thread of this process is gone, is taken over
// when no free one is left. A process that cannot claim one (all taken by
// live threads) is not counted: its threads look like outside threads,
// which only closes the gate more often.
//
// The segment needs no initialization (zeros are free slots), so whoever
// comes first creates it and the others open it, without a race on its
// contents. The last process of the job to let it go (no live pid left in
// its slots) unlinks it; one killed with kill -9 leaves it to the
// launcher's cleanup. A role that opens it after it was unlinked makes a
// new one and counts apart from those still on the old: more threads look
// like outside ones, which closes the gate more often, nothing worse.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cortado::shm {

class JobThreads {
 public:
  static constexpr uint32_t kSlots = 256;
  static constexpr std::chrono::microseconds kDefaultGrace{100};

  // Opens (or creates) the job's segment under `prefix` (shm::jobPrefix);
  // nullptr, with a warning, when /dev/shm refuses it.
  static std::unique_ptr<JobThreads> open(const std::string& prefix,
                                          std::chrono::microseconds grace = kDefaultGrace);
  ~JobThreads();  // frees this object's slots; unlinks the segment when the last
  JobThreads(const JobThreads&) = delete;
  JobThreads& operator=(const JobThreads&) = delete;

  // The calling thread is awake (runnable) now: its slot's stamp is set.
  void awake();
  // Slot `index` (another thread's, from its slotIndex()) is awake now: a
  // thread that wakes another stamps it before the wake-up, since the woken
  // thread is runnable from then on but stamps itself only once it runs.
  // An index out of range is ignored.
  void awake(int32_t index);
  // The calling thread's slot (claimed on first use), -1 when none is free.
  int32_t slotIndex();
  // The calling thread is about to sleep: its slot's stamp is cleared.
  void asleep();
  // The job's threads whose stamp is younger than `grace` (on the whole
  // machine, every process of the job).
  int count() const;
  // Slots claimed by live or dead threads (for tests and logs).
  uint32_t claimed() const;

  const std::string& name() const { return name_; }
  static std::string segmentName(const std::string& prefix);

  // One slot as laid out in the segment.
  struct Slot {
    std::atomic<int32_t> pid;  // 0: free
    std::atomic<int32_t> tid;
    std::atomic<int64_t> stamp;  // steady-clock ns when last awake; 0: asleep
  };

 private:
  JobThreads(std::string name, int fd, uint8_t* data, std::chrono::microseconds grace);
  // The calling thread's slot, claimed on first use; nullptr when none is free.
  Slot* mine();
  Slot* slots() const;
  std::atomic<uint32_t>& highWater() const;

  std::string name_;
  int fd_;
  uint8_t* data_;
  int64_t graceNs_;
  uint64_t id_;  // tells this object's claims from an earlier one's at the same address
  std::mutex mu_;
  std::vector<uint32_t> mine_;  // slots this object claimed (freed when it goes)
};

}  // namespace cortado::shm
