// The optimizer zoo through the binary: each optimizer trains the tiny model on a repeated
// sentence and lowers its loss; a run stopped and resumed from its checkpoint ends with the
// same weights, bit for bit, as the run that was not stopped; settings the zoo cannot combine
// with are refused in one line that names the optimizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/process.h"

namespace {

// Written under this process's own name and renamed, so that tests running in parallel
// (ctest -j) never read another's half-written file.
std::string text_file() {
  const std::string path = ::testing::TempDir() + "omnitron_zoo_text.txt";
  const std::string mine = path + "." + std::to_string(::getpid());
  {
    std::ofstream out(mine);
    for (int i = 0; i < 300; ++i) out << "In the beginning was the Word. ";
  }
  std::filesystem::rename(mine, path);
  return path;
}

std::string tiny(const std::string& optimizer, const std::string& lr) {
  return "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
         "--micro-batch-size 4 --lr-decay-style constant --eval-iters 0 --log-interval 1 "
         "--max-new-tokens 0 --no-progress --train-text " +
         text_file() + " --optimizer " + optimizer + " --lr " + lr + " ";
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  for (size_t at = out.find("lm loss: "); at != std::string::npos;
       at = out.find("lm loss: ", at + 1))
    l.push_back(std::stod(out.substr(at + 9)));
  return l;
}

struct Case {
  const char* optimizer;
  const char* lr;  // a learning rate that suits it on this model
};

class ZooTrains : public ::testing::TestWithParam<Case> {};

TEST_P(ZooTrains, TwentyStepsLowerTheLoss) {
  const Case c = GetParam();
  // adam8bit: the model's tensors are small, so 8-bit states from 256 elements on; GaLore
  // projects on 4 singular vectors, renewed every 5 steps; Shampoo preconditions from step 5.
  auto [code, out] = run_omnitron(tiny(c.optimizer, c.lr) +
                                  "--train-iters 20 --adam8bit-min-8bit-size 256 --galore-rank 4 "
                                  "--galore-update-proj-gap 5 --shampoo-update-freq 5");
  ASSERT_EQ(code, 0) << out;
  const std::vector<double> l = losses(out);
  ASSERT_EQ(l.size(), 20u) << out;
  std::printf("[ zoo ] %-18s lr %-5s loss %.3f -> %.3f\n", c.optimizer, c.lr, l.front(), l.back());
  EXPECT_LT(l.back(), 0.8 * l.front()) << out;
}

INSTANTIATE_TEST_SUITE_P(Cli, ZooTrains,
                         ::testing::Values(Case{"lamb", "1e-1"}, Case{"ds.fusedlamb", "1e-1"},
                                           Case{"lion", "1e-3"}, Case{"muon", "3e-3"},
                                           Case{"adamwschedulefree", "1e-2"},
                                           Case{"sgdschedulefree", "1.0"}, Case{"adam8bit", "1e-2"},
                                           Case{"sophiag", "1e-3"}, Case{"galoreadamw", "1e-2"},
                                           Case{"shampoo", "1e-2"}),
                         [](const auto& info) {
                           std::string name = info.param.optimizer;
                           for (char& ch : name)
                             if (ch == '.') ch = '_';
                           return name;
                         });

std::string model_bytes(const std::string& dir) {
  return read_text(dir + "/iter_0000006/model.bin");
}

// The schedule-free averaging weights (scalar state) and adam8bit's quantised states go
// through the checkpoint: 3 + 3 steps end where 6 steps do. (Shampoo's preconditioners, which
// are not shaped like the parameters: tests/mpi/test_optimizer_zoo_mpi.cpp, under PP 2.)
TEST(CliOptimizerZoo, ResumeFromACheckpointIsBitExact) {
  for (const char* optimizer : {"adamwschedulefree", "adam8bit", "muon", "lion"}) {
    const std::string base = ::testing::TempDir() + "omnitron_zoo_ckpt_" + optimizer;
    const std::string straight = base + "_straight", stopped = base + "_stopped";
    std::filesystem::remove_all(straight);
    std::filesystem::remove_all(stopped);
    const std::string run = tiny(optimizer, "1e-3") + "--adam8bit-min-8bit-size 256 ";
    auto [c1, o1] = run_omnitron(run + "--train-iters 6 --save " + straight);
    ASSERT_EQ(c1, 0) << o1;
    auto [c2, o2] = run_omnitron(run + "--train-iters 6 --exit-interval 3 --save " + stopped);
    ASSERT_EQ(c2, 0) << o2;
    auto [c3, o3] = run_omnitron(run + "--train-iters 6 --load " + stopped + " --save " + stopped);
    ASSERT_EQ(c3, 0) << o3;
    EXPECT_NE(o3.find("3 iterations (4 to 6)"), std::string::npos) << o3;
    const std::string a = model_bytes(straight), b = model_bytes(stopped);
    ASSERT_FALSE(a.empty()) << o1;
    EXPECT_TRUE(a == b) << optimizer << ": the resumed run's weights differ";
  }
}

void expect_one_line_error(const ProcessResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;  // one line
}

TEST(CliOptimizerZoo, SettingsItCannotCombineWithAreRefusedInOneLine) {
  const std::string run = tiny("lamb", "1e-2") + "--train-iters 1 ";
  expect_one_line_error(run_omnitron(tiny("muon", "1e-2") + "--muon-scalar-optimizer sgd"),
                        "--muon-scalar-optimizer sgd");
  expect_one_line_error(run_omnitron(tiny("ds.onebitlamb", "1e-2") + "--train-iters 1"),
                        "--optimizer ds.onebitlamb: not built yet");
  expect_one_line_error(run_omnitron(tiny("galoreadamw", "1e-2") + "--galore-proj-type up"),
                        "--galore-proj-type: 'up' is not one of std, reverse_std, left, right");
  // GaLore and Shampoo keep per-matrix states whole: refused where they would be split
  // (the distributed optimizer shards them by whole tensors: tests/optim/test_zoo_shards.cpp).
  expect_one_line_error(run_omnitron(tiny("shampoo", "1e-2") + "--train-iters 1 --zero-stage 3"),
                        "--optimizer shampoo with --zero-stage 3: not built yet");
  expect_one_line_error(
      run_omnitron(tiny("galoreadamw8bit", "1e-2") + "--train-iters 1 --zero-stage 2"),
      "--optimizer galoreadamw8bit with --zero-stage 2: not built yet");
  // (with --tensor-model-parallel-size 2: tests/optim/test_optimizer_zoo.cpp, one process)
  expect_one_line_error(run_omnitron(tiny("adagrad", "1e-2") + "--train-iters 1"),
                        "is not one of adam (adamw), sgd, lamb, ds.fusedlamb");
}

TEST(CliOptimizerZoo, MegatronDeepSpeedOptNamesSelectTheZoo) {
  const std::string run =
      "train --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
      "--seq-length 8 --micro-batch-size 2 --mock-data --vocab-size 40 "
      "--eval-iters 0 --max-new-tokens 0 --no-progress --train-iters 1";
  for (const char* opt :
       {"ds.fusedlamb", "ipex.lamb", "lion", "adam8bit", "sgdschedulefree", "sophiag"}) {
    auto [code, out] = run_omnitron_env("OMNITRON_ENV_OVERRIDES=1 OPT=" + std::string(opt), run);
    EXPECT_EQ(code, 0) << opt << ": " << out;
  }
  auto [code, out] = run_omnitron_env("OMNITRON_ENV_OVERRIDES=1 OPT=ds.onebitlamb", run);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("OPT=ds.onebitlamb: not built yet"), std::string::npos) << out;
}

}  // namespace
