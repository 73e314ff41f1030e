// Issue 4's crash test: the binary killed with SIGKILL at random points of a run that saves
// every step, then resumed with --load, ends with the same parameters and optimizer state,
// bit for bit, as the run that was never interrupted.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "cli/process.h"

namespace {

namespace fs = std::filesystem;

const std::string kRun =
    "train --mock-data --vocab-size 50 --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
    "--seq-length 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 60 --lr 1e-2 "
    "--lr-decay-style cosine --lr-warmup-iters 4 --eval-iters 0 --log-interval 10 --no-progress "
    "--max-new-tokens 0 --device cpu --save-interval 1 ";

TEST(CheckpointCrash, KilledAtRandomPointsAndResumedEndsBitIdentical) {
  const std::string base =
      ::testing::TempDir() + "omnitron_ckpt_kill_" + std::to_string(getpid()) + "_";
  const std::string straight = base + "straight";
  fs::remove_all(straight);
  auto [c0, out0] = run_omnitron(kRun + "--save " + straight);
  ASSERT_EQ(c0, 0) << out0;
  const std::string final_dir = "/iter_0000060/";

  std::mt19937 rng(20261122);
  int killed = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const std::string dir = base + std::to_string(trial);
    fs::remove_all(dir);
    // Wait for the first checkpoint, then kill -9 a random few milliseconds later.
    const int delay_ms = std::uniform_int_distribution<int>(0, 250)(rng);
    auto [ck, outk] = run_omnitron(
        kRun + "--save " + dir + " & pid=$!; while [ ! -s " + dir +
        "/latest_checkpointed_iteration.txt ] && kill -0 $pid 2>/dev/null; do sleep 0.01; "
        "done; sleep " +
        std::to_string(delay_ms / 1000.0) + "; kill -9 $pid; wait $pid");
    const std::string latest = read_text(dir + "/latest_checkpointed_iteration.txt");
    if (ck == 128 + 9) ++killed;
    // Resume (from wherever the kill left the latest complete checkpoint) to the end.
    auto [cr, outr] = run_omnitron(kRun + "--save " + dir + " --load " + dir);
    ASSERT_EQ(cr, 0) << outk << outr;
    for (const char* file : {"model.bin", "optimizer.bin"}) {
      const std::string a = read_text(straight + final_dir + file);
      const std::string b = read_text(dir + final_dir + file);
      ASSERT_FALSE(a.empty());
      EXPECT_TRUE(a == b) << file << " differs after a kill " << delay_ms
                          << " ms after the first save\n"
                          << outk << outr;
    }
    std::printf("trial %d: killed %d ms after the first save, latest checkpoint %s, exit %d\n",
                trial, delay_ms, latest.c_str(), ck);
  }
  EXPECT_GT(killed, 0) << "every run finished before its kill: lengthen the run";
}

}  // namespace
