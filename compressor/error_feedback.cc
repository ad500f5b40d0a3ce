#include "compressor/error_feedback.h"

#include <algorithm>

#include "compressor/cpu/kernels.h"
#include "core/common/error.h"
#include "core/common/half.h"

namespace cortado::compressor {

const char* toString(StateDType t) { return t == StateDType::kBFloat16 ? "bf16" : "fp32"; }

StateDType stateDTypeFromString(const std::string& s, const std::string& what) {
  if (s == "fp32" || s == "float32") return StateDType::kFloat32;
  if (s == "bf16" || s == "bfloat16") return StateDType::kBFloat16;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}='{}': error feedback keeps its state in fp32 (exact to one fp32 "
                          "rounding) or bf16 (half the memory, one bf16 rounding per round)",
                          what, s));
}

namespace {

// fp32 working copies of a bf16 state during one encode, shared by every
// ErrorFeedback of the process: one per encode running at once.
struct Scratch {
  std::vector<float, PageAllocator<float>> e, u;
  uint64_t bytes() const { return (e.capacity() + u.capacity()) * sizeof(float); }
};

struct ScratchPool {
  std::mutex mu;
  std::vector<std::unique_ptr<Scratch>> idle;
  uint64_t bytes = 0;  // every scratch's, idle or lent
};

ScratchPool& scratchPool() {
  static ScratchPool* p = new ScratchPool;  // never destroyed: encodes may run at exit
  return *p;
}

// A scratch of at least n elements (and n of u with momentum) for one encode.
class ScratchLease {
 public:
  ScratchLease(size_t n, bool momentum) {
    ScratchPool& p = scratchPool();
    {
      std::lock_guard<std::mutex> lk(p.mu);
      if (!p.idle.empty()) {
        s_ = std::move(p.idle.back());
        p.idle.pop_back();
      }
    }
    if (!s_) s_ = std::make_unique<Scratch>();
    const uint64_t before = s_->bytes();
    // Exactly n when it grows (no doubling), the old buffer freed first.
    auto grow = [n](std::vector<float, PageAllocator<float>>& v) {
      if (v.size() >= n) return;
      std::vector<float, PageAllocator<float>>().swap(v);
      v.resize(n);
    };
    grow(s_->e);
    if (momentum) grow(s_->u);
    const uint64_t after = s_->bytes();
    if (after != before) {
      std::lock_guard<std::mutex> lk(p.mu);
      p.bytes += after - before;
    }
  }
  ~ScratchLease() {
    ScratchPool& p = scratchPool();
    std::lock_guard<std::mutex> lk(p.mu);
    p.idle.push_back(std::move(s_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  Scratch* operator->() const { return s_.get(); }

 private:
  std::unique_ptr<Scratch> s_;
};

}  // namespace

ErrorFeedback::ErrorFeedback(CodecPtr codec, float momentum, StateDType state)
    : codec_(std::move(codec)),
      momentum_(momentum < 0 ? (codec_ ? codec_->momentumCorrection() : 0.0f) : momentum),
      stateType_(state) {
  CORTADO_ENFORCE(codec_ != nullptr, ErrorCode::kInvalidArgument,
                  "ErrorFeedback needs a codec");
  CORTADO_ENFORCE(codec_->device() == Device::kCpu, ErrorCode::kInvalidArgument,
                  "ErrorFeedback wraps CPU codecs; '{}' runs on {} (use cuda::CudaErrorFeedback)",
                  codec_->spec(), deviceName(codec_->device()));
  CORTADO_ENFORCE(momentum_ == 0.0f || codec_->sparse(), ErrorCode::kInvalidArgument,
                  "momentum correction needs a sparse codec, '{}' is dense", codec_->spec());
}

ErrorFeedback::State& ErrorFeedback::state(uint64_t key, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = states_[key];
  if (!slot) {
    slot = std::make_unique<State>();
    slot->n = n;
    const bool m = momentum_ > 0;
    if (stateType_ == StateDType::kBFloat16) {
      slot->residual16.assign(n, 0);  // bf16 0x0000 is +0
      if (m) slot->velocity16.assign(n, 0);
    } else {
      slot->residual.assign(n, 0.0f);
      if (m) slot->velocity.assign(n, 0.0f);
    }
  }
  CORTADO_ENFORCE(slot->n == n, ErrorCode::kInvalidArgument,
                  "error feedback: tensor key {} had {} elements, now {}", key, slot->n, n);
  return *slot;
}

void ErrorFeedback::update(float* e, float* u, const float* grad, size_t n,
                           const EncodeContext& ctx) const {
  const FeedbackUpdate up{e, momentum_ > 0 ? u : nullptr, grad, momentum_};
  cpu::parallelAligned(ctx.pool, n, 64,
                       [&up](size_t b, size_t end) { cpu::applyUpdate(up, b, end); });
}

size_t ErrorFeedback::afterEncode(float* e, float* u, size_t n, std::span<std::byte> out,
                                  size_t bytes, const EncodeContext& ctx) const {
  auto payload = std::span<const std::byte>(out.data(), bytes);
  codec_->decompressAdd(payload, e, n, -1.0f, ctx);
  if (momentum_ > 0 && ctx.restartMomentum)
    std::fill(u, u + n, 0.0f);
  else if (momentum_ > 0)
    codec_->zeroSent(payload, u, n, ctx);
  return bytes;
}

size_t ErrorFeedback::encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                             const EncodeContext& ctx) {
  State& s = state(key, n);
  const bool m = momentum_ > 0;
  if (stateType_ == StateDType::kFloat32) {
    float* e = s.residual.data();
    float* u = m ? s.velocity.data() : nullptr;
    // The codec's own pass applies the update where it has one (top-k, DGC).
    size_t bytes = codec_->encodeUpdated({e, u, grad, momentum_}, n, out, ctx);
    if (bytes == 0) {
      update(e, u, grad, n, ctx);
      bytes = codec_->encode(e, n, out, ctx);
    }
    return afterEncode(e, u, n, out, bytes, ctx);
  }
  // bf16: widen into scratch and update there in one pass (widening is
  // exact: the same fp32 algebra as update()), encode, store back rounded.
  ScratchLease sc(n, m);
  float* e = sc->e.data();
  float* u = m ? sc->u.data() : nullptr;
  const uint16_t* e16 = s.residual16.data();
  const uint16_t* u16 = m ? s.velocity16.data() : nullptr;
  const float mu = momentum_;
  cpu::parallelAligned(ctx.pool, n, 64, [&](size_t b, size_t end) {
    if (m) {
      for (size_t i = b; i < end; ++i) {
        u[i] = mu * bf16ToFloat(u16[i]) + grad[i];
        e[i] = bf16ToFloat(e16[i]) + u[i];
      }
    } else {
      for (size_t i = b; i < end; ++i) e[i] = bf16ToFloat(e16[i]) + grad[i];
    }
  });
  const size_t bytes = afterEncode(e, u, n, out, codec_->encode(e, n, out, ctx), ctx);
  cpu::parallelAligned(ctx.pool, n, 64, [&](size_t b, size_t end) {
    cpu::floatToBf16(e + b, s.residual16.data() + b, end - b);
    if (m) cpu::floatToBf16(u + b, s.velocity16.data() + b, end - b);
  });
  return bytes;
}

namespace {
template <class V16>
ErrorFeedback::Floats widen(const std::vector<float, PageAllocator<float>>& f32, const V16& b16) {
  if (!f32.empty()) return {f32.begin(), f32.end()};
  ErrorFeedback::Floats out(b16.size());
  bf16ToFloatN(b16.data(), out.data(), b16.size());
  return out;
}
}  // namespace

ErrorFeedback::Floats ErrorFeedback::residual(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  if (it == states_.end()) return {};
  return widen(it->second->residual, it->second->residual16);
}

ErrorFeedback::Floats ErrorFeedback::velocity(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  if (it == states_.end()) return {};
  return widen(it->second->velocity, it->second->velocity16);
}

void ErrorFeedback::reset(uint64_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  states_.erase(key);
}

void ErrorFeedback::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  states_.clear();
}

uint64_t ErrorFeedback::heldBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t bytes = 0;
  for (const auto& [key, s] : states_)
    bytes += (s->residual.capacity() + s->velocity.capacity()) * sizeof(float) +
             (s->residual16.capacity() + s->velocity16.capacity()) * sizeof(uint16_t);
  return bytes;
}

void ErrorFeedback::releaseIdleScratch() {
  std::vector<std::unique_ptr<Scratch>> idle;
  {
    ScratchPool& p = scratchPool();
    std::lock_guard<std::mutex> lk(p.mu);
    idle.swap(p.idle);
    for (const auto& s : idle) p.bytes -= s->bytes();
  }
}  // freed here, outside the lock

uint64_t ErrorFeedback::scratchBytes() {
  ScratchPool& p = scratchPool();
  std::lock_guard<std::mutex> lk(p.mu);
  return p.bytes;
}

}  // namespace cortado::compressor
