#include "launcher/hosts.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/common/error.h"
#include "core/common/logging.h"
#include "core/common/net.h"

namespace cortado::launcher {
namespace {

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<std::string> splitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string replaceHost(std::string word, const std::string& host) {
  for (size_t p; (p = word.find("{host}")) != std::string::npos;) word.replace(p, 6, host);
  return word;
}

}  // namespace

std::vector<std::string> parseHostList(const std::string& option, const std::string& list) {
  std::vector<std::string> out;
  static const std::regex kName("[A-Za-z0-9._-]+");
  for (size_t start = 0; start <= list.size();) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string h = list.substr(start, comma - start);
    start = comma + 1;
    CORTADO_ENFORCE(std::regex_match(h, kName), ErrorCode::kInvalidArgument,
                    "{}: '{}' is not a host name (letters, digits, '.', '-', '_'; "
                    "separate hosts with commas, e.g. --hosts node1,node2)",
                    option, h);
    out.push_back(h);
  }
  CORTADO_ENFORCE(!out.empty(), ErrorCode::kInvalidArgument, "{} lists no host", option);
  return out;
}

void checkHosts(const HostsOptions& h) {
  std::set<std::string> seen;
  for (const auto* list : {&h.hosts, &h.serverHosts})
    for (const auto& x : *list)
      CORTADO_ENFORCE(seen.insert(x).second, ErrorCode::kInvalidArgument,
                      "host '{}' is listed twice in --hosts/--server-hosts: list each host once "
                      "and set -w/-s per host",
                      x);
  CORTADO_ENFORCE(h.serverHosts.empty() || !h.hosts.empty(), ErrorCode::kInvalidArgument,
                  "--server-hosts needs --hosts (the hosts of the workers)");
  CORTADO_ENFORCE(!h.dedicatedServers || !h.serverHosts.empty(), ErrorCode::kInvalidArgument,
                  "--dedicated-servers needs --server-hosts (the hosts that run the servers)");
  if (!h.agent.empty())
    CORTADO_ENFORCE(h.agent.find("{host}") != std::string::npos, ErrorCode::kInvalidArgument,
                    "--agent '{}' has no {{host}}: the template must say where the host name "
                    "goes, e.g. --agent 'tests/testbed/testbed.sh exec-host {{host}}'",
                    h.agent);
}

bool isLocalHost(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1") return true;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return false;
  std::string me(buf);
  return host == me || me.rfind(host + ".", 0) == 0 || host.rfind(me + ".", 0) == 0;
}

std::vector<std::string> agentArgv(const std::string& agent, const std::string& host,
                                   const std::vector<std::string>& command) {
  std::vector<std::string> argv;
  if (agent.empty()) {
    // ssh runs the command line through the remote shell: quote each word.
    argv = {"ssh", "-o", "BatchMode=yes", host};
    std::string line;
    for (const auto& c : command) {
      if (!line.empty()) line += ' ';
      line += shellQuote(c);
    }
    argv.push_back(line);
    return argv;
  }
  for (const auto& w : splitWords(agent)) argv.push_back(replaceHost(w, host));
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::string writeMpiAgentWrapper(const std::string& dir, const std::string& agent,
                                 const std::string& self) {
  // OpenMPI calls `AGENT HOST WORDS...` and means WORDS as a command line for
  // a remote shell (as ssh does); an exec-style template gets `sh -c`.
  std::string line = "exec " + shellQuote(self) + " agent-exec --";
  for (const auto& w : splitWords(agent)) {
    std::string quoted;
    size_t start = 0;
    for (size_t p; (p = w.find("{host}", start)) != std::string::npos; start = p + 6)
      quoted += shellQuote(w.substr(start, p - start)) + "\"$host\"";
    quoted += shellQuote(w.substr(start));
    line += " " + quoted;
  }
  // `exec`: the daemon replaces the shell, so it keeps agent-exec's
  // parent-death signal (OpenMPI sends one simple command: orted ...).
  line += " /bin/sh -c \"exec $*\"";
  std::string path = dir + "/mpi_agent.sh";
  std::ofstream f(path);
  f << "#!/bin/sh\n# Written by cortado launch: OpenMPI's rsh agent, through --agent.\n"
    << "host=$1\nshift\n" << line << "\n";
  f.close();
  CORTADO_ENFORCE(f.good() && chmod(path.c_str(), 0755) == 0, ErrorCode::kUnavailable,
                  "cannot write the mpirun agent wrapper {}", path);
  return path;
}

std::vector<std::string> mpirunArgv(const HostsOptions& h, int numWorkers,
                                    const std::vector<std::string>& forwardVars,
                                    const std::string& agentWrapper, const std::string& tcpSubnet,
                                    const std::vector<std::string>& command) {
  std::vector<std::string> a = {"mpirun"};
  if (geteuid() == 0) a.push_back("--allow-run-as-root");
  // The roles' threads are ours to place; binding W ranks to cores would
  // pile them onto few cores.
  a.insert(a.end(), {"--bind-to", "none", "-np", std::to_string(numWorkers)});
  if (h.hosts.empty()) {
    a.push_back("--oversubscribe");
  } else {
    std::string list;
    for (const auto& x : h.hosts) list += fmt::format("{}{}:{}", list.empty() ? "" : ",", x, h.workersPerHost);
    a.insert(a.end(), {"--host", list});
  }
  if (!agentWrapper.empty()) {
    a.insert(a.end(), {"--mca", "plm_rsh_agent", agentWrapper});
    // The agent is the rsh launcher's: another launcher that OpenMPI picks
    // from its environment ignores it. On a GPU machine of ours the default
    // refused the hosts' slots, or ran every worker on the first host.
    if (!getenv("OMPI_MCA_plm")) a.insert(a.end(), {"--mca", "plm", "rsh"});
  }
  if (!tcpSubnet.empty()) {
    if (!getenv("OMPI_MCA_oob_tcp_if_include"))
      a.insert(a.end(), {"--mca", "oob_tcp_if_include", tcpSubnet});
    if (!getenv("OMPI_MCA_btl_tcp_if_include"))
      a.insert(a.end(), {"--mca", "btl_tcp_if_include", tcpSubnet});
  }
  if (!h.hosts.empty()) {
    // A daemon on a host cut off from mpirun hears nothing; TCP keepalive
    // lets it notice within ~11 s and stop its workers (the default is
    // 300 s + 9 x 20 s).
    for (auto [k, v] : {std::pair{"oob_tcp_keepalive_time", "5"},
                        std::pair{"oob_tcp_keepalive_intvl", "2"},
                        std::pair{"oob_tcp_keepalive_probes", "3"}})
      if (!getenv(fmt::format("OMPI_MCA_{}", k).c_str())) a.insert(a.end(), {"--mca", k, v});
  }
  for (const auto& v : forwardVars) a.insert(a.end(), {"-x", v});
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

bool reapMpirun(pid_t pid, int& status) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid)
    return false;
  // OpenMPI 4: <base>/ompi.<host name up to its first dot>.<uid>/pid.<mpirun's pid>,
  // base = orte_tmpdir_base (or orte_local_tmpdir_base), else $TMPDIR, $TEMP,
  // $TMP, /tmp.
  std::string base = "/tmp";
  for (const char* v : {"OMPI_MCA_orte_local_tmpdir_base", "OMPI_MCA_orte_tmpdir_base", "TMPDIR",
                        "TEMP", "TMP"}) {
    if (const char* e = getenv(v); e && *e) {
      base = e;
      break;
    }
  }
  const std::string host = net::localHostname();
  const std::string h = host.substr(0, host.find('.'));
  const std::filesystem::path top =
      std::filesystem::path(base) / fmt::format("ompi.{}.{}", h, getuid());
  const std::filesystem::path session = top / fmt::format("pid.{}", pid);
  // The job family (the upper 16 bits of the jobid that contact.txt
  // starts with) names the shared-memory segments of the job's ranks on
  // this machine, /dev/shm/vader_segment.<host>.<uid>.<jobid, hex>.<local
  // rank>: mpirun removes them when the job ends, and a killed one cannot.
  std::ifstream contact(session / "contact.txt");
  unsigned long long jobid = 0;
  if (contact >> jobid) {
    const std::string prefix = fmt::format("vader_segment.{}.{}.", h, getuid());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const unsigned long long id = std::strtoull(name.c_str() + prefix.size(), nullptr, 16);
      if (id >> 16 == jobid >> 16) unlink(e.path().c_str());
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(session, ec);
  rmdir(top.c_str());  // only when empty: other jobs' mpiruns keep theirs
  return waitpid(pid, &status, 0) == pid;
}

int runAgentExec(const std::vector<std::string>& command) {
  if (command.empty()) {
    fmt::print(stderr, "cortado agent-exec: needs a command after --\n");
    return 2;
  }
  // The agent (and what it execs) dies with the process that started it
  // (mpirun), so no remote daemon outlives the job on this machine.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::vector<char*> argv;
  for (const auto& c : command) argv.push_back(const_cast<char*>(c.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  fmt::print(stderr, "cortado agent-exec: cannot run '{}': {}\n", command[0], strerror(errno));
  return 127;
}

void readEnvFromStdinAndWatch() {
  std::string line;
  bool ended = false;
  while (std::getline(std::cin, line)) {
    if (line == "END") {
      ended = true;
      break;
    }
    auto eq = line.find('=');
    CORTADO_ENFORCE(eq != std::string::npos && eq > 0, ErrorCode::kInvalidArgument,
                    "--env-stdin: line '{}' is not KEY=VALUE", line.substr(0, 80));
    setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
  }
  CORTADO_ENFORCE(ended, ErrorCode::kInvalidArgument,
                  "--env-stdin: stdin closed before the END line (the launcher is gone?)");
  // Nothing else arrives on stdin; its end means the launcher (or the agent
  // between us) is gone, and a role without its launcher must not linger.
  std::thread([] {
    char c;
    while (read(0, &c, 1) > 0) {
    }
    fmt::print(stderr, "cortado: the launcher is gone (stdin closed): exiting\n");
    _exit(1);
  }).detach();
}

}  // namespace cortado::launcher
