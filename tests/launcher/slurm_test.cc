// The Slurm pieces of `cortado launch` (launcher/slurm.h) that need no
// cluster: tasks per node from the allocation's variables, the srun command
// line, and the refusals. tests/launchers/slurm_test.sh runs real jobs.
#include "launcher/slurm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "core/common/error.h"

namespace cortado::launcher {
namespace {

TEST(Slurm, TasksPerNodeFromTheAllocation) {
  EXPECT_EQ(slurmTasksPerNode("4", nullptr), 4);
  EXPECT_EQ(slurmTasksPerNode("4", "2(x3)"), 4);  // SLURM_NTASKS_PER_NODE first
  EXPECT_EQ(slurmTasksPerNode(nullptr, "2(x3)"), 2);
  EXPECT_EQ(slurmTasksPerNode(nullptr, "2,2(x2),2"), 2);
  EXPECT_EQ(slurmTasksPerNode("", "3"), 3);
  // Not uniform, or not a count: 0, and the launcher asks for -w.
  EXPECT_EQ(slurmTasksPerNode(nullptr, "2(x3),1"), 0);
  EXPECT_EQ(slurmTasksPerNode(nullptr, "two"), 0);
  EXPECT_EQ(slurmTasksPerNode("x", nullptr), 0);
  EXPECT_EQ(slurmTasksPerNode(nullptr, nullptr), 0);
  EXPECT_EQ(slurmTasksPerNode(nullptr, "0"), 0);
}

TEST(Slurm, SrunStepSpansEveryNode) {
  SlurmAllocation a{"7", {"n1", "n2", "n3"}, 2};
  auto argv = srunArgv(a, 2, "cortado-workers", {"python3", "train.py"});
  ASSERT_GE(argv.size(), 3u);
  EXPECT_EQ(argv.front(), "srun");
  auto has = [&](const std::string& s) {
    return std::find(argv.begin(), argv.end(), s) != argv.end();
  };
  EXPECT_TRUE(has("--nodes=3"));
  EXPECT_TRUE(has("--ntasks=6"));
  EXPECT_TRUE(has("--ntasks-per-node=2"));
  EXPECT_TRUE(has("--overlap"));
  EXPECT_TRUE(has("--kill-on-bad-exit=1"));
  EXPECT_EQ(argv[argv.size() - 2], "python3");
  EXPECT_EQ(argv.back(), "train.py");
}

TEST(Slurm, InsideAnAllocationButNotInAStep) {
  for (const char* v : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_STEP_ID"}) ::unsetenv(v);
  EXPECT_FALSE(insideSlurmAllocation());
  try {
    readSlurmAllocation();
    ADD_FAILURE() << "no allocation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sbatch"), std::string::npos) << e.what();
  }
  ::setenv("SLURM_JOB_ID", "12", 1);
  ::setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  EXPECT_TRUE(insideSlurmAllocation());
  ::setenv("SLURM_STEP_ID", "0", 1);  // `srun cortado launch`: a local job
  EXPECT_FALSE(insideSlurmAllocation());
  for (const char* v : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_STEP_ID"}) ::unsetenv(v);
}

TEST(Slurm, MalformedNodeListIsRefusedBeforeAnyShell) {
  try {
    expandSlurmNodeList("n1;rm -rf /");
    ADD_FAILURE() << "a node list with shell characters was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a Slurm host list"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado::launcher
