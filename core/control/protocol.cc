#include "core/control/protocol.h"

#include <fmt/format.h>

namespace cortado::control {

const char* msgTypeName(MsgType t) {
  switch (t) {
    case MsgType::kHello: return "Hello";
    case MsgType::kChallenge: return "Challenge";
    case MsgType::kProof: return "Proof";
    case MsgType::kWelcome: return "Welcome";
    case MsgType::kRefused: return "Refused";
    case MsgType::kRegister: return "Register";
    case MsgType::kAddressBook: return "AddressBook";
    case MsgType::kHeartbeat: return "Heartbeat";
    case MsgType::kPing: return "Ping";
    case MsgType::kDeclare: return "Declare";
    case MsgType::kDeclared: return "Declared";
    case MsgType::kBarrier: return "Barrier";
    case MsgType::kBarrierDone: return "BarrierDone";
    case MsgType::kRequestFailed: return "RequestFailed";
    case MsgType::kFinish: return "Finish";
    case MsgType::kShutdown: return "Shutdown";
    case MsgType::kAbort: return "Abort";
    case MsgType::kPut: return "Put";
    case MsgType::kGet: return "Get";
    case MsgType::kValue: return "Value";
    case MsgType::kProfile: return "Profile";
    case MsgType::kProfileAck: return "ProfileAck";
    case MsgType::kPlanUpdate: return "PlanUpdate";
    case MsgType::kStall: return "Stall";
    case MsgType::kStalled: return "Stalled";
  }
  return "unknown";
}

namespace {
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}
uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t get32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
}  // namespace

void encodeHeader(const FrameHeader& h, uint8_t* out) {
  put32(out, h.magic);
  put16(out + 4, h.version);
  put16(out + 6, h.type);
  put32(out + 8, h.bodyLength);
}

FrameHeader decodeHeader(const uint8_t* in) {
  FrameHeader h;
  h.magic = get32(in);
  h.version = get16(in + 4);
  h.type = get16(in + 6);
  h.bodyLength = get32(in + 8);
  return h;
}

std::string checkHeader(const FrameHeader& h, size_t maxBody) {
  if (h.magic != kFrameMagic) {
    return fmt::format("bad magic 0x{:08x} (expected 0x{:08x}): not a Cortado control frame",
                       h.magic, kFrameMagic);
  }
  if (h.version != kProtocolVersion) {
    return fmt::format("unsupported protocol version {} (this side speaks {})", h.version,
                       kProtocolVersion);
  }
  if (h.type == 0 || h.type > kMaxMsgType) return fmt::format("unknown message type {}", h.type);
  if (h.bodyLength > maxBody) {
    return fmt::format("{} frame announces a body of {} bytes, over the limit of {} bytes",
                       msgTypeName(static_cast<MsgType>(h.type)), h.bodyLength, maxBody);
  }
  return {};
}

std::string encodeFrame(MsgType type, const Json& body) {
  // Replace invalid UTF-8 (a hostname, say) rather than throw on the io thread.
  std::string text = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  CORTADO_ENFORCE(text.size() <= kMaxBody, ErrorCode::kInvalidArgument,
                  "control message {} of {} bytes exceeds the limit of {} bytes", msgTypeName(type),
                  text.size(), kMaxBody);
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.bodyLength = static_cast<uint32_t>(text.size());
  std::string frame(kFrameHeaderSize, '\0');
  encodeHeader(h, reinterpret_cast<uint8_t*>(frame.data()));
  frame += text;
  return frame;
}

std::string getString(const Json& body, const char* field) {
  auto it = body.find(field);
  CORTADO_ENFORCE(it != body.end() && it->is_string(), ErrorCode::kProtocol,
                  "field '{}' is missing or not a string", field);
  return it->get<std::string>();
}

int64_t getInt(const Json& body, const char* field) {
  auto it = body.find(field);
  CORTADO_ENFORCE(it != body.end() && it->is_number_integer(), ErrorCode::kProtocol,
                  "field '{}' is missing or not an integer", field);
  return it->get<int64_t>();
}

uint64_t getUInt(const Json& body, const char* field) {
  auto it = body.find(field);
  CORTADO_ENFORCE(it != body.end() && it->is_number_unsigned(), ErrorCode::kProtocol,
                  "field '{}' is missing or not an unsigned integer", field);
  return it->get<uint64_t>();
}

Json nodeInfoToJson(const NodeInfo& n) {
  return Json{{"role", static_cast<int>(n.id.role)},
              {"rank", n.id.rank},
              {"dataAddress", n.dataAddress},
              {"hostname", n.hostname},
              {"pid", n.pid},
              {"sharedMemory", n.sharedMemory},
              {"pushBudget", n.pushBudget}};
}

NodeInfo nodeInfoFromJson(const Json& j) {
  CORTADO_ENFORCE(j.is_object(), ErrorCode::kProtocol, "a node entry is not an object");
  NodeInfo n;
  int64_t role = getInt(j, "role");
  CORTADO_ENFORCE(role >= 0 && role <= 2, ErrorCode::kProtocol, "bad role {} in a node entry",
                  role);
  n.id.role = static_cast<Role>(role);
  int64_t rank = getInt(j, "rank");
  CORTADO_ENFORCE(rank >= -1 && rank <= INT32_MAX, ErrorCode::kProtocol,
                  "bad rank {} in a node entry", rank);
  n.id.rank = static_cast<int32_t>(rank);
  n.dataAddress = getString(j, "dataAddress");
  n.hostname = getString(j, "hostname");
  n.pid = static_cast<int32_t>(getInt(j, "pid"));
  auto shm = j.find("sharedMemory");
  n.sharedMemory = shm != j.end() && shm->is_boolean() && shm->get<bool>();
  auto budget = j.find("pushBudget");
  n.pushBudget = budget != j.end() && budget->is_number_unsigned() ? budget->get<uint64_t>() : 0;
  return n;
}

int errorCodeToWire(ErrorCode c) { return static_cast<int>(c); }

ErrorCode errorCodeFromWire(int64_t v) {
  if (v < 0 || v > static_cast<int64_t>(ErrorCode::kInternal)) return ErrorCode::kProtocol;
  return static_cast<ErrorCode>(v);
}

}  // namespace cortado::control
