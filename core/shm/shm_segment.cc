#include "core/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "core/common/error.h"
#include "core/common/logging.h"

namespace cortado::shm {

std::string jobPrefix(const std::string& token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  std::string hex;
  for (int i = 0; i < 6; ++i) hex += fmt::format("{:02x}", digest[i]);
  return "/cortado-" + hex;
}

std::string segmentName(const std::string& prefix, const NodeId& owner, uint32_t index) {
  return fmt::format("{}-{}-{}", prefix, owner.toWire(), index);
}

int removeJobSegments(const std::string& prefix) {
  // POSIX shared memory objects are the files of /dev/shm on Linux.
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  const std::string stem = prefix.substr(1) + "-";
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, stem.c_str(), stem.size()) == 0) {
      const std::string name = fmt::format("/{}", e->d_name);  // not "/" + ...: GCC 12's -Wrestrict misfires
      removed += shm_unlink(name.c_str()) == 0;
    }
  }
  closedir(d);
  return removed;
}

uint64_t ownedSegmentBytes(const std::string& prefix, const NodeId& owner) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  uint64_t bytes = 0;
  const std::string stem = fmt::format("{}-{}-", prefix.substr(1), owner.toWire());
  while (dirent* e = readdir(d)) {
    struct stat st {};
    if (std::strncmp(e->d_name, stem.c_str(), stem.size()) == 0 &&
        fstatat(dirfd(d), e->d_name, &st, 0) == 0)
      bytes += uint64_t(st.st_blocks) * 512;  // allocated, not the size
  }
  closedir(d);
  return bytes;
}

std::unique_ptr<Segment> Segment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  CORTADO_ENFORCE(fd >= 0, ErrorCode::kUnavailable, "cannot create shared memory {}: {}", name,
                  strerror(errno));
  // No pages yet: the arena reserves each region's as it hands it out.
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw Error(ErrorCode::kUnavailable,
                fmt::format("cannot size shared memory {} to {} bytes: {} (is /dev/shm full?)", name,
                            bytes, strerror(err)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw Error(ErrorCode::kUnavailable,
                fmt::format("cannot map shared memory {}: {}", name, strerror(err)));
  }
  return std::unique_ptr<Segment>(new Segment(name, static_cast<uint8_t*>(p), bytes, fd));
}

void Segment::reserve(uint64_t offset, uint64_t len) {
  CORTADO_ENFORCE(fd_ >= 0 && offset <= size_ && len <= size_ - offset, ErrorCode::kInternal,
                  "shared memory {}: reserve [{}, +{}) outside the creator's {} bytes", name_,
                  offset, len, size_);
  if (len == 0) return;
  int err = posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(len));
  if (err != 0) {
    throw Error(ErrorCode::kUnavailable,
                fmt::format("cannot reserve {} bytes of shared memory in {}: {} (is /dev/shm "
                            "full? enlarge it, or set CORTADO_SHM=0)",
                            len, name_, strerror(err)));
  }
}

void Segment::release(uint64_t offset, uint64_t len) {
  if (fd_ < 0 || offset > size_ || len > size_ - offset) return;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = (offset + page - 1) / page * page;  // whole pages only: the
  const uint64_t last = (offset + len) / page * page;        // edges may be a neighbour's
  if (last <= first) return;
  // Best effort: a kernel without hole punching on tmpfs keeps the pages.
  (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first),
                  static_cast<off_t>(last - first));
}

std::unique_ptr<Segment> Segment::open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  CORTADO_ENFORCE(fd >= 0, ErrorCode::kProtocol, "cannot open the peer's shared memory {}: {}",
                  name, strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  size_t bytes = static_cast<size_t>(st.st_size);
  void* p = bytes ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr;
  close(fd);
  CORTADO_ENFORCE(bytes > 0 && p != MAP_FAILED, ErrorCode::kProtocol,
                  "cannot map the peer's shared memory {} ({} bytes): {}", name, bytes,
                  strerror(errno));
  return std::unique_ptr<Segment>(new Segment(name, static_cast<uint8_t*>(p), bytes, -1));
}

Segment::~Segment() {
  if (data_) munmap(data_, size_);
  if (fd_ >= 0) {
    close(fd_);
    shm_unlink(name_.c_str());
  }
}

Arena::Arena(std::string prefix, NodeId owner, size_t segmentBytes)
    : prefix_(std::move(prefix)), owner_(owner), segmentBytes_(segmentBytes) {}

void Arena::free(const Region& r, size_t bytes) {
  if (!r.data) return;
  std::lock_guard<std::mutex> lk(mu_);
  segments_.at(r.segment)->release(r.offset, rounded(bytes));
  free_[rounded(bytes)].push_back(r);
}

Region Arena::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  // 64-byte alignment keeps the vector loops on whole cache lines.
  const size_t need = rounded(bytes);
  if (auto it = free_.find(need); it != free_.end() && !it->second.empty()) {
    Region r = it->second.back();
    segments_.at(r.segment)->reserve(r.offset, need);  // throws: the region stays free
    it->second.pop_back();
    return r;
  }
  if (segments_.empty() || used_ + need > segments_.back()->size()) {
    uint32_t index = static_cast<uint32_t>(segments_.size());
    segments_.push_back(
        Segment::create(segmentName(prefix_, owner_, index), std::max(segmentBytes_, need)));
    used_ = 0;
    CORTADO_LOG_DEBUG("{}: shared memory segment {} ({} bytes)", owner_.toString(),
                      segments_.back()->name(), segments_.back()->size());
  }
  segments_.back()->reserve(used_, need);  // throws: nothing handed out
  Region r;
  r.segment = static_cast<uint32_t>(segments_.size() - 1);
  r.offset = used_;
  r.data = segments_.back()->data() + used_;
  used_ += need;
  return r;
}

size_t RegionPool::classBytes(size_t bytes) {
  const size_t c = (std::max<size_t>(bytes, 1) + 63) & ~size_t(63);
  if (c <= (size_t(64) << 10)) return c;
  size_t p = size_t(64) << 10;
  while (p <= c / 2) p *= 2;  // the power of two at or below c
  const size_t step = p / 8;
  return (c + step - 1) / step * step;
}

void RegionPool::evictLocked(uint64_t need, size_t keep) {
  // Largest class first, `keep` (the class in use now) last.
  while (held_ + need > limit_ && !warm_.empty()) {
    auto it = std::prev(warm_.end());
    if (it->first == keep && it != warm_.begin()) it = std::prev(it);
    const size_t c = it->first;
    arena_.free(it->second.back(), c);
    it->second.pop_back();
    if (it->second.empty()) warm_.erase(it);
    held_ -= c;
    warmBytes_ -= c;
  }
}

Region RegionPool::take(size_t bytes) {
  const size_t c = classBytes(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = warm_.find(c); it != warm_.end()) {
    Region r = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) warm_.erase(it);
    warmBytes_ -= c;
    return r;
  }
  evictLocked(c, c);
  Region r = arena_.allocate(c);  // throws: nothing taken
  held_ += c;
  return r;
}

void RegionPool::give(const Region& r, size_t bytes) {
  if (!r.data) return;
  const size_t c = classBytes(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  // Past the limit: other classes' warm regions go first, so that the
  // class in use keeps its pages from round to round.
  evictLocked(0, c);
  if (held_ > limit_) {
    arena_.free(r, c);
    held_ -= c;
    return;
  }
  warm_[c].push_back(r);
  warmBytes_ += c;
}

void RegionPool::setLimit(uint64_t limit) {
  std::lock_guard<std::mutex> lk(mu_);
  limit_ = limit;
  evictLocked(0, 0);
}

uint64_t RegionPool::heldBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_;
}

uint64_t RegionPool::warmBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return warmBytes_;
}

uint8_t* PeerMappings::resolve(const NodeId& peer, uint32_t index, uint64_t offset, uint64_t len) {
  std::lock_guard<std::mutex> lk(mu_);
  auto key = std::make_pair(peer, index);
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    try {
      it = maps_.emplace(key, Segment::open(segmentName(prefix_, peer, index))).first;
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("{} sent a shared-memory descriptor for its segment {}: {}",
                                        peer.toString(), index, e.what()));
    }
  }
  const Segment& s = *it->second;
  CORTADO_ENFORCE(offset <= s.size() && len <= s.size() - offset, ErrorCode::kProtocol,
                  "{} sent a shared-memory descriptor [{}, +{}) outside its segment {} of {} bytes",
                  peer.toString(), offset, len, s.name(), s.size());
  return s.data() + offset;
}

}  // namespace cortado::shm
