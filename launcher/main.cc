// The `cortado` command: launch a job, run a role, plan, benchmark.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "core/common/crash.h"
#include "core/common/env.h"
#include "core/common/error.h"
#include "core/common/logging.h"
#include "core/config.h"
#include "core/executor/executor.h"
#include "cortado/config.h"
#include "launcher/bench_model.h"
#include "launcher/bench_pushpull.h"
#include "launcher/bench_sparse.h"
#include "launcher/hosts.h"
#include "launcher/launch.h"
#include "launcher/roles.h"
#include "launcher/shm_reaper.h"
#include "launcher/slurm.h"
#include "launcher/trace_command.h"
#include "scheduler/planner/plan_command.h"

using namespace cortado;

namespace {

// Flags shared by `launch` and the role commands; they override the
// environment (see docs/running.md, "Settings").
struct JobFlags {
  std::string transport, logLevel, partition, inflight, host;
  int port = -1, serverThreads = -1;
  bool async = false;
  void add(CLI::App* app) {
    app->add_option("--transport", transport, "data plane: zmq, ucx or auto")
        ->check(CLI::IsMember({"zmq", "ucx", "auto"}));
    app->add_option("--port", port, "scheduler TCP port (0: any free port)");
    app->add_option("--host", host, "scheduler address");
    app->add_option("--partition-bytes", partition, "chunk size, e.g. 4M");
    app->add_option("--max-inflight-bytes", inflight, "credit bound per worker, e.g. 64M");
    app->add_option("--server-threads", serverThreads, "engine threads per server");
    app->add_flag("--async", async, "servers apply each push at once (async mode)");
  }
  void apply(JobConfig& c) const {
    if (!transport.empty()) c.transport = transport;
    if (!logLevel.empty()) c.logLevel = logLevel;
    if (!partition.empty()) {
      c.partitionBytes = parseBytes(partition);
      c.partitionBytesGiven = true;
    }
    if (!inflight.empty()) c.maxInflightBytes = parseBytes(inflight);
    if (!host.empty()) c.schedulerHost = host;
    if (port >= 0) c.schedulerPort = port;
    if (serverThreads > 0) c.serverThreads = serverThreads;
    if (async) c.async = true;
  }
};

void printSettings() {
  std::cout << "| variable | alias | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const auto& s : settingsTable()) {
    std::string aliases;
    std::istringstream in(s.alias);
    for (std::string a; in >> a;) aliases += (aliases.empty() ? "`" : ", `") + a + "`";
    std::cout << "| `" << s.name << "` | " << aliases << " | " << s.fallback << " | " << s.meaning
              << " |\n";
  }
}

// One write per message: the workers of a job share the launcher's stderr,
// and a message written in pieces interleaves with theirs.
int reportError(const char* kind, const std::exception& e, int status) {
  std::cerr << fmt::format("cortado: {}: {}\n", kind, e.what()) << std::flush;
  return status;
}

}  // namespace

// A function-try-block: what escapes the command (its set-up included)
// becomes an exit status, not std::terminate.
int main(int argc, char** argv) try {
  CLI::App app{"Cortado: gradient synchronization for data-parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", CORTADO_VERSION);
  std::string logLevel;
  app.add_option("--log-level", logLevel, "trace, debug, info, warn, error, off");

  // launch
  auto* launch = app.add_subcommand("launch", "run a job on this machine: scheduler, servers, workers");
  int workers = 0, servers = 0;
  std::string pidDir;
  std::vector<std::string> command;
  JobFlags launchFlags;
  std::string hostList, serverHostList, agent, traceDir, planFile;
  bool mpi = false, mpiOnly = false, dedicatedServers = false;
  bool slurmOn = false, slurmOff = false;
  launch->add_option("-w,--workers", workers,
                     "number of workers (per host with --hosts, per node under Slurm, where the "
                     "allocation's tasks per node are the default)")
      ->check(CLI::Range(1, 4096));
  launch->add_option("-s,--servers", servers,
                     "number of servers (per host with --hosts, per node under Slurm, default 1)")
      ->check(CLI::Range(1, 4096));
  auto* slurmOpt = launch->add_flag("--slurm", slurmOn,
                                    "start servers and workers with srun over the Slurm "
                                    "allocation's nodes (the default inside salloc/sbatch)");
  launch->add_flag("--no-slurm", slurmOff, "inside a Slurm allocation, run the job as outside it")
      ->excludes(slurmOpt);
  launch->add_option("--pid-dir", pidDir, "write <role>.<rank>.pid files here");
  launch->add_option("--hosts", hostList,
                     "run across these hosts (h1,h2,...): W workers (under mpirun) and S servers on each");
  launch->add_option("--server-hosts", serverHostList, "extra hosts that run S servers each and no worker");
  launch->add_flag("--dedicated-servers", dedicatedServers,
                   "servers only on the --server-hosts, none on the worker hosts");
  launch->add_option("--agent", agent,
                     "how to run a command on a host: a template with {host}, e.g. "
                     "'tests/testbed/testbed.sh exec-host {host}' (default: ssh)");
  launch->add_flag("--mpi", mpi, "start the workers under one mpirun, as the MPI processes of the job");
  launch->add_flag("--mpi-only", mpiOnly,
                   "run the command under the job's mpirun only (no scheduler, no servers): for MPI peers in benchmarks");
  launch->add_option("--trace", traceDir,
                     "every worker and server writes a Chrome trace of its stages to DIR "
                     "(CORTADO_TRACE_DIR; CORTADO_TRACE_ITERATIONS picks the iterations)");
  launch->add_option("--plan", planFile,
                     "the plan every worker's plan executor runs (a plan file as `cortado plan "
                     "--json` writes it; CORTADO_PLAN), checked before anything starts");
  launchFlags.add(launch);
  bool serversOnly = false;
  launch->add_flag("--servers-only", serversOnly,
                   "run the scheduler and the servers only, for -w workers that another launcher "
                   "(torchrun) starts with the same CORTADO_JOB_TOKEN and scheduler port "
                   "(docs/launchers.md)");
  launch->add_option("command", command, "the worker command, after --");

  // roles
  auto* schedCmd = app.add_subcommand("scheduler", "run the scheduler role (settings from the environment)");
  JobFlags schedFlags;
  schedFlags.add(schedCmd);
  auto* serverCmd = app.add_subcommand("server", "run a server role (settings from the environment)");
  JobFlags serverFlags;
  serverFlags.add(serverCmd);
  bool envStdin = false;
  serverCmd->add_flag("--env-stdin", envStdin,
                      "read KEY=VALUE settings from stdin up to a line END, and exit when stdin "
                      "closes (how `cortado launch --hosts` starts servers through the agent)");
  // Used by the mpirun agent wrapper that `launch --hosts --agent` writes.
  auto* agentExec = app.add_subcommand("agent-exec", "");
  agentExec->group("");
  std::vector<std::string> agentCommand;
  agentExec->add_option("command", agentCommand)->required();
  // Started by `cortado launch` (launcher/shm_reaper.h).
  auto* reaperCmd = app.add_subcommand("shm-reaper", "");
  reaperCmd->group("");
  int reaperFd = -1;
  std::string reaperPrefix;
  reaperCmd->add_option("--fd", reaperFd)->required();
  reaperCmd->add_option("--prefix", reaperPrefix)->required();

  // bench
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* pp = bench->add_subcommand("pushpull", "push-pull bandwidth sweep (nccl-tests style)");
  launcher::PushPullBenchOptions ppo;
  std::string minBytes = "4K", maxBytes = "256M";
  pp->add_option("-w,--workers", ppo.workers, "workers when it launches its own job")->check(CLI::Range(1, 256));
  pp->add_option("-s,--servers", ppo.servers, "servers when it launches its own job")->check(CLI::Range(1, 256));
  pp->add_option("-b,--min-bytes", minBytes, "smallest size, e.g. 4K");
  pp->add_option("-e,--max-bytes", maxBytes, "largest size, e.g. 256M");
  pp->add_option("-n,--iters", ppo.iters, "timed iterations per size (0: automatic)");
  pp->add_option("--warmup", ppo.warmup, "untimed iterations per size");
  pp->add_option("--dtype", ppo.dtype, "float32, float64, float16, bfloat16, int32, int64");
  pp->add_option("--transport", ppo.transport, "zmq, ucx or auto")->check(CLI::IsMember({"zmq", "ucx", "auto"}));
  pp->add_flag("--json", ppo.json, "one JSON object per line and size");
  pp->add_option("--codec", ppo.codec,
                 "compress every tensor with this codec spec, e.g. topk:ratio=0.01 or fp16 "
                 "(docs/codecs.md; default: uncompressed)");
  pp->add_flag("--executor", ppo.executor,
               "also run each size through the plan executor's default plan (workers under "
               "mpirun; CORTADO_FAKE_HOST_SIZE emulates machines) and print its time and ratio "
               "to push_pull");

  // bench sparse
  auto* sp = bench->add_subcommand(
      "sparse",
      "Zen's sparse push/pull against dense push/pull, an allgather of the pairs and "
      "MPI_Allreduce, in one job (docs/zen.md)");
  launcher::SparseBenchOptions spo;
  sp->add_option("-w,--workers", spo.workers, "workers when it launches its own job")
      ->check(CLI::Range(1, 256));
  sp->add_option("-s,--servers", spo.servers, "servers when it launches its own job")
      ->check(CLI::Range(1, 256));
  sp->add_option("--elements", spo.elements, "float32 elements of the tensor")
      ->check(CLI::Range(uint64_t(1), uint64_t(0xfffffffe)));
  sp->add_option("--densities", spo.densities, "percent non-zero per worker, comma-separated");
  sp->add_option("-n,--iters", spo.iters, "timed iterations per density")
      ->check(CLI::Range(1, 10000));
  sp->add_option("--warmup", spo.warmup, "untimed iterations per density")
      ->check(CLI::Range(0, 10000));

  // bench model
  auto* bm = bench->add_subcommand(
      "model", "replay a model profile through the plan executor under several strategies "
               "(a worker command: run it under cortado launch --mpi or --hosts)");
  launcher::ModelBenchOptions bmo;
  bm->add_option("--profile", bmo.profile,
                 "vgg16, resnet50, resnet101, bert-base, gpt2, lstm, or a profile .json")->required();
  bm->add_option(
        "--strategies", bmo.strategies,
        "comma-separated: none (BytePS default), gpu (compress all, GPU placement), cpu "
        "(compress all on the CPU), pertensor (Espresso's per-tensor plan, no groups), plan "
        "(the planner's plan: per-tensor options with Cupcake's fused groups where they pay), "
        "mergecomp (every tensor on one compress-everything option, gpu's and cpu's each "
        "searched in turn by MergeComp's search timing iterations, the faster option and "
        "groups kept; timed once the search has ended), replan (the offline plan, then the "
        "scheduler's plans from online profiling: needs CORTADO_PROFILE_WINDOW > 0; "
        "timed once the plan has settled; later --rounds run the plan it settled on), "
        "gravac (GraVAC in the executor, one batch per iteration once every gradient is "
        "ready; its plan re-planned by the planner with the measured costs when the CF "
        "moves 2x; settings: --gravac)")
      ->delimiter(',')
      ->capture_default_str();
  bm->add_option("--codec", bmo.codec, "codec spec, e.g. dgc:ratio=0.01, efsignsgd, fp16")
      ->capture_default_str();
  bm->add_option("--gravac", bmo.gravac,
                 "the gravac strategy's settings, e.g. codec=topk,window=5,min_ratio=10 (codec, "
                 "min_ratio, max_ratio, window, epsilon, omega, policy, step, alpha; the paper's "
                 "defaults, the codec --codec's when a sparsifier, else topk)");
  bm->add_option("--iterations", bmo.iterations, "timed iterations per strategy")->capture_default_str();
  bm->add_option("--warmup", bmo.warmup, "untimed iterations per strategy")->capture_default_str();
  bm->add_option("--rounds", bmo.rounds,
                 "run every strategy this many times (--warmup and --iterations each time), the "
                 "order reversed every other round, so that a drift of the machine's speed weighs "
                 "on all alike; results over all rounds")
      ->capture_default_str();
  bm->add_flag("--probe-once", bmo.probeOnce,
               "measure the links and the codec only before the first round (default: again "
               "before every round, whose strategies are predicted from their round's costs too; "
               "a strategy's prediction is the mean over the rounds)");
  bm->add_option("--compute-scale", bmo.computeScale,
                 "multiply the profile's forward and backward times (the replayed compute)")
      ->capture_default_str();
  bm->add_flag("--separate-buffers", bmo.separateBuffers,
               "every gradient in a buffer of its own (default: one flat buffer in gradient-ready "
               "order, where fused groups run in place): groups are gathered into a buffer and "
               "scattered back, and the predictions count those copies");
  bm->add_flag("--queued-streams", bmo.queuedStreams,
               "with CORTADO_DEVICE=host: run every stream's work on a thread of its own, as a "
               "GPU's, so that the gradients live in device buffers apart from the host's and "
               "the CUDA path's copies, stream waits and device probes run on a machine without "
               "a GPU (a check of that path, slower than the default host device)");
  bm->add_option("--cpu-cores", bmo.cpuCores,
                 "CPU cores per machine in the cost model (0: this host's cores / machines, at most the "
                 "workers per machine: each worker runs one codec call at a time)");
  bm->add_option("--sync-skew", bmo.syncSkew,
                 "the workers' skew at each collective or push after CPU work, in the "
                 "predictions: auto (measured at start-up), off, or US,FRACTION (the last worker "
                 "arrives US + FRACTION x the work late; docs/model_bench.md)")
      ->capture_default_str();
  bm->add_option("--data-dir", bmo.dataDir, "planner data folder (profiles/, costs/)");
  bm->add_option("--plan-out", bmo.planOut, "rank 0 writes the planner's plan (JSON) here");
  bm->add_option("--predicted-trace", bmo.predictedTrace,
                 "rank 0 writes the plan's predicted timeline (measured costs) here, and each "
                 "other strategy's beside it (FILE-none.json, ...), for `cortado trace "
                 "compare` against a run with --trace");
  bm->add_flag("--json", bmo.json, "one JSON object per strategy, then a summary object");
  bm->add_flag("--progress", bmo.progress, "show the progress bar even when stderr is not a terminal");

  // plan and bench plan: they run in their callbacks during parse().
  planner::addPlanCommand(app);
  launcher::addTraceCommand(app);
  planner::addPlanBenchCommand(*bench);
  planner::addScaleBenchCommand(*bench);

  // settings table
  auto* settings = app.add_subcommand("settings", "print the table of CORTADO_* settings (Markdown)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    return reportError("error", e, 2);
  } catch (const std::exception& e) {
    return reportError("unexpected error", e, 3);
  }

  // A fatal signal prints which process died and its stack (roles refine
  // the name with their rank).
  std::string who = "cortado";
  for (const auto* sub : app.get_subcommands()) who += " " + sub->get_name();
  installCrashReport(who);

  try {
    JobConfig probe = readJobConfig(false);
    std::string level = !logLevel.empty() ? logLevel : probe.logLevel;
    if (*settings) {
      printSettings();
      return 0;
    }
    if (*agentExec) return launcher::runAgentExec(agentCommand);
    if (*reaperCmd) return launcher::runShmReaper(reaperFd, reaperPrefix);
    if (*launch) {
      setupLogging("launch", level);
      launcher::LaunchOptions lo;
      if (!hostList.empty()) lo.hosts.hosts = launcher::parseHostList("--hosts", hostList);
      if (!serverHostList.empty())
        lo.hosts.serverHosts = launcher::parseHostList("--server-hosts", serverHostList);
      CORTADO_ENFORCE(agent.empty() || !lo.hosts.hosts.empty(), ErrorCode::kInvalidArgument,
                      "--agent needs --hosts (it says how to reach them)");
      // Inside an allocation (not in one of its steps) the roles go to srun,
      // unless the command line asks for another way.
      const bool useSlurm = slurmOn || (!slurmOff && launcher::insideSlurmAllocation() &&
                                        hostList.empty() && !mpi && !mpiOnly && !serversOnly);
      if (useSlurm) {
        lo.slurm = launcher::readSlurmAllocation();
        if (workers == 0) workers = lo.slurm->tasksPerNode;
        CORTADO_ENFORCE(workers > 0, ErrorCode::kInvalidArgument,
                        "cortado launch under Slurm: the allocation sets no uniform tasks per node "
                        "(SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE='{}'): give -w/--workers "
                        "per node",
                        getenv("SLURM_TASKS_PER_NODE") ? getenv("SLURM_TASKS_PER_NODE") : "");
        if (servers == 0) servers = 1;
        CORTADO_LOG_INFO("inside Slurm job {}: {} workers and {} servers on each of {} nodes, "
                         "started with srun (--no-slurm runs them here)",
                         lo.slurm->jobId, workers, servers, lo.slurm->nodes.size());
      }
      CORTADO_ENFORCE(workers > 0, ErrorCode::kInvalidArgument,
                      "cortado launch needs -w/--workers (per host with --hosts)");
      CORTADO_ENFORCE(servers > 0 || mpiOnly, ErrorCode::kInvalidArgument,
                      "cortado launch needs -s/--servers (per host with --hosts)");
      lo.hosts.dedicatedServers = dedicatedServers;
      lo.hosts.mpi = mpi;
      lo.hosts.agent = agent;
      lo.hosts.workersPerHost = workers;
      lo.hosts.serversPerHost = servers;
      lo.mpiOnly = mpiOnly;
      const int nHosts =
          lo.slurm ? int(lo.slurm->nodes.size()) : std::max<int>(1, lo.hosts.hosts.size());
      lo.job = probe;
      lo.job.logLevel = level;
      launchFlags.apply(lo.job);
      lo.job.numWorkers = workers * nHosts;
      const int serverHostCount =
          lo.slurm               ? nHosts
          : lo.hosts.hosts.empty() ? 1
          : dedicatedServers     ? int(lo.hosts.serverHosts.size())
                                 : int(lo.hosts.hosts.size() + lo.hosts.serverHosts.size());
      lo.job.numServers = std::max(1, servers) * serverHostCount;
      // A job of its own picks a free port; with --servers-only the workers'
      // launcher was given CORTADO_SCHEDULER_PORT too.
      lo.job.schedulerPort = launchFlags.port >= 0 ? launchFlags.port
                             : serversOnly         ? probe.schedulerPort
                                                   : 0;
      if (!traceDir.empty()) lo.job.traceDir = std::filesystem::absolute(traceDir).string();
      if (!planFile.empty()) {
        try {
          executor::loadPlanFile(planFile);
        } catch (const Error& e) {
          throw Error(e.code(), fmt::format("--plan: {}", e.what()));
        }
        lo.job.planFile = std::filesystem::absolute(planFile).string();
      }
      lo.command = command;
      lo.serversOnly = serversOnly;
      lo.pidDir = pidDir;
      return launcher::runLaunch(lo);
    }
    if (*schedCmd || *serverCmd) {
      if (*serverCmd && envStdin) launcher::readEnvFromStdinAndWatch();
      JobConfig job = readJobConfig(false);
      (*schedCmd ? schedFlags : serverFlags).apply(job);
      job.role = *schedCmd ? Role::kScheduler : Role::kServer;
      if (!logLevel.empty()) job.logLevel = logLevel;
      // Now everything a node needs must be there.
      std::vector<std::string> missing;
      if (job.numWorkers == 0) missing.push_back("CORTADO_NUM_WORKERS");
      if (job.numServers == 0) missing.push_back("CORTADO_NUM_SERVERS");
      if (job.schedulerPort == 0) missing.push_back("CORTADO_SCHEDULER_PORT (or --port)");
      if (job.token.empty()) missing.push_back("CORTADO_JOB_TOKEN");
      if (*serverCmd && job.rank < 0) missing.push_back("CORTADO_RANK");
      if (!missing.empty()) {
        std::string list;
        for (auto& m : missing) list += (list.empty() ? "" : ", ") + m;
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("cortado {}: missing {}. Use `cortado launch`, or set them as "
                                "docs/running.md (\"Settings\") describes",
                                roleName(job.role), list));
      }
      job.validate();
      setupLogging(job.role == Role::kServer ? fmt::format("server {}", job.rank) : "scheduler",
                   job.logLevel);
      return *schedCmd ? launcher::runSchedulerRole(job) : launcher::runServerRole(job);
    }
    if (*sp) {
#if CORTADO_MPI
      setupLogging("bench", level);
      return launcher::runSparseBench(spo);
#else
      throw Error(ErrorCode::kUnavailable,
                  "cortado bench sparse needs MPI, and this build has none: install OpenMPI "
                  "(scripts/install_deps.sh) and reconfigure");
#endif
    }
    if (*bm) {
#if CORTADO_MPI
      return launcher::runModelBench(bmo);
#else
      throw Error(ErrorCode::kUnavailable,
                  "cortado bench model needs MPI, and this build has none: install OpenMPI "
                  "(scripts/install_deps.sh) and reconfigure");
#endif
    }
    if (*pp) {
      setupLogging("bench", level);
      ppo.minBytes = parseBytes(minBytes);
      ppo.maxBytes = parseBytes(maxBytes);
      return launcher::runPushPullBench(ppo);
    }
  } catch (const Error& e) {
    return reportError("error", e, 2);
  } catch (const std::exception& e) {
    return reportError("unexpected error", e, 3);
  }
  return 0;
} catch (const std::exception& e) {
  return reportError("unexpected error", e, 3);
}
