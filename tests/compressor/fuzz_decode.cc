// libFuzzer target: arbitrary bytes as a payload for every decoder entry
// point. Input: byte 0 picks the codec (fuzz_specs.h), the rest is the
// payload, copied into a buffer of exactly its size so that AddressSanitizer
// catches any read past the end. A decoder may accept the input or throw
// cortado::Error(kProtocol); anything else (a crash, another exception, an
// ASan report) is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "compressor/payload.h"
#include "compressor/registry.h"
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Codecs* codecs = new Codecs;  // built once, never freed: the harness's own state
  if (size < 1) return 0;
  const Codec& codec = *codecs->list[data[0] % codecs->list.size()];
  std::unique_ptr<std::byte[]> buf(new std::byte[size - 1]);
  if (size > 1) std::memcpy(buf.get(), data + 1, size - 1);
  std::span<const std::byte> payload(buf.get(), size - 1);

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
