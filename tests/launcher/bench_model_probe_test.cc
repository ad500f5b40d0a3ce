// The model bench's codec probe smoothing (launcher/bench_model.h) against
// hand-worked cases: spikes of one size go, the genuine shapes stay.
#include <gtest/gtest.h>

#include <vector>

#include "launcher/bench_model.h"

namespace cortado::launcher {
namespace {

TEST(CodecProbes, AnEncodeSpikeIsTakenAtItsLargerNeighbour) {
  // Measured in one run (DGC, us, sizes 64 .. 2359296): 65536 elements at
  // 2637 between 197 and 551.
  std::vector<double> enc = {11, 13, 21, 51, 197, 2637, 551, 1813, 3534};
  std::vector<double> dec(enc.size(), 1.0);
  smoothCodecProbes(enc, dec);
  EXPECT_EQ(enc, (std::vector<double>{11, 13, 21, 51, 197, 551, 551, 1813, 3534}));
  // The drop where the selection starts sampling (16384: 204 us, 65536: 141
  // us) is real and stays, and so does a rise of up to 3x the larger
  // neighbour; the first and last sizes have one neighbour and stay.
  enc = {900, 13, 20, 47, 204, 141, 435, 1305, 7276, 90000};
  dec.assign(enc.size(), 1.0);
  const std::vector<double> want = enc;
  smoothCodecProbes(enc, dec);
  EXPECT_EQ(enc, want);
}

TEST(CodecProbes, ADecodeDearerThanALargerSizeIsCappedAtIt) {
  // One run: 1048576 elements at 2373 us between 497 and 406.
  std::vector<double> dec = {2, 2, 3, 3, 5, 12, 497, 2373, 406};
  std::vector<double> enc(dec.size(), 1.0);
  smoothCodecProbes(enc, dec);
  EXPECT_EQ(dec, (std::vector<double>{2, 2, 3, 3, 5, 12, 406, 406, 406}));
  EXPECT_EQ(enc, std::vector<double>(dec.size(), 1.0));  // a flat encode stays
  // A non-decreasing curve is left as it is; short ones too.
  dec = {1, 2, 2, 8, 30};
  smoothCodecProbes(enc, dec);
  EXPECT_EQ(dec, (std::vector<double>{1, 2, 2, 8, 30}));
  std::vector<double> none, one = {5}, two = {9, 3};
  std::vector<double> e0, e1 = {5}, e2 = {9, 3};
  smoothCodecProbes(e0, none);
  smoothCodecProbes(e1, one);
  smoothCodecProbes(e2, two);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(one, std::vector<double>{5});
  EXPECT_EQ(two, (std::vector<double>{3, 3}));
  EXPECT_EQ(e2, (std::vector<double>{9, 3}));
}

}  // namespace
}  // namespace cortado::launcher
