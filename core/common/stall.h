// A stalled round: a server key whose current round some workers pushed and
// the others have not, for longer than the stall check's time
// (CORTADO_STALL_CHECK_MS). The server's engine finds it
// (server/server_engine.h), the server sends it to the scheduler
// (ControlClient::reportStall), and the scheduler names the tensor and the
// workers it waits for in its log: the usual cause is a worker that skips a
// tensor the others push, or pushes its tensors in another order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cortado {

struct StallReport {
  uint64_t key = 0;         // the server key (partition.h: chunkKey(tensor key, chunk))
  uint64_t round = 0;       // the round that waits
  std::vector<int> pushed;  // ranks of the workers whose push of the round came, ascending
  int expected = 0;         // pushes that complete the round
  uint64_t waitedMs = 0;    // since the round's first push
  std::string tensor;       // the name a compressed push carries; else empty
};

}  // namespace cortado
