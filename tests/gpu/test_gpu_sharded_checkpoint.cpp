// Sharded checkpoints of a GPU run (issue 15): each rank's parameters and optimizer states
// live in device memory, and each rank writes its part from there and reads it back into it.
// Emulated GPU ranks (in-process, one device each) at TP 2 x PP 2 with --bf16 (fp32 master
// weights on the device): stopped at 2 of 4 steps and resumed at the same layout, the losses
// are the uninterrupted run's exactly; the checkpoint loaded at one CPU rank and saved again
// holds the same state, bit for bit. (Named GpuLayouts*: the CMake filters run it at 32 lanes only and
// outside the race check, as the other trainings on emulated ranks.)
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "checkpoint/sharded_checkpoint.h"
#include "comm/local_communicator.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/trainer.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

Options options(const std::vector<std::string>& extra, int world) {
  Options o;
  std::vector<std::string> args = {
      "--mock-data", "--vocab-size",        "97", "--num-layers",
      "4",           "--hidden-size",       "32", "--num-attention-heads",
      "4",           "--seq-length",        "16", "--micro-batch-size",
      "2",           "--global-batch-size", "4",  "--train-iters",
      "4",           "--eval-iters",        "0",  "--lr",
      "1e-2",        "--no-progress"};
  args.insert(args.end(), extra.begin(), extra.end());
  parse_options(args, o);
  o.data_parallel_size = world / (o.tensor_model_parallel_size * o.pipeline_model_parallel_size);
  finalize(o);
  return o;
}

// Rank 0's losses of a run on `world` in-process ranks (emulated GPUs unless --device cpu).
std::vector<double> train(const Options& o, int world, bool save_now = false) {
  std::vector<double> losses;
  run_ranks(world, [&](Communicator& w) {
    if (o.device != "cpu") gpu::set_device(w.rank());
    Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &w);
    MetricsSink sink("", false, nullptr);
    const TrainResult r = t.run(sink);
    if (save_now) t.save(sink);
    if (w.rank() == 0) losses = r.train_losses;
  });
  return losses;
}

TEST(GpuLayoutsShardedCheckpoint, Tp2Pp2Bf16ResumesExactlyAndLoadsAtOneCpuRank) {
#if !defined(OMNITRON_GPU_EMULATE)
  GTEST_SKIP() << "in-process ranks share host memory, which only the emulated device is";
#endif
  set_gpu_backend(&gpu::backend());
  const std::string dir =
      (fs::temp_directory_path() / ("omnitron_gpu_sharded_" + std::to_string(getpid()))).string();
  const std::string cpu = dir + "_cpu";
  fs::remove_all(dir), fs::remove_all(cpu);
  const std::vector<std::string> gpu = {"--device", "cuda",
                                        "--bf16",   "--tensor-model-parallel-size",
                                        "2",        "--pipeline-model-parallel-size",
                                        "2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), gpu.begin(), gpu.end());
    return options(more, 4);
  };
  const std::vector<double> whole = train(with({}), 4);
  train(with({"--save", dir, "--exit-interval", "2"}), 4);
  const std::vector<double> rest = train(with({"--load", dir}), 4);
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(rest[i], whole[i + 2]) << "step " << i + 3;

  train(options({"--device", "cpu", "--train-iters", "2", "--load", dir, "--save", cpu}, 1), 1,
        true);
  for (const std::string prefix : {"", "optimizer."}) {
    const auto a = CheckpointReader(dir).read_whole(prefix);
    const auto b = CheckpointReader(cpu).read_whole(prefix);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      ASSERT_EQ(a[i].second.size(), b[i].second.size());
      EXPECT_EQ(std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * 4), 0)
          << a[i].first;
    }
  }
  fs::remove_all(dir), fs::remove_all(cpu);
}

}  // namespace
}  // namespace omni
