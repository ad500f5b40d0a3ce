// The job settings that roles read from the environment (core/config.h):
// here the stall check's, read, handed to children and refused with its name,
// and Horovod's names read as aliases.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/common/error.h"
#include "core/config.h"

namespace cortado {
namespace {

std::string valueIn(const JobConfig& c, const std::string& name) {
  for (const auto& [k, v] : c.toEnv())
    if (k == name) return v;
  return "(missing)";
}

// readJobConfig refuses `var=value` as an invalid argument whose message
// holds `says`; `var` is unset afterwards.
void expectRefused(const char* var, const char* value, const std::string& says) {
  ::setenv(var, value, 1);
  try {
    readJobConfig(false);
    ADD_FAILURE() << var << "=" << value << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  ::unsetenv(var);
}

// validate() refuses `c`, a configuration built in code, with a message that
// holds `says`.
void expectInvalid(JobConfig c, const std::string& says) {
  c.numWorkers = c.numServers = 1;
  try {
    c.validate();
    ADD_FAILURE() << "a configuration that should say \"" << says << "\" was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(Settings, StallCheckIsReadPassedOnAndCheckedWithItsName) {
  ::unsetenv("CORTADO_STALL_CHECK_MS");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.stallCheck, Millis(60000));  // the default, as docs/running.md's table says
  EXPECT_EQ(valueIn(c, "CORTADO_STALL_CHECK_MS"), "60000");
  ::setenv("CORTADO_STALL_CHECK_MS", "250", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.stallCheck, Millis(250));
  EXPECT_EQ(valueIn(c, "CORTADO_STALL_CHECK_MS"), "250");
  ::setenv("CORTADO_STALL_CHECK_MS", "0", 1);  // off
  c = readJobConfig(false);
  c.numWorkers = c.numServers = 1;
  EXPECT_NO_THROW(c.validate());
  ::setenv("CORTADO_STALL_CHECK_MS", "-5", 1);
  expectInvalid(readJobConfig(false), "CORTADO_STALL_CHECK_MS -5 is negative");
  expectRefused("CORTADO_STALL_CHECK_MS", "soon",
                "CORTADO_STALL_CHECK_MS='soon' is not an integer");
}

TEST(Settings, DeclareCheckIsReadPassedOnAndCheckedWithItsName) {
  ::unsetenv("CORTADO_DECLARE_CHECK_MS");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.declareCheck, Millis(10000));  // the default, as docs/running.md's table says
  EXPECT_EQ(valueIn(c, "CORTADO_DECLARE_CHECK_MS"), "10000");
  ::setenv("CORTADO_DECLARE_CHECK_MS", "0", 1);  // off
  c = readJobConfig(false);
  EXPECT_EQ(c.declareCheck, Millis(0));
  EXPECT_EQ(valueIn(c, "CORTADO_DECLARE_CHECK_MS"), "0");
  c.numWorkers = c.numServers = 1;
  EXPECT_NO_THROW(c.validate());
  ::setenv("CORTADO_DECLARE_CHECK_MS", "-1", 1);
  expectInvalid(readJobConfig(false), "CORTADO_DECLARE_CHECK_MS -1 is negative");
  expectRefused("CORTADO_DECLARE_CHECK_MS", "later",
                "CORTADO_DECLARE_CHECK_MS='later' is not an integer");
}

// The latency settings (docs/transports.md, "Latency"): their defaults, read,
// handed to children, and refused with their names and ranges.
TEST(Settings, CompactSparseIsOnByDefaultReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_COMPACT_SPARSE");
  JobConfig c = readJobConfig(false);
  EXPECT_TRUE(c.compactSparse);
  EXPECT_EQ(valueIn(c, "CORTADO_COMPACT_SPARSE"), "1");
  ::setenv("CORTADO_COMPACT_SPARSE", "0", 1);
  c = readJobConfig(false);
  EXPECT_FALSE(c.compactSparse);
  EXPECT_EQ(valueIn(c, "CORTADO_COMPACT_SPARSE"), "0");
  expectRefused("CORTADO_COMPACT_SPARSE", "sometimes",
                "CORTADO_COMPACT_SPARSE='sometimes' is not a boolean");
}

TEST(Settings, ErrorFeedbackStateIsFp32ByDefaultReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_EF_DTYPE");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.efDType, "fp32");
  EXPECT_EQ(valueIn(c, "CORTADO_EF_DTYPE"), "fp32");
  ::setenv("CORTADO_EF_DTYPE", "bfloat16", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.efDType, "bf16");  // canonical
  EXPECT_EQ(valueIn(c, "CORTADO_EF_DTYPE"), "bf16");
  expectRefused("CORTADO_EF_DTYPE", "fp8",
                "CORTADO_EF_DTYPE='fp8': error feedback keeps its state in fp32");
}

TEST(Settings, StaggerIsOffByDefaultReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_STAGGER");
  JobConfig c = readJobConfig(false);
  EXPECT_FALSE(c.staggerChunks);
  EXPECT_EQ(valueIn(c, "CORTADO_STAGGER"), "0");
  ::setenv("CORTADO_STAGGER", "1", 1);
  c = readJobConfig(false);
  EXPECT_TRUE(c.staggerChunks);
  EXPECT_EQ(valueIn(c, "CORTADO_STAGGER"), "1");
  expectRefused("CORTADO_STAGGER", "rotate", "CORTADO_STAGGER='rotate' is not a boolean");
}

TEST(Settings, InlineBytesAndBusyPollAreReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_INLINE_BYTES");
  ::unsetenv("CORTADO_BUSY_POLL_US");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.inlineBytes, 64u << 10);
  EXPECT_EQ(c.busyPollUs, 0);  // off by default: polling threads take cores from the roles
  EXPECT_EQ(valueIn(c, "CORTADO_INLINE_BYTES"), "65536");
  EXPECT_EQ(valueIn(c, "CORTADO_BUSY_POLL_US"), "0");
  ::setenv("CORTADO_INLINE_BYTES", "1MiB", 1);
  ::setenv("CORTADO_BUSY_POLL_US", "50", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.inlineBytes, 1u << 20);
  EXPECT_EQ(c.busyPollUs, 50);
  EXPECT_EQ(valueIn(c, "CORTADO_INLINE_BYTES"), "1048576");
  EXPECT_EQ(valueIn(c, "CORTADO_BUSY_POLL_US"), "50");
  ::setenv("CORTADO_INLINE_BYTES", "0", 1);  // every tensor and key handed off
  EXPECT_EQ(readJobConfig(false).inlineBytes, 0u);
  expectRefused("CORTADO_INLINE_BYTES", "-1",
                "CORTADO_INLINE_BYTES='-1': a size cannot be negative");
  expectRefused("CORTADO_INLINE_BYTES", "small", "CORTADO_INLINE_BYTES='small'");
  expectRefused("CORTADO_BUSY_POLL_US", "-1", "CORTADO_BUSY_POLL_US=-1 is out of range 0..10000");
  expectRefused("CORTADO_BUSY_POLL_US", "10001",
                "CORTADO_BUSY_POLL_US=10001 is out of range 0..10000");
  expectRefused("CORTADO_BUSY_POLL_US", "fast", "CORTADO_BUSY_POLL_US='fast' is not an integer");
  c = readJobConfig(false);
  c.busyPollUs = 20000;  // a configuration built in code is checked too
  expectInvalid(c, "CORTADO_BUSY_POLL_US 20000 is out of range 0..10000");
}

TEST(Settings, PushWindowIsReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_PUSH_WINDOW_CHUNKS");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.pushWindowChunks, 8);
  EXPECT_EQ(valueIn(c, "CORTADO_PUSH_WINDOW_CHUNKS"), "8");
  ::setenv("CORTADO_PUSH_WINDOW_CHUNKS", "0", 1);  // no window
  c = readJobConfig(false);
  EXPECT_EQ(c.pushWindowChunks, 0);
  EXPECT_EQ(valueIn(c, "CORTADO_PUSH_WINDOW_CHUNKS"), "0");
  expectRefused("CORTADO_PUSH_WINDOW_CHUNKS", "-2",
                "CORTADO_PUSH_WINDOW_CHUNKS=-2 is out of range 0..1024");
  expectRefused("CORTADO_PUSH_WINDOW_CHUNKS", "4096",
                "CORTADO_PUSH_WINDOW_CHUNKS=4096 is out of range 0..1024");
  expectRefused("CORTADO_PUSH_WINDOW_CHUNKS", "2MiB",
                "CORTADO_PUSH_WINDOW_CHUNKS='2MiB' is not an integer");
  c.pushWindowChunks = 2000;  // a configuration built in code is checked too
  expectInvalid(c, "CORTADO_PUSH_WINDOW_CHUNKS 2000 is out of range 0..1024");
}

TEST(Settings, UcxPeerSendsAreReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_UCX_PEER_SENDS");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.ucxPeerSends, 1);
  EXPECT_EQ(valueIn(c, "CORTADO_UCX_PEER_SENDS"), "1");
  ::setenv("CORTADO_UCX_PEER_SENDS", "0", 1);  // no bound
  c = readJobConfig(false);
  EXPECT_EQ(c.ucxPeerSends, 0);
  EXPECT_EQ(valueIn(c, "CORTADO_UCX_PEER_SENDS"), "0");
  expectRefused("CORTADO_UCX_PEER_SENDS", "-1",
                "CORTADO_UCX_PEER_SENDS=-1 is out of range 0..1024");
  expectRefused("CORTADO_UCX_PEER_SENDS", "1025",
                "CORTADO_UCX_PEER_SENDS=1025 is out of range 0..1024");
  expectRefused("CORTADO_UCX_PEER_SENDS", "many",
                "CORTADO_UCX_PEER_SENDS='many' is not an integer");
  c.ucxPeerSends = -3;  // a configuration built in code is checked too
  expectInvalid(c, "CORTADO_UCX_PEER_SENDS -3 is out of range 0..1024");
}

TEST(Settings, ShmMessagesTheirSpinAndWaiterReceivesAreReadPassedOnAndRefused) {
  ::unsetenv("CORTADO_SHM_MESSAGES");
  ::unsetenv("CORTADO_SHM_SPIN_US");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.shmMessages, JobConfig{}.shmMessages);
  EXPECT_EQ(c.shmSpinUs, JobConfig{}.shmSpinUs);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_MESSAGES"), c.shmMessages ? "1" : "0");
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_SPIN_US"), std::to_string(c.shmSpinUs));
  ::setenv("CORTADO_SHM_MESSAGES", "0", 1);
  ::setenv("CORTADO_SHM_SPIN_US", "75", 1);
  c = readJobConfig(false);
  EXPECT_FALSE(c.shmMessages);
  EXPECT_EQ(c.shmSpinUs, 75);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_MESSAGES"), "0");
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_SPIN_US"), "75");
  ::setenv("CORTADO_SHM_MESSAGES", "1", 1);
  EXPECT_TRUE(readJobConfig(false).shmMessages);
  expectRefused("CORTADO_SHM_SPIN_US", "-1", "CORTADO_SHM_SPIN_US=-1 is out of range 0..10000");
  expectRefused("CORTADO_SHM_SPIN_US", "10001",
                "CORTADO_SHM_SPIN_US=10001 is out of range 0..10000");
  expectRefused("CORTADO_SHM_MESSAGES", "ring", "CORTADO_SHM_MESSAGES='ring' is not a boolean");
  ::unsetenv("CORTADO_SHM_MESSAGES");
  ::unsetenv("CORTADO_SHM_SPIN_US");
  ::unsetenv("CORTADO_SHM_WAITER_RECEIVES");
  c = readJobConfig(false);
  EXPECT_TRUE(c.shmWaiterReceives);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_WAITER_RECEIVES"), "1");
  ::setenv("CORTADO_SHM_WAITER_RECEIVES", "0", 1);
  c = readJobConfig(false);
  EXPECT_FALSE(c.shmWaiterReceives);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_WAITER_RECEIVES"), "0");
  expectRefused("CORTADO_SHM_WAITER_RECEIVES", "caller",
                "CORTADO_SHM_WAITER_RECEIVES='caller' is not a boolean");
  ::unsetenv("CORTADO_SHM_WAITER_RECEIVES");
  c = readJobConfig(false);
  c.shmSpinUs = 20000;  // a configuration built in code is checked too
  expectInvalid(c, "CORTADO_SHM_SPIN_US 20000 is out of range 0..10000");
}

TEST(Settings, ShmServerPollIsReadPassedOnAndRefusedOutOfRange) {
  ::unsetenv("CORTADO_SHM_SERVER_POLL_US");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.shmServerPollUs, 50);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_SERVER_POLL_US"), "50");
  ::setenv("CORTADO_SHM_SERVER_POLL_US", "0", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.shmServerPollUs, 0);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_SERVER_POLL_US"), "0");
  ::setenv("CORTADO_SHM_SERVER_POLL_US", "10000", 1);
  EXPECT_EQ(readJobConfig(false).shmServerPollUs, 10000);
  expectRefused("CORTADO_SHM_SERVER_POLL_US", "-1",
                "CORTADO_SHM_SERVER_POLL_US=-1 is out of range 0..10000");
  expectRefused("CORTADO_SHM_SERVER_POLL_US", "10001",
                "CORTADO_SHM_SERVER_POLL_US=10001 is out of range 0..10000");
  expectRefused("CORTADO_SHM_SERVER_POLL_US", "often",
                "CORTADO_SHM_SERVER_POLL_US='often' is not an integer");
  ::unsetenv("CORTADO_SHM_SERVER_POLL_US");
  c = readJobConfig(false);
  c.shmServerPollUs = -5;  // a configuration built in code is checked too
  expectInvalid(c, "CORTADO_SHM_SERVER_POLL_US -5 is out of range 0..10000");
}

TEST(Settings, ShmYieldPollsIsReadPassedOnAndRefusedWhenNotABoolean) {
  ::unsetenv("CORTADO_SHM_YIELD_POLLS");
  JobConfig c = readJobConfig(false);
  EXPECT_TRUE(c.shmYieldPolls);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_YIELD_POLLS"), "1");
  ::setenv("CORTADO_SHM_YIELD_POLLS", "0", 1);
  c = readJobConfig(false);
  EXPECT_FALSE(c.shmYieldPolls);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_YIELD_POLLS"), "0");
  expectRefused("CORTADO_SHM_YIELD_POLLS", "yes please",
                "CORTADO_SHM_YIELD_POLLS='yes please' is not a boolean");
  ::unsetenv("CORTADO_SHM_YIELD_POLLS");
}

TEST(Settings, ShmWaiterPollIsReadPassedOnAndRefusedOutOfRange) {
  ::unsetenv("CORTADO_SHM_WAITER_POLL_US");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.shmWaiterPollUs, 50);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_WAITER_POLL_US"), "50");
  ::setenv("CORTADO_SHM_WAITER_POLL_US", "0", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.shmWaiterPollUs, 0);
  EXPECT_EQ(valueIn(c, "CORTADO_SHM_WAITER_POLL_US"), "0");
  ::setenv("CORTADO_SHM_WAITER_POLL_US", "10000", 1);
  EXPECT_EQ(readJobConfig(false).shmWaiterPollUs, 10000);
  expectRefused("CORTADO_SHM_WAITER_POLL_US", "-1",
                "CORTADO_SHM_WAITER_POLL_US=-1 is out of range 0..10000");
  expectRefused("CORTADO_SHM_WAITER_POLL_US", "10001",
                "CORTADO_SHM_WAITER_POLL_US=10001 is out of range 0..10000");
  ::unsetenv("CORTADO_SHM_WAITER_POLL_US");
  c = readJobConfig(false);
  c.shmWaiterPollUs = 10001;  // a configuration built in code is checked too
  expectInvalid(c, "CORTADO_SHM_WAITER_POLL_US 10001 is out of range 0..10000");
}

TEST(Settings, HorovodNamesAreReadAsAliases) {
  for (const char* v : {"CORTADO_LOG_LEVEL", "CORTADO_FUSION_BYTES", "CORTADO_STALL_CHECK_MS",
                        "HOROVOD_LOG_LEVEL", "HOROVOD_FUSION_THRESHOLD",
                        "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE"})
    ::unsetenv(v);
  ::setenv("HOROVOD_LOG_LEVEL", "WARNING", 1);
  ::setenv("HOROVOD_FUSION_THRESHOLD", "33554432", 1);
  ::setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "7", 1);
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.logLevel, "warn");
  EXPECT_EQ(c.fusionBytes, 33554432u);
  EXPECT_EQ(c.stallCheck, Millis(7000));
  ::setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
  EXPECT_EQ(readJobConfig(false).stallCheck, Millis(0));
  // Cortado's own names win over the aliases.
  ::setenv("CORTADO_LOG_LEVEL", "error", 1);
  ::setenv("CORTADO_FUSION_BYTES", "1M", 1);
  ::setenv("CORTADO_STALL_CHECK_MS", "250", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.logLevel, "error");
  EXPECT_EQ(c.fusionBytes, 1u << 20);
  EXPECT_EQ(c.stallCheck, Millis(250));
  ::setenv("HOROVOD_LOG_LEVEL", "fatal", 1);
  ::unsetenv("CORTADO_LOG_LEVEL");
  EXPECT_EQ(readJobConfig(false).logLevel, "error");
  for (const char* v : {"CORTADO_LOG_LEVEL", "CORTADO_FUSION_BYTES", "CORTADO_STALL_CHECK_MS",
                        "HOROVOD_LOG_LEVEL", "HOROVOD_FUSION_THRESHOLD",
                        "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE"})
    ::unsetenv(v);
}

// The variables other launchers set: torchrun's RANK, WORLD_SIZE and
// MASTER_ADDR for a worker, SLURM_PROCID for srun's tasks, each below the
// CORTADO_* ones and in the order core/config.cc documents.
TEST(Settings, OtherLaunchersVariablesFillTheGaps) {
  const char* vars[] = {"CORTADO_ROLE", "CORTADO_RANK", "CORTADO_NUM_WORKERS", "CORTADO_NUM_SERVERS",
                        "CORTADO_SCHEDULER_HOST", "CORTADO_SCHEDULER_PORT", "CORTADO_JOB_TOKEN",
                        "DMLC_ROLE", "DMLC_WORKER_ID", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI",
                        "RANK", "WORLD_SIZE", "MASTER_ADDR", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                        "SLURM_PROCID"};
  for (const char* v : vars) ::unsetenv(v);
  ::setenv("CORTADO_NUM_SERVERS", "2", 1);
  ::setenv("CORTADO_SCHEDULER_PORT", "4000", 1);
  ::setenv("CORTADO_JOB_TOKEN", "t", 1);

  // torchrun: a worker takes rank, size and scheduler host from torch's.
  ::setenv("CORTADO_ROLE", "worker", 1);
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("MASTER_ADDR", "10.1.2.3", 1);
  ::setenv("SLURM_PROCID", "1", 1);  // torchrun under srun: the agent's task, not the worker's rank
  JobConfig c = readJobConfig(true);
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.numWorkers, 4);
  EXPECT_EQ(c.schedulerHost, "10.1.2.3");
  // The CORTADO_* settings win.
  ::setenv("CORTADO_RANK", "0", 1);
  ::setenv("CORTADO_NUM_WORKERS", "8", 1);
  ::setenv("CORTADO_SCHEDULER_HOST", "10.9.9.9", 1);
  c = readJobConfig(true);
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.numWorkers, 8);
  EXPECT_EQ(c.schedulerHost, "10.9.9.9");
  ::unsetenv("CORTADO_RANK");
  ::unsetenv("CORTADO_SCHEDULER_HOST");
  // torch's variables are a worker's only: a server does not read them.
  ::setenv("CORTADO_ROLE", "server", 1);
  c = readJobConfig(true);
  EXPECT_EQ(c.rank, 1);  // SLURM_PROCID
  EXPECT_EQ(c.schedulerHost, "127.0.0.1");

  // srun: a worker without torch's variables takes SLURM_PROCID, but an
  // MPI rank first (mpirun inside an allocation).
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("MASTER_ADDR");
  ::setenv("CORTADO_ROLE", "worker", 1);
  ::setenv("SLURM_PROCID", "5", 1);
  EXPECT_EQ(readJobConfig(true).rank, 5);
  ::setenv("OMPI_COMM_WORLD_RANK", "6", 1);
  EXPECT_EQ(readJobConfig(true).rank, 6);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  // The scheduler has no rank.
  ::setenv("CORTADO_ROLE", "scheduler", 1);
  EXPECT_LT(readJobConfig(true).rank, 0);

  // Without any of them a worker is refused, naming CORTADO_RANK.
  ::unsetenv("SLURM_PROCID");
  ::setenv("CORTADO_ROLE", "worker", 1);
  try {
    readJobConfig(true);
    ADD_FAILURE() << "a worker without a rank was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_RANK"), std::string::npos) << e.what();
  }
  for (const char* v : vars) ::unsetenv(v);
}

}  // namespace
}  // namespace cortado
