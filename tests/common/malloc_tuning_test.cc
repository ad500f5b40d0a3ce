// keepFreedMemory (core/common/malloc_tuning.h): glibc's default hands a
// large freed block back to the kernel, so the next block of that size
// faults in fresh pages; once tuned, the block stays in the heap and the
// next one reuses its pages. Its own test binary: malloc's thresholds are
// process-wide, and ctest runs each test in a process of its own.
#include "core/common/malloc_tuning.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace cortado {
namespace {

long minorFaults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Writes every page through a volatile pointer, so that neither the writes
// nor the allocation can be optimized away.
void touch(void* p, size_t bytes) {
  volatile char* c = static_cast<volatile char*>(p);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < bytes; i += page) c[i] = 1;
}

// Minor page faults taken by allocating and writing `bytes`, freed after.
long faultsOfFreshBlock(size_t bytes) {
  const long before = minorFaults();
  void* p = std::malloc(bytes);
  EXPECT_NE(p, nullptr);
  touch(p, bytes);
  const long faults = minorFaults() - before;
  std::free(p);
  return faults;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty())
      unsetenv(name_);
    else
      setenv(name_, old_.c_str(), 1);
  }

 private:
  const char* name_;
  std::string old_;
};

#if defined(__GLIBC__)

TEST(MallocTuning, FreedBlocksStayInTheHeapOnceTuned) {
  // 30 MiB: above glibc's first mmap threshold, within what the tuning
  // serves from the heap.
  constexpr size_t kBytes = 30u << 20;
  const long pages = static_cast<long>(kBytes / static_cast<size_t>(sysconf(_SC_PAGESIZE)));

  // The default, untouched: the block is mmap'ed and unmapped when freed,
  // and the next one faults in every page again.
  ASSERT_EQ(std::getenv("MALLOC_MMAP_THRESHOLD_"), nullptr) << "run without MALLOC_*_ settings";
  const size_t mappedBefore = mallinfo2().hblkhd;
  void* p = std::malloc(kBytes);
  ASSERT_NE(p, nullptr);
  EXPECT_GE(mallinfo2().hblkhd, mappedBefore + kBytes) << "glibc's default mmaps 30 MiB";
  touch(p, kBytes);
  std::free(p);
  EXPECT_GE(faultsOfFreshBlock(kBytes), pages * 9 / 10);

  MallocTuning t = keepFreedMemory(1ull << 30);
  ASSERT_TRUE(t.applied) << t.detail;
  EXPECT_NE(t.detail.find("1073741824"), std::string::npos) << t.detail;

  // Tuned: from the heap, kept there when freed, and its pages reused.
  const size_t mapped = mallinfo2().hblkhd;
  p = std::malloc(kBytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(mallinfo2().hblkhd, mapped) << "a 30 MiB block should come from the heap";
  touch(p, kBytes);
  std::free(p);
  EXPECT_GE(mallinfo2().keepcost, kBytes) << "the freed block should stay at the heap's top";
  EXPECT_LT(faultsOfFreshBlock(kBytes), pages / 20);
  EXPECT_LT(faultsOfFreshBlock(kBytes / 2), pages / 20);
}

TEST(MallocTuning, AboveTheLargestHeapBlockAKeepStillTakesEffect) {
  // A keep beyond int's range means "never trim" rather than an error.
  MallocTuning t = keepFreedMemory(1ull << 40);
  EXPECT_TRUE(t.applied) << t.detail;
  EXPECT_NE(t.detail.find(std::to_string(INT32_MAX)), std::string::npos) << t.detail;
}

#endif  // __GLIBC__

TEST(MallocTuning, ZeroLeavesMallocAlone) {
  MallocTuning t = keepFreedMemory(0);
  EXPECT_FALSE(t.applied);
  EXPECT_NE(t.detail.find("CORTADO_MALLOC_KEEP_BYTES=0"), std::string::npos) << t.detail;
}

TEST(MallocTuning, TheEnvironmentsOwnSettingsWin) {
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_",
                           "MALLOC_TOP_PAD_"}) {
    ScopedEnv env(name, "1048576");
    MallocTuning t = keepFreedMemory(1ull << 30);
    EXPECT_FALSE(t.applied) << name;
    EXPECT_NE(t.detail.find(name), std::string::npos) << t.detail;
  }
  ScopedEnv env("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576");
  MallocTuning t = keepFreedMemory(1ull << 30);
  EXPECT_FALSE(t.applied);
  EXPECT_NE(t.detail.find("GLIBC_TUNABLES"), std::string::npos) << t.detail;
}

}  // namespace
}  // namespace cortado
