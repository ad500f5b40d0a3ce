// The device conformance suite on the host device, with streams run inline
// (the executor's default) and on a queue thread each.
#include "core/common/error.h"
#include "core/device/host/factory.h"
#include "tests/device/device_test.h"

namespace cortado::device::testing {
namespace {

Backend hostBackend(bool queued) {
  Backend b;
  b.name = queued ? "HostQueued" : "Host";
  b.asynchronous = queued;
  b.make = [queued] {
    host::Options o;
    o.queued = queued;
    return host::create(o);
  };
  return b;
}

CORTADO_DEVICE_CONFORMANCE(Host, hostBackend(false));
CORTADO_DEVICE_CONFORMANCE(HostQueued, hostBackend(true));

TEST(DeviceKind, NamesAreParsedAndOthersRefused) {
  EXPECT_EQ(parseKind("host"), Kind::kHost);
  EXPECT_EQ(parseKind("cuda"), Kind::kCuda);
  try {
    parseKind("gpu");
    ADD_FAILURE() << "'gpu' was taken as a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CORTADO_DEVICE"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado::device::testing
