// The MPI (OpenMPI) backend of the collective plane, for host buffers.
//
// Operations run as non-blocking MPI calls (MPI_Iallreduce, ...) polled with
// MPI_Test until they complete or the deadline passes, because a blocking MPI
// call cannot be given a deadline or cancelled. Communicators use
// MPI_ERRORS_RETURN, so MPI failures become cortado::Error, never an abort.
#pragma once

#include <memory>

#include "core/collective/collectives.h"

namespace cortado::collective::mpi {

struct Options {
  // Ranks per emulated machine: 0 groups ranks by the machine they run on
  // (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)); N > 0 puts world ranks
  // [kN, kN+N) on emulated machine k, for tests on one host
  // (CORTADO_FAKE_HOST_SIZE).
  int fakeHostSize = 0;
  InterGroups inter = InterGroups::kSameLocalRank;
  // Compare every call's arguments across the members first (one small
  // allgather per call; CORTADO_COLLECTIVE_CHECK).
  bool checkArguments = true;

  // Reads CORTADO_FAKE_HOST_SIZE and CORTADO_COLLECTIVE_CHECK over the defaults.
  static Options fromEnv();
};

// MPI's lifetime in this process. MPI can be initialized once per process:
// the first Runtime initializes it (unless the program already did) and the
// Runtime that initialized it finalizes it when destroyed. Keep it alive
// longer than every group made from it.
class Runtime {
 public:
  Runtime();  // Error(kUnavailable) when MPI cannot be initialized
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int worldRank() const;
  int worldSize() const;

 private:
  bool owns_ = false;
};

// Forms the world, intra-machine and inter-machine groups. Collective over
// MPI_COMM_WORLD: every rank calls it with the same options.
Groups createGroups(Runtime& runtime, const Options& options, Deadline deadline);

}  // namespace cortado::collective::mpi
