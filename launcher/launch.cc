#include "launcher/launch.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <fmt/ranges.h>

#include "core/backends.h"
#include "core/common/logging.h"
#include "core/common/net.h"
#include "core/shm/shm_segment.h"
#include "launcher/roles.h"
#include "launcher/shm_reaper.h"
#include "scheduler/scheduler.h"

namespace cortado::launcher {
namespace {

struct Child {
  Role role;
  int rank;  // -1: the mpirun of all workers, or an srun step of all of its role
  pid_t pid;
  std::string host;   // where it runs; empty: here
  int stdinFd = -1;   // our end of its stdin (remote roles), closed when it ends
  bool running = true;
  bool signalled = false;  // the launcher sent it SIGTERM or SIGKILL
  int exitStatus = 0;  // raw waitpid status
  bool srun = false;   // an srun job step (rank -1)
  std::string label() const {
    if (rank < 0 && srun) return fmt::format("{}s (srun)", roleName(role));
    if (rank < 0) return "workers (mpirun)";
    std::string l = fmt::format("{} {}", roleName(role), rank);
    return host.empty() ? l : fmt::format("{} on host {}", l, host);
  }
  std::string pidFile() const {
    if (rank < 0 && srun) return fmt::format("srun.{}s", roleName(role));
    return rank < 0 ? "mpirun" : fmt::format("{}.{}", roleName(role), rank);
  }
};

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return fmt::format("status {}", status);
}

bool cleanExit(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string makeToken() {
  unsigned char raw[24];
  if (RAND_bytes(raw, sizeof(raw)) != 1)
    throw Error(ErrorCode::kUnavailable, "cannot draw random bytes for the job token");
  std::string hex;
  for (unsigned char c : raw) hex += fmt::format("{:02x}", c);
  return hex;
}

// fork + exec with the job environment; the child gets its own process
// group, the default signal mask, and dies with the launcher.
// With `stdinFd`, the child's stdin is a pipe and *stdinFd our end of it.
pid_t spawn(const std::vector<std::string>& argv,
            const std::vector<std::pair<std::string, std::string>>& env, int* stdinFd = nullptr) {
  int pipeFds[2] = {-1, -1};
  if (stdinFd && pipe2(pipeFds, O_CLOEXEC) != 0)
    throw Error(ErrorCode::kUnavailable, fmt::format("pipe failed: {}", strerror(errno)));
  std::vector<std::string> envStrings;
  for (char** e = environ; *e; ++e) {
    std::string s(*e);
    bool overridden = false;
    for (const auto& [k, v] : env) overridden |= s.rfind(k + "=", 0) == 0;
    if (!overridden) envStrings.push_back(s);
  }
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envStrings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    if (stdinFd) close(pipeFds[0]), close(pipeFds[1]);
    throw Error(ErrorCode::kUnavailable, fmt::format("fork failed: {}", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher is already gone
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (stdinFd) dup2(pipeFds[0], 0);  // dup2 clears O_CLOEXEC on fd 0
    execvpe(cargv[0], cargv.data(), cenv.data());
    fprintf(stderr, "cortado launch: cannot run '%s': %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also from here, so that the group exists before any kill
  if (stdinFd) {
    close(pipeFds[0]);
    *stdinFd = pipeFds[1];
  }
  return pid;
}

// Hands a remote role its settings (`cortado server --env-stdin`); the pipe
// stays open so that its end tells the role that the launcher is gone.
void writeEnv(int fd, const std::vector<std::pair<std::string, std::string>>& env) {
  std::string text;
  for (const auto& [k, v] : env) text += k + "=" + v + "\n";
  text += "END\n";
  for (size_t off = 0; off < text.size();) {
    ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    // The agent failed at once; its exit status tells why.
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// The variables that reach the workers on other hosts: mpirun forwards only
// what -x names (ssh forwards nothing).
std::vector<std::string> forwardedVars(const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> vars;
  for (const auto& [k, v] : env) vars.push_back(k);
  for (const char* extra : {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "UCX_TLS", "UCX_NET_DEVICES"})
    if (getenv(extra)) vars.push_back(extra);
  return vars;
}

// A private directory for the generated agent wrapper, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cortado-launch-XXXXXX";
    if (!mkdtemp(tmpl))
      throw Error(ErrorCode::kUnavailable, fmt::format("mkdtemp failed: {}", strerror(errno)));
    path = tmpl;
  }
  ~TempDir() {
    unlink((path + "/mpi_agent.sh").c_str());
    rmdir(path.c_str());
  }
};

// --mpi-only: the command under the job's mpirun, nothing else.
int runMpiOnly(const LaunchOptions& opts, const std::vector<std::string>& argv) {
  sigset_t waitSet, oldMask;
  sigemptyset(&waitSet);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&waitSet, s);
  pthread_sigmask(SIG_BLOCK, &waitSet, &oldMask);
  pid_t pid = spawn(argv, {});
  int status = 0;
  Clock::time_point killAt = Clock::time_point::max();
  for (;;) {
    timespec ts{0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&waitSet, nullptr, &ts);
    if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && killAt == Clock::time_point::max()) {
      kill(-pid, SIGTERM);
      killAt = Clock::now() + opts.killAfterTerm;
    }
    if (Clock::now() >= killAt) kill(-pid, SIGKILL);
    if (reapMpirun(pid, status)) break;
  }
  kill(-pid, SIGKILL);
  pthread_sigmask(SIG_SETMASK, &oldMask, nullptr);
  if (!cleanExit(status)) {
    fmt::print(stderr, "cortado launch: mpirun failed: {}\n", describeStatus(status));
    return 1;
  }
  return 0;
}

}  // namespace

std::string selfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error(ErrorCode::kUnavailable, "cannot find the cortado executable");
  buf[n] = '\0';
  return buf;
}

int runLaunch(const LaunchOptions& opts) {
  CORTADO_ENFORCE(!opts.command.empty() || opts.serversOnly, ErrorCode::kInvalidArgument,
                  "cortado launch needs a worker command after `--`, e.g. "
                  "`cortado launch -w 2 -s 1 -- python3 train.py`");
  JobConfig job = opts.job;
  if (opts.serversOnly) {
    CORTADO_ENFORCE(opts.command.empty(), ErrorCode::kInvalidArgument,
                    "cortado launch --servers-only starts no worker: drop the command after `--` "
                    "(start the workers with their own launcher, e.g. torchrun)");
    CORTADO_ENFORCE(!opts.slurm && opts.hosts.hosts.empty() && !opts.hosts.mpi && !opts.mpiOnly,
                    ErrorCode::kInvalidArgument,
                    "--servers-only runs the scheduler and the servers on this machine: it does "
                    "not go with --slurm, --hosts, --mpi or --mpi-only");
    CORTADO_ENFORCE(!job.token.empty(), ErrorCode::kInvalidArgument,
                    "cortado launch --servers-only needs CORTADO_JOB_TOKEN in the environment, the "
                    "same as the workers' (e.g. export CORTADO_JOB_TOKEN=$(openssl rand -hex 24))");
    CORTADO_ENFORCE(job.schedulerPort > 0, ErrorCode::kInvalidArgument,
                    "cortado launch --servers-only needs --port (or CORTADO_SCHEDULER_PORT): the "
                    "workers must be told where the scheduler listens");
    // Workers on other machines reach the servers at their own address.
    if (job.schedulerHost != "127.0.0.1" && job.schedulerHost != "localhost" &&
        !getenv("CORTADO_DATA_HOST") && !getenv("DMLC_NODE_HOST"))
      job.dataHost = "auto";
  }
  if (job.token.empty()) job.token = makeToken();
  const HostsOptions& hosts = opts.hosts;
  checkHosts(hosts);
  const bool slurm = opts.slurm.has_value();
  CORTADO_ENFORCE(!slurm || (hosts.hosts.empty() && !hosts.mpi && !opts.mpiOnly),
                  ErrorCode::kInvalidArgument,
                  "inside a Slurm allocation the roles run under srun: --hosts, --mpi and "
                  "--mpi-only do not apply (give --no-slurm to run them as outside Slurm)");
  // Under Slurm: the allocation's nodes, unless it is this machine alone.
  std::vector<std::string> slurmNodes;
  if (slurm)
    for (const auto& n : opts.slurm->nodes)
      if (!isLocalHost(n) || opts.slurm->nodes.size() > 1) slurmNodes.push_back(n);
  const bool multiHost = !hosts.hosts.empty() || !slurmNodes.empty();
  const bool mpi = !slurm && (hosts.mpi || multiHost || opts.mpiOnly);
  std::string tcpSubnet;
  if (multiHost) {
    // The scheduler runs here and must be reached from every host: unless
    // --host names an address, advertise the one that routes to the hosts.
    if (job.schedulerHost == "127.0.0.1" || job.schedulerHost == "localhost") {
      std::string toward = slurm ? slurmNodes.front() : hosts.hosts.front();
      const std::vector<std::string>* lists[] = {&hosts.hosts, &hosts.serverHosts, &slurmNodes};
      for (const auto* list : lists)
        for (const auto& h : *list)
          if (isLocalHost(toward) && !isLocalHost(h)) toward = h;
      // A Slurm node's name may not resolve outside the cluster's nodes
      // (salloc on a login node): then Slurm's own address for it.
      if (slurm) {
        try {
          net::resolveIPv4(toward);
        } catch (const Error&) {
          toward = slurmNodeAddress(toward);
        }
      }
      job.schedulerHost = net::localAddressToward(toward);
    }
    // Each role advertises the address of its own interface toward the
    // scheduler, never 127.0.0.1.
    job.dataHost = "auto";
    tcpSubnet = net::subnetOf(job.schedulerHost);
    if (slurm)
      CORTADO_LOG_INFO("Slurm job {} on nodes {}: scheduler at {}", opts.slurm->jobId,
                       fmt::join(slurmNodes, ","), job.schedulerHost);
    else
      CORTADO_LOG_INFO("hosts {} (+ server-only {}): scheduler at {}, MPI TCP on {}",
                       fmt::join(hosts.hosts, ","), fmt::join(hosts.serverHosts, ","),
                       job.schedulerHost, tcpSubnet.empty() ? "(OpenMPI's choice)" : tcpSubnet);
    // Across hosts every chunk's exchange starts and ends with links waiting
    // about a chunk's time per worker, and the push window (a number of
    // chunks) keeps the links' queues shorter with smaller chunks, so they
    // fill the links better (docs/benchmarks.md, "Hosts"); on one host the
    // larger default is faster, and a named size always wins.
    if (!job.partitionBytesGiven) {
      job.partitionBytes = kMultiHostPartitionBytes;
      CORTADO_LOG_INFO(
          "roles on several hosts: {} KiB chunks (CORTADO_PARTITION_BYTES names another size)",
          job.partitionBytes >> 10);
    }
  }
  std::unique_ptr<TempDir> tmp;
  std::string agentWrapper;
  if (multiHost && !hosts.agent.empty()) {
    tmp = std::make_unique<TempDir>();
    agentWrapper = writeMpiAgentWrapper(tmp->path, hosts.agent, selfExecutable());
  }
  if (opts.mpiOnly)
    return runMpiOnly(opts, mpirunArgv(hosts, job.numWorkers, forwardedVars({}), agentWrapper,
                                       tcpSubnet, opts.command));
  job.validate();
  // Removes the job's segments if this process is killed (shm_reaper.h).
  ShmReaper reaper(shm::jobPrefix(job.token));
  // One decision for the whole job, before anything starts: every role gets
  // the resolved transport, so no two nodes disagree, and an explicit ucx
  // that cannot work here fails now, with UCX's reason.
  if (job.transport != "zmq") {
    TransportChoice choice = chooseTransport(job);
    if (job.transport == "auto" && choice.kind == "zmq" && ucxBuilt()) {
      CORTADO_LOG_WARN("transport auto: using zmq: {}", choice.reason);
    } else {
      CORTADO_LOG_INFO("transport {}: using {}: {}", job.transport, choice.kind, choice.reason);
    }
    job.transport = choice.kind;
  }

  // Block the signals we wait for before any thread starts: every thread
  // inherits the mask, so only sigtimedwait() below sees them.
  sigset_t waitSet;
  sigemptyset(&waitSet);
  sigaddset(&waitSet, SIGCHLD);
  sigaddset(&waitSet, SIGINT);
  sigaddset(&waitSet, SIGTERM);
  sigaddset(&waitSet, SIGHUP);
  // A remote role's stdin pipe may close under us; that is its exit's story.
  signal(SIGPIPE, SIG_IGN);
  sigset_t oldMask;
  pthread_sigmask(SIG_BLOCK, &waitSet, &oldMask);

  scheduler::SchedulerOptions so =
      schedulerOptions(job, job.schedulerHost == "127.0.0.1" ? "127.0.0.1" : "0.0.0.0");
  // mpirun (srun) is told -w per host; the scheduler checks that it did so.
  if (slurm)
    so.workersPerHost.assign(opts.slurm->nodes.size(), hosts.workersPerHost);
  else if (multiHost)
    so.workersPerHost.assign(hosts.hosts.size(), hosts.workersPerHost);
  auto sched = scheduler::Scheduler::create(std::move(so));
  job.schedulerPort = sched->port();
  CORTADO_LOG_INFO("scheduler on {}:{}, {} servers, {} workers, transport {}", job.schedulerHost,
                   job.schedulerPort, job.numServers, job.numWorkers, job.transport);
  if (opts.serversOnly)
    CORTADO_LOG_INFO(
        "servers only: waiting for {} workers started elsewhere with this job's "
        "CORTADO_JOB_TOKEN and CORTADO_SCHEDULER_PORT={}",
        job.numWorkers, job.schedulerPort);

  std::mutex schedMu;
  bool schedDone = false;
  Status schedStatus;
  std::thread schedThread([&] {
    Status s = sched->run();
    std::lock_guard<std::mutex> lk(schedMu);
    schedStatus = s;
    schedDone = true;
    kill(getpid(), SIGCHLD);  // wake the supervisor
  });

  std::vector<Child> children;
  auto writePid = [&](const Child& c) {
    if (opts.pidDir.empty()) return;
    mkdir(opts.pidDir.c_str(), 0755);
    std::ofstream(fmt::format("{}/{}.pid", opts.pidDir, c.pidFile())) << c.pid << "\n";
  };
  if (!opts.pidDir.empty()) {
    mkdir(opts.pidDir.c_str(), 0755);
    std::ofstream(fmt::format("{}/launcher.pid", opts.pidDir)) << getpid() << "\n";
    std::ofstream(fmt::format("{}/shm-prefix", opts.pidDir)) << shm::jobPrefix(job.token) << "\n";
  }
  const std::string self = selfExecutable();
  std::string failure;  // first failure, names the role
  // Server rank i runs on host i / serversPerHost of hosts + server hosts
  // (of the server hosts alone with dedicatedServers).
  std::vector<std::string> serverHostOf;
  for (const auto* list : {&hosts.hosts, &hosts.serverHosts}) {
    if (hosts.dedicatedServers && list == &hosts.hosts) continue;
    for (const auto& h : *list)
      for (int k = 0; k < hosts.serversPerHost; ++k) serverHostOf.push_back(h);
  }
  // Under Slurm each role is one srun step whose tasks take their ranks from
  // SLURM_PROCID (core/config.cc): the launcher's own CORTADO_RANK, if any,
  // must not reach them.
  auto srunEnv = [&](Role role) {
    JobConfig c = job;
    c.role = role;
    c.rank = -1;
    auto env = c.toEnv();
    std::erase_if(env, [](const auto& kv) { return kv.first == "CORTADO_RANK"; });
    return env;
  };
  if (slurm) unsetenv("CORTADO_RANK");
  try {
    if (slurm) {
      auto argv = srunArgv(*opts.slurm, hosts.serversPerHost, "cortado-servers", {self, "server"});
      CORTADO_LOG_DEBUG("servers: {}", fmt::join(argv, " "));
      children.push_back({Role::kServer, -1, spawn(argv, srunEnv(Role::kServer)), ""});
      children.back().srun = true;
      writePid(children.back());
      argv = srunArgv(*opts.slurm, hosts.workersPerHost, "cortado-workers", opts.command);
      CORTADO_LOG_DEBUG("workers: {}", fmt::join(argv, " "));
      children.push_back({Role::kWorker, -1, spawn(argv, srunEnv(Role::kWorker)), ""});
      children.back().srun = true;
      writePid(children.back());
    }
    for (int i = 0; i < job.numServers && !slurm; ++i) {
      JobConfig c = job;
      c.role = Role::kServer;
      c.rank = i;
      const std::string host = multiHost ? serverHostOf.at(i) : "";
      if (host.empty() || isLocalHost(host)) {
        children.push_back({Role::kServer, i, spawn({self, "server"}, c.toEnv()), host});
      } else {
        int fd = -1;
        pid_t pid = spawn(agentArgv(hosts.agent, host, {self, "server", "--env-stdin"}), {}, &fd);
        children.push_back({Role::kServer, i, pid, host, fd});
        writeEnv(fd, c.toEnv());
      }
      writePid(children.back());
    }
    if (slurm || opts.serversOnly) {
      // Started above, or by another launcher.
    } else if (mpi) {
      JobConfig c = job;
      c.role = Role::kWorker;
      c.rank = -1;
      auto env = c.toEnv();
      // Each worker takes its MPI rank (OMPI_COMM_WORLD_RANK) as its rank.
      std::erase_if(env, [](const auto& kv) { return kv.first == "CORTADO_RANK"; });
      env.push_back({"OMPI_MCA_rmaps_base_oversubscribe", "1"});
      auto argv = mpirunArgv(hosts, job.numWorkers, forwardedVars(env), agentWrapper, tcpSubnet,
                             opts.command);
      CORTADO_LOG_DEBUG("workers: {}", fmt::join(argv, " "));
      children.push_back({Role::kWorker, -1, spawn(argv, env), ""});
      writePid(children.back());
    } else {
      for (int i = 0; i < job.numWorkers; ++i) {
        JobConfig c = job;
        c.role = Role::kWorker;
        c.rank = i;
        children.push_back({Role::kWorker, i, spawn(opts.command, c.toEnv()), ""});
        writePid(children.back());
      }
    }
  } catch (const Error& e) {
    failure = e.what();
  }

  auto signalAll = [&](int sig) {
    for (auto& c : children)
      if (c.running) kill(-c.pid, sig), c.signalled = true;
  };
  // When the job fails: a role started on this machine that never registered
  // cannot hear the job's end from the scheduler (a server still connecting,
  // a worker that never got to Cortado), so it is stopped now rather than
  // after the grace. A role counts as registered when a process of its
  // process group did (a worker command may be a shell around the program).
  // The workers' mpirun and roles on other hosts are left to the grace.
  auto stopUnregistered = [&] {
    const std::string here = net::localHostname();
    std::set<pid_t> groups;
    for (const auto& [host, pid] : sched->registeredProcesses())
      if (host == here)
        if (pid_t g = getpgid(pid); g > 0) groups.insert(g);
    for (auto& c : children) {
      if (!c.running || c.rank < 0 || (!c.host.empty() && !isLocalHost(c.host)) ||
          groups.count(c.pid))
        continue;
      CORTADO_LOG_WARN("{} (pid {}) never registered with the scheduler, so it cannot hear that "
                       "the job failed: stopping it now",
                       c.label(), c.pid);
      kill(-c.pid, SIGTERM);
      c.signalled = true;
    }
  };
  auto anyRunning = [&] {
    for (auto& c : children)
      if (c.running) return true;
    return false;
  };
  bool rootIsSignal = false;
  enum class Phase { kRunning, kGrace, kTerm, kKill } phase = Phase::kRunning;
  auto reap = [&] {
    for (auto& c : children) {
      if (!c.running) continue;
      int st = 0;
      const bool ended =
          c.rank < 0 && !c.srun ? reapMpirun(c.pid, st) : waitpid(c.pid, &st, WNOHANG) == c.pid;
      if (ended) {
        c.running = false;
        c.exitStatus = st;
        if (c.stdinFd >= 0) close(c.stdinFd), c.stdinFd = -1;
        // Whatever it left in its process group goes with it.
        kill(-c.pid, SIGKILL);
        if (cleanExit(st)) {
          CORTADO_LOG_INFO("{} (pid {}) finished", c.label(), c.pid);
        } else if (c.signalled && WIFSIGNALED(st)) {
          CORTADO_LOG_WARN("{} (pid {}) stopped by the launcher: {}", c.label(), c.pid,
                           describeStatus(st));
        } else {
          std::string what = fmt::format("{} (pid {}) failed: {}", c.label(), c.pid, describeStatus(st));
          CORTADO_LOG_ERROR("{}", what);
          // A role killed by a signal that we did not send is the root cause;
          // the others then exit with errors that name it.
          bool killed = WIFSIGNALED(st) && !c.signalled;
          if (failure.empty() || (killed && !rootIsSignal)) {
            failure = what;
            rootIsSignal = killed;
          }
        }
      }
    }
  };

  // Supervise. Phases: running -> (failure or signal) grace -> SIGTERM -> SIGKILL.
  Clock::time_point phaseEnd = Clock::time_point::max();
  int forwardedSignal = 0;
  if (!failure.empty()) {
    phase = Phase::kTerm;
    signalAll(SIGTERM);
    phaseEnd = Clock::now() + opts.killAfterTerm;
  }
  while (anyRunning()) {
    timespec ts{0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&waitSet, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      CORTADO_LOG_WARN("received signal {}: stopping every role", sig);
      forwardedSignal = sig;
      if (failure.empty()) failure = fmt::format("stopped by signal {} ({})", sig, strsignal(sig));
      sched->stop();
      if (phase < Phase::kTerm) {
        signalAll(SIGTERM);
        phase = Phase::kTerm;
        phaseEnd = Clock::now() + opts.killAfterTerm;
      }
    }
    reap();
    Status ss;
    bool sd = false;
    {
      std::lock_guard<std::mutex> lk(schedMu);
      sd = schedDone;
      ss = schedStatus;
    }
    if (sd && !ss.ok() && failure.empty()) {
      failure = fmt::format("scheduler: {}", ss.message());
      CORTADO_LOG_ERROR("{}", failure);
    }
    bool workersLeft = false;
    for (auto& c : children) workersLeft |= c.running && c.role == Role::kWorker;
    // With --servers-only the workers are another launcher's: the job is
    // over when the scheduler has seen them all finish.
    const bool workersDone = opts.serversOnly ? sd && ss.ok() : !workersLeft;
    if (phase == Phase::kRunning && failure.empty() && workersDone) {
      // Every worker exited cleanly: the servers have nothing left to serve.
      sched->stop();
      phase = Phase::kGrace;
      phaseEnd = Clock::now() + opts.graceAfterFailure;
    }
    if (phase == Phase::kRunning && !failure.empty()) {
      phase = Phase::kGrace;
      phaseEnd = Clock::now() + opts.graceAfterFailure;
      // The others must hear which role died (a no-op when the scheduler
      // already ended the job with its own word on it).
      sched->fail(Status(ErrorCode::kPeerDead, failure));
      stopUnregistered();
    }
    if (Clock::now() >= phaseEnd) {
      if (phase == Phase::kGrace) {
        CORTADO_LOG_WARN("roles still running {} ms after the failure: sending SIGTERM",
                         opts.graceAfterFailure.count());
        signalAll(SIGTERM);
        phase = Phase::kTerm;
        phaseEnd = Clock::now() + opts.killAfterTerm;
      } else if (phase == Phase::kTerm) {
        CORTADO_LOG_WARN("roles ignored SIGTERM: sending SIGKILL");
        signalAll(SIGKILL);
        phase = Phase::kKill;
        phaseEnd = Clock::time_point::max();
      }
    }
  }
  // Every worker is gone; if the scheduler is still waiting (e.g. a worker
  // exited 0 without finishing), end it.
  sched->stop();
  schedThread.join();
  // Shared memory that a killed role could not unlink.
  if (int n = shm::removeJobSegments(shm::jobPrefix(job.token)))
    CORTADO_LOG_INFO("removed {} shared-memory segments left by the job", n);
  reaper.jobCleanedUp();
  pthread_sigmask(SIG_SETMASK, &oldMask, nullptr);
  if (failure.empty() && !schedStatus.ok() && schedStatus.code() != ErrorCode::kClosed)
    failure = fmt::format("scheduler: {}", schedStatus.message());
  if (!failure.empty()) {
    fmt::print(stderr, "cortado launch: job failed: {}\n", failure);
    // A stalled round is the likelier cause than the timeouts it led to.
    if (auto stalls = sched->stalls(); !stalls.empty())
      fmt::print(stderr, "cortado launch: before that, the scheduler reported {}{}\n", stalls[0],
                 stalls.size() == 1 ? ""
                 : stalls.size() < 16
                     ? fmt::format(" (and {} more stalled rounds)", stalls.size() - 1)
                     : " (and at least 15 more stalled rounds)");
    return forwardedSignal ? 128 + forwardedSignal : 1;
  }
  CORTADO_LOG_INFO("job finished: {} worker{} and {} server{} exited cleanly", job.numWorkers,
                   job.numWorkers == 1 ? "" : "s", job.numServers, job.numServers == 1 ? "" : "s");
  return 0;
}

}  // namespace cortado::launcher
