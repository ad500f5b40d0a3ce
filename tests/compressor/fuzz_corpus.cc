// Writes a seed corpus for fuzz_decode: valid payloads of every fuzzed codec
// at a few sizes, each prefixed with the codec's index.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "compressor/compact.h"
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
  // Zen (byte 0 one past the codecs): COO pushes (ascending and not), delta-coded
  // pushes, bitmap and index-list answers, stage lists.
  for (uint64_t n : {1, 40, 300}) {
    zen::Ownership own(n, 3, 9);
    auto list = zen::ownedIndices(own, 1);
    std::vector<uint32_t> idx(list.begin(), list.begin() + list.size() / 2);
    std::vector<float> val(idx.size(), 1.5f);
    zen::ServerSum sum(own, 1);
    auto coo = zen::encodeCoo(own, 1, idx, val);
    // The same pairs out of order (as the hash table's slot order is).
    auto cooDown = zen::encodeCoo(own, 1, std::vector<uint32_t>(idx.rbegin(), idx.rend()), val);
    auto delta = zen::encodeDeltaPush(own, 1, idx, val);
    sum.add(coo);
    auto bitmap = sum.answer(zen::ServerSum::Form::kBitmap);
    sum.add(coo);
    auto indexList = sum.answer(zen::ServerSum::Form::kIndexList);
    zen::CooList stage{idx, val};
    auto stageBytes = zen::encodeStageList(stage);
    for (const auto* p : {&coo, &cooDown, &delta, &bitmap, &indexList, &stageBytes}) {
      std::ofstream f(std::string(argv[1]) + "/seed_zen_" + std::to_string(n) +
                          (p == &coo         ? "_coo"
                           : p == &cooDown   ? "_coo_down"
                           : p == &delta     ? "_delta"
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
  // The compact form (byte 0 two past the codecs): top-k and DGC payloads
  // compacted, alone and two back to back with a plain one.
  for (const char* spec : {"topk:ratio=0.1", "dgc:ratio=0.1", "topk:ratio=0.5"}) {
    auto codec = r.create(spec);
    for (size_t n : {1, 40, 300}) {
      std::vector<float> x(n);
      for (auto& v : x) v = d(rng);
      std::vector<std::byte> plain(codec->payloadBytes(n));
      codec->encode(x.data(), n, plain, EncodeContext{});
      const size_t bytes = compactBytes(plain);
      if (bytes == 0) continue;
      // One buffer: the compact payload, the plain one, the compact one again.
      std::vector<std::byte> run(2 * bytes + plain.size());
      compactSparsePayload(plain, std::span(run).first(bytes));
      std::copy(plain.begin(), plain.end(), run.begin() + std::ptrdiff_t(bytes));
      std::copy_n(run.begin(), bytes, run.end() - std::ptrdiff_t(bytes));
      std::vector<std::byte> compact(run.begin(), run.begin() + std::ptrdiff_t(bytes));
      int which = 0;
      for (const auto* p : {&compact, &run}) {
        std::ofstream f(std::string(argv[1]) + "/seed_compact_" + codec->spec() + "_" +
                            std::to_string(n) + (which++ ? "_run" : ""),
                        std::ios::binary);
        char pick = static_cast<char>(fuzz::kSpecs.size() + 1);
        f.write(&pick, 1);
        f.write(reinterpret_cast<const char*>(p->data()), static_cast<std::streamsize>(p->size()));
        ++files;
      }
    }
  }
  std::printf("wrote %d seed payloads to %s\n", files, argv[1]);
  return 0;
}
