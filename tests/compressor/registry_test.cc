#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "compressor/registry.h"
#include "core/common/error.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using ::testing::HasSubstr;
using testing::cpuRegistry;

std::string errorOf(const std::function<void()>& fn, ErrorCode want = ErrorCode::kInvalidArgument) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

TEST(Registry, HasEveryCpuCodec) {
  std::vector<std::string> want = {"bf16",   "dgc",     "efsignsgd", "fp16",    "natural", "onebit",
                                   "powersgd", "qsgd", "randomk", "signsgd", "terngrad", "topk"};
  EXPECT_EQ(cpuRegistry().names(Device::kCpu), want);
  EXPECT_TRUE(cpuRegistry().names(Device::kCuda).empty());
}

TEST(Registry, BuildsFromSpecWithCanonicalForm) {
  auto c = cpuRegistry().create("topk:ratio=0.05");
  EXPECT_EQ(c->id(), CodecId::kTopK);
  EXPECT_EQ(c->spec(), "topk:ratio=0.05");
  EXPECT_EQ(cpuRegistry().create("topk")->spec(), "topk:ratio=0.01");
  EXPECT_EQ(cpuRegistry().create(" qsgd : levels = 3 ")->spec(), "qsgd:levels=3");
  EXPECT_EQ(cpuRegistry().canonical("dgc:momentum=0.5"), "dgc:ratio=0.001,sample=0.01,momentum=0.5");
  EXPECT_EQ(cpuRegistry().create("fp16")->spec(), "fp16");
}

TEST(Registry, UnknownNameListsValidOnes) {
  auto msg = errorOf([] { cpuRegistry().create("top-k:ratio=0.1"); });
  EXPECT_THAT(msg, HasSubstr("unknown codec 'top-k'"));
  EXPECT_THAT(msg, HasSubstr("topk"));
  EXPECT_THAT(msg, HasSubstr("powersgd"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("fp16", Device::kCuda); }),
              HasSubstr("(none registered)"));
}

TEST(Registry, BadParametersSayWhatIsValid) {
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:k=10"); }),
              HasSubstr("no parameter 'k': valid are: ratio"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:ratio=abc"); }), HasSubstr("not a number"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:ratio=2"); }), HasSubstr("out of range"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:ratio=0"); }), HasSubstr("out of range"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("qsgd:levels=2.5"); }),
              HasSubstr("must be an integer"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("qsgd:levels=128"); }), HasSubstr("[1, 127]"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("fp16:x=1"); }),
              HasSubstr("it takes no parameters"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:ratio"); }), HasSubstr("has no value"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:ratio=0.1,ratio=0.2"); }),
              HasSubstr("given twice"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create(":ratio=1"); }), HasSubstr("no codec name"));
  EXPECT_THAT(errorOf([] { cpuRegistry().create("topk:ratio=nan"); }), HasSubstr("not a number"));
}

TEST(Registry, DuplicateRegistrationIsAnError) {
  Registry r;
  registerCpuCodecs(r);
  EXPECT_THAT(errorOf([&] { registerCpuCodecs(r); }), HasSubstr("already registered"));
}

TEST(Registry, HelpListsParameters) {
  auto h = cpuRegistry().help();
  EXPECT_THAT(h, HasSubstr("dgc:"));
  EXPECT_THAT(h, HasSubstr("momentum"));
}

}  // namespace
}  // namespace cortado::compressor
