#include "compressor/compact.h"

#include <cstring>
#include <optional>

#include "compressor/format.h"
#include "compressor/sparse_sum.h"
#include "compressor/varint.h"
#include "core/common/error.h"

namespace cortado::compressor {
namespace {

// The plain payload's header when it is a well-formed plain top-k or DGC
// payload (its indices not read yet); nullopt otherwise.
std::optional<PayloadHeader> plainSparseHeader(std::span<const std::byte> plain) {
  PayloadHeader h;
  try {
    h = parseHeader(plain);
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!listsIndices(h.codec) || h.flags != 0 || h.count > h.numel ||
      h.numel > format::kMaxSparseNumel || h.bodyBytes != format::sparseBody(h.count))
    return std::nullopt;
  return h;
}

// The raw header fields a run's walk needs before the header is parsed.
struct RawHeader {
  uint8_t codec, flags;
  uint64_t body;
};
RawHeader rawHeader(const std::byte* p) {
  return {static_cast<uint8_t>(p[5]), static_cast<uint8_t>(p[7]), loadLe<uint64_t>(p + 16)};
}
bool looksCompact(const RawHeader& r) {
  return (r.codec == uint8_t(CodecId::kTopK) || r.codec == uint8_t(CodecId::kDgc)) &&
         (r.flags & kCompactIndicesFlag);
}

// Size of the payload at run[at..]: header plus the body its header
// declares; 0 where the rest holds no header or not that body.
size_t sizeAt(std::span<const std::byte> run, size_t at) {
  const size_t left = run.size() - at;
  if (left < kHeaderBytes) return 0;
  const uint64_t body = loadLe<uint64_t>(run.data() + at + 16);
  return body <= left - kHeaderBytes ? kHeaderBytes + size_t(body) : 0;
}

// What a compact payload's header must say before its body is read: the
// flag alone, a count within the tensor and u32 indices, and 5 to 9 body
// bytes per index (so the plain form is at most 1.6 times the body plus
// the header: a header cannot make the receiver allocate more).
void checkCompactHeader(const PayloadHeader& h) {
  const char* name = codecIdName(h.codec);
  CORTADO_ENFORCE(listsIndices(h.codec) && h.flags == kCompactIndicesFlag, ErrorCode::kProtocol,
                  "not a compact top-k or DGC payload: {}", describe(h));
  CORTADO_ENFORCE(h.numel <= format::kMaxSparseNumel && h.count <= h.numel, ErrorCode::kProtocol,
                  "compact {} payload lists {} indices of a {}-element tensor (at most the "
                  "elements, and fewer than 2^32)",
                  name, h.count, h.numel);
  CORTADO_ENFORCE(h.bodyBytes >= 5 * h.count && h.bodyBytes <= 9 * h.count, ErrorCode::kProtocol,
                  "compact {} payload: the body has {} bytes, {} indices need {} to {} (a "
                  "truncated payload?)",
                  name, h.bodyBytes, h.count, 5 * h.count, 9 * h.count);
}

// The compact form of a plain top-k or DGC payload: its bytes (0 when the
// payload is not one, or its indices are not strictly ascending and in
// range) and how many entries it keeps (the non-zero ones).
struct CompactSize {
  size_t bytes = 0;
  uint64_t kept = 0;
};

CompactSize measureCompact(std::span<const std::byte> plain) {
  const auto h = plainSparseHeader(plain);
  if (!h) return {};
  const std::byte* idx = plain.data() + kHeaderBytes;
  const std::byte* val = idx + 4 * h->count;
  size_t kept = 0, varints = 0;
  uint64_t next = 0;  // the smallest index the next one may be
  uint64_t after = 0;  // one past the last index kept
  for (uint64_t i = 0; i < h->count; ++i) {
    const uint32_t j = loadLe<uint32_t>(idx + 4 * i);
    if (j < next || j >= h->numel) return {};
    next = uint64_t(j) + 1;
    if (loadLe<float>(val + 4 * i) == 0.0f) continue;  // adds nothing: not sent
    ++kept;
    varints += varintBytes(static_cast<uint32_t>(j - after));
    after = uint64_t(j) + 1;
  }
  return {kHeaderBytes + 4 * kept + varints, kept};
}

}  // namespace

bool isCompact(const PayloadHeader& h) {
  return listsIndices(h.codec) && (h.flags & kCompactIndicesFlag);
}

size_t compactBytes(std::span<const std::byte> plain) { return measureCompact(plain).bytes; }

size_t compactSparsePayload(std::span<const std::byte> plain, std::span<std::byte> out) {
  const CompactSize size = measureCompact(plain);
  const size_t need = size.bytes;
  CORTADO_ENFORCE(need > 0, ErrorCode::kInvalidArgument,
                  "compactSparsePayload: the {}-byte payload is not a plain top-k or DGC payload "
                  "with strictly ascending indices",
                  plain.size());
  CORTADO_ENFORCE(out.size() >= need, ErrorCode::kInvalidArgument,
                  "compactSparsePayload: the compact form needs {} bytes, the output has {}", need,
                  out.size());
  PayloadHeader h = parseHeader(plain);
  const uint64_t k = h.count;
  const std::byte* idx = plain.data() + kHeaderBytes;
  const std::byte* val = idx + 4 * k;
  h.flags = kCompactIndicesFlag;
  h.count = size.kept;
  h.bodyBytes = need - kHeaderBytes;
  writeHeader(h, out);
  std::byte* v = out.data() + kHeaderBytes;
  std::byte* p = v + 4 * size.kept;
  uint64_t after = 0;
  for (uint64_t i = 0; i < k; ++i) {
    const float x = loadLe<float>(val + 4 * i);
    if (x == 0.0f) continue;
    const uint32_t j = loadLe<uint32_t>(idx + 4 * i);
    std::memcpy(v, val + 4 * i, 4);  // the value's bits as they are
    v += 4;
    p = writeVarint(p, static_cast<uint32_t>(j - after));
    after = uint64_t(j) + 1;
  }
  return need;
}

size_t expandedBytes(const PayloadHeader& h) { return kHeaderBytes + format::sparseBody(h.count); }

size_t expandSparsePayload(std::span<const std::byte> compact, std::span<std::byte> out) {
  const PayloadHeader h = parseHeader(compact);
  checkCompactHeader(h);
  const char* name = codecIdName(h.codec);
  const std::byte* vals = compact.data() + kHeaderBytes;
  const auto* begin = reinterpret_cast<const uint8_t*>(vals + 4 * h.count);
  const auto* end = reinterpret_cast<const uint8_t*>(compact.data() + compact.size());
  const GapWalk w = walkGaps(begin, end, h.count, h.numel, [](uint64_t, uint64_t) { return true; });
  CORTADO_ENFORCE(w.stop != GapStop::kBadVarint, ErrorCode::kProtocol,
                  "compact {} payload: gap #{} (byte {} of the index list) is truncated, longer "
                  "than 5 bytes, overlong or past 32 bits",
                  name, w.at, w.bytes);
  CORTADO_ENFORCE(w.stop != GapStop::kOutOfRange, ErrorCode::kProtocol,
                  "compact {} payload: index #{} is {}, out of range for {} elements", name, w.at,
                  w.index, h.numel);
  CORTADO_ENFORCE(w.stop != GapStop::kLeftOver, ErrorCode::kProtocol,
                  "compact {} payload: {} bytes left over after its {} indices", name, w.bytes,
                  h.count);
  // Canonical: the compact form leaves zero values out (a sender never
  // lists one), so that expanding and compacting again gives the same bytes.
  for (uint64_t i = 0; i < h.count; ++i)
    CORTADO_ENFORCE(loadLe<float>(vals + 4 * i) != 0.0f, ErrorCode::kProtocol,
                    "compact {} payload: value #{} is zero (the compact form leaves zeros out)",
                    name, i);
  const size_t total = expandedBytes(h);
  CORTADO_ENFORCE(out.size() >= total, ErrorCode::kInvalidArgument,
                  "expanding a compact {} payload of {} indices needs {} bytes, the output has {}",
                  name, h.count, total, out.size());
  PayloadHeader plain = h;
  plain.flags = 0;
  plain.bodyBytes = format::sparseBody(h.count);
  writeHeader(plain, out);
  std::byte* idx = out.data() + kHeaderBytes;
  if (h.count > 0) std::memcpy(idx + 4 * h.count, vals, 4 * h.count);
  const uint8_t* p = begin;
  uint64_t next = 0;
  for (uint64_t i = 0; i < h.count; ++i) {
    uint32_t g = 0;
    p = readVarint(p, end, g);
    next += g;
    storeLe<uint32_t>(idx + 4 * i, static_cast<uint32_t>(next));
    ++next;
  }
  return total;
}

size_t compactedRunBytes(std::span<const std::byte> run) {
  size_t total = 0;
  for (size_t at = 0; at < run.size();) {
    const size_t n = sizeAt(run, at);
    if (n == 0) return run.size();
    const size_t c = compactBytes(run.subspan(at, n));
    total += c > 0 && c < n ? c : n;
    at += n;
  }
  return total;
}

size_t compactRun(std::span<const std::byte> run, std::span<std::byte> out) {
  const size_t total = compactedRunBytes(run);
  CORTADO_ENFORCE(out.size() >= total, ErrorCode::kInvalidArgument,
                  "compactRun: the compacted payloads need {} bytes, the output has {}", total,
                  out.size());
  if (total == run.size()) {
    if (!run.empty()) std::memcpy(out.data(), run.data(), run.size());
    return total;
  }
  size_t w = 0;
  for (size_t at = 0; at < run.size();) {
    const size_t n = sizeAt(run, at);
    const auto one = run.subspan(at, n);
    const size_t c = compactBytes(one);
    if (c > 0 && c < n) {
      w += compactSparsePayload(one, out.subspan(w));
    } else {
      std::memcpy(out.data() + w, one.data(), n);
      w += n;
    }
    at += n;
  }
  return w;
}

std::span<const std::byte> expandRun(std::span<const std::byte> run,
                                     std::vector<std::byte>& scratch) {
  // First pass: the headers alone. A run that does not split into whole
  // payloads before any compact one is left to the codecs' checks, which
  // refuse it as they always have; once a payload claims the compact form,
  // whatever is wrong is this function's to say.
  size_t total = 0, at = 0, payloads = 0;
  bool compact = false;
  for (; at < run.size(); ++payloads) {
    const size_t left = run.size() - at;
    if (left < kHeaderBytes) {
      CORTADO_ENFORCE(!compact, ErrorCode::kProtocol,
                      "payload #{} (byte {}) is cut short: {} bytes, a header needs {}", payloads,
                      at, left, kHeaderBytes);
      return run;
    }
    const RawHeader r = rawHeader(run.data() + at);
    const bool mine = looksCompact(r);
    if (r.body > left - kHeaderBytes) {
      CORTADO_ENFORCE(!(compact || mine), ErrorCode::kProtocol,
                      "{}payload #{} (byte {}) declares a {}-byte body but {} bytes follow its "
                      "header (a truncated payload?)",
                      mine ? "compact " : "", payloads, at, r.body, left - kHeaderBytes);
      return run;
    }
    const size_t n = kHeaderBytes + size_t(r.body);
    if (mine) {
      compact = true;
      PayloadHeader h;
      try {
        h = parseHeader(run.subspan(at, n));
        checkCompactHeader(h);
      } catch (const Error& e) {
        throw Error(ErrorCode::kProtocol,
                    fmt::format("compact payload #{} (byte {}): {}", payloads, at, e.what()));
      }
      total += expandedBytes(h);
    } else {
      total += n;
    }
    at += n;
  }
  if (!compact) return run;
  scratch.resize(total);
  size_t w = 0;
  at = 0;
  for (size_t i = 0; at < run.size(); ++i) {
    const size_t n = kHeaderBytes + size_t(rawHeader(run.data() + at).body);
    const auto one = run.subspan(at, n);
    if (looksCompact(rawHeader(one.data()))) {
      try {
        w += expandSparsePayload(one, std::span<std::byte>(scratch).subspan(w));
      } catch (const Error& e) {
        throw Error(e.code(), payloads > 1 ? fmt::format("payload #{}: {}", i, e.what())
                                           : std::string(e.what()));
      }
    } else {
      std::memcpy(scratch.data() + w, one.data(), n);
      w += n;
    }
    at += n;
  }
  return {scratch.data(), w};
}

}  // namespace cortado::compressor
