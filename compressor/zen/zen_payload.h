// Zen's payloads (specs/zen.md §3, §7.5): a worker's push to server p
// lists the (index, value) pairs that p owns, as COO (u32 indices) or, where
// that is fewer bytes and the pairs are given ascending, delta-coded (the
// indices as LEB128 varint gaps, the index list's coding below); p's answer to a
// pull is a hash bitmap, one bit per index of I_p (ascending, zen_hash.h)
// set where the round's sum is non-zero, then those non-zero values in I_p
// order. The bitmap costs |G| / 8 bytes over all servers whatever their
// number, so it stays smaller than the dense sum up to very high densities.
// For a sparser sum the answer is an index list instead: the same values,
// then the ascending indices of the non-zeros as gaps in LEB128 varints
// (1-2 bytes per non-zero where the bitmap costs 1/density bits), which
// decodes in O(non-zeros) rather than O(|I_p|) and without reading I_p. A server sends
// whichever form is fewer bytes for that answer; the kind byte says which
// (decodeAnswer reads both).
//
// All four start with the same 48-byte little-endian header:
//
//   off size field
//     0    4 magic "ZENS"
//     4    1 version (kZenVersion)
//     5    1 kind: 1 = COO push, 2 = bitmap answer, 3 = index-list answer,
//                4 = delta-coded push
//     6    1 dtype: float32 (the only one for now)
//     7    1 reserved, zero
//     8    8 numel |G| of the dense tensor (<= kMaxElements)
//    16    4 servers n
//    20    4 server p (< n)
//    24    8 seed of the ownership hash h0
//    32    8 count: pairs (pushes) or non-zeros (answers)
//    40    8 list size |I_p| (answers); zero for pushes
//
//   COO body:    count x u32 index, then count x f32 value
//   bitmap body: ceil(|I_p| / 8) bytes of bits, LSB first (bits past |I_p|
//                zero), then count x f32 value; count = bits set
//   index-list body: count x f32 value, then count unsigned LEB128 varints
//                (7 bits a byte, low bits first, high bit = more follow; at
//                most 5 bytes, no overlong form) that end with the payload:
//                the first is the index i_0 of the first non-zero, each
//                next one i_k - i_(k-1) - 1; every index < |G| and owned by
//                server p, count <= |I_p|
//   delta-coded push body: count x f32 value, then count varints coded as
//                the index list's (so the indices strictly ascend: none is
//                listed twice); every index < |G| (ownership and the
//                varints' form are checked by ServerSum::add)
//
// Every parse checks the whole payload before anything is written and never
// reads past its end; what is wrong is thrown as Error(kProtocol), which the
// server or worker extends with the tensor and the sender.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "compressor/varint.h"
#include "compressor/zen/zen_hash.h"

namespace cortado::compressor::zen {

inline constexpr uint32_t kZenMagic = 0x534e455au;  // "ZENS" in memory order
inline constexpr uint8_t kZenVersion = 1;
inline constexpr size_t kZenHeaderBytes = 48;

enum class Kind : uint8_t { kCoo = 1, kBitmap = 2, kIndexList = 3, kDeltaPush = 4 };

struct ZenHeader {
  Kind kind = Kind::kCoo;
  uint64_t numel = 0;
  uint32_t servers = 1;
  uint32_t server = 0;
  uint64_t seed = 0;
  uint64_t count = 0;
  uint64_t listSize = 0;
  bool operator==(const ZenHeader&) const = default;
};

// Bytes of a COO push of `pairs` pairs, of a bitmap answer, and of an
// index-list answer of the ascending indices `indices`.
size_t cooBytes(uint64_t pairs);
size_t bitmapBytes(uint64_t listSize, uint64_t nonzeros);
size_t indexListBytes(std::span<const uint32_t> indices);
// Bytes of a delta-coded push of the strictly ascending `indices` (the
// index list's size: values and varint gaps).
size_t deltaPushBytes(std::span<const uint32_t> indices);
// Bytes of one LEB128 varint of v (1 to 5; compressor/varint.h).
using compressor::varintBytes;

// The push of the pairs `index` to a server: delta-coded where `compact`,
// the indices strictly ascend and that form is fewer bytes; COO otherwise.
enum class PushForm { kCoo, kDelta };
PushForm choosePushForm(std::span<const uint32_t> index, bool compact);
// Bytes of the push in that form.
size_t pushBytes(std::span<const uint32_t> index, PushForm form);

// Parses and checks what the header alone can tell (size, magic, version,
// kind, dtype, reserved, numel, server < servers, body size exact for the
// kind and count). Safe on any input.
ZenHeader parseZenHeader(std::span<const std::byte> payload);

// The ownership a header promises; throws kProtocol when it differs from
// `own` (another tensor size, server count or seed) or names another server.
void expectPartition(const ZenHeader& h, const Ownership& own, uint32_t server);

// Writes a COO push for server p of ownership `own`; out must hold
// cooBytes(index.size()). Returns the bytes written.
size_t writeCoo(const Ownership& own, uint32_t server, std::span<const uint32_t> index,
                std::span<const float> value, std::span<std::byte> out);
std::vector<std::byte> encodeCoo(const Ownership& own, uint32_t server,
                                 std::span<const uint32_t> index, std::span<const float> value);

// Writes the push for server p in `form` (kDelta needs strictly ascending
// indices: kInvalidArgument otherwise); out must hold pushBytes(index,
// form). Returns the bytes written.
size_t writePush(const Ownership& own, uint32_t server, std::span<const uint32_t> index,
                 std::span<const float> value, PushForm form, std::span<std::byte> out);
std::vector<std::byte> encodeDeltaPush(const Ownership& own, uint32_t server,
                                       std::span<const uint32_t> index,
                                       std::span<const float> value);

// A parsed COO push: views into the payload. Indices are unchecked here;
// ServerSum::add checks range, ownership and duplicates.
struct CooView {
  ZenHeader header;
  const std::byte* index = nullptr;  // count x u32, little-endian, unaligned
  const std::byte* value = nullptr;  // count x f32
  uint32_t indexAt(size_t i) const;
  float valueAt(size_t i) const;
};
CooView parseCoo(std::span<const std::byte> payload);

// A parsed delta-coded push: the values, and the varint gaps from `gaps` to
// `end` (the payload's end), unchecked here (ServerSum::add decodes them
// with compressor::readVarint, which refuses a truncated, overlong or too
// long varint, and checks range and ownership and that none is left over).
struct DeltaView {
  ZenHeader header;
  const std::byte* value = nullptr;  // count x f32, little-endian, unaligned
  const uint8_t* gaps = nullptr;
  const uint8_t* end = nullptr;
  float valueAt(size_t i) const;
};
DeltaView parseDeltaPush(std::span<const std::byte> payload);

// Writes the bitmap answer of server p: list = I_p, present[t] says whether
// position t is non-zero, values are those non-zeros in order.
std::vector<std::byte> encodeBitmap(const Ownership& own, uint32_t server,
                                    std::span<const uint32_t> list,
                                    std::span<const uint64_t> presentBits,
                                    std::span<const float> values);

// Writes the index-list answer of server p (which owns listSize indices):
// indices are the non-zeros' indices ascending, values theirs.
std::vector<std::byte> encodeIndexList(const Ownership& own, uint32_t server, uint64_t listSize,
                                       std::span<const uint32_t> indices,
                                       std::span<const float> values);

// Checks a bitmap answer against I_p (the list size, the bit count, the
// padding bits) and then calls fn(index, value) for each non-zero in
// ascending index order. Nothing is called for a malformed answer.
void decodeBitmap(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                  std::span<const uint32_t> list, const std::function<void(uint32_t, float)>& fn);
// A server's answer in either form: the bitmap above, or the index list.
// The index list is checked whole first: its list size is |I_p|, every
// varint complete, at most 5 bytes, not overlong and within 32 bits, every
// index below |G| and owned by `server` (so at most |I_p| of them), no
// bytes left over. fn(index, value) is called for
// each non-zero in ascending order, nothing for a malformed answer. Cost:
// O(|I_p| / 8 + non-zeros) for a bitmap, O(non-zeros) for an index list.
void decodeAnswer(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                  std::span<const uint32_t> list, const std::function<void(uint32_t, float)>& fn);
void decodeAnswerInto(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                      std::span<const uint32_t> list, float* dense);

// A server's answer checked whole (decodeAnswer's checks), with the
// indices of its non-zeros decoded, ascending; the values stay in the
// payload, which must outlive this.
struct CheckedAnswer {
  ZenHeader header;
  std::vector<uint32_t> index;
  const std::byte* values = nullptr;  // header.count x f32, little-endian, unaligned
};
// Throws Error(kProtocol) for a malformed answer of server p (then `out`
// is unspecified). Cost: decodeAnswer's, without its calls.
void checkAnswer(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                 std::span<const uint32_t> list, CheckedAnswer& out);

// The dense sum from every server's checked answer (the servers own
// disjoint indices): dense[i] = scale * value where an answer names i, 0
// everywhere else, for i < numElements. One pass over dense: each block of
// it is zeroed and gets every answer's values for it while it is in the
// cache (each answer ascends), and is then streamed out, rather than
// zeroing dense whole and then storing each answer's values into it at a
// cache miss per non-zero on a large tensor. Cost O(numElements +
// non-zeros). Answers not filled by checkAnswer (indices that do not ascend
// or lie past numElements, a count that differs) throw kInvalidArgument,
// with nothing read or written out of bounds.
void assembleDense(std::span<const CheckedAnswer> answers, uint64_t numElements, float scale,
                   float* dense);

// The same, writing dense[index] = value (other elements untouched).
void decodeBitmapInto(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                      std::span<const uint32_t> list, float* dense);

}  // namespace cortado::compressor::zen
