// Writes a seed corpus for fuzz_decode: valid payloads of every fuzzed codec
// at a few sizes, each prefixed with the codec's index.
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "compressor/registry.h"
#include "compressor/zen/zen_payload.h"
#include "compressor/zen/zen_scheme.h"
#include "compressor/zen/zen_sum.h"
#include "fuzz_specs.h"

int main(int argc, char** argv) {
  using namespace cortado::compressor;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  Registry r;
  registerCpuCodecs(r);
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  int files = 0;
  for (size_t c = 0; c < fuzz::kSpecs.size(); ++c) {
    auto codec = r.create(fuzz::kSpecs[c]);
    for (size_t n : {0, 1, 5, 16, 33, 100}) {
      std::vector<float> x(n);
      for (auto& v : x) v = d(rng);
      EncodeContext ctx;
      ctx.seed = n;
      ctx.rows = codec->id() == CodecId::kPowerSgd && n == 100 ? 10 : 0;
      std::vector<std::byte> p(ctx.rows ? codec->payloadBytes(n, ctx.rows) : codec->payloadBytes(n));
      codec->encode(x.data(), n, p, ctx);
      std::ofstream f(std::string(argv[1]) + "/seed_" + std::to_string(c) + "_" + std::to_string(n),
                      std::ios::binary);
      char idx = static_cast<char>(c);
      f.write(&idx, 1);
      f.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size()));
      ++files;
    }
  }
  // Zen (byte 0 one past the codecs): COO pushes (ascending and not), bitmap and index-list
  // answers, stage lists.
  for (uint64_t n : {1, 40, 300}) {
    zen::Ownership own(n, 3, 9);
    auto list = zen::ownedIndices(own, 1);
    std::vector<uint32_t> idx(list.begin(), list.begin() + list.size() / 2);
    std::vector<float> val(idx.size(), 1.5f);
    zen::ServerSum sum(own, 1);
    auto coo = zen::encodeCoo(own, 1, idx, val);
    // The same pairs out of order (as the hash table's slot order is).
    auto cooDown = zen::encodeCoo(own, 1, std::vector<uint32_t>(idx.rbegin(), idx.rend()), val);
    sum.add(coo);
    auto bitmap = sum.answer(zen::ServerSum::Form::kBitmap);
    sum.add(coo);
    auto indexList = sum.answer(zen::ServerSum::Form::kIndexList);
    zen::CooList stage{idx, val};
    auto stageBytes = zen::encodeStageList(stage);
    for (const auto* p : {&coo, &cooDown, &bitmap, &indexList, &stageBytes}) {
      std::ofstream f(std::string(argv[1]) + "/seed_zen_" + std::to_string(n) +
                          (p == &coo         ? "_coo"
                           : p == &cooDown   ? "_coo_down"
                           : p == &bitmap    ? "_bitmap"
                           : p == &indexList ? "_indexlist"
                                             : "_stage"),
                      std::ios::binary);
      char pick = static_cast<char>(fuzz::kSpecs.size());
      f.write(&pick, 1);
      f.write(reinterpret_cast<const char*>(p->data()), static_cast<std::streamsize>(p->size()));
      ++files;
    }
  }
  std::printf("wrote %d seed payloads to %s\n", files, argv[1]);
  return 0;
}
