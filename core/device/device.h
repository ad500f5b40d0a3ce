// Where a tensor's bytes live and how work on them is ordered (DESIGN.md,
// "Folders": core/device). The plan executor runs every step through this
// interface, so one orchestration runs on CUDA buffers (cuda/factory.h:
// cudaMalloc, cudaMemcpyAsync, CUDA streams and events, the CUDA codecs,
// NCCL groups) and on host memory (host/factory.h: memcpy, streams run in
// order on the calling thread or on a queue thread each, the CPU codecs, the
// MPI groups). The host implementation is the CPU-only build's real path.
//
// Contract, for every implementation:
// - "Device memory" is what allocate() returns (and what a framework hands
//   over for the device: a CUDA tensor's data). "Pinned" memory is host
//   memory the device copies from and to asynchronously (allocatePinned).
//   The caller owns every buffer and keeps it alive, unwritten by the host,
//   until the work that reads it has completed (an event recorded after it).
// - Work enqueued on one Stream runs in order, asynchronously with respect
//   to the host; work on different streams is unordered unless a stream
//   waits for an event recorded on another (wait()). The host learns that
//   work finished only through an Event: query() or synchronize(deadline).
// - Copies, fills, scales, adds and codec encodes go on a stream. Decodes
//   (decompressAdd) validate the payload before they write: a CUDA codec
//   synchronizes its stream for that; it throws kProtocol on a bad payload.
// - Methods may be called from several threads (the executor's encode
//   pipeline runs a second one); a Stream is used from one thread at a time.
//   bindThread() makes the device current on a new thread before it uses it.
// - Errors: misuse (null pointers with a non-zero size, a stream or event of
//   another device) throws kInvalidArgument; a failed allocation or a backend
//   failure throws kUnavailable or kInternal naming the call and the bytes;
//   a synchronize() whose deadline passes throws kTimeout naming `what`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compressor/codec.h"
#include "compressor/error_feedback.h"
#include "core/collective/collectives.h"
#include "core/common/deadline.h"
#include "core/common/page_allocator.h"

namespace cortado::compressor {
class Registry;
}

namespace cortado::device {

enum class Kind : uint8_t { kHost, kCuda };
const char* kindName(Kind k);
// "host" or "cuda" (CORTADO_DEVICE); anything else throws kInvalidArgument
// listing both.
Kind parseKind(std::string_view text);

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// An ordered queue of device work. Made by Device::createStream().
class Stream {
 public:
  virtual ~Stream() = default;
};

// A point in a stream's work. Made by Device::createEvent().
class Event {
 public:
  virtual ~Event() = default;
  // Marks the end of the work enqueued on `s` so far; the event completes
  // when that work has. Recording again moves the mark.
  virtual void record(Stream& s) = 0;
  // Whether the work before the last record() has completed (true when
  // never recorded).
  virtual bool query() = 0;
  // Waits on the host until it has, or throws kTimeout naming `what`.
  virtual void synchronize(Deadline deadline, const char* what) = 0;
};

// Error feedback at one encode point (compressor/error_feedback.h's algebra)
// with its state in this device's memory: grad and out are device memory.
// Host copies of device state (ErrorFeedback::residual, velocity).
using HostFloats = std::vector<float, PageAllocator<float>>;

class ErrorFeedback {
 public:
  virtual ~ErrorFeedback() = default;
  virtual size_t payloadBytes(size_t n) const = 0;
  // Encodes grad (n elements) with the key's residual folded in into `out`
  // (payloadBytes(n) bytes), after the work enqueued on `s` so far and
  // before the work enqueued after it. `ctx` gives the seed and dtype; its
  // stream is set here. s == nullptr (hostErrorFeedback only): on the
  // calling thread, on host data that is ready.
  virtual void encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                      compressor::EncodeContext ctx, Stream* s) = 0;
  // A host copy of the key's residual (v with momentum); empty when the key
  // has no state. Waits for the key's pending encode. In memory mapped for
  // it (PageAllocator), which goes back when the copy is freed.
  virtual HostFloats residual(uint64_t key) const = 0;
  // The momentum correction m (DGC's; 0 without), and a host copy of the
  // key's u, empty when m = 0 or the key has no state.
  virtual float momentum() const = 0;
  virtual HostFloats velocity(uint64_t key) const = 0;
  // Bytes of state held for every key (residuals, velocities), in the
  // device's memory: what error feedback costs here (Executor::memory).
  virtual uint64_t heldBytes() const = 0;
};

// Error feedback on host memory (compressor::ErrorFeedback): the host
// device's, and every device's for steps placed on the CPU.
std::unique_ptr<ErrorFeedback> hostErrorFeedback(
    compressor::CodecPtr codec, compressor::StateDType state = compressor::StateDType::kFloat32);

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual Kind kind() const = 0;
  // "host", "host (queued streams)", "cuda:0 (NVIDIA H200)": in errors and logs.
  virtual std::string name() const = 0;
  // Whether device memory is the host's and stream work runs on the calling
  // thread as it is enqueued (the host device with inline streams): the host
  // may then read and write device buffers directly, and the executor skips
  // its copies through pinned staging (a CPU-only job's memory and time).
  virtual bool hostAddressable() const { return false; }
  // The planner's name for where codecs run here: "gpu" or "cpu" (trace lanes).
  const char* lane() const { return kind() == Kind::kCuda ? "gpu" : "cpu"; }

  // --- memory ---------------------------------------------------------------
  // At least `bytes` (0 allowed: a unique non-null pointer), 256-byte aligned.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void* allocatePinned(size_t bytes) = 0;
  virtual void releasePinned(void* p) noexcept = 0;

  // --- streams and events ---------------------------------------------------
  virtual std::unique_ptr<Stream> createStream() = 0;
  virtual std::unique_ptr<Event> createEvent() = 0;
  // Work enqueued on `s` after this waits for `e`'s last record().
  virtual void wait(Stream& s, Event& e) = 0;
  // Makes this device current on the calling thread.
  virtual void bindThread() {}

  // --- work on a stream -----------------------------------------------------
  // Host pointers of a copy should be pinned for it to be asynchronous.
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) = 0;
  virtual void fill(float* x, float value, size_t n, Stream& s) = 0;
  virtual void scale(float* x, float factor, size_t n, Stream& s) = 0;
  // dst[i] += src[i], both device memory.
  virtual void add(float* dst, const float* src, size_t n, Stream& s) = 0;

  // --- codecs ---------------------------------------------------------------
  // The codecs that run on this device's memory (the CPU codecs on host).
  virtual compressor::Device codecDevice() const = 0;
  virtual const compressor::Registry& codecs() const = 0;
  // The context a codec call on stream `s` needs (EncodeContext::stream).
  virtual compressor::EncodeContext context(Stream& s) const = 0;
  // Error feedback around `codec` (one of codecs()), its state in this
  // device's memory, in fp32 or bf16 (compressor/error_feedback.h).
  virtual std::unique_ptr<ErrorFeedback> errorFeedback(compressor::CodecPtr codec,
                                                       compressor::StateDType state) = 0;
  // Bytes of this device's memory that its error feedback keeps as scratch
  // for bf16 states (the fp32 working copies, kept for the next encode),
  // every ErrorFeedback of the process together: 0 on the host device,
  // whose scratch is host memory (compressor::ErrorFeedback::scratchBytes).
  virtual uint64_t errorFeedbackScratchBytes() const { return 0; }
  // sum[i] += decoded payload[i] (payload and sum in device memory), ordered
  // on `s` like encode(); validates first (kProtocol, sum untouched).
  // `pool`: helpers for the host device's CPU codec (EncodeContext::pool;
  // nullptr: the calling thread alone); a CUDA device has no use for it.
  virtual void decompressAdd(const compressor::Codec& codec, std::span<const std::byte> payload,
                             float* sum, size_t n, Stream& s, ThreadPool* pool = nullptr) = 0;

  // --- collectives ----------------------------------------------------------
  // The groups whose buffers are this device's memory (MPI for host, NCCL
  // for CUDA): world, intra- and inter-machine; nullptr when the job has
  // none (a worker without mpirun). Collectives block until done and order
  // themselves after nothing: wait for the data's event first.
  virtual const collective::Groups* groups() const = 0;

 protected:
  Device() = default;
};

// Device memory owned by one object, grown on demand (contents not kept).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device& d, bool pinned) : device_(&d), pinned_(pinned) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // At least `bytes`, reallocated when smaller (contents lost).
  void* reserve(size_t bytes);
  float* floats(size_t n) { return static_cast<float*>(reserve(n * sizeof(float))); }
  std::byte* bytes(size_t n) { return static_cast<std::byte*>(reserve(n)); }
  size_t capacity() const { return capacity_; }
  void* data() const { return p_; }  // nullptr before the first reserve()
  void reset();

 private:
  Device* device_ = nullptr;
  bool pinned_ = false;
  void* p_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace cortado::device
