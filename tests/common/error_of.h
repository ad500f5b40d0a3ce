// What a call throws, for the tests that check an error's message: the
// message of the cortado::Error that `f` throws, or "" when it throws none.
#pragma once

#include <functional>
#include <string>

#include "core/common/error.h"

namespace cortado::test {

inline std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace cortado::test
