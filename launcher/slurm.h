// `cortado launch` inside a Slurm allocation (salloc, sbatch): the servers
// and the workers are two `srun` job steps over the allocation's nodes, each
// task taking its rank from SLURM_PROCID; the scheduler runs in the launcher
// (under sbatch: on the allocation's first node). Supervision, signals and
// the failure path are the launcher's (launch.h); the node list, the tasks
// per node and the srun command line come from here.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cortado::launcher {

struct SlurmAllocation {
  std::string jobId;               // SLURM_JOB_ID
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST, expanded by `scontrol show hostnames`
  int tasksPerNode =
      0;  // from SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE; 0: not uniform or not set
};

// True when this process runs inside an allocation and not inside one of its
// job steps: SLURM_JOB_ID and SLURM_JOB_NODELIST set, SLURM_STEP_ID not set
// (a batch script or an salloc shell; `srun cortado launch` runs a local job).
bool insideSlurmAllocation();

// Reads the allocation from the environment. Throws Error(kInvalidArgument)
// naming what is missing or malformed, kUnavailable when scontrol fails.
SlurmAllocation readSlurmAllocation();

// Tasks per node from SLURM_NTASKS_PER_NODE, else from SLURM_TASKS_PER_NODE
// ("2(x3)" or "2,2"), when every node has the same count; 0 otherwise.
int slurmTasksPerNode(const char* ntasksPerNode, const char* tasksPerNode);

// Expands a Slurm host list ("node[1-3,7],gpu01") with `scontrol show
// hostnames`, under a 20 s deadline.
std::vector<std::string> expandSlurmNodeList(const std::string& list);

// The address Slurm has for `node` (NodeAddr in `scontrol show node`), for
// a node whose name does not resolve where the launcher runs. Throws
// Error(kUnavailable) naming the node when scontrol does not say.
std::string slurmNodeAddress(const std::string& node);

// The srun argv of one job step: `tasksPerNode` tasks on each of the
// allocation's nodes, sharing the nodes with the other step (--overlap,
// --overcommit), no CPU binding (the roles' threads are ours to place), and
// the step killed when one task fails (--kill-on-bad-exit).
std::vector<std::string> srunArgv(const SlurmAllocation& alloc, int tasksPerNode,
                                  const std::string& stepName,
                                  const std::vector<std::string>& command);

}  // namespace cortado::launcher
