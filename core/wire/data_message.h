// The data-plane wire format between workers and servers.
//
// Every message has two parts: a fixed 48-byte little-endian header, then a
// body (tensor bytes for PUSH and PULL_RESPONSE, UTF-8 text for ERROR, empty
// otherwise). decode() checks the magic, the version, the op, the dtype and
// that the body length matches what the header promises before anyone reads
// the body, so a malformed message is rejected with a reason, never read past
// its end.
//
// Compressed tensors (kFlagCompressed): a PUSH body is a preamble that names
// the tensor and its codec, then the codec payload (compressor/payload.h):
//   u16 specBytes | u16 nameBytes | spec | name | payload        (little-endian)
// so a server learns each key's codec from the pushes themselves, with no
// ordering between the control plane and the data plane to get wrong, and can
// name the tensor in its errors. A compressed PULL_RESPONSE body is a payload
// alone. Compressed messages never use kFlagShm.
//
// The plan executor (core/executor/executor.h) adds two forms: a compressed PUSH body
// may hold several payloads of the same chunk back to back (a machine's
// gathered, still-encoded contributions; the server decodes and adds each),
// and a PULL with kFlagCompressed whose body is a preamble alone asks for the
// round's sum of an uncompressed key in that codec's form.
//
// Sparse tensors (kFlagSparse; docs/zen.md): a tensor's key p lives on
// server p; a PUSH body is the compressed preamble with codec spec "zen" and
// a Zen COO payload of the (index, value) pairs that server p owns, and a
// PULL_RESPONSE body is a Zen hash-bitmap payload (compressor/zen/).
//
// Flow (sync mode): for each key and round a worker sends PUSH then PULL; the
// server sums the PUSHes of all workers for that round and answers each PULL
// with the round's sum once all have arrived. Async mode: each PUSH is added
// to the stored value at once and acknowledged with PUSH_ACK; PULL returns the
// stored value as it is.
//
// A server's budget of pushes received and not yet summed (sync and async;
// server/server_engine.h, "Push budget"): a PUSH that carries its bytes
// (not kFlagShm) and asks with kFlagAck is acknowledged with PUSH_ACK once
// the server has summed it, unless that push completed its round (then the
// PULL's answer, which follows on the same connection, says so). The worker
// counts the bytes it sent each server until then.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/common/buffer.h"
#include "core/common/dtype.h"
#include "core/common/error.h"

namespace cortado::wire {

inline constexpr uint32_t kMagic = 0x54524f43;  // "CORT"
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 48;

enum class Op : uint8_t {
  kPush = 1,
  kPull = 2,
  kPullResponse = 3,
  kPushAck = 4,
  kError = 5,
  // The sender is done with this key (its plan was retired): once every
  // worker that pushes it (`contributors`, as on its pushes) has said so,
  // the server frees the key's state. Empty body, no answer.
  kRelease = 6,
};
const char* opName(Op op);

enum Flags : uint8_t {
  kFlagNone = 0,
  kFlagAsync = 1,       // async mode push/pull
  kFlagCompressed = 2,  // body is a codec payload, not raw dtype elements
  kFlagShm = 4,         // PUSH / PULL_RESPONSE: the body is a 16-byte shm::Descriptor
                        // naming the sender's shared memory; PULL: answer that way
  kFlagDenseAnswer = 8, // compressed PUSH: answer this key's pulls with the dense fp32
                        // sum instead of re-encoding it (a plan's raw pull after a
                        // compressed push)
  kFlagErrorFeedback = 16,  // compressed PUSH, or PULL in a codec's form: the server keeps
                            // this key's re-encoding error and adds it to the next round's
                            // sum (sync mode; server/server_engine.h)
  kFlagFlushResidual = 32,  // PUSH: the key's last round before a plan switch retires it;
                            // a key holding an error-feedback residual answers this
                            // round with the dense fp32 sum plus the residual and clears
                            // it (sync mode; any push of the round may say so)
  kFlagSparse = 64,         // PUSH: the body is a preamble (codec spec "zen") and a Zen
                            // COO payload of the pairs the server owns; PULL: a sparse
                            // key's sum; PULL_RESPONSE: a Zen answer, bitmap or pairs
                            // (compressor/zen/zen_payload.h). Sync mode only; never with
                            // kFlagShm or kFlagCompressed
  kFlagAck = 128,           // PUSH: answer with PUSH_ACK once summed, unless this push
                            // completes its round (the server's push budget, above)
};
inline constexpr uint8_t kAllFlags = kFlagAsync | kFlagCompressed | kFlagShm | kFlagDenseAnswer |
                                     kFlagErrorFeedback | kFlagFlushResidual | kFlagSparse |
                                     kFlagAck;
inline constexpr uint64_t kShmDescriptorBytes = 16;

struct DataHeader {
  Op op = Op::kPush;
  DType dtype = DType::kFloat32;
  uint8_t flags = kFlagNone;
  uint32_t requestId = 0;   // echoed in the answer
  uint64_t key = 0;         // chunk key
  uint64_t round = 0;       // iteration of this key, from 0
  uint64_t numElements = 0;
  uint64_t bodyBytes = 0;   // must equal the body part's size
  // PUSH: how many pushes complete a round of this key; 0 = every worker.
  // A hierarchical plan has one worker per machine push a shard (core/executor).
  uint32_t contributors = 0;

  // Raw (uncompressed) body size implied by dtype and numElements.
  uint64_t denseBytes() const { return numElements * dtypeSize(dtype); }
};

// The parts of a compressed PUSH body; views into the body.
struct CompressedPush {
  std::string_view codecSpec;
  std::string_view tensorName;
  const uint8_t* payload = nullptr;
  size_t payloadBytes = 0;
};
inline constexpr size_t kMaxCodecSpecBytes = 1024;
// Bytes of the preamble for this spec and name; throws kInvalidArgument when
// either is too long (spec: kMaxCodecSpecBytes, name: 65535).
size_t compressedPreambleBytes(std::string_view codecSpec, std::string_view tensorName);
// Writes the preamble into out[0..compressedPreambleBytes()).
void writeCompressedPreamble(uint8_t* out, std::string_view codecSpec, std::string_view tensorName);
// Splits a compressed PUSH body. Throws Error(kProtocol) saying what is wrong
// when the preamble is truncated or its lengths run past the body.
CompressedPush parseCompressedPush(const uint8_t* body, size_t bodyBytes);

// Serializes `h` into a new 48-byte Buffer.
Buffer encodeHeader(const DataHeader& h);

// Parses and validates a header part against its body part size. Throws
// Error(kProtocol) that says which field was wrong and its value.
DataHeader decodeHeader(const Buffer& header, size_t bodySize);

}  // namespace cortado::wire
