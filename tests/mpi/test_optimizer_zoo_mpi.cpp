// The optimizer zoo under mpirun: with data parallelism (every rank steps the whole model on
// the all-reduced gradients, or with --use-distributed-optimizer its shard of it) and
// pipeline parallelism (each stage steps whole tensors) the
// losses equal the one-rank run's within 1e-5 relative (Shampoo under the distributed
// optimizer sharded by whole tensors), and a multi-rank run stopped after 3
// steps and resumed from its checkpoint (the one-rank model's, with the optimizer's state
// buffers and schedule-free's scalar state) ends with the weights of the run that was not
// stopped, bit for bit. Under tensor parallelism GaLore and Shampoo assemble each split
// matrix over the tp pair and step it whole (optim/optimizer_zoo.h's WholeTensorStates).
// Shampoo takes its roots every 2 steps, with epsilon 1e-4: at 1e-12 the
// roots of its rank-deficient early factors turn the layouts' rounding differences into 1e-5.
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <string>

#include "checkpoint/sharded_checkpoint.h"
#include "cli/process.h"
#include "mpirun.h"
#include "tiny_models.h"

namespace {

namespace fs = std::filesystem;

struct Case {
  const char* optimizer;
  const char* layout;
};

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("omnitron_zoo_mpi_" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string zoo_flags(const Case& c, int iters) {
  return "train " + tiny_model_flags("gpt2", iters) + " --optimizer " + c.optimizer +
         " --adam8bit-min-8bit-size 256 --shampoo-update-freq 2 --shampoo-eps 1e-4 " + c.layout;
}

std::string name_of(const Case& c) {
  std::string n = std::string(c.optimizer) + (*c.layout ? c.layout : "_dp2");
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << name_of(c);
}

class ZooLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(ZooLayouts, LossesMatchOneRankAndResumeIsBitExact) {
  const Case c = GetParam();
  const fs::path dir = fresh_dir(name_of(c));
  const Case one{c.optimizer, ""};
  const ProcessResult r1 = run_omnitron_env(
      "OMP_NUM_THREADS=1", zoo_flags(one, 6) + " --metrics-file " + (dir / "one.jsonl").string());
  ASSERT_EQ(r1.exit_code, 0) << r1.output;

  const std::string mpi = std::string(OMNITRON_BINARY) + " ";
  const MpiRun straight =
      mpirun(2,
             mpi + zoo_flags(c, 6) + " --metrics-file " + (dir / "two.jsonl").string() +
                 " --save " + (dir / "straight").string(),
             "-x OMP_NUM_THREADS=1");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::vector<double> ref = losses_of(dir / "one.jsonl"), got = losses_of(dir / "two.jsonl");
  ASSERT_EQ(ref.size(), 6u);
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - ref[i]) / ref[i]);
  std::printf("%s: largest loss difference from one rank %.3g (relative)\n", name_of(c).c_str(),
              worst);
  EXPECT_LE(worst, 1e-5);

  const std::string stopped = (dir / "stopped").string();
  const MpiRun first = mpirun(2, mpi + zoo_flags(c, 6) + " --exit-interval 3 --save " + stopped,
                              "-x OMP_NUM_THREADS=1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const MpiRun second =
      mpirun(2, mpi + zoo_flags(c, 6) + " --load " + stopped + " --save " + stopped,
             "-x OMP_NUM_THREADS=1");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // Each rank wrote its part; the tensors read back whole (the latest is iteration 6).
  const auto a = omni::CheckpointReader((dir / "straight").string()).read_whole();
  const auto b = omni::CheckpointReader(stopped).read_whole();
  ASSERT_FALSE(a.empty()) << straight.output;
  EXPECT_TRUE(a == b) << name_of(c) << ": the resumed run's weights differ";
}

INSTANTIATE_TEST_SUITE_P(Mpi, ZooLayouts,
                         ::testing::Values(Case{"adamwschedulefree",
                                                "--pipeline-model-parallel-size 2"},
                                           Case{"adam8bit", "--pipeline-model-parallel-size 2"},
                                           Case{"muon", "--pipeline-model-parallel-size 2"},
                                           Case{"shampoo", "--pipeline-model-parallel-size 2"},
                                           Case{"adamwschedulefree", ""}, Case{"lamb", ""},
                                           Case{"adamwschedulefree", "--use-distributed-optimizer"},
                                           Case{"shampoo", "--use-distributed-optimizer"},
                                           Case{"shampoo", "--tensor-model-parallel-size 2"},
                                           Case{"galoreadamw8bit",
                                                "--tensor-model-parallel-size 2"}),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace

#endif  // OMNITRON_MPI_CHECK
