// For the tests of payload decoders (zen_test.cc, zen_wire_test.cc): `fn`
// must throw a cortado::Error of code kProtocol whose message holds `words`.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/common/error.h"

namespace cortado::test {

inline void expectProtocol(const std::function<void()>& fn, const std::string& words) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one saying '" << words << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

}  // namespace cortado::test
