// The device conformance cases (device_test.h).
#include "tests/device/device_test.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "compressor/error_feedback.h"
#include "compressor/registry.h"
#include "core/common/error.h"

namespace cortado::device::testing {
namespace {

std::vector<float> ramp(size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(float(i) * 0.37f + 0.1f);
  return v;
}

// Host -> device -> host through pinned memory on one stream.
std::vector<float> roundTrip(Device& d, Stream& s, const std::vector<float>& in) {
  const size_t bytes = in.size() * sizeof(float);
  Buffer pin(d, true), dev(d, false);
  float* p = pin.floats(in.size());
  std::memcpy(p, in.data(), bytes);
  float* x = dev.floats(in.size());
  d.copy(x, p, bytes, CopyKind::kHostToDevice, s);
  std::vector<float> out(in.size());
  Buffer back(d, true);
  float* q = back.floats(in.size());
  d.copy(q, x, bytes, CopyKind::kDeviceToHost, s);
  auto e = d.createEvent();
  e->record(s);
  e->synchronize(Deadline::after(Millis(30000)), "round trip");
  std::memcpy(out.data(), q, bytes);
  return out;
}

TEST_P(DeviceConformance, CopiesRoundTripExactly) {
  auto s = dev_->createStream();
  for (size_t n : {size_t(0), size_t(1), size_t(1000), (size_t(1) << 20) + 3}) {
    auto in = ramp(n);
    EXPECT_EQ(roundTrip(*dev_, *s, in), in) << n << " elements";
  }
}

TEST_P(DeviceConformance, DeviceToDeviceCopiesAtOffsets) {
  auto s = dev_->createStream();
  const size_t n = 4096;
  auto in = ramp(n);
  Buffer pin(*dev_, true), a(*dev_, false), b(*dev_, false);
  float* p = pin.floats(n);
  std::memcpy(p, in.data(), n * sizeof(float));
  float* x = a.floats(n);
  float* y = b.floats(n);
  dev_->copy(x, p, n * sizeof(float), CopyKind::kHostToDevice, *s);
  dev_->fill(y, -1.0f, n, *s);
  dev_->copy(y + 100, x + 7, 1000 * sizeof(float), CopyKind::kDeviceToDevice, *s);
  dev_->copy(p, y, n * sizeof(float), CopyKind::kDeviceToHost, *s);
  auto e = dev_->createEvent();
  e->record(*s);
  e->synchronize(Deadline::after(Millis(30000)), "offset copy");
  for (size_t i = 0; i < n; ++i) {
    const float want = i >= 100 && i < 1100 ? in[i - 100 + 7] : -1.0f;
    ASSERT_EQ(p[i], want) << "element " << i;
  }
}

TEST_P(DeviceConformance, FillScaleAddMatchAPlainLoop) {
  auto s = dev_->createStream();
  const size_t n = 100003;
  auto y = ramp(n, 3.0f);
  Buffer pin(*dev_, true), a(*dev_, false), b(*dev_, false);
  float* p = pin.floats(n);
  std::memcpy(p, y.data(), n * sizeof(float));
  float* dx = a.floats(n);
  float* dy = b.floats(n);
  dev_->copy(dy, p, n * sizeof(float), CopyKind::kHostToDevice, *s);
  dev_->fill(dx, 2.5f, n, *s);
  dev_->scale(dx, 0.5f, n, *s);
  dev_->add(dx, dy, n, *s);
  dev_->scale(dx, 1.0f, 0, *s);  // zero elements: nothing
  dev_->copy(p, dx, n * sizeof(float), CopyKind::kDeviceToHost, *s);
  auto e = dev_->createEvent();
  e->record(*s);
  e->synchronize(Deadline::after(Millis(30000)), "kernels");
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 2.5f * 0.5f + y[i]) << "element " << i;
}

// Work on a second stream that waits for an event of the first sees all of
// the first's work before the event, however long it takes.
TEST_P(DeviceConformance, StreamsAreOrderedByEvents) {
  auto s1 = dev_->createStream();
  auto s2 = dev_->createStream();
  const size_t n = size_t(1) << 22;
  Buffer a(*dev_, false), b(*dev_, false), pin(*dev_, true);
  float* x = a.floats(n);
  float* y = b.floats(n);
  float* p = pin.floats(n);
  auto e1 = dev_->createEvent();
  auto e2 = dev_->createEvent();
  for (int round = 1; round <= 3; ++round) {
    dev_->fill(x, 0.0f, n, *s1);
    for (int k = 0; k < 8; ++k) dev_->add(x, x, n, *s1);  // 0s, slow
    dev_->fill(x, float(round), n, *s1);
    e1->record(*s1);
    dev_->wait(*s2, *e1);
    dev_->copy(y, x, n * sizeof(float), CopyKind::kDeviceToDevice, *s2);
    dev_->copy(p, y, n * sizeof(float), CopyKind::kDeviceToHost, *s2);
    e2->record(*s2);
    e2->synchronize(Deadline::after(Millis(30000)), "the second stream");
    EXPECT_TRUE(e2->query());
    EXPECT_TRUE(e1->query());
    for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(p[i], float(round)) << "round " << round;
    ASSERT_EQ(p[n - 1], float(round));
  }
}

TEST_P(DeviceConformance, EventsNeverRecordedAreComplete) {
  auto e = dev_->createEvent();
  EXPECT_TRUE(e->query());
  e->synchronize(Deadline::after(Millis(0)), "an event never recorded");
  auto s = dev_->createStream();
  dev_->wait(*s, *e);  // waits for nothing
  auto f = dev_->createEvent();
  f->record(*s);
  f->synchronize(Deadline::after(Millis(30000)), "after waiting for nothing");
}

// A deadline that passes while the work is pending throws kTimeout naming
// what was waited for; the work still completes and a later wait succeeds.
TEST_P(DeviceConformance, SynchronizeHonoursItsDeadline) {
  auto s = dev_->createStream();
  auto e = dev_->createEvent();
  const size_t n = size_t(1) << 26;  // 256 MiB
  Buffer a(*dev_, false);
  float* x = a.floats(n);
  for (int k = 0; k < 6; ++k) dev_->fill(x, float(k), n, *s);
  e->record(*s);
  if (!GetParam().asynchronous) {
    EXPECT_TRUE(e->query()) << "work on this device's streams runs when enqueued";
    return;
  }
  try {
    e->synchronize(Deadline::after(Millis(0)), "six fills of 256 MiB");
    ADD_FAILURE() << "synchronize with an expired deadline returned while 1.5 GiB of fills "
                     "were queued";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kTimeout) << err.what();
    EXPECT_NE(std::string(err.what()).find("six fills of 256 MiB"), std::string::npos)
        << err.what();
  }
  e->synchronize(Deadline::after(Millis(60000)), "the fills");
  EXPECT_TRUE(e->query());
}

TEST_P(DeviceConformance, MisuseIsRefused) {
  auto s = dev_->createStream();
  Buffer a(*dev_, false);
  float* x = a.floats(16);
  try {
    dev_->copy(x, nullptr, 64, CopyKind::kHostToDevice, *s);
    ADD_FAILURE() << "a copy from null was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  try {
    dev_->add(nullptr, x, 16, *s);
    ADD_FAILURE() << "an add into null was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  dev_->copy(nullptr, nullptr, 0, CopyKind::kDeviceToDevice, *s);  // nothing to copy: fine
  try {
    void* p = dev_->allocate(size_t(1) << 62);
    dev_->release(p);
    ADD_FAILURE() << "an allocation of 4 EiB succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("bytes"), std::string::npos) << e.what();
  }
  // The device stays usable.
  auto in = ramp(100);
  EXPECT_EQ(roundTrip(*dev_, *s, in), in);
}

TEST_P(DeviceConformance, BuffersGrowAndKeepTheirMemoryWhenLargeEnough) {
  Buffer b(*dev_, false);
  EXPECT_EQ(b.data(), nullptr);
  void* p = b.reserve(1000);
  EXPECT_NE(p, nullptr);
  EXPECT_GE(b.capacity(), 1000u);
  EXPECT_EQ(b.reserve(10), p);
  b.reserve(b.capacity() + 1);
  EXPECT_GE(b.capacity(), 1001u);
  Buffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
}

// Each codec of the device encodes the same payload bytes as the CPU codec
// with error feedback over three rounds, keeps the same residual, and
// decodes into a sum as the CPU codec does; with the state in fp32 and in
// bf16 (the CPU's ErrorFeedback is the CUDA one's twin for both).
TEST_P(DeviceConformance, CodecsMatchTheCpuCodecs) {
  compressor::Registry cpu;
  compressor::registerCpuCodecs(cpu);
  auto s = dev_->createStream();
  auto e = dev_->createEvent();
  const Deadline d = Deadline::after(Millis(60000));
  const size_t n = 5003;
  int tested = 0;
  for (auto state : {compressor::StateDType::kFloat32, compressor::StateDType::kBFloat16})
  for (const char* spec : {"fp16", "onebit", "efsignsgd", "topk:ratio=0.25", "randomk:ratio=0.5",
                           "dgc:ratio=0.25"}) {
    const std::string name = std::string(spec).substr(0, std::string(spec).find(':'));
    if (!dev_->codecs().has(name, dev_->codecDevice())) continue;
    ++tested;
    SCOPED_TRACE(fmt::format("{}, {} state", spec, compressor::toString(state)));
    auto hostCodec = cpu.create(spec);
    auto devCodec = dev_->codecs().create(spec, dev_->codecDevice());
    compressor::ErrorFeedback ref(hostCodec, -1.0f, state);
    auto ef = dev_->errorFeedback(devCodec, state);
    const size_t bytes = ef->payloadBytes(n);
    ASSERT_EQ(bytes, hostCodec->payloadBytes(n));
    Buffer x(*dev_, false), pay(*dev_, false), pin(*dev_, true), sum(*dev_, false);
    for (int round = 0; round < 3; ++round) {
      auto g = ramp(n, 1.0f + round);
      float* p = pin.floats(n + bytes / 4 + 1);
      std::memcpy(p, g.data(), n * sizeof(float));
      dev_->copy(x.floats(n), p, n * sizeof(float), CopyKind::kHostToDevice, *s);
      compressor::EncodeContext ctx;
      ctx.seed = 77 + round;
      ef->encode(5, x.floats(n), n, std::span<std::byte>(pay.bytes(bytes), bytes), ctx, s.get());
      std::vector<std::byte> want(bytes);
      ref.encode(5, g.data(), n, want, ctx);
      auto* got = reinterpret_cast<std::byte*>(p);
      dev_->copy(got, pay.bytes(bytes), bytes, CopyKind::kDeviceToHost, *s);
      e->record(*s);
      e->synchronize(d, "encode");
      ASSERT_EQ(std::memcmp(got, want.data(), bytes), 0)
          << "round " << round << ": payloads differ";
      auto r = ef->residual(5);
      auto rr = ref.residual(5);
      ASSERT_EQ(r.size(), rr.size());
      for (size_t i = 0; i < r.size(); ++i)
        ASSERT_NEAR(r[i], rr[i], 1e-6f * (1 + std::abs(rr[i]))) << "residual element " << i;
      auto u = ef->velocity(5), uu = ref.velocity(5);
      ASSERT_EQ(u.size(), uu.size());
      for (size_t i = 0; i < u.size(); ++i)
        ASSERT_NEAR(u[i], uu[i], 1e-6f * (1 + std::abs(uu[i]))) << "velocity element " << i;
      // Decode into a sum of ones on the device and on the host.
      std::vector<float> hsum(n, 1.0f);
      hostCodec->decompressAdd(want, hsum.data(), n);
      float* ds = sum.floats(n);
      dev_->fill(ds, 1.0f, n, *s);
      dev_->decompressAdd(*devCodec, std::span<const std::byte>(pay.bytes(bytes), bytes), ds, n,
                          *s);
      dev_->copy(p, ds, n * sizeof(float), CopyKind::kDeviceToHost, *s);
      e->record(*s);
      e->synchronize(d, "decode");
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], hsum[i]) << "decoded element " << i;
    }
    // A bf16 state's fp32 scratch: in the device's memory on CUDA (the
    // residual's widened copy, and the velocity's with DGC), counted by the
    // device; the host device's is host memory, counted by ErrorFeedback.
    if (state == compressor::StateDType::kBFloat16 && dev_->kind() == Kind::kCuda) {
      EXPECT_GE(dev_->errorFeedbackScratchBytes(), n * sizeof(float));
    } else if (dev_->kind() != Kind::kCuda) {
      EXPECT_EQ(dev_->errorFeedbackScratchBytes(), 0u);
    }
  }
  EXPECT_GE(tested, 8) << "the device has too few of the codecs the executor's tests use";
  EXPECT_TRUE(dev_->errorFeedback(dev_->codecs().create("fp16", dev_->codecDevice()),
                                  compressor::StateDType::kFloat32)
                  ->residual(3)
                  .empty());
}

// A payload whose header names another codec is refused before the sum is
// written.
TEST_P(DeviceConformance, BadPayloadsAreRefusedAndTheSumKept) {
  auto s = dev_->createStream();
  auto e = dev_->createEvent();
  const size_t n = 64;
  auto codec = dev_->codecs().create("fp16", dev_->codecDevice());
  compressor::Registry cpu;
  compressor::registerCpuCodecs(cpu);
  auto other = cpu.create("onebit");
  std::vector<std::byte> bad(other->payloadBytes(n));
  auto g = ramp(n);
  other->encode(g.data(), n, bad, {});
  Buffer pay(*dev_, false), sum(*dev_, false), pin(*dev_, true);
  std::byte* hp = pin.bytes(bad.size() + n * sizeof(float));
  std::memcpy(hp, bad.data(), bad.size());
  dev_->copy(pay.bytes(bad.size()), hp, bad.size(), CopyKind::kHostToDevice, *s);
  float* ds = sum.floats(n);
  dev_->fill(ds, 7.0f, n, *s);
  try {
    dev_->decompressAdd(*codec, std::span<const std::byte>(pay.bytes(bad.size()), bad.size()), ds,
                        n, *s);
    ADD_FAILURE() << "an onebit payload was decoded as fp16";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kProtocol) << err.what();
  }
  auto* back = reinterpret_cast<float*>(hp);
  dev_->copy(back, ds, n * sizeof(float), CopyKind::kDeviceToHost, *s);
  e->record(*s);
  e->synchronize(Deadline::after(Millis(30000)), "the sum");
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 7.0f) << "element " << i;
}

}  // namespace
}  // namespace cortado::device::testing
