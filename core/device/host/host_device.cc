// The host device (host/factory.h): host memory, memcpy, the CPU codecs and
// the given (MPI) groups; streams inline or on a thread each.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "compressor/registry.h"
#include "core/common/error.h"
#include "core/device/host/factory.h"

namespace cortado::device::host {
namespace {

// What an event's records and completions have reached: record n completes
// when done >= n.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t done = 0;
  void complete(uint64_t n) {
    {
      std::lock_guard<std::mutex> lk(mu);
      done = std::max(done, n);
    }
    cv.notify_all();
  }
  bool reached(uint64_t n) {
    std::lock_guard<std::mutex> lk(mu);
    return done >= n;
  }
};

class HostStream;
// The device's streams, so that releasing memory can wait for their work.
struct StreamRegistry {
  std::mutex mu;
  std::set<HostStream*> streams;
};

class HostStream final : public Stream {
 public:
  HostStream(bool queued, std::shared_ptr<StreamRegistry> reg)
      : queued_(queued), reg_(std::move(reg)) {
    if (queued_) thread_ = std::thread([this] { loop(); });
    std::lock_guard<std::mutex> lk(reg_->mu);
    reg_->streams.insert(this);
  }
  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lk(reg_->mu);
      reg_->streams.erase(this);
    }
    if (!queued_) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Runs fn now (inline) or after the work enqueued before it (queued).
  template <typename F>
  void enqueue(F&& fn) {
    if (!queued_) {
      fn();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      work_.emplace_back(std::forward<F>(fn));
    }
    cv_.notify_all();
  }
  // Waits until every piece of work enqueued so far has run. Queued work
  // is memcpy-like and ends; waits on events refer to work enqueued before
  // them, so this ends too.
  void drain() {
    if (!queued_) return;
    std::unique_lock<std::mutex> lk(mu_);
    idle_.wait(lk, [&] { return work_.empty() && !busy_; });
  }
  bool queued() const { return queued_; }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;  // stopping, nothing left
      auto fn = std::move(work_.front());
      work_.pop_front();
      busy_ = true;
      lk.unlock();
      fn();
      lk.lock();
      busy_ = false;
      if (work_.empty()) idle_.notify_all();
    }
  }

  const bool queued_;
  std::shared_ptr<StreamRegistry> reg_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> work_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

class HostEvent final : public Event {
 public:
  void record(Stream& s) override;
  void recordOn(HostStream& hs) {
    uint64_t n;
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      n = ++state_->recorded;
    }
    if (!hs.queued()) {
      state_->complete(n);
      return;
    }
    hs.enqueue([st = state_, n] { st->complete(n); });
  }
  bool query() override {
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->done >= state_->recorded;
  }
  void synchronize(Deadline deadline, const char* what) override {
    std::unique_lock<std::mutex> lk(state_->mu);
    const uint64_t target = state_->recorded;
    if (!state_->cv.wait_until(lk, deadline.at(), [&] { return state_->done >= target; }))
      throw Error(ErrorCode::kTimeout,
                  fmt::format("host device: waiting for {}: the work did not complete by its "
                              "deadline",
                              what));
  }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
};

HostStream& hostStream(Stream& s) {
  auto* h = dynamic_cast<HostStream*>(&s);
  CORTADO_ENFORCE(h != nullptr, ErrorCode::kInvalidArgument,
                  "a stream of another device was passed to the host device");
  return *h;
}

void HostEvent::record(Stream& s) { recordOn(hostStream(s)); }

void checkPointers(const void* a, const void* b, size_t bytes, const char* op) {
  CORTADO_ENFORCE(bytes == 0 || (a != nullptr && b != nullptr), ErrorCode::kInvalidArgument,
                  "host device: {} of {} bytes with a null pointer", op, bytes);
}

class HostDeviceErrorFeedback final : public ErrorFeedback {
 public:
  HostDeviceErrorFeedback(compressor::CodecPtr codec, compressor::StateDType state)
      : ef_(hostErrorFeedback(std::move(codec), state)) {}
  size_t payloadBytes(size_t n) const override { return ef_->payloadBytes(n); }
  void encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
              compressor::EncodeContext ctx, Stream* s) override {
    // After the stream's earlier work and before its later work: the CPU
    // codec runs on this thread once the stream is idle.
    if (s) hostStream(*s).drain();
    ef_->encode(key, grad, n, out, ctx, nullptr);
  }
  HostFloats residual(uint64_t key) const override { return ef_->residual(key); }
  float momentum() const override { return ef_->momentum(); }
  HostFloats velocity(uint64_t key) const override { return ef_->velocity(key); }
  uint64_t heldBytes() const override { return ef_->heldBytes(); }

 private:
  std::unique_ptr<ErrorFeedback> ef_;
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(const Options& o) : queued_(o.queued), groups_(o.groups), codecs_(o.codecs) {
    if (!codecs_) {
      auto r = std::make_shared<compressor::Registry>();
      compressor::registerCpuCodecs(*r);
      codecs_ = std::move(r);
    }
  }
  ~HostDevice() override = default;

  Kind kind() const override { return Kind::kHost; }
  std::string name() const override { return queued_ ? "host (queued streams)" : "host"; }
  // Queued streams keep the staging copies, so that CPU-only tests exercise
  // them and their ordering.
  bool hostAddressable() const override { return !queued_; }

  void* allocate(size_t bytes) override {
    const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    void* p = std::aligned_alloc(256, rounded);
    CORTADO_ENFORCE(p != nullptr, ErrorCode::kUnavailable,
                    "host device: cannot allocate {} bytes of host memory", bytes);
    return p;
  }
  void release(void* p) noexcept override {
    drainAll();
    std::free(p);
  }
  void* allocatePinned(size_t bytes) override { return allocate(bytes); }
  void releasePinned(void* p) noexcept override { release(p); }

  std::unique_ptr<Stream> createStream() override {
    return std::make_unique<HostStream>(queued_, reg_);
  }
  std::unique_ptr<Event> createEvent() override { return std::make_unique<HostEvent>(); }
  void wait(Stream& s, Event& e) override {
    auto* he = dynamic_cast<HostEvent*>(&e);
    CORTADO_ENFORCE(he != nullptr, ErrorCode::kInvalidArgument,
                    "an event of another device was passed to the host device");
    auto st = he->state();
    uint64_t target;
    {
      std::lock_guard<std::mutex> lk(st->mu);
      target = st->recorded;
    }
    if (target == 0) return;  // never recorded: nothing to wait for
    hostStream(s).enqueue([st, target] {
      std::unique_lock<std::mutex> lk(st->mu);
      st->cv.wait(lk, [&] { return st->done >= target; });
    });
  }

  void copy(void* dst, const void* src, size_t bytes, CopyKind, Stream& s) override {
    checkPointers(dst, src, bytes, "copy");
    if (bytes == 0 || dst == src) return;
    hostStream(s).enqueue([=] { std::memmove(dst, src, bytes); });
  }
  void fill(float* x, float value, size_t n, Stream& s) override {
    checkPointers(x, x, n, "fill");
    if (n) hostStream(s).enqueue([=] { std::fill_n(x, n, value); });
  }
  void scale(float* x, float factor, size_t n, Stream& s) override {
    checkPointers(x, x, n, "scale");
    if (n)
      hostStream(s).enqueue([=] {
        for (size_t i = 0; i < n; ++i) x[i] *= factor;
      });
  }
  void add(float* dst, const float* src, size_t n, Stream& s) override {
    checkPointers(dst, src, n, "add");
    if (n)
      hostStream(s).enqueue([=] {
        for (size_t i = 0; i < n; ++i) dst[i] += src[i];
      });
  }

  compressor::Device codecDevice() const override { return compressor::Device::kCpu; }
  const compressor::Registry& codecs() const override { return *codecs_; }
  compressor::EncodeContext context(Stream&) const override { return {}; }
  std::unique_ptr<ErrorFeedback> errorFeedback(compressor::CodecPtr codec,
                                               compressor::StateDType state) override {
    return std::make_unique<HostDeviceErrorFeedback>(std::move(codec), state);
  }
  void decompressAdd(const compressor::Codec& codec, std::span<const std::byte> payload, float* sum,
                     size_t n, Stream& s, ThreadPool* pool = nullptr) override {
    hostStream(s).drain();
    compressor::EncodeContext ctx;
    ctx.pool = pool;
    codec.decompressAdd(payload, sum, n, 1.0f, ctx);
  }

  const collective::Groups* groups() const override { return groups_; }

 private:
  void drainAll() noexcept {
    if (!queued_) return;
    std::lock_guard<std::mutex> lk(reg_->mu);
    for (HostStream* s : reg_->streams) s->drain();
  }

  const bool queued_;
  const collective::Groups* groups_;
  std::shared_ptr<const compressor::Registry> codecs_;
  std::shared_ptr<StreamRegistry> reg_ = std::make_shared<StreamRegistry>();
};

}  // namespace

std::shared_ptr<Device> create(const Options& options) {
  return std::make_shared<HostDevice>(options);
}

}  // namespace cortado::device::host
