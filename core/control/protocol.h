// The control plane's wire format (private to core/control and the scheduler).
//
// A frame is a fixed 12-byte header followed by a body:
//   magic u32 | version u16 | type u16 | body length u32     (all big-endian)
// The body is a JSON object (these messages are small and rare). A reader
// checks the header, and the body length against its current limit, before it
// allocates or parses anything; anything else closes the connection.
//
// Conversation (node N, scheduler S):
//   N->S Hello{version, nonce}        S->N Challenge{nonce, pingIntervalMs}
//   N->S Proof{mac}                   S->N Welcome{mac} | Refused{code, message}
//   N->S Register{role, requestedRank, dataAddress, hostname, pid}
//   S->N AddressBook{rank, servers, workers}        (once every node registered)
//   then, in any order:
//   N->S Heartbeat{}                  S->N Ping{}
//   N->S Declare{req, name, dtype, numElements, codec}  S->N Declared{req, key}
//   N->S Barrier{req, group, name}    S->N BarrierDone{req}
//   N->S Put{req, key, value}         S->N Value{req, value}  (value as hex)
//   N->S Get{req, key}                S->N Value{req, value}  (once some node put it)
//                                     S->N RequestFailed{req, code, message}
//   N->S Profile{req, report}         S->N ProfileAck{req, switchAt}  (report: JSON
//                                     text, plan::ProfileReport, at most
//                                     kMaxProfileBytes; switchAt 0: no re-planning)
//                                     S->N PlanUpdate{window, version, switchAt, plan}
//                                     (unasked, to every worker, once every worker
//                                     reported the window: version 0 and an empty
//                                     plan when the plan stays)
//   N->S Stall{key, round, pushed, expected, waitedMs, tensor}      (servers; no answer:
//                                     a round of `key` waits for some workers' pushes)
//                                     S->N Stalled{key, round, text}  (unasked, to every
//                                     worker: tensor `key`'s stalled round, as logged)
//   N->S Finish{}                     S->N Shutdown{} | Abort{code, message, node?}
// After Refused, Shutdown or Abort the scheduler sends nothing more and
// half-closes; the node closes its side.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/common/error.h"
#include "core/common/node.h"

namespace cortado::control {

using Json = nlohmann::json;

inline constexpr uint32_t kFrameMagic = 0x43544c31;  // "CTL1"
// 2: Stall and Stalled (2026-11-27); a node of another version is refused at
// its first frame, not later at a message the other side does not know.
inline constexpr uint16_t kProtocolVersion = 2;
inline constexpr size_t kFrameHeaderSize = 12;
// Body limits: small until the peer proved the job token, larger after (an
// address book of thousands of nodes fits).
inline constexpr size_t kMaxBodyBeforeAuth = 4 * 1024;
inline constexpr size_t kMaxBody = 8 * 1024 * 1024;

enum class MsgType : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kWelcome = 4,
  kRefused = 5,
  kRegister = 6,
  kAddressBook = 7,
  kHeartbeat = 8,
  kPing = 9,
  kDeclare = 10,
  kDeclared = 11,
  kBarrier = 12,
  kBarrierDone = 13,
  kRequestFailed = 14,
  kFinish = 15,
  kShutdown = 16,
  kAbort = 17,
  kPut = 18,
  kGet = 19,
  kValue = 20,
  kProfile = 21,
  kProfileAck = 22,
  kPlanUpdate = 23,
  kStall = 24,
  kStalled = 25,
};
inline constexpr uint16_t kMaxMsgType = 25;
// A plan handed out in PlanUpdate: checked by the scheduler before sending and
// by the client on receipt.
inline constexpr size_t kMaxPlanBytes = 4 * 1024 * 1024;

// The job's key-value rendezvous (ControlClient::put/get): limits checked by
// the client before sending and by the scheduler on receipt.
inline constexpr size_t kMaxKvKey = 256;
inline constexpr size_t kMaxKvValue = 64 * 1024;
inline constexpr size_t kMaxKvEntries = 4096;

const char* msgTypeName(MsgType t);

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint32_t bodyLength = 0;
};

void encodeHeader(const FrameHeader& h, uint8_t* out);  // writes kFrameHeaderSize bytes
FrameHeader decodeHeader(const uint8_t* in);             // reads kFrameHeaderSize bytes
// Empty when the header is acceptable under `maxBody`; otherwise what is wrong.
std::string checkHeader(const FrameHeader& h, size_t maxBody);

// Header + serialized body, ready to write. Throws Error(kInvalidArgument) when
// the body exceeds kMaxBody.
std::string encodeFrame(MsgType type, const Json& body);

// Field readers for received bodies: throw Error(kProtocol) naming the field
// when it is missing or has the wrong type.
std::string getString(const Json& body, const char* field);
int64_t getInt(const Json& body, const char* field);
uint64_t getUInt(const Json& body, const char* field);

Json nodeInfoToJson(const NodeInfo& n);
NodeInfo nodeInfoFromJson(const Json& j);

int errorCodeToWire(ErrorCode c);
ErrorCode errorCodeFromWire(int64_t v);  // unknown values read as kProtocol

}  // namespace cortado::control
