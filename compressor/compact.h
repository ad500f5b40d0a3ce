// The compact wire form of top-k and DGC payloads (docs/codecs.md, "Compact
// index lists"). A plain top-k or DGC payload sends k u32 indices, then k
// f32 values: 8 bytes per kept element. Its indices ascend, so the gaps
// between them are small at the densities these codecs run at: as LEB128
// varints (varint.h) a gap below 128 takes one byte, below 16384 two, so
// at 1% to 10% density the payload takes about 5 bytes per kept element
// (about 6 at 0.1%).
//
// The compact form is for the wire only. Codecs keep their fixed
// payloadBytes(n) (collectives and buffers rely on it) and never read it:
// the worker engine compacts what it pushes, the plan executor the payloads
// it gathers and pushes, and the servers their sparse answers, each only
// where that is smaller, and the receiver expands before anything else
// reads the payload.
//
// Zero values are not sent. A top-k or DGC payload lists k elements however
// many non-zeros the tensor has: where it has fewer (an embedding's
// gradient is non-zero only in the rows of the step's words), the
// selection fills the payload up with zeros. The compact form leaves out
// every entry whose value is zero (+0 or -0), so it lists k' = min(k,
// non-zeros) entries, and the payload expands to a plain one of k'
// entries: the same entries less the zeros, which add nothing to any sum
// (the receivers, the servers and the executor's decoders, take any count).
// Where no value is zero the two forms are bit for bit the same payload
// once expanded. The sender's error feedback is computed on its plain
// payload, whose zeros subtract nothing, so it stays exact.
//
// Compact form: the same 48-byte header (payload.h) with flag
// kCompactIndicesFlag set (no other flag), count = k' (the entries listed)
// and the body size of this body:
//
//   k' x f32 values, in the plain payload's order, none of them zero
//   k' unsigned LEB128 varints that end with the payload: the first is the
//   first index i_0, each next one i_j - i_(j-1) - 1 (so the indices
//   strictly ascend); every index below numel
//
// Expanding checks the whole payload before it writes anything and never
// reads past its end; what is wrong is thrown as Error(kProtocol).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compressor/payload.h"

namespace cortado::compressor {

// Header flag of the compact form (top-k and DGC payloads only).
inline constexpr uint8_t kCompactIndicesFlag = 0x80;

// True for a header of a compact top-k or DGC payload.
bool isCompact(const PayloadHeader& h);

// Bytes of the compact form of `plain` (its non-zero entries), or 0 where
// it has none: not a well-formed plain top-k or DGC payload (another codec,
// a flag set, a body of other than 8 bytes per listed index), or indices
// that do not strictly ascend or reach past numel. Reads every entry.
size_t compactBytes(std::span<const std::byte> plain);

// Writes the compact form of `plain` (compactBytes(plain) > 0) into out,
// which must hold compactBytes(plain) bytes; returns the bytes written.
// Throws kInvalidArgument where `plain` has no compact form or out is short.
size_t compactSparsePayload(std::span<const std::byte> plain, std::span<std::byte> out);

// Bytes of the plain form of the compact payload `h` describes (48 + 8k).
size_t expandedBytes(const PayloadHeader& h);

// Checks the compact payload `compact` whole (header, flags, k <= numel <
// 2^32, body size between 5 and 9 bytes per index, every varint complete,
// at most 5 bytes, not overlong, within 32 bits, every index below numel,
// no bytes left over, no value zero), then writes its plain form into out, which must
// hold expandedBytes() bytes. Returns the bytes written. Throws kProtocol
// naming what is wrong, writing nothing.
size_t expandSparsePayload(std::span<const std::byte> compact, std::span<std::byte> out);

// Runs of payloads back to back (a push of the plan executor carries one or
// more payloads of a chunk).
//
// The bytes of `run` with every top-k and DGC payload that has a smaller
// compact form compacted; run.size() when none has (or the run does not
// parse as whole payloads: it is then sent as it is, for the receiver to
// refuse).
size_t compactedRunBytes(std::span<const std::byte> run);
// Writes that form into out (compactedRunBytes(run) bytes); returns them.
size_t compactRun(std::span<const std::byte> run, std::span<std::byte> out);
// The plain form of `run`: `run` itself when it holds no compact payload,
// else a view of `scratch`, into which every compact payload is expanded
// (and the plain ones copied). Checks every header it walks: a run that
// does not split into whole payloads, or a malformed compact payload,
// throws kProtocol naming the payload's position.
std::span<const std::byte> expandRun(std::span<const std::byte> run,
                                     std::vector<std::byte>& scratch);

}  // namespace cortado::compressor
