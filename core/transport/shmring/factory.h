// Same-host messages through shared-memory rings, in front of another
// transport (CORTADO_SHM_MESSAGES). The node gets a mailbox
// (core/shm/mailbox.h) that same-host peers write small messages into; a
// thread of this transport waits on it and hands them to the receive
// callback. send() to a peer whose mailbox exists on this host (same
// hostname) puts a message that fits a slot into that peer's ring and
// rings its doorbell only if the peer sleeps. Everything else goes to the
// inner transport as before: peers on other hosts, peers without a mailbox,
// larger messages, and any message while the ring is full or refused.
// connect(), listen(), disconnect() and peer failures are the inner
// transport's.
//
// Order: messages from one sender arrive in the order sent, whichever way
// each went. Every ring record carries how many messages its sender had
// sent to this peer over the inner transport before it; the receiver hands
// a record over only once it has received that many from that peer over
// the inner transport, and before it hands over a later inner message, it
// hands over the ring records written before that message.
//
// Threads: the receive callback runs on the inner transport's loop thread,
// on the ring thread, or on a thread in receiveWhileWaiting(), one at a
// time (a mutex), never while a lock that send() takes is held. The error
// callback also reports a peer whose process is gone while it had a ring
// here (checked by the ring thread every `checkEvery`, whoever takes the
// records meanwhile).
//
// A waiting thread as the consumer (receiveWhileWaiting, `waiterReceives`):
// the ring thread is the mailbox's consumer until a thread that waits for a
// reply takes the role; that thread then takes the records itself, with
// the same code and the same order as the ring thread, and sleeps on the
// doorbell, so that the producer's wake-up reaches it directly, while the
// ring thread parks (shm::Mailbox's turns: neither move wakes a thread).
// When its done() turns true, its deadline passes, or the transport
// closes, it hands the role to a thread that waits for it, or back to the
// ring thread. One consumer at a time; wakeWaiting() wakes it (and the
// threads that wait for the role) to look at their done() again.
//
// Polls instead of sleeps, where a message is known to be on its way: the
// ring thread after a batch while the receiver expects more
// (Transport::setExpecting: a server whose round waits for pushes), and a
// waiting thread as the consumer before each sleep. Each is bounded
// (pollWhileExpecting, waiterPoll) and goes on only while spareCpu() says
// that no thread of the machine waits for a CPU, so a poll takes no CPU
// that another thread wants (core/common/idle_cpus.h); with `yieldPolls`,
// also while the only threads that wait for a CPU are the job's own, and
// then yielding the CPU between looks (core/shm/job_threads.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/shm/mailbox.h"
#include "core/transport/transport.h"

namespace cortado::transport::shmring {

struct RingOptions {
  // shm::jobPrefix(token): the mailboxes are job segments.
  std::string prefix;
  // Compared with the peers' (net::localHostname() when empty): only a
  // peer on the same host is written to.
  std::string host;
  // The ring thread polls this long after its last message before it
  // sleeps on the doorbell (CORTADO_SHM_SPIN_US), yielding the core
  // between looks.
  std::chrono::microseconds spin{0};
  // The ring thread polls its rings for up to this long, instead of
  // sleeping at once, after it handed messages over while the receiver
  // expects more (Transport::setExpecting: a server with a worker waiting
  // for a round's answer; with `yieldPolls`, after every batch of a
  // receiver that set a predicate at all) and while the gate (`spareCpu()`)
  // says that no thread of the machine waits for a CPU, looked at every
  // few microseconds (CORTADO_SHM_SERVER_POLL_US; shm::Mailbox::poll). 0:
  // never.
  std::chrono::microseconds pollWhileExpecting{0};
  // A thread in receiveWhileWaiting() as the consumer polls for up to this
  // long for its answer before it sleeps on the doorbell, again after each
  // message that did not end its wait, while `spareCpu()` says so
  // (CORTADO_SHM_WAITER_POLL_US). 0: never.
  std::chrono::microseconds waiterPoll{0};
  // Whether polling costs nobody a CPU now; nullptr: IdleCpus's gate
  // (core/common/idle_cpus.h). Called on the polling thread.
  std::function<bool()> spareCpu;
  // The gate tells the job's own threads from others (CORTADO_SHM_YIELD_POLLS):
  // the threads of this transport that take ring messages count themselves
  // awake or asleep in the job's shm::JobThreads segment (under `prefix`),
  // and the gate (without `spareCpu`) lets the polls go on while every
  // runnable thread of the machine is one of the job's, yielding the CPU
  // between looks (IdleCpus::Verdict::kJobOnly); a thread outside the job
  // that wants a CPU closes it as before.
  bool yieldPolls = false;
  // How often a sleeping ring thread looks for producers whose process
  // is gone.
  std::chrono::milliseconds checkEvery{100};
  // receiveWhileWaiting() takes the consumer's role (CORTADO_SHM_WAITER_RECEIVES);
  // false: it returns false, and the ring thread takes every record.
  bool waiterReceives = true;
  shm::MailboxShape shape;
};

// Takes `inner`; its self() is this transport's. Throws Error(kUnavailable)
// when the mailbox cannot be created (/dev/shm full).
std::unique_ptr<Transport> create(std::unique_ptr<Transport> inner, const RingOptions& options);

}  // namespace cortado::transport::shmring
