#include "core/common/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace cortado {
namespace {

// Written by installCrashReport, read by the handler: a fixed buffer, so
// that the handler touches no allocator (it may run inside a corrupt heap).
char gWho[128] = "cortado";
char gAltStack[64 * 1024];

void put(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void putNumber(long v) {
  char buf[24];
  int i = sizeof(buf) - 1;
  buf[i] = '\0';
  bool negative = v < 0;
  unsigned long u = negative ? 0ul - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u > 0 && i > 1);
  if (negative) buf[--i] = '-';
  put(buf + i);
}

void onFatal(int sig, siginfo_t* info, void*) {
  // Only async-signal-safe calls below: write(2), backtrace_symbols_fd (which
  // does not allocate) and backtrace (its library was loaded at install).
  put("\n*** ");
  put(gWho);
  put(" (pid ");
  putNumber(static_cast<long>(::getpid()));
  put("): fatal signal ");
  putNumber(sig);
  put(" (");
  const char* name = sigabbrev_np(sig);
  put(name ? name : "?");
  put(")");
  if (info && info->si_code <= 0) {
    // Sent by a process (kill, raise, abort), not raised by a fault.
    put(" sent by pid ");
    putNumber(static_cast<long>(info->si_pid));
  } else if (info) {
    put(" at address 0x");
    char hex[17];
    auto a = reinterpret_cast<uintptr_t>(info->si_addr);
    for (int i = 15; i >= 0; --i, a >>= 4) hex[i] = "0123456789abcdef"[a & 0xf];
    hex[16] = '\0';
    put(hex);
  }
  put("; its stack, innermost first (addr2line -f -C -e MODULE OFFSET names a frame):\n");
  void* frames[64];
  int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  put("*** please report this with the lines above: it is a bug in Cortado or below it\n");
  // SA_RESETHAND restored the default action: die of the same signal.
  ::raise(sig);
}

}  // namespace

void installCrashReport(const std::string& who) {
  std::strncpy(gWho, who.c_str(), sizeof(gWho) - 1);
  gWho[sizeof(gWho) - 1] = '\0';
  static bool installed = false;
  if (installed) return;
  installed = true;
  // backtrace() loads libgcc on its first call, which allocates: do it now,
  // not in the handler.
  void* warm[2];
  ::backtrace(warm, 2);
  // Its own stack, so that a stack overflow on this (the main) thread is
  // reported too; other threads report on their own stacks.
  stack_t ss{};
  ss.ss_sp = gAltStack;
  ss.ss_size = sizeof(gAltStack);
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = &onFatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace cortado
