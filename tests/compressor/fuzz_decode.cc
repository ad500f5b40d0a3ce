// libFuzzer target: arbitrary bytes as a payload for every decoder entry
// point. Input: byte 0 picks the codec (fuzz_specs.h) or, one past the
// codecs, Zen's sparse payloads (a server's COO or delta-coded push check and sum, a
// worker's answer decode, a centralization stage's list; compressor/zen/),
// or, two past, the compact wire form of top-k and DGC payloads
// (compressor/compact.h: a payload and a run of them expanded, compacted);
// the rest is the payload, copied
// into a buffer of exactly its size so that AddressSanitizer catches any
// read past the end. A decoder may accept the input or throw
// cortado::Error(kProtocol); anything else (a crash, another exception, an
// ASan report) is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "compressor/compact.h"
#include "compressor/payload.h"
#include "compressor/registry.h"
#include "compressor/zen/zen_payload.h"
#include "compressor/zen/zen_scheme.h"
#include "compressor/zen/zen_sum.h"
#include "core/common/error.h"
#include "fuzz_specs.h"

using namespace cortado;
using namespace cortado::compressor;

namespace {

struct Codecs {
  Registry registry;
  std::vector<CodecPtr> list;
  Codecs() {
    registerCpuCodecs(registry);
    for (const char* s : fuzz::kSpecs) list.push_back(registry.create(s));
  }
};

template <typename Fn>
void expectProtocolOrOk(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kProtocol) {
      fprintf(stderr, "unexpected error code %s: %s\n", errorCodeName(e.code()), e.what());
      abort();
    }
  }
}

// Zen: the ownership is taken from the header when it is small enough to
// hash (so that well-formed payloads reach the index checks), else a fixed
// one that the header's check refuses.
void fuzzZen(std::span<const std::byte> payload) {
  using namespace cortado::compressor::zen;
  Ownership own(64, 2, 1);
  uint32_t server = 0;
  try {
    ZenHeader h = parseZenHeader(payload);
    if (h.numel <= (1u << 16) && h.servers <= 64) {
      own = Ownership(h.numel, h.servers, h.seed);
      server = h.server;
    }
  } catch (const Error&) {
  }
  ServerSum sum(own, server);
  expectProtocolOrOk([&] { sum.add(payload); });
  expectProtocolOrOk([&] { sum.add(payload); });  // again: a duplicate push of the same pairs
  expectProtocolOrOk([&] { (void)sum.answer(); });
  std::vector<float> out(own.numElements(), 0.0f);
  expectProtocolOrOk([&] { decodeBitmapInto(payload, own, server, sum.list(), out.data()); });
  expectProtocolOrOk([&] { decodeAnswerInto(payload, own, server, sum.list(), out.data()); });
  // The worker's way: the answer checked (its indices decoded), then
  // written with the other servers' (empty) answers into the whole output.
  IndexLists lists(own);
  std::vector<CheckedAnswer> answers(own.numServers());
  bool checked = true;
  for (uint32_t q = 0; q < own.numServers() && checked; ++q) {
    const std::vector<std::byte> empty = encodeIndexList(own, q, lists.of(q).size(), {}, {});
    checked = false;
    expectProtocolOrOk([&] {
      if (q == server) {
        checkAnswer(payload, own, q, lists.of(q), answers[q]);
      } else {
        checkAnswer(empty, own, q, lists.of(q), answers[q]);
        answers[q].values = nullptr;  // no values: `empty` goes out of scope
      }
      checked = true;
    });
  }
  if (checked) assembleDense(answers, own.numElements(), 0.5f, out.data());  // must not throw
  // A hierarchical-centralization stage's list (core/zen_collective.h), then
  // merged as a stage merges it.
  expectProtocolOrOk([&] {
    CooList l = parseStageList(payload, own.numElements());
    (void)mergeSum(l, l);
  });
}

// `plain` (a plain top-k or DGC payload that compacts) less its entries
// whose value is zero: what its compact form expands to.
std::vector<std::byte> withoutZeros(std::span<const std::byte> plain) {
  PayloadHeader h = parseHeader(plain);
  const std::byte* idx = plain.data() + kHeaderBytes;
  const std::byte* val = idx + 4 * h.count;
  std::vector<uint32_t> keptIdx;
  std::vector<float> keptVal;
  for (uint64_t i = 0; i < h.count; ++i)
    if (loadLe<float>(val + 4 * i) != 0.0f) {
      keptIdx.push_back(loadLe<uint32_t>(idx + 4 * i));
      keptVal.push_back(loadLe<float>(val + 4 * i));
    }
  h.count = keptIdx.size();
  h.bodyBytes = 8 * h.count;
  std::vector<std::byte> out(kHeaderBytes + h.bodyBytes);
  writeHeader(h, out);
  if (h.count > 0) {
    std::memcpy(out.data() + kHeaderBytes, keptIdx.data(), 4 * h.count);
    std::memcpy(out.data() + kHeaderBytes + 4 * h.count, keptVal.data(), 4 * h.count);
  }
  return out;
}

// A run as its compact form expands: each payload that compacts smaller,
// less its zeros; the others as they are (kProtocol where it does not split).
std::vector<std::byte> expectedAfterCompaction(std::span<const std::byte> run) {
  if (compactedRunBytes(run) == run.size()) return {run.begin(), run.end()};
  std::vector<std::byte> out;
  for (auto one : splitRun(run)) {
    const size_t c = compactBytes(one);
    if (c > 0 && c < one.size()) {
      const auto w = withoutZeros(one);
      out.insert(out.end(), w.begin(), w.end());
    } else {
      out.insert(out.end(), one.begin(), one.end());
    }
  }
  return out;
}

// The compact form: expanding refuses with kProtocol or gives a plain
// payload that compacts back to the input bit for bit (the form is
// canonical) and that the top-k decoder then checks; compacting any input
// gives 0 or a form that expands back to the input less its zero values;
// runs likewise.
void fuzzCompact(std::span<const std::byte> payload, const Codec& topk) {
  expectProtocolOrOk([&] {
    const PayloadHeader h = parseHeader(payload);
    // Big enough for any count the body can hold (5 bytes an index at least).
    std::vector<std::byte> plain(kHeaderBytes + 8 * std::min<uint64_t>(h.count, payload.size()));
    const size_t n = expandSparsePayload(payload, plain);
    const std::span<const std::byte> p(plain.data(), n);
    std::vector<std::byte> again(compactBytes(p));
    if (again.size() != payload.size()) abort();
    compactSparsePayload(p, again);
    if (std::memcmp(again.data(), payload.data(), payload.size()) != 0) abort();
    if (h.numel <= (1u << 20)) {
      std::vector<float> out(h.numel);
      topk.validate(p, h.numel);
      topk.decode(p, out.data(), h.numel);
    }
  });
  if (const size_t c = compactBytes(payload)) {
    const auto want = withoutZeros(payload);
    std::vector<std::byte> compact(c), back(want.size());
    compactSparsePayload(payload, compact);
    if (expandSparsePayload(compact, back) != want.size() || back != want) abort();
  }
  // A run: compacting it changes nothing that expanding shows.
  std::vector<std::byte> scratch, scratch2;
  std::span<const std::byte> want;
  bool expands = true;
  try {
    want = expandRun(payload, scratch);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kProtocol) abort();
    expands = false;
  }
  std::vector<std::byte> run(compactedRunBytes(payload));
  if (compactRun(payload, run) != run.size()) abort();
  if (expands) {
    const auto got = expandRun(run, scratch2);
    const auto expected = expectedAfterCompaction(want);
    if (got.size() != expected.size() ||
        (!got.empty() && std::memcmp(got.data(), expected.data(), got.size()) != 0))
      abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Codecs* codecs = new Codecs;  // built once, never freed: the harness's own state
  if (size < 1) return 0;
  std::unique_ptr<std::byte[]> buf(new std::byte[size - 1]);
  if (size > 1) std::memcpy(buf.get(), data + 1, size - 1);
  std::span<const std::byte> payload(buf.get(), size - 1);
  const size_t pick = data[0] % (codecs->list.size() + 2);
  if (pick == codecs->list.size()) {
    fuzzZen(payload);
    return 0;
  }
  if (pick == codecs->list.size() + 1) {
    fuzzCompact(payload, *codecs->list[5]);  // topk (fuzz_specs.h)
    return 0;
  }
  const Codec& codec = *codecs->list[pick];

  // The server knows n from the tensor's declaration; take it from the header
  // when it is plausible so that valid-looking payloads get past the n check.
  size_t n = 64;
  try {
    auto h = parseHeader(payload);
    if (h.numel <= (1u << 20)) n = h.numel;
  } catch (const Error&) {
  }
  std::vector<float> out(n, 1.0f);
  expectProtocolOrOk([&] { codec.validate(payload, n); });
  expectProtocolOrOk([&] { codec.decode(payload, out.data(), n); });
  expectProtocolOrOk([&] { codec.decompressAdd(payload, out.data(), n, 0.5f); });
  if (codec.sparse()) expectProtocolOrOk([&] { codec.zeroSent(payload, out.data(), n); });
  if (codec.summable()) {
    std::unique_ptr<std::byte[]> acc(new std::byte[size - 1]);
    if (size > 1) std::memcpy(acc.get(), data + 1, size - 1);
    expectProtocolOrOk([&] { codec.addPayload(std::span(acc.get(), size - 1), payload); });
  }
  return 0;
}
