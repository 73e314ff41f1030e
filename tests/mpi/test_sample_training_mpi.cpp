// --calculate-per-token-loss and --rampup-batch-size across data-parallel ranks: the token
// count is summed over the ranks and each rank takes its share of every ramped batch, so two
// ranks train what one process trains (per-step losses within 1e-6 relative).
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/process.h"
#include "mpirun.h"

namespace {

namespace fs = std::filesystem;

TEST(MpiSampleTraining, PerTokenLossAndBatchRampOnTwoDataParallelRanksMatchOneProcess) {
  const fs::path dir =
      fs::temp_directory_path() / ("omnitron_sample_mpi_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // NullTokenizer's end-of-document id (the vocabulary's last) is in the mock tokens, so the
  // micro-batches hold different numbers of loss tokens. Ramp 4 -> 8 over 8 samples: steps
  // of 4, 4, 8, ... 9 in all for 64 samples.
  const std::string flags =
      " train --mock-data --vocab-size 64 --num-layers 2 --hidden-size 32 --seq-length 64 "
      "--num-attention-heads 4 --micro-batch-size 2 --global-batch-size 8 --train-samples 64 "
      "--rampup-batch-size 4 4 8 --tokenizer-type NullTokenizer --eod-mask-loss "
      "--calculate-per-token-loss --lr 3e-3 --log-interval 1 --eval-iters 0 --seed 5 "
      "--max-new-tokens 0 --no-progress --device cpu --metrics-file ";
  const ProcessResult one = run_command("OMP_NUM_THREADS=1 " + std::string(OMNITRON_BINARY) +
                                        flags + (dir / "one.jsonl").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const MpiRun two = mpirun(2, std::string(OMNITRON_BINARY) + flags + (dir / "two.jsonl").string(),
                            "-x OMP_NUM_THREADS=1");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<double> a = losses_of(dir / "one.jsonl"),
                            b = losses_of(dir / "two.jsonl");
  ASSERT_EQ(a.size(), 9u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-6 * a[i]) << "step " << i + 1;
  fs::remove_all(dir);
}

}  // namespace

#endif  // OMNITRON_MPI_CHECK
