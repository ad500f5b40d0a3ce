// The NCCL backend of the collective plane, for CUDA buffers. Built when NCCL
// is found (CORTADO_WITH_NCCL).
//
// It needs no MPI: the job's ranks agree on one ncclUniqueId through a
// UniqueIdExchange that the caller provides (the scheduler in a job, MPI or a
// file in tests), and the intra- and inter-machine groups are split from the
// world communicator with ncclCommSplit. Communicators are non-blocking
// (ncclConfig_t.blocking = 0): every wait polls against the deadline and
// aborts the communicator (ncclCommAbort) when it passes.
#pragma once

#include <functional>
#include <string>

#include "core/collective/collectives.h"

namespace cortado::collective::nccl {

// Called once by every rank of the job with the same key: world rank 0 passes
// the id it made (`rootId`, non-empty) and gets it back; every other rank
// passes an empty string and gets rank 0's. Throws Error(kTimeout) when the
// deadline passes first.
using UniqueIdExchange =
    std::function<std::string(const std::string& key, const std::string& rootId, Deadline deadline)>;

struct Options {
  int device = -1;  // CUDA device for this rank; -1: localRank % deviceCount()
  InterGroups inter = InterGroups::kSameLocalRank;
  bool checkArguments = true;  // as in mpi::Options
};

// CUDA devices visible to this process; 0 without a GPU or a driver.
int deviceCount();

// Forms the world, intra- and inter-machine groups for `topology` (where this
// rank sits; the caller knows the machines). Every rank of the job calls it.
// Error(kUnavailable) when no CUDA device is visible.
Groups createGroups(const Topology& topology, const UniqueIdExchange& exchange, const Options& options,
                    Deadline deadline);

}  // namespace cortado::collective::nccl
