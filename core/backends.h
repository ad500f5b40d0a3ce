// The one place (with the tests) that names concrete transports: builds the
// data-plane transport that a job's configuration asks for. Used by the role
// commands and the bindings; the worker and server engines only see the
// Transport interface.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/collective/collectives.h"
#include "core/config.h"
#include "core/control/control_client.h"
#include "core/device/device.h"
#include "core/transport/transport.h"
#include "core/worker.h"

namespace cortado {

// What every program that runs a job's node takes from the job's settings:
// the control client's options for `role` (scheduler address, token, rank,
// deadlines; the data address is the caller's, after listen()), and a
// worker's engine options (chunk size, credits, async, shared memory, listen
// address). One place, so that no entry point forgets a setting.
control::ClientOptions controlOptions(const JobConfig& job, Role role);
WorkerOptions workerOptions(const JobConfig& job);

// Starts this job's worker with the options above and makeTransport()'s
// transport; blocks until registered or `deadline` (throws as Worker::start).
std::unique_ptr<Worker> startWorker(const JobConfig& job, Deadline deadline);

// Where worker `rank` sits among the job's workers, from the hostnames they
// registered with (AddressBook::workers): machines are numbered in the order
// of their lowest worker rank, and local ranks follow worker ranks within a
// machine. This is the Topology that collective::nccl::createGroups takes
// in a job that has no MPI. Error(kInvalidArgument) for a rank out of range.
collective::Topology workerTopology(const control::AddressBook& book, int rank);

// NCCL's unique-id exchange (collective::nccl::UniqueIdExchange) through the
// scheduler's key-value rendezvous: the rank that brings the id puts it
// under "nccl/<key>", every other rank gets it. The client must outlive the
// returned function. Errors are the client's: kTimeout naming the key when
// rank 0 never puts it, the job's failure when a node dies meanwhile.
std::function<std::string(const std::string& key, const std::string& rootId, Deadline deadline)>
schedulerIdExchange(control::ControlClient& client);

// The device a worker's plan executor runs on (JobConfig::device,
// CORTADO_DEVICE; core/device/device.h):
// - "host": host memory, the CPU codecs (`codecs`; nullptr: its own), and
//   `hostGroups` (the MPI groups; may be null) for the collectives.
// - "cuda": CUDA device (mpirun's local rank) % deviceCount(), the CUDA
//   codecs, and NCCL groups formed over hostGroups' topology, the ranks
//   agreeing on the NCCL id through hostGroups' world broadcast (every rank
//   calls this; the ranks run under mpirun). Ranks that share a GPU (found
//   by its UUID, gathered over the world group) are each a host of their
//   own to NCCL (NCCL_HOSTID, unless set), which refuses two ranks of one
//   host on one GPU; over loopback where every rank is on this machine. Error(kUnavailable) when this build has no
//   CUDA or NCCL, or no GPU is visible; kInvalidArgument without hostGroups.
// bool cudaDeviceBuilt(): whether "cuda" can be asked for in this build.
std::shared_ptr<device::Device> makeDevice(const JobConfig& job,
                                           const collective::Groups* hostGroups,
                                           std::shared_ptr<const compressor::Registry> codecs,
                                           Deadline deadline);
bool cudaDeviceBuilt();
// CUDA devices visible to this process; 0 without a GPU or in a build without CUDA.
int cudaDeviceCount();

// True when this build has the UCX transport (libucx was found at configure).
bool ucxBuilt();

// What a job's `transport` setting resolves to, and why (for the log).
struct TransportChoice {
  std::string kind;    // "zmq" or "ucx"
  std::string reason;  // one line, e.g. "UCX initialized and its endpoints connect on loopback"
};

// Resolves config.transport without keeping a transport:
// - "zmq": ZeroMQ.
// - "ucx": UCX; throws Error(kUnavailable) when this build has no UCX, or
//   when UCX fails to initialize, naming the cause and the UCX_* variables in
//   force.
// - "auto": UCX where it was built, initializes, and a probe endpoint
//   connects to a probe listener on config.dataHost and carries a message
//   (within a few seconds); ZeroMQ otherwise. Never throws for UCX's sake.
// The launcher calls this once and hands the result to every role, so a
// whole job runs on one transport.
TransportChoice chooseTransport(const JobConfig& config);

// Builds this node's transport. For "auto" it runs chooseTransport() and
// logs the choice and the reason. Throws as chooseTransport() does.
std::unique_ptr<transport::Transport> makeTransport(const JobConfig& config, const NodeId& self);

// The listen address for this node's data plane: ucx://host:0 for "ucx",
// tcp://host:0 for "zmq" and "auto" (both transports listen on it; each
// returns the address peers connect to, in its own scheme).
std::string dataListenAddress(const JobConfig& config);

}  // namespace cortado
