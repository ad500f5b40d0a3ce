// What every device shares: kind names, Buffer, and error feedback on host
// memory.
#include "core/device/device.h"

#include <utility>

#include "compressor/error_feedback.h"
#include "core/common/error.h"

namespace cortado::device {

const char* kindName(Kind k) { return k == Kind::kCuda ? "cuda" : "host"; }

Kind parseKind(std::string_view text) {
  if (text == "host") return Kind::kHost;
  if (text == "cuda") return Kind::kCuda;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown device '{}' (CORTADO_DEVICE): use host (host memory, the CPU "
                          "codecs, MPI) or cuda (CUDA buffers, the CUDA codecs, NCCL)",
                          text));
}

namespace {

class HostErrorFeedback final : public ErrorFeedback {
 public:
  HostErrorFeedback(compressor::CodecPtr codec, compressor::StateDType state)
      : ef_(std::move(codec), -1.0f, state) {}
  size_t payloadBytes(size_t n) const override { return ef_.payloadBytes(n); }
  void encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
              compressor::EncodeContext ctx, Stream* s) override {
    CORTADO_ENFORCE(s == nullptr, ErrorCode::kInvalidArgument,
                    "host error feedback runs on the calling thread: pass no stream");
    ef_.encode(key, grad, n, out, ctx);
  }
  HostFloats residual(uint64_t key) const override { return ef_.residual(key); }
  float momentum() const override { return ef_.momentum(); }
  HostFloats velocity(uint64_t key) const override { return ef_.velocity(key); }
  uint64_t heldBytes() const override { return ef_.heldBytes(); }

 private:
  compressor::ErrorFeedback ef_;
};

}  // namespace

std::unique_ptr<ErrorFeedback> hostErrorFeedback(compressor::CodecPtr codec,
                                                 compressor::StateDType state) {
  CORTADO_ENFORCE(codec && codec->device() == compressor::Device::kCpu, ErrorCode::kInvalidArgument,
                  "host error feedback wraps CPU codecs, not '{}'",
                  codec ? codec->spec() : std::string("(null)"));
  return std::make_unique<HostErrorFeedback>(std::move(codec), state);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, nullptr);
    pinned_ = o.pinned_;
    p_ = std::exchange(o.p_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

void* Buffer::reserve(size_t bytes) {
  CORTADO_ENFORCE(device_ != nullptr, ErrorCode::kInternal, "device buffer without a device");
  if (p_ && capacity_ >= bytes) return p_;
  reset();
  // Grow by half again, so that buffers that creep up reallocate rarely.
  const size_t want = bytes + bytes / 2;
  p_ = pinned_ ? device_->allocatePinned(want) : device_->allocate(want);
  capacity_ = want;
  return p_;
}

void Buffer::reset() {
  if (p_) {
    if (pinned_)
      device_->releasePinned(p_);
    else
      device_->release(p_);
  }
  p_ = nullptr;
  capacity_ = 0;
}

}  // namespace cortado::device
