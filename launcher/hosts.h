// What `cortado launch --mpi / --hosts` adds to the single-host launcher: the
// mpirun command that starts the workers as the MPI processes of the job, the
// host agent (ssh, or a command template with {host}) that starts servers on
// other hosts, and the addresses that roles on other hosts reach.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace cortado::launcher {

struct HostsOptions {
  bool mpi = false;                      // workers under mpirun (implied by hosts)
  std::vector<std::string> hosts;        // worker hosts; each also runs serversPerHost servers
  std::vector<std::string> serverHosts;  // server-only hosts
  bool dedicatedServers = false;         // servers only on serverHosts, none on the worker hosts
  int workersPerHost = 0;
  int serversPerHost = 0;
  std::string agent;                     // template with {host}; empty: ssh
};

// Splits "a,b,c" and checks each name (no spaces, no shell characters, no
// duplicates across both lists). Throws Error(kInvalidArgument) naming the
// option and the bad entry.
std::vector<std::string> parseHostList(const std::string& option, const std::string& list);
void checkHosts(const HostsOptions& h);

// True when `host` names this machine (OpenMPI's view too: localhost or our
// hostname), so a role there is started directly, not through the agent.
bool isLocalHost(const std::string& host);

// The argv that runs `command` on `host` through the agent.
std::vector<std::string> agentArgv(const std::string& agent, const std::string& host,
                                   const std::vector<std::string>& command);

// A shell script for OpenMPI's plm_rsh_agent that runs OpenMPI's remote
// command line through the agent template; written into `dir`. `self` is the
// cortado executable (its `agent-exec` binds the agent to mpirun's life).
std::string writeMpiAgentWrapper(const std::string& dir, const std::string& agent,
                                 const std::string& self);

// The mpirun argv for the workers. `env` lists the variables to forward (-x);
// `tcpSubnet`, when set, restricts OpenMPI's oob and btl TCP to it.
std::vector<std::string> mpirunArgv(const HostsOptions& h, int numWorkers,
                                    const std::vector<std::string>& forwardVars,
                                    const std::string& agentWrapper, const std::string& tcpSubnet,
                                    const std::vector<std::string>& command);

// Reaps the exited mpirun `pid` into `status` (false while it runs). Before
// the reap, while its zombie still holds the pid, removes the session
// directory that OpenMPI's mpirun keeps on this machine
// (TMPDIR/ompi.HOST.UID/pid.PID, or under orte_tmpdir_base), which it
// removes itself on a normal exit and a killed mpirun leaves behind, the
// directory above it when that is then empty, and the job's ranks' shared
// memory segments in /dev/shm (OpenMPI's vader_segment.*).
bool reapMpirun(pid_t pid, int& status);

// `cortado agent-exec -- CMD...`: bind to the parent's life (PR_SET_PDEATHSIG)
// and exec CMD. Returns only on failure (exit code).
int runAgentExec(const std::vector<std::string>& command);

// `cortado server --env-stdin`: read KEY=VALUE lines from stdin up to a line
// "END" into the environment, then watch stdin: when it closes (the launcher
// or its agent is gone) the process exits. Throws on malformed input.
void readEnvFromStdinAndWatch();

}  // namespace cortado::launcher
