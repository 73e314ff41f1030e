// A new user's first runs, typed as Megatron's users type them (issue 11, "First runs"):
// each one trains, or stops with the message that gets it going.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/process.h"

namespace {

namespace fs = std::filesystem;

const std::string kTiny =
    "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --train-iters 2 --eval-iters 0 --no-progress ";

// A fresh, empty scratch directory for one test.
fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("omnitron_first_runs_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// --- --save DIR --load DIR before DIR holds a checkpoint (Megatron's checkpointing.py) ---

TEST(FirstRuns, LoadWithoutACheckpointYetWarnsAsMegatronAndTrainsFromRandom) {
  const std::string dir = (scratch("load") / "ckpt").string();
  ProcessResult r = run_omnitron(kTiny + "--save " + dir + " --load " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "WARNING: could not find the metadata file " + dir +
                                     "/latest_checkpointed_iteration.txt\n"
                                     "    will not load any checkpoints and will start from "
                                     "random\n"))
      << r.output;
  EXPECT_TRUE(fs::exists(dir + "/iter_0000002")) << r.output;
  // The re-queued job resumes from what the first one saved.
  r = run_omnitron(kTiny + "--save " + dir + " --load " + dir + " --train-iters 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "WARNING")) << r.output;
  EXPECT_TRUE(contains(r.output, "loaded " + dir + " at iteration 2")) << r.output;
}

TEST(FirstRuns, LoadOfAnEmptyDirectoryOrAnInterruptedFirstSaveStartsFromRandom) {
  const fs::path dir = scratch("load_tmp");
  fs::create_directories(dir / "iter_0000010.tmp");  // a first save that a crash cut short
  std::ofstream(dir / "events.out.tfevents") << "logs";
  ProcessResult r = run_omnitron(kTiny + "--load " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "will start from random")) << r.output;
}

TEST(FirstRuns, ExitOnMissingCheckpointMakesAMissingCheckpointAnError) {
  const std::string dir = (scratch("exit_missing") / "ckpt").string();
  ProcessResult r = run_omnitron(kTiny + "--load " + dir + " --exit-on-missing-checkpoint");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "error: --exit-on-missing-checkpoint: no checkpoint was found "
                       "under --load '" +
                           dir + "'"))
      << r.output;
  EXPECT_FALSE(fs::exists(dir)) << r.output;
}

TEST(FirstRuns, LoadOfSomethingThatIsNotACheckpointStaysAnError) {
  const fs::path dir = scratch("not_checkpoint");
  std::ofstream(dir / "model.pt") << "not a directory";
  ProcessResult r = run_omnitron(kTiny + "--load " + (dir / "model.pt").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "is a file, not a checkpoint directory")) << r.output;

  fs::create_directories(dir / "lost_index" / "iter_0000100");  // its index file was lost
  r = run_omnitron(kTiny + "--load " + (dir / "lost_index").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "holds iter_0000100 but no")) << r.output;

  fs::create_directories(dir / "corrupt");  // a latest file that names no number
  std::ofstream(dir / "corrupt" / "latest_checkpointed_iteration.txt") << "soon";
  r = run_omnitron(kTiny + "--load " + (dir / "corrupt").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "should hold an iteration number, found 'soon'")) << r.output;
}

// --- --vocab-file + --merge-file without --tokenizer-type ---

TEST(FirstRuns, VocabAndMergeFilesWithoutATokenizerTypeAreGpt2Bpe) {
  const fs::path gpt2 =
      fs::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path() / "data" / "tokenizers" / "gpt2";
  if (!fs::exists(gpt2 / "vocab.json")) GTEST_SKIP() << gpt2 << " is missing: run scripts/setup.sh";
  ProcessResult r = run_omnitron(
      "train --mock-data --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 "
      "--micro-batch-size 1 --train-iters 1 --eval-iters 0 --no-progress --vocab-file " +
      (gpt2 / "vocab.json").string() + " --merge-file " + (gpt2 / "merges.txt").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "note: --vocab-file with --merge-file and no --tokenizer-type: "
                       "GPT2BPETokenizer"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 50257")) << r.output;  // GPT-2's, from vocab.json
}

// --- the model zoo outside the checkout ---

TEST(FirstRuns, InstalledBinaryFindsTheModelZooFromAnyDirectory) {
  const fs::path build = fs::path(OMNITRON_BINARY).parent_path();
  const fs::path prefix = scratch("install"), elsewhere = scratch("install_cwd");
  ProcessResult r =
      run_command("cmake --install '" + build.string() + "' --prefix '" + prefix.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* installed : {"bin/omnitron", "share/omnitron/configs/models/tiny_llama.yaml",
                                "share/omnitron/configs/examples/tiny_llama_smoke.yaml"})
    EXPECT_TRUE(fs::exists(prefix / installed)) << installed << "\n" << r.output;

  const std::string omnitron = (prefix / "bin" / "omnitron").string();
  r = run_command("cd '" + elsewhere.string() + "' && '" + omnitron +
                  "' train --model tiny_llama --mock-data --vocab-size 64 --seq-length 16 "
                  "--micro-batch-size 1 --train-iters 1 --eval-iters 0 --no-progress");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "2 layers, hidden 64")) << r.output;  // tiny_llama.yaml's
  // It is the installed copy that was read.
  r = run_command("cd '" + elsewhere.string() + "' && '" + omnitron +
                  "' train --print-config --model tiny_llama --mock-data --vocab-size 64");
  EXPECT_TRUE(
      contains(r.output, (prefix / "share/omnitron/configs/models/tiny_llama.yaml").string()))
      << r.output;
  // A YAML of the user's own, outside any checkout, names a zoo model too.
  std::ofstream(elsewhere / "mine.yaml") << "model: tiny_gpt2\nmock_data: true\nvocab_size: 64\n";
  r = run_command("cd '" + elsewhere.string() + "' && '" + omnitron +
                  "' train --print-config --config mine.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "share/omnitron/configs/models/tiny_gpt2.yaml")) << r.output;
}

TEST(FirstRuns, AnUnknownZooModelSaysWhereItLooked) {
  ProcessResult r = run_omnitron("train --model no_such_model --mock-data");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--model: model 'no_such_model' not found")) << r.output;
  EXPECT_TRUE(contains(r.output, "beside the omnitron executable")) << r.output;
}

// --- a single process asked for tensor parallelism ---

TEST(FirstRuns, OneProcessAskedForTensorParallelismGetsTheMpirunCommand) {
  const std::string args = kTiny + "--tensor-model-parallel-size 2 --prompt 'In the beginning'";
  ProcessResult r = run_omnitron(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--tensor-model-parallel-size 2 needs 2 ranks")) << r.output;
  // The user's own command line, quoted for a shell.
  EXPECT_TRUE(contains(r.output, "`mpirun -np 2 " + std::string(OMNITRON_BINARY) + " " + kTiny +
                                     "--tensor-model-parallel-size 2 --prompt "
                                     "'In the beginning'`"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "NPROC=2 bash scripts/launch.sh --mock-data")) << r.output;
#ifdef OMNITRON_MPIRUN
  // And that command trains.
  const size_t from = r.output.find("`mpirun") + 1, to = r.output.find('`', from);
  std::string command = r.output.substr(from, to - from);
  command.replace(0, 6, std::string(OMNITRON_MPIRUN) + " --oversubscribe");
  r = run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 " +
                  command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  EXPECT_TRUE(contains(r.output, "2 ranks = tensor 2")) << r.output;
#endif
}

#ifdef OMNITRON_MPIRUN
// Ranks that no launcher binds to their own cores each take a share of the node's cores
// (at least one thread) instead of a thread per core each, and the start says so.
TEST(FirstRuns, UnboundRanksShareTheCores) {
  const ProcessResult r = run_command(
      "env -u OMP_NUM_THREADS OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "
      "120 " +
      std::string(OMNITRON_MPIRUN) + " --oversubscribe --bind-to none -np 4 " + OMNITRON_BINARY +
      " " + kTiny + "--global-batch-size 8");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, " cores shared by 4 ranks on this node; waiting ")) << r.output;
}
#endif

// A Slurm batch script's one process sees SLURM_NTASKS_PER_NODE too: it keeps every core.
TEST(FirstRuns, ASlurmBatchScriptsProcessKeepsItsCores) {
  const ProcessResult r = run_omnitron_env("env -u OMP_NUM_THREADS SLURM_NTASKS_PER_NODE=4", kTiny);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "device: cpu, ")) << r.output;
  EXPECT_FALSE(contains(r.output, "shared by")) << r.output;
}

// --- --eod-mask-loss with --mock-data ---

TEST(FirstRuns, MockDocumentsEndWithTheEndOfDocumentToken) {
  // Megatron's mock documents are 1 to 4095 tokens long: 16 samples of 512 hold several ends.
  ProcessResult r = run_omnitron(
      "data-samples --mock-data --vocab-size 50 --seq-length 512 --global-batch-size 16 "
      "--train-iters 1 --print-samples 16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "closed by end-of-document token 49")) << r.output;
  EXPECT_TRUE(contains(r.output, " 49 ")) << r.output;
}

TEST(FirstRuns, EodMaskLossWithMockDataMasksTheDocumentEnds) {
  const std::string run =
      "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
      "--seq-length 512 --micro-batch-size 4 --train-iters 1 --eval-iters 0 --no-progress "
      "--log-interval 1";
  ProcessResult plain = run_omnitron(run), masked = run_omnitron(run + " --eod-mask-loss");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(masked.exit_code, 0) << masked.output;
  auto loss = [](const std::string& out) {
    const size_t at = out.find("lm loss: ");
    return at == std::string::npos ? std::string() : out.substr(at + 9, 12);
  };
  EXPECT_FALSE(loss(plain.output).empty()) << plain.output;
  // The same samples; the masked run leaves the end-of-document positions out of the loss.
  EXPECT_NE(loss(plain.output), loss(masked.output)) << plain.output << masked.output;
}

// --- OpenMP threads spin briefly on an idle machine, else wait passively, unless the user
// says otherwise ---

TEST(FirstRuns, IdleOpenMPThreadsWaitByTheMachinesLoadUnlessTheUserSaysOtherwise) {
  ProcessResult r = run_omnitron_env("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT", kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Which of the two depends on what else the machine runs at that moment.
  EXPECT_TRUE(contains(r.output, "threads (waiting passive)") ||
              contains(r.output,
                       "threads (waiting GOMP_SPINCOUNT=5000: a short spin, the machine was idle "
                       "at start)"))
      << r.output;
  // Busy: a process spinning on every core while omnitron starts.
  r = run_omnitron_env(
      "sh -c 'n=$(nproc); for i in $(seq $n); do timeout 5 sh -c \"while :; do :; done\" & "
      "done; sleep 0.3; env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT \"$0\" \"$@\"; s=$?; "
      "pkill -P $$ timeout; exit $s'",
      kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "threads (waiting passive)")) << r.output;
  r = run_omnitron_env("env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active", kTiny);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "threads (waiting active)")) << r.output;
}

}  // namespace
