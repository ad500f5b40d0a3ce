#include "core/common/error.h"

namespace cortado {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerDead: return "peer dead";
    case ErrorCode::kProtocol: return "protocol error";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kClosed: return "closed";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

}  // namespace cortado
