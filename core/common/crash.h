// A report for fatal signals: a process that dies of SIGSEGV, SIGBUS, SIGILL,
// SIGFPE or SIGABRT (glibc's heap checks abort) first writes which process it
// was and its stack to stderr, then dies of the same signal as before (the
// exit status and any core dump are unchanged).
//
// Installed by the `cortado` command's roles and by programs that opt in;
// never by the Python bindings (the interpreter's own faulthandler is the
// user's to choose). The frames are raw addresses with their module and
// offset where a symbol is not exported: `addr2line -f -C -e MODULE OFFSET`
// names the function (and the line in a build with debug information).
#pragma once

#include <string>

namespace cortado {

// `who` names the process in the report, e.g. "worker 0" or "server 1";
// later calls replace it. Safe to call more than once.
void installCrashReport(const std::string& who);

}  // namespace cortado
