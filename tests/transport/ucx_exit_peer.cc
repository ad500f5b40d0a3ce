// A process that uses UCX transports, closes them and exits, for
// ucx_exit_test.cc: when the libraries' destructors run at its exit, no UCX
// thread may be left. A UCP worker that outlives the exit handlers keeps
// UCX's async thread serving its sockets while libucs frees the state that
// thread uses, which corrupts the heap (docs/transports.md, "Closing a UCX
// transport"). A handler registered first, so that it runs after every other
// exit handler and just before the destructors, counts the threads that UCX
// names "async" and exits with status 3 if there is one.
//
//   ucx_exit_peer exchange          two transports exchange messages both ways,
//                                   close one after the other, and the process
//                                   exits
//   ucx_exit_peer connect-to-closed a transport connects and sends to one that
//                                   closed; five more closes let the closed
//                                   one go, which rejects the request, and
//                                   the connecting one must report it
//
// Prints what it saw; exits 0 when every check held.
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "core/common/deadline.h"
#include "core/transport/ucx/factory.h"

using namespace cortado;

namespace {

// Threads of this process that UCX named "async" (ucs/async/thread.c).
int ucxAsyncThreads() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "async") ++n;
  }
  ::closedir(d);
  return n;
}

void checkAtExit() {
  const int n = ucxAsyncThreads();
  std::printf("UCX async threads at exit: %d\n", n);
  std::fflush(stdout);
  if (n != 0) _exit(3);  // the destructors that would run now are the hazard
}

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  int messages = 0;
  std::string error;

  void listenTo(transport::Transport& t) {
    t.setCallbacks(
        [this](transport::Message&&) {
          std::lock_guard g(mu);
          ++messages;
          cv.notify_all();
        },
        [this](const NodeId&, const Status& s) {
          std::lock_guard g(mu);
          if (error.empty()) error = s.message();
          cv.notify_all();
        });
  }
  template <typename Pred>
  bool waitFor(Pred pred, Millis timeout) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, pred);
  }
};

transport::Message text(const std::string& s) {
  transport::Message m;
  m.parts.push_back(Buffer::copyOf(s.data(), s.size()));
  return m;
}

std::unique_ptr<transport::Transport> make(const NodeId& id) {
  transport::ucx::UcxOptions o;
  o.connectTimeout = Millis(60000);  // longer than any wait here: no timeout reports
  return transport::ucx::create(id, o);
}

int fail(const char* what) {
  std::printf("FAILED: %s\n", what);
  return 1;
}

int exchange() {
  const NodeId a{Role::kServer, 0}, b{Role::kWorker, 0};
  auto ta = make(a), tb = make(b);
  Inbox ia, ib;
  ia.listenTo(*ta);
  ib.listenTo(*tb);
  const std::string addrA = ta->listen("ucx://127.0.0.1:0");
  const std::string addrB = tb->listen("ucx://127.0.0.1:0");
  ta->connect(b, addrB);
  tb->connect(a, addrA);
  for (int i = 0; i < 20; ++i) {
    ta->send(b, text("to b"));
    tb->send(a, text("to a"));
  }
  if (!ia.waitFor([&] { return ia.messages == 20; }, Millis(30000)) ||
      !ib.waitFor([&] { return ib.messages == 20; }, Millis(30000)))
    return fail("the 20 messages each way did not arrive");
  const int open = ucxAsyncThreads();
  std::printf("UCX async threads while open: %d\n", open);
  if (open < 1) return fail("no UCX async thread while open: the exit check would see nothing");
  ta->close();
  tb->close();
  std::printf("closed\n");
  return 0;
}

int connectToClosed() {
  const NodeId a{Role::kServer, 0}, b{Role::kWorker, 0};
  auto ta = make(a);
  Inbox ia;
  ia.listenTo(*ta);
  const std::string addrA = ta->listen("ucx://127.0.0.1:0");
  ta->close();  // parked, still listening
  auto tb = make(b);
  Inbox ib;
  ib.listenTo(*tb);
  tb->listen("ucx://127.0.0.1:0");
  tb->connect(a, addrA);
  tb->send(a, text("to a closed node"));
  // The request reaches the parked listener; give it time to be queued.
  std::this_thread::sleep_for(Millis(300));
  // Four more closes park four more workers: the closed one is then let go,
  // its pending request rejected.
  for (int i = 1; i <= 4; ++i) {
    auto t = make(NodeId{Role::kServer, i});
    Inbox in;
    in.listenTo(*t);
    t->listen("ucx://127.0.0.1:0");
    t->close();
  }
  if (!ib.waitFor([&] { return !ib.error.empty(); }, Millis(20000)))
    return fail("the node that connected to a closed one got no error within 20 s");
  std::printf("connecting node's error: %s\n", ib.error.c_str());
  tb->close();
  std::printf("closed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ucx_exit_peer exchange|connect-to-closed\n");
    return 2;
  }
  std::atexit(checkAtExit);  // first registered: runs last, before the destructors
  const std::string mode = argv[1];
  try {
    if (mode == "exchange") return exchange();
    if (mode == "connect-to-closed") return connectToClosed();
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "ucx_exit_peer: unknown mode '%s'\n", mode.c_str());
  return 2;
}
