// The job settings that roles read from the environment (core/config.h):
// here the stall check's, read, handed to children and refused with its name,
// and Horovod's names read as aliases.
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
  EXPECT_EQ(c.stallCheck, Millis(60000));  // the default, as docs/running.md's table says
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

TEST(Settings, HorovodNamesAreReadAsAliases) {
  for (const char* v : {"CORTADO_LOG_LEVEL", "CORTADO_FUSION_BYTES", "CORTADO_STALL_CHECK_MS",
                        "HOROVOD_LOG_LEVEL", "HOROVOD_FUSION_THRESHOLD",
                        "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE"})
    ::unsetenv(v);
  ::setenv("HOROVOD_LOG_LEVEL", "WARNING", 1);
  ::setenv("HOROVOD_FUSION_THRESHOLD", "33554432", 1);
  ::setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "7", 1);
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.logLevel, "warn");
  EXPECT_EQ(c.fusionBytes, 33554432u);
  EXPECT_EQ(c.stallCheck, Millis(7000));
  ::setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
  EXPECT_EQ(readJobConfig(false).stallCheck, Millis(0));
  // Cortado's own names win over the aliases.
  ::setenv("CORTADO_LOG_LEVEL", "error", 1);
  ::setenv("CORTADO_FUSION_BYTES", "1M", 1);
  ::setenv("CORTADO_STALL_CHECK_MS", "250", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.logLevel, "error");
  EXPECT_EQ(c.fusionBytes, 1u << 20);
  EXPECT_EQ(c.stallCheck, Millis(250));
  ::setenv("HOROVOD_LOG_LEVEL", "fatal", 1);
  ::unsetenv("CORTADO_LOG_LEVEL");
  EXPECT_EQ(readJobConfig(false).logLevel, "error");
  for (const char* v : {"CORTADO_LOG_LEVEL", "CORTADO_FUSION_BYTES", "CORTADO_STALL_CHECK_MS",
                        "HOROVOD_LOG_LEVEL", "HOROVOD_FUSION_THRESHOLD",
                        "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE"})
    ::unsetenv(v);
}

}  // namespace
}  // namespace cortado
