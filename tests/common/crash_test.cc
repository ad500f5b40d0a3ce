// The fatal-signal report (core/common/crash.h), in forked children: each
// installs it, dies, and the parent checks what it wrote and how it died.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "core/common/crash.h"

namespace cortado {
namespace {

struct Death {
  std::string stderrText;
  int signal = 0;  // 0 when the child exited (or was not reaped in time)
};

// Runs `die` in a child whose stderr is a pipe; reads it and reaps the child,
// each with a deadline.
Death runChild(const std::function<void()>& die) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    rlimit none{0, 0};
    ::setrlimit(RLIMIT_CORE, &none);  // no core file in the test's folder
    die();
    ::_exit(0);
  }
  ::close(fds[1]);
  Death d;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;  // the child's end closed: it is gone
    d.stderrText.append(buf, n);
  }
  ::close(fds[0]);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFSIGNALED(status)) d.signal = WTERMSIG(status);
      return d;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  ADD_FAILURE() << "the child did not die within 20 s";
  return d;
}

TEST(CrashReport, ASegfaultNamesTheProcessPrintsItsStackAndStillDiesOfIt) {
  Death d = runChild([] {
    installCrashReport("first name");
    installCrashReport("worker 3");  // a later call renames
    ::raise(SIGSEGV);
  });
  EXPECT_EQ(d.signal, SIGSEGV) << d.stderrText;
  EXPECT_NE(d.stderrText.find("*** worker 3 (pid "), std::string::npos) << d.stderrText;
  EXPECT_NE(d.stderrText.find("fatal signal 11 (SEGV) sent by pid "), std::string::npos)
      << d.stderrText;
  EXPECT_EQ(d.stderrText.find("first name"), std::string::npos) << d.stderrText;
  // backtrace_symbols_fd writes one "module(symbol+offset) [address]" line per
  // frame; the test binary itself is among them.
  EXPECT_NE(d.stderrText.find("common_test("), std::string::npos) << d.stderrText;
  EXPECT_NE(d.stderrText.find("please report this"), std::string::npos) << d.stderrText;
}

TEST(CrashReport, AFaultGivesTheAddress) {
  Death d = runChild([] {
    installCrashReport("worker 1");
    // A read through a pointer the compiler cannot see is null.
    int* volatile p = nullptr;
    std::printf("%d", *p);
  });
  EXPECT_EQ(d.signal, SIGSEGV) << d.stderrText;
  EXPECT_NE(d.stderrText.find("fatal signal 11 (SEGV) at address 0x0000000000000000"),
            std::string::npos)
      << d.stderrText;
}

TEST(CrashReport, GlibcsHeapCheckAbortIsReported) {
  Death d = runChild([] {
    installCrashReport("server 1");
    void* volatile p = std::malloc(64);
    std::free(p);
    std::free(p);  // glibc: "free(): double free detected", then abort()
  });
  EXPECT_EQ(d.signal, SIGABRT) << d.stderrText;
  EXPECT_NE(d.stderrText.find("double free"), std::string::npos) << d.stderrText;
  EXPECT_NE(d.stderrText.find("*** server 1 (pid "), std::string::npos) << d.stderrText;
  EXPECT_NE(d.stderrText.find("fatal signal 6 (ABRT)"), std::string::npos) << d.stderrText;
  EXPECT_NE(d.stderrText.find("common_test("), std::string::npos) << d.stderrText;
}

TEST(CrashReport, ANormalExitPrintsNothing) {
  Death d = runChild([] { installCrashReport("worker 0"); });
  EXPECT_EQ(d.signal, 0);
  EXPECT_EQ(d.stderrText, "");
}

}  // namespace
}  // namespace cortado
