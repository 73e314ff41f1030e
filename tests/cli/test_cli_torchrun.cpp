// `torchrun --no-python --nproc-per-node N omnitron train ...` on this machine: N copies of the
// binary started at once with the variables torchrun gives its workers (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID), as torchrun
// would start them (so the tests do not need torchrun; one test also runs the real torchrun
// where it works). Without a GPU each run must stop at device selection with one line, never
// hang: every copy runs under `timeout`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/device.h"
#include "cli/process.h"

namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("omnitron_torchrun_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Starts `ranks` copies of `omnitron <args>` as torchrun's workers, all at once, with `env`
// before each; returns each rank's exit code and output (stdout and stderr). A copy still
// running after 120 s is ended by `timeout` (exit 124).
std::vector<ProcessResult> run_as_torchrun(int ranks, const std::string& args,
                                           const std::string& env = "") {
  // One directory per test and call: ctest runs tests of this file at the same time.
  static int calls = 0;
  const fs::path dir =
      scratch(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
              std::to_string(calls++));
  std::string script;
  for (int r = 0; r < ranks; ++r) {
    const std::string out = (dir / ("out" + std::to_string(r))).string();
    script += "(RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(ranks) +
              " LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(ranks) +
              " GROUP_RANK=0 TORCHELASTIC_RUN_ID=test MASTER_ADDR=127.0.0.1 MASTER_PORT=6000 " +
              env + " timeout 120 " + OMNITRON_BINARY + " " + args + " > " + out +
              " 2>&1; echo $? > " + out + ".rc) & ";
  }
  const ProcessResult launcher = run_command(script + "wait");
  EXPECT_EQ(launcher.exit_code, 0) << launcher.output;
  std::vector<ProcessResult> results;
  for (int r = 0; r < ranks; ++r) {
    const std::string out = (dir / ("out" + std::to_string(r))).string();
    const std::string rc = read_text(out + ".rc");
    results.push_back({rc.empty() ? -1 : std::stoi(rc), read_text(out)});
  }
  return results;
}

// The lines of the output that carry an error.
std::vector<std::string> error_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (contains(line, "error:")) lines.push_back(line);
  return lines;
}

const std::string kTiny =
    "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --train-iters 2 --eval-iters 0 --no-progress ";
const std::string kNoGpu = "CUDA_VISIBLE_DEVICES=-1 HIP_VISIBLE_DEVICES=-1";

TEST(CliTorchrun, CpuRanksGetTheMpirunCommandFromRankZeroOnly) {
  const std::vector<ProcessResult> r = run_as_torchrun(2, kTiny + "--device cpu");
  EXPECT_EQ(r[0].exit_code, 2) << r[0].output;
  const std::vector<std::string> errors = error_lines(r[0].output);
  ASSERT_EQ(errors.size(), 1u) << r[0].output;
  for (const std::string& part :
       {std::string("omnitron train [rank 0 of 2]: error: torchrun started 2 ranks and --device "
                    "cpu was asked for; CPU ranks talk through MPI"),
        "`mpirun -np 2 " + std::string(OMNITRON_BINARY) + " " + kTiny + "--device cpu`"})
    EXPECT_TRUE(contains(errors[0], part)) << part << " in:\n" << errors[0];
  EXPECT_EQ(r[1].exit_code, 2) << r[1].output;  // the same code, quietly
  EXPECT_EQ(r[1].output, "");
}

TEST(CliTorchrun, NamedGpuWithoutOneStopsEveryRankWithTheNoGpuLine) {
  const std::vector<ProcessResult> r = run_as_torchrun(2, kTiny + "--device cuda", kNoGpu);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(r[rank].exit_code, 2) << r[rank].output;
    const std::vector<std::string> errors = error_lines(r[rank].output);
    ASSERT_EQ(errors.size(), 1u) << r[rank].output;
#if defined(OMNITRON_CUDA)
    EXPECT_TRUE(contains(errors[0], "--device cuda: no CUDA GPU is visible")) << errors[0];
#else
    EXPECT_TRUE(contains(errors[0], "--device cuda: this omnitron was built without CUDA"))
        << errors[0];
#endif
    EXPECT_TRUE(contains(errors[0], "[rank " + std::to_string(rank) + " of 2]")) << errors[0];
  }
}

TEST(CliTorchrun, OneRankIsAPlainSingleProcessRun) {
  const std::vector<ProcessResult> r = run_as_torchrun(1, kTiny + "--device auto", kNoGpu);
  EXPECT_EQ(r[0].exit_code, 0) << r[0].output;
  EXPECT_TRUE(contains(r[0].output, "done: 2 iterations")) << r[0].output;
}

// The real torchrun, where one is installed and starts (`--redirects 1 --tee 1`: the default
// redirect of torch 1.13 fails on Python 3.11, and these values work on every version).
TEST(CliTorchrun, UnderTheRealTorchrunCpuRanksGetTheMpirunCommand) {
  if (run_command("torchrun --help").exit_code != 0) GTEST_SKIP() << "no working torchrun here";
  const ProcessResult r = run_command(
      "timeout 120 torchrun --standalone --nproc_per_node=2 --no_python --redirects 1 "
      "--tee 1 " +
      std::string(OMNITRON_BINARY) + " " + kTiny + "--device cpu");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "omnitron train [rank 0 of 2]: error: torchrun started 2 ranks "
                       "and --device cpu was asked for"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "`mpirun -np 2 " + std::string(OMNITRON_BINARY) + " train"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "[rank 1 of 2]")) << r.output;
}

// The three `torchrun --nproc_per_node=2 pretrain_gpt.py ...` examples of the ROCm guide
// (specs/user-commands.md), with `omnitron train` for the script and real paths: GPT-2's
// tokenizer files, a dataset preprocessed with it, and fresh checkpoint and TensorBoard
// directories. They get as far as device selection and stop with the no-GPU line.
TEST(CliTorchrun, TheGuidesTorchrunExamplesStopAtDeviceSelectionWithoutAGpu) {
  const fs::path gpt2 =
      fs::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path() / "data" / "tokenizers" / "gpt2";
  if (!fs::exists(gpt2 / "vocab.json")) GTEST_SKIP() << gpt2 << " is missing: run scripts/setup.sh";
  if (omni::gpu_device_count() > 0) GTEST_SKIP() << "a GPU is visible: these runs would train";
  const fs::path dir = scratch("guide");
  std::ofstream(dir / "corpus.jsonl")
      << "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
         "{\"text\": \"And the earth was without form, and void.\"}\n";
  const std::string tokenizer = " --vocab-file " + (gpt2 / "vocab.json").string() +
                                " --merge-file " + (gpt2 / "merges.txt").string();
  const ProcessResult pre =
      run_omnitron("preprocess --input " + (dir / "corpus.jsonl").string() +
                   " --tokenizer-type GPT2BPETokenizer" + tokenizer +
                   " --append-eod --no-progress --output-prefix " + (dir / "corpus").string());
  ASSERT_EQ(pre.exit_code, 0) << pre.output;
  const std::string paths =
      " --train-iters 100000 --lr 0.0001 --min-lr 0.00001 --lr-decay-style cosine "
      "--lr-warmup-fraction 0.01 --weight-decay 0.01 --clip-grad 1.0 --fp16 --data-path " +
      (dir / "corpus_text_document").string() + tokenizer + " --save " +
      (dir / "checkpoints").string() + " --load " + (dir / "checkpoints").string() +
      " --tensorboard-dir " + (dir / "tensorboard").string();
  const std::vector<std::string> examples = {
      "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
      "--micro-batch-size 4 --global-batch-size 32",
      "--tensor-model-parallel-size 2 --num-layers 24 --hidden-size 2048 "
      "--num-attention-heads 16 --seq-length 2048 --micro-batch-size 2 --global-batch-size 16",
      "--pipeline-model-parallel-size 2 --num-layers 48 --hidden-size 1536 "
      "--num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 --global-batch-size 8"};
  for (const std::string& example : examples) {
    // The guide's environment: two GPUs named, none present here (or hidden).
    const std::vector<ProcessResult> r =
        run_as_torchrun(2, "train " + example + paths,
                        "CUDA_VISIBLE_DEVICES=0,1 HIP_VISIBLE_DEVICES=0,1 PYTORCH_ROCM_DEVICE=0,1");
    EXPECT_EQ(r[0].exit_code, 2) << example << "\n" << r[0].output;
    const std::vector<std::string> errors = error_lines(r[0].output);
    ASSERT_EQ(errors.size(), 1u) << example << "\n" << r[0].output;
    EXPECT_TRUE(contains(errors[0], "torchrun started 2 ranks and --device auto found no GPU: "))
        << errors[0];
#if defined(OMNITRON_CUDA)
    EXPECT_TRUE(contains(errors[0], "no CUDA GPU is visible")) << errors[0];
#elif !defined(OMNITRON_HIP)
    EXPECT_TRUE(contains(errors[0], "built without CUDA or HIP")) << errors[0];
#endif
    EXPECT_TRUE(
        contains(errors[0], "`mpirun -np 2 " + std::string(OMNITRON_BINARY) + " train " + example))
        << errors[0];
    EXPECT_EQ(r[1].exit_code, 2) << r[1].output;
    EXPECT_TRUE(error_lines(r[1].output).empty()) << r[1].output;
  }
}

}  // namespace
