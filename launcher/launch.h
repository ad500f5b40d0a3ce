// `cortado launch`: runs a whole job on this machine. The scheduler runs in
// this process; S servers (`cortado server`) and W copies of the user's
// command run as children, each in its own process group, with the job's
// environment. The launcher forwards SIGINT/SIGTERM, and when any role fails
// it gives the others a grace period to exit on the control plane's word
// (which names the failed node), then stops what is left. No child outlives
// it: each is also bound to it with PR_SET_PDEATHSIG. When the job ends the
// launcher removes the job's shared-memory segments that killed roles left,
// and a reaper process does it if the launcher itself is killed
// (shm_reaper.h).
//
// With --mpi the workers are the MPI processes of one mpirun; with --hosts
// that mpirun spans the hosts (OpenMPI's rsh launch through the host agent),
// servers start on each host through the agent (their settings on stdin,
// whose end tells them the launcher is gone), and every role advertises the
// address that reaches the scheduler (CORTADO_DATA_HOST=auto).
//
// With --slurm (inside an allocation, by default) the servers and the
// workers are two srun job steps over the allocation's nodes (slurm.h), and
// each srun is supervised as the workers' mpirun is.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "launcher/hosts.h"
#include "launcher/slurm.h"

namespace cortado::launcher {

struct LaunchOptions {
  JobConfig job;                      // numWorkers, numServers and the settings to hand down
  std::vector<std::string> command;   // the worker command
  std::string pidDir;                 // if set: <role>.<rank>.pid files, for tests and operators
  Millis graceAfterFailure{10000};    // wait this long for roles to exit on their own
  Millis killAfterTerm{5000};         // SIGTERM, then SIGKILL after this
  // --mpi / --hosts: workers under mpirun, servers on the hosts through the
  // agent (numWorkers and numServers are then the job's totals).
  HostsOptions hosts;
  // --mpi-only: run `command` under the same mpirun (hosts, agent) and
  // nothing else: no scheduler, no servers (for MPI peers in benchmarks).
  bool mpiOnly = false;
  // Set: the roles run as srun steps over these nodes, hosts.serversPerHost
  // servers and hosts.workersPerHost workers on each.
  std::optional<SlurmAllocation> slurm;
  // --servers-only: the scheduler and the servers, no worker command; the
  // job's numWorkers workers come from another launcher (torchrun) with the
  // job's token and scheduler port, and the job ends when the scheduler
  // has seen them all finish.
  bool serversOnly = false;
};

// Returns the process exit code: 0 when every role finished cleanly.
int runLaunch(const LaunchOptions& opts);

// Path of the running `cortado` executable (to start `cortado server`).
std::string selfExecutable();

}  // namespace cortado::launcher
