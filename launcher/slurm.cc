#include "launcher/slurm.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "core/common/error.h"

namespace cortado::launcher {

bool insideSlurmAllocation() {
  auto set = [](const char* v) {
    const char* e = getenv(v);
    return e && *e;
  };
  return set("SLURM_JOB_ID") && set("SLURM_JOB_NODELIST") && !set("SLURM_STEP_ID");
}

int slurmTasksPerNode(const char* ntasksPerNode, const char* tasksPerNode) {
  if (ntasksPerNode && *ntasksPerNode) {
    char* end = nullptr;
    long n = strtol(ntasksPerNode, &end, 10);
    if (*end == '\0' && n > 0 && n <= 4096) return int(n);
  }
  if (!tasksPerNode || !*tasksPerNode) return 0;
  // "2(x3),1": counts, each with an optional repeat; uniform or nothing.
  static const std::regex kItem(R"(^([0-9]+)(\(x[0-9]+\))?$)");
  int count = 0;
  std::stringstream in(tasksPerNode);
  for (std::string item; std::getline(in, item, ',');) {
    std::smatch m;
    if (!std::regex_match(item, m, kItem)) return 0;
    int n = std::stoi(m[1].str());
    if (n <= 0 || (count && n != count)) return 0;
    count = n;
  }
  return count;
}

namespace {

// Runs `scontrol ARGS` (ARGS checked by the caller: no shell characters)
// under a 20 s deadline and returns its output; throws naming the command.
std::string scontrol(const std::string& args) {
  const std::string cmd = fmt::format("timeout 20 scontrol {} 2>&1", args);
  FILE* p = popen(cmd.c_str(), "r");
  CORTADO_ENFORCE(p, ErrorCode::kUnavailable, "cannot run `scontrol {}`", args);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  int status = pclose(p);
  CORTADO_ENFORCE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  ErrorCode::kUnavailable,
                  "`scontrol {}` failed ({}): are Slurm's client (slurm-client) and its "
                  "configuration (slurm.conf, SLURM_CONF) on this node?",
                  args, out.empty() ? fmt::format("status {}", status) : out.substr(0, 300));
  return out;
}

}  // namespace

std::vector<std::string> expandSlurmNodeList(const std::string& list) {
  static const std::regex kList(R"([A-Za-z0-9._,\[\]-]+)");
  CORTADO_ENFORCE(std::regex_match(list, kList), ErrorCode::kInvalidArgument,
                  "SLURM_JOB_NODELIST '{}' is not a Slurm host list (names, ranges in [], commas)",
                  list);
  const std::string out = scontrol(fmt::format("show hostnames '{}'", list));
  std::vector<std::string> nodes;
  std::istringstream words(out);
  for (std::string w; words >> w;) nodes.push_back(w);
  CORTADO_ENFORCE(!nodes.empty(), ErrorCode::kInvalidArgument,
                  "the Slurm node list '{}' names no node", list);
  return nodes;
}

std::string slurmNodeAddress(const std::string& node) {
  static const std::regex kName("[A-Za-z0-9._-]+");
  CORTADO_ENFORCE(std::regex_match(node, kName), ErrorCode::kInvalidArgument,
                  "'{}' is not a Slurm node name", node);
  const std::string out = scontrol(fmt::format("show node -o '{}'", node));
  static const std::regex kAddr(R"((^|\s)NodeAddr=([^\s]+))");
  std::smatch m;
  CORTADO_ENFORCE(std::regex_search(out, m, kAddr), ErrorCode::kUnavailable,
                  "`scontrol show node {}` names no NodeAddr: {}", node, out.substr(0, 300));
  return m[2].str();
}

SlurmAllocation readSlurmAllocation() {
  SlurmAllocation a;
  const char* id = getenv("SLURM_JOB_ID");
  const char* list = getenv("SLURM_JOB_NODELIST");
  CORTADO_ENFORCE(id && *id && list && *list, ErrorCode::kInvalidArgument,
                  "--slurm: this is not a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST "
                  "are not set): run cortado launch inside `sbatch` or `salloc`");
  a.jobId = id;
  a.nodes = expandSlurmNodeList(list);
  a.tasksPerNode =
      slurmTasksPerNode(getenv("SLURM_NTASKS_PER_NODE"), getenv("SLURM_TASKS_PER_NODE"));
  return a;
}

std::vector<std::string> srunArgv(const SlurmAllocation& alloc, int tasksPerNode,
                                  const std::string& stepName,
                                  const std::vector<std::string>& command) {
  const int n = int(alloc.nodes.size());
  std::vector<std::string> a = {"srun",
                                fmt::format("--job-name={}", stepName),
                                fmt::format("--nodes={}", n),
                                fmt::format("--ntasks={}", n * tasksPerNode),
                                fmt::format("--ntasks-per-node={}", tasksPerNode),
                                "--distribution=block",
                                "--overlap",
                                "--overcommit",
                                "--cpu-bind=none",
                                "--kill-on-bad-exit=1",
                                "--export=ALL"};
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

}  // namespace cortado::launcher
