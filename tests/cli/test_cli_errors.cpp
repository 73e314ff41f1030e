// Bad input to the omnitron binary: a one-line error naming the option, a non-zero exit,
// no crash. The binary is the one the build just made (OMNITRON_BINARY).
#include <gtest/gtest.h>

#include <string>

#include "cli/process.h"

namespace {

// A tiny mock-data run that would succeed, so each test changes one thing.
const std::string kTiny =
    "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --train-iters 2 --eval-iters 0 --no-progress ";

void expect_usage_error(const std::string& args, const std::string& must_mention) {
  ProcessResult r = run_omnitron(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(must_mention), std::string::npos) << r.output;
  // One line: the message ends the output.
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;
}

TEST(CliErrors, TinyRunSucceeds) {
  ProcessResult r = run_omnitron(kTiny);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CliErrors, UnknownFlagNamesTheClosestKnownOne) {
  expect_usage_error(kTiny + "--num-layer 2", "did you mean --num-layers?");
}

TEST(CliErrors, ZeroLayersIsRejected) {
  expect_usage_error(kTiny + "--num-layers 0", "--num-layers");
}

TEST(CliErrors, HeadsThatDoNotDivideTheHiddenSizeAreRejected) {
  expect_usage_error(kTiny + "--num-attention-heads 3",
                     "--num-attention-heads (3) must divide --hidden-size (16)");
}

TEST(CliErrors, QueryGroupsThatDoNotDivideTheHeadsAreRejected) {
  expect_usage_error(kTiny + "--num-attention-heads 4 --group-query-attention --num-query-groups 3",
                     "--num-query-groups (3) must divide --num-attention-heads (4)");
}

// Ulysses gives each rank whole heads and key/value groups; a2a+p2p (hierarchical) is not built.
TEST(CliErrors, UlyssesDegreeThatDoesNotDivideTheHeadsIsRejected) {
  // plan checks a layout without the ranks that train would first ask to start.
  expect_usage_error(
      "plan --gpus 4 --machine H100 --vocab-size 50 --num-layers 1 --hidden-size 16 "
      "--seq-length 8 --num-attention-heads 4 --group-query-attention --num-query-groups 2 "
      "--ds-sequence-parallel-size 4",
      "--num-attention-heads (4) and --num-query-groups (2) must divide by "
      "--tensor-model-parallel-size (1) x the sequence-parallel size (4)");
  expect_usage_error(kTiny + "--cp-comm-type a2a+p2p", "--cp-comm-type a2a+p2p");
  expect_usage_error(kTiny + "--cp-comm-type ring", "'ring' is not one of p2p, a2a");
}

TEST(CliErrors, NonNumericValueNamesTheFlag) {
  expect_usage_error(kTiny + "--hidden-size big", "--hidden-size expects an integer, got 'big'");
}

TEST(CliErrors, MissingValueNamesTheFlag) {
  expect_usage_error(kTiny + "--lr", "--lr needs a value");
}

TEST(CliErrors, GlobalBatchMustBeAMultipleOfTheMicroBatch) {
  expect_usage_error(kTiny + "--global-batch-size 3", "--global-batch-size (3)");
}

TEST(CliErrors, UnknownDecayStyleListsTheChoices) {
  expect_usage_error(kTiny + "--lr-decay-style triangle", "cosine");
}

TEST(CliErrors, FeaturesNotBuiltYetSaySo) {
  expect_usage_error(kTiny + "--num-experts 8 --moe-use-upcycling",
                     "--moe-use-upcycling with --num-experts: not built yet: MoE upcycling from a "
                     "dense checkpoint and routing replay");
}

TEST(CliErrors, ALayoutLargerThanTheWorldNamesTheFlags) {
  // One process: the message is the mpirun command (test_cli_first_runs.cpp).
  expect_usage_error(kTiny + "--tensor-model-parallel-size 2",
                     "--tensor-model-parallel-size 2 needs 2 ranks, and this is a single process");
}

TEST(CliErrors, MissingCorpusFileIsNamed) {
  expect_usage_error("train --train-text /nonexistent/corpus.txt --num-layers 1",
                     "/nonexistent/corpus.txt");
}

TEST(CliErrors, GenerateWithoutWeightsSaysWhatItNeeds) {
  expect_usage_error("generate --load /nonexistent/dir",
                     "/nonexistent/dir/latest_checkpointed_iteration.txt");
}

TEST(CliErrors, UnknownCommandExitsNonZero) {
  ProcessResult r = run_omnitron("trian");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown command 'trian'"), std::string::npos) << r.output;
}

TEST(CliHelp, ListsOptionsFromTheTable) {
  ProcessResult r = run_omnitron("train --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--num-layers", "--group-query-attention", "--lr-decay-style",
                           "--metrics-file", "--untie-embeddings-and-output-weights"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

}  // namespace
