// The device conformance suite (core/device/device.h), written once and
// instantiated per implementation in one line (CORTADO_DEVICE_CONFORMANCE):
// memory, copies, the vector kernels, stream and event ordering, deadlines,
// and the codecs with error feedback against the CPU codecs on the same
// data. An implementation that cannot run here (CUDA without a GPU) skips
// every case, saying why.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <memory>
#include <string>

#include "core/device/device.h"

namespace cortado::device::testing {

struct Backend {
  std::string name;
  // Non-empty: why the cases cannot run here (they skip with it).
  std::function<std::string()> skipReason = [] { return std::string(); };
  std::function<std::shared_ptr<Device>()> make;
  // Work runs after the call returns (a GPU, the host's queued streams), so
  // an event can be seen pending; false: every event completes when recorded.
  bool asynchronous = true;
};

// The name in test listings (not the object's bytes).
inline void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

class DeviceConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (std::string why = GetParam().skipReason(); !why.empty()) GTEST_SKIP() << why;
    dev_ = GetParam().make();
  }
  std::shared_ptr<Device> dev_;
};

}  // namespace cortado::device::testing

#define CORTADO_DEVICE_CONFORMANCE(Name, backend)          \
  INSTANTIATE_TEST_SUITE_P(                                \
      Name, DeviceConformance, ::testing::Values(backend), \
      [](const ::testing::TestParamInfo<Backend>& i) { return i.param.name; })
