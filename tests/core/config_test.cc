// The job settings that roles read from the environment (core/config.h):
// here the stall check's, read, handed to children and refused with its name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/common/error.h"
#include "core/config.h"

namespace cortado {
namespace {

std::string valueIn(const JobConfig& c, const std::string& name) {
  for (const auto& [k, v] : c.toEnv())
    if (k == name) return v;
  return "(missing)";
}

TEST(Settings, StallCheckIsReadPassedOnAndCheckedWithItsName) {
  ::unsetenv("CORTADO_STALL_CHECK_MS");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.stallCheck, Millis(60000));  // the default, as README's table says
  EXPECT_EQ(valueIn(c, "CORTADO_STALL_CHECK_MS"), "60000");
  ::setenv("CORTADO_STALL_CHECK_MS", "250", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.stallCheck, Millis(250));
  EXPECT_EQ(valueIn(c, "CORTADO_STALL_CHECK_MS"), "250");
  ::setenv("CORTADO_STALL_CHECK_MS", "0", 1);  // off
  c = readJobConfig(false);
  c.numWorkers = c.numServers = 1;
  EXPECT_NO_THROW(c.validate());
  ::setenv("CORTADO_STALL_CHECK_MS", "-5", 1);
  c = readJobConfig(false);
  c.numWorkers = c.numServers = 1;
  try {
    c.validate();
    ADD_FAILURE() << "a negative stall check was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_STALL_CHECK_MS -5 is negative"),
              std::string::npos)
        << e.what();
  }
  ::setenv("CORTADO_STALL_CHECK_MS", "soon", 1);
  try {
    readJobConfig(false);
    ADD_FAILURE() << "CORTADO_STALL_CHECK_MS=soon accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_STALL_CHECK_MS='soon' is not an integer"),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("CORTADO_STALL_CHECK_MS");
}

}  // namespace
}  // namespace cortado
