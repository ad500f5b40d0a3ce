#include "core/shm/job_threads.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/common/logging.h"
#include "core/shm/mailbox.h"

namespace cortado::shm {
namespace {

// Layout: a 64-byte header (the high-water mark of claimed slots), then
// the slots.
constexpr size_t kHeaderBytes = 64;
constexpr size_t kBytes = kHeaderBytes + JobThreads::kSlots * sizeof(JobThreads::Slot);
static_assert(sizeof(JobThreads::Slot) == 16);
static_assert(std::atomic<int64_t>::is_always_lock_free &&
              std::atomic<int32_t>::is_always_lock_free);

// A process's registration slot (it holds a pid for the unlink's count and
// is never stamped).
constexpr int32_t kRegistration = -1;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int32_t threadId() { return static_cast<int32_t>(::syscall(SYS_gettid)); }

bool threadAlive(int32_t pid, int32_t tid) {
  if (tid == kRegistration) return true;  // its process's, freed by its owner
  return ::syscall(SYS_tgkill, pid, tid, 0) == 0 || errno != ESRCH;
}

std::atomic<uint64_t> nextId{1};

// The calling thread's slots, per JobThreads object (by id).
struct Cached {
  uint64_t id;
  JobThreads::Slot* slot;
};
thread_local std::vector<Cached> tlsSlots;

}  // namespace

std::string JobThreads::segmentName(const std::string& prefix) { return prefix + "-threads"; }

std::unique_ptr<JobThreads> JobThreads::open(const std::string& prefix,
                                             std::chrono::microseconds grace) {
  const std::string name = segmentName(prefix);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    CORTADO_LOG_WARN("shared memory {}: {}; the polls' gate counts no thread of the job", name,
                     std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (st.st_size != 0 && st.st_size != off_t(kBytes)) ||
      (st.st_size == 0 && ::ftruncate(fd, off_t(kBytes)) != 0)) {
    CORTADO_LOG_WARN(
        "shared memory {}: {}; the polls' gate counts no thread of the job", name,
        st.st_size != 0 && st.st_size != off_t(kBytes)
            ? fmt::format("{} bytes, not the {} this build lays out", st.st_size, kBytes)
            : std::string(std::strerror(errno)));
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    CORTADO_LOG_WARN("shared memory {}: mmap: {}; the polls' gate counts no thread of the job",
                     name, std::strerror(errno));
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<JobThreads>(new JobThreads(name, fd, static_cast<uint8_t*>(p), grace));
}

JobThreads::JobThreads(std::string name, int fd, uint8_t* data, std::chrono::microseconds grace)
    : name_(std::move(name)),
      fd_(fd),
      data_(data),
      graceNs_(std::chrono::duration_cast<std::chrono::nanoseconds>(grace).count()),
      id_(nextId.fetch_add(1)) {
  // The process's registration: while it holds a slot, nobody unlinks.
  const int32_t pid = static_cast<int32_t>(::getpid());
  Slot* s = slots();
  for (uint32_t i = 0; i < kSlots; ++i) {
    int32_t free = 0;
    if (s[i].pid.load(std::memory_order_relaxed) == 0 &&
        s[i].pid.compare_exchange_strong(free, pid, std::memory_order_acq_rel)) {
      s[i].tid.store(kRegistration, std::memory_order_relaxed);
      s[i].stamp.store(0, std::memory_order_release);
      uint32_t hw = highWater().load(std::memory_order_relaxed);
      while (hw < i + 1 && !highWater().compare_exchange_weak(hw, i + 1)) {
      }
      mine_.push_back(i);
      break;
    }
  }
}

JobThreads::~JobThreads() {
  const int32_t pid = static_cast<int32_t>(::getpid());
  Slot* s = slots();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (uint32_t i : mine_) {
      s[i].stamp.store(0, std::memory_order_relaxed);
      int32_t want = pid;
      s[i].pid.compare_exchange_strong(want, 0, std::memory_order_acq_rel);
    }
  }
  // The last of the job (no live process left in a slot) unlinks.
  bool anyone = false;
  const uint32_t hw = std::min(highWater().load(std::memory_order_acquire), kSlots);
  for (uint32_t i = 0; i < hw && !anyone; ++i) {
    const int32_t p = s[i].pid.load(std::memory_order_acquire);
    anyone = p != 0 && processAlive(p);
  }
  if (!anyone) ::shm_unlink(name_.c_str());
  ::munmap(data_, kBytes);
  ::close(fd_);
}

JobThreads::Slot* JobThreads::slots() const {
  return reinterpret_cast<Slot*>(data_ + kHeaderBytes);
}

std::atomic<uint32_t>& JobThreads::highWater() const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(data_);
}

JobThreads::Slot* JobThreads::mine() {
  for (const Cached& c : tlsSlots)
    if (c.id == id_) return c.slot;
  const int32_t pid = static_cast<int32_t>(::getpid());
  const int32_t tid = threadId();
  Slot* s = slots();
  auto take = [&](uint32_t i, int32_t expect) {
    if (!s[i].pid.compare_exchange_strong(expect, pid, std::memory_order_acq_rel)) return false;
    s[i].tid.store(tid, std::memory_order_relaxed);
    s[i].stamp.store(0, std::memory_order_release);
    uint32_t hw = highWater().load(std::memory_order_relaxed);
    while (hw < i + 1 && !highWater().compare_exchange_weak(hw, i + 1)) {
    }
    return true;
  };
  int found = -1;
  for (uint32_t i = 0; i < kSlots && found < 0; ++i)
    if (s[i].pid.load(std::memory_order_relaxed) == 0 && take(i, 0)) found = int(i);
  // None free: one whose process or thread is gone.
  for (uint32_t i = 0; i < kSlots && found < 0; ++i) {
    const int32_t p = s[i].pid.load(std::memory_order_acquire);
    const int32_t t = s[i].tid.load(std::memory_order_relaxed);
    // Of this process, only a slot of this object (another object's would
    // be freed under the thread by its destructor).
    bool gone = p != 0 && (p == pid ? !threadAlive(p, t) : !processAlive(p));
    if (gone && p == pid) {
      std::lock_guard<std::mutex> lk(mu_);
      gone = std::find(mine_.begin(), mine_.end(), i) != mine_.end();
    }
    if (gone && take(i, p)) found = int(i);
  }
  Slot* slot = found >= 0 ? &s[found] : nullptr;
  if (slot) {
    std::lock_guard<std::mutex> lk(mu_);
    mine_.push_back(uint32_t(found));
  }
  tlsSlots.push_back({id_, slot});  // nullptr too: not looked for again
  return slot;
}

void JobThreads::awake() {
  if (Slot* s = mine()) s->stamp.store(nowNs(), std::memory_order_release);
}

void JobThreads::awake(int32_t index) {
  if (index >= 0 && uint32_t(index) < kSlots)
    slots()[index].stamp.store(nowNs(), std::memory_order_release);
}

int32_t JobThreads::slotIndex() {
  Slot* s = mine();
  return s ? int32_t(s - slots()) : -1;
}

void JobThreads::asleep() {
  if (Slot* s = mine()) s->stamp.store(0, std::memory_order_release);
}

int JobThreads::count() const {
  const int64_t now = nowNs();
  const Slot* s = slots();
  const uint32_t hw = std::min(highWater().load(std::memory_order_acquire), kSlots);
  int n = 0;
  for (uint32_t i = 0; i < hw; ++i) {
    const int64_t t = s[i].stamp.load(std::memory_order_acquire);
    n += t != 0 && now - t < graceNs_;
  }
  return n;
}

uint32_t JobThreads::claimed() const {
  const Slot* s = slots();
  uint32_t n = 0;
  for (uint32_t i = 0; i < kSlots; ++i) n += s[i].pid.load(std::memory_order_relaxed) != 0;
  return n;
}

}  // namespace cortado::shm
