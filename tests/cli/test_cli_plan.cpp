// `omnitron plan` through the binary: a model from the zoo, a Primus file or flags, a layout
// and a machine give per-rank memory and step time with an explanation per figure; --search
// lists fitting layouts; mistakes are one-line errors that name the value.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli/process.h"

namespace {

const std::string kLlama8b = "plan llama3_8b --vocab-size 128256 ";

int count_lines(const std::string& s) {
  return int(std::count(s.begin(), s.end(), '\n'));
}

bool has(const std::string& out, const std::string& text) {
  return out.find(text) != std::string::npos;
}

// The one line of an error: "omnitron plan: error: ..." and nothing else.
void expect_one_line_error(const ProcessResult& r, const std::string& text) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count_lines(r.output), 1) << r.output;
  EXPECT_EQ(r.output.rfind("omnitron plan: error: ", 0), 0u) << r.output;
  EXPECT_TRUE(has(r.output, text)) << r.output;
}

TEST(CliPlan, ZooModelOnAGpuLayoutExplainsEachFigure) {
  const ProcessResult r = run_omnitron(
      kLlama8b +
      "--machine H100 --gpus 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
      "--bf16 --sequence-parallel --use-distributed-optimizer --global-batch-size 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "8.03 B parameters")) << r.output;
  EXPECT_TRUE(has(r.output, "16 x H100")) << r.output;
  EXPECT_TRUE(has(r.output, "TP 2 x CP 1 x PP 2 x DP 4")) << r.output;
  for (const char* figure :
       {"parameters", "gradients", "optimizer", "activations", "workspace", "comm buffers", "total",
        "compute", "TP/SP comm", "DP grad reduce", "PP p2p", "bubble", "step"})
    EXPECT_TRUE(has(r.output, std::string("  ") + figure + " ")) << figure << "\n" << r.output;
  EXPECT_TRUE(has(r.output, "12 B / 4 (distributed optimizer")) << r.output;
  EXPECT_TRUE(has(r.output, "1F1B on stage 0")) << r.output;
  EXPECT_TRUE(has(r.output, "Korthikanti")) << r.output;
  EXPECT_FALSE(has(r.output, "= P_rank")) << "formulas only with --explain\n" << r.output;

  const ProcessResult e =
      run_omnitron(kLlama8b +
                   "--machine h100 --gpus 8 --explain --bf16 "
                   "--use-distributed-optimizer --tensor-model-parallel-size 2");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(has(e.output, "= P_rank x bytes(param)")) << e.output;
  EXPECT_TRUE(has(e.output, "(p-1)/(v m)")) << e.output;
}

// Ulysses context parallelism: the layout names it, the activations and the CP row say what it
// keeps and sends; heads that do not split over TP x CP are training's one-line error.
TEST(CliPlan, UlyssesContextParallelism) {
  const std::string layout =
      "--machine H100 --gpus 16 --bf16 --global-batch-size 32 --use-distributed-optimizer "
      "--cp-comm-type a2a --context-parallel-size ";
  const ProcessResult r = run_omnitron(kLlama8b + layout + "2 --tensor-model-parallel-size 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "TP 2 x CP 2 (Ulysses)")) << r.output;
  EXPECT_TRUE(has(r.output, "Ulysses: q, k, v and output of H/CP heads")) << r.output;
  EXPECT_TRUE(has(r.output, "Ulysses: 8 micro-batches x (32 layers x 8) all-to-alls")) << r.output;
  expect_one_line_error(run_omnitron(kLlama8b + layout + "4 --tensor-model-parallel-size 4"),
                        "--num-query-groups (8) must divide by --tensor-model-parallel-size (4) "
                        "x the sequence-parallel size (4)");
}

TEST(CliPlan, RecomputeShrinksActivations) {
  auto activations = [](const std::string& extra) {
    const ProcessResult r = run_omnitron(kLlama8b +
                                         "--machine H200 --gpus 8 --bf16 "
                                         "--use-distributed-optimizer "
                                         "--tensor-model-parallel-size 2 --sequence-parallel " +
                                         extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.find("  activations ");
    return at == std::string::npos ? 0.0 : std::stod(r.output.substr(at + 14));
  };
  const double none = activations(""), full = activations("--recompute-granularity full");
  EXPECT_GT(none, 0);
  EXPECT_LT(full, none / 10);
}

// Expert parallelism: the experts' share and their expert-data-parallel shard, the
// all-to-alls; an EP that the GPUs cannot take is training's one-line error. Expert tensor
// parallelism 1 under TP 2 + SP: EP 2 over the 2 GPUs' TP ranks plans (ETP = TP refuses it),
// each rank's experts whole and its all-to-alls of its half of the rows.
TEST(CliPlan, ExpertParallelism) {
  const std::string moe =
      "plan --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
      "--vocab-size 256 --num-experts 4 --machine H100 --bf16 --use-distributed-optimizer "
      "--global-batch-size 4 ";
  const ProcessResult r = run_omnitron(moe + "--gpus 4 --expert-model-parallel-size 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "(EP 2) x DP 4")) << r.output;
  EXPECT_TRUE(has(r.output, "(E/EP 2 of 4) over the 2 expert-data-parallel ranks")) << r.output;
  EXPECT_TRUE(has(r.output, "  EP dispatch ")) << r.output;
  expect_one_line_error(
      run_omnitron(moe + "--gpus 2 --expert-model-parallel-size 4"),
      "--gpus 2: the world of 2 ranks is not divisible by "
      "--tensor-model-parallel-size (1) x --context-parallel-size (1) x "
      "--expert-model-parallel-size (4) x --pipeline-model-parallel-size (1) = 4");
  const std::string tp2 = moe +
                          "--gpus 2 --tensor-model-parallel-size 2 --sequence-parallel "
                          "--disable-bias-linear --expert-model-parallel-size 2 ";
  expect_one_line_error(run_omnitron(tp2), "--gpus 2: the world of 2 ranks is not divisible by");
  const ProcessResult etp = run_omnitron(tp2 + "--expert-tensor-parallel-size 1");
  EXPECT_EQ(etp.exit_code, 0) << etp.output;
  for (const char* needle :
       {"(EP 2) (ETP 1) x DP 1", "this rank's block's 1/2 under ETP 1", "  EP dispatch "})
    EXPECT_TRUE(has(etp.output, needle)) << etp.output;
  // --search keeps a given ETP, in a column of its own where it differs from TP.
  const ProcessResult s = run_omnitron(moe +
                                       "--gpus 4 --disable-bias-linear "
                                       "--expert-tensor-parallel-size 1 --search --top 1000");
  EXPECT_EQ(s.exit_code, 0) << s.output;
  for (const char* needle : {", ETP 1 as given", "GiB/rank    EP  ETP layout", "    1 TP 2 x "})
    EXPECT_TRUE(has(s.output, needle)) << s.output;
}

// How Megatron 2021 ran (bench/plan_narayanan.sh): attention that materialises its scores, and
// the pipeline's sends scattered over the TP ranks' NICs; neither by default.
TEST(CliPlan, MegatronTwentyTwentyOneSwitches) {
  const std::string gpt =
      "plan --num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
      "--vocab-size 51200 --machine A100 --gpus 32 --tensor-model-parallel-size 8 "
      "--pipeline-model-parallel-size 4 --fp16 --global-batch-size 16 "
      "--recompute-granularity full ";
  const ProcessResult plain = run_omnitron(gpt);
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_FALSE(has(plain.output, "score matrix")) << plain.output;
  EXPECT_FALSE(has(plain.output, "scattered over")) << plain.output;
  const ProcessResult r = run_omnitron(gpt + "--attention-backend local --scatter-gather-p2p");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "score matrix (--attention-backend local)")) << r.output;
  EXPECT_TRUE(has(r.output, "scattered over the 8 TP ranks' links")) << r.output;
}

TEST(CliPlan, PrimusExperimentFile) {
  const std::string file =
      std::string(OMNITRON_PRIMUS_SPECS_DIR) + "/examples/megatron/configs/llama3_8B-pretrain.yaml";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << "no Primus files at " << file;
  const ProcessResult r =
      run_omnitron("plan --config " + file + " --vocab-size 128256 --machine MI300X --gpus 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The file's micro-batch 2 and global batch 16, and its --overlap-grad-reduce.
  EXPECT_TRUE(has(r.output, "micro-batch 2, global batch 16")) << r.output;
  EXPECT_TRUE(has(r.output, "less the last micro-batch's backward it overlaps")) << r.output;
}

TEST(CliPlan, CpuIsMeasured) {
  const ProcessResult r = run_omnitron(
      "plan tiny_gpt2 --vocab-size 256 --machine cpu --gpus 2 "
      "--tensor-model-parallel-size 2 --micro-batch-size 4 --global-batch-size 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "measured now, per rank at")) << r.output;
  EXPECT_TRUE(has(r.output, "memory per rank (stage 0)   MiB")) << r.output;
}

TEST(CliPlan, SearchListsTheFastestFittingLayouts) {
  const ProcessResult r = run_omnitron(kLlama8b +
                                       "--machine H100 --gpus 16 --search --top=3 --bf16 "
                                       "--global-batch-size 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "the fastest 3:")) << r.output;
  EXPECT_EQ(count_lines(r.output), 6) << r.output;  // header, columns, 3 layouts, hint
}

TEST(CliPlan, UnknownMachineNamesTheKnownOnes) {
  expect_one_line_error(run_omnitron(kLlama8b + "--machine V100"),
                        "--machine 'V100': not a device plan knows (H100, H200, B200, A100, "
                        "MI250X, MI300X, MI325X, cpu)");
}

TEST(CliPlan, LayoutMustDivideTheGpus) {
  expect_one_line_error(
      run_omnitron(kLlama8b + "--machine H100 --gpus 6 "
                              "--tensor-model-parallel-size 4"),
      "--gpus 6 is not divisible by the layout's --tensor-model-parallel-size "
      "(4) x --context-parallel-size (1) x --pipeline-model-parallel-size (1) = 4");
}

TEST(CliPlan, ModelThatDoesNotFitSaysSoAfterThePlan) {
  const ProcessResult r =
      run_omnitron("plan llama3_70b --vocab-size 128256 --machine H100 --gpus 1 --bf16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "does not fit")) << r.output;
  EXPECT_TRUE(
      has(r.output, "omnitron plan: error: does not fit: a rank of pipeline stage 0 needs "))
      << r.output;
  expect_one_line_error(
      run_omnitron("plan llama3_70b --vocab-size 128256 --machine H100 --gpus 8 --bf16 --search "
                   "--global-batch-size 64"),
      "no layout of 8 x H100 fits: the smallest");
}

// Multi-token prediction's depths count on the last stage, as the model's parameter count
// counts them: DeepSeek-V3's 671.03 B main model and 11.6 B of its one depth.
TEST(CliPlan, CountsMultiTokenPredictionDepths) {
  const std::string v3 = "plan deepseek_v3 --vocab-size 129280 --machine H100 --gpus 1 --bf16 ";
  const ProcessResult with = run_omnitron(v3);
  EXPECT_TRUE(has(with.output, "682.64 B parameters x 2 B")) << with.output;
  EXPECT_TRUE(has(with.output, "+ output layer + 1 MTP depth")) << with.output;
  const ProcessResult without = run_omnitron(v3 + "--mtp-num-layers 0");
  EXPECT_TRUE(has(without.output, "671.03 B parameters x 2 B")) << without.output;
  EXPECT_FALSE(has(without.output, "MTP")) << without.output;
}

// --search varies expert parallelism, and splits DeepSeek-V3's 61 layers unevenly over the
// stages: on 1024 H100s its fastest layout has EP above 8 (in a column of the table, beside
// ETP: its seq_aux_loss routes at ETP 1 under TP too) and a pipeline. A given EP stays (Plan.SearchVariesExpertParallelismUnlessGiven): one that fits
// nowhere says so.
TEST(CliPlan, SearchVariesExpertParallelismUnlessGiven) {
  const ProcessResult r = run_omnitron(
      "plan deepseek_v3 --vocab-size 129280 --machine H100 --gpus 1024 --bf16 "
      "--global-batch-size 2048 --search --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "expert parallelism over the divisors of 256 experts")) << r.output;
  EXPECT_TRUE(has(r.output, "GiB/rank    EP  ETP layout")) << r.output;
  EXPECT_TRUE(has(r.output, "(layers: first stage ")) << r.output;
  const size_t at = r.output.find("(EP ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_GT(std::stoi(r.output.substr(at + 4)), 8) << r.output;
  expect_one_line_error(
      run_omnitron("plan deepseek_v3 --vocab-size 129280 --machine H100 --gpus 128 --bf16 "
                   "--global-batch-size 2048 --search --expert-model-parallel-size 1"),
      "fits: the smallest (TP 8 x CP 1 x PP 16 (layers: first stage 3, last 2) x DP 1, "
      "micro-batch 1, global batch 2048 (2048 micro-batches), bf16, SP, recompute full) needs "
      "102.9 GiB per rank of 74.5 GiB; add GPUs or leave --expert-model-parallel-size to the "
      "search");
}

TEST(CliPlan, MistakesAreOneLineErrors) {
  expect_one_line_error(run_omnitron("plan llama3_8b --machine H100"), "--vocab-size N");
  expect_one_line_error(run_omnitron(kLlama8b + "--search --machine H100"),
                        "--search needs --gpus");
  expect_one_line_error(run_omnitron(kLlama8b + "--machine H100 --gpus 0"), "--gpus '0'");
  expect_one_line_error(run_omnitron(kLlama8b + "--machine H100 --gpus 8 --num-layerz 3"),
                        "--num-layerz");
  expect_one_line_error(run_omnitron(kLlama8b + "--machine H100 --gpus 8 "
                                                "--tensor-model-parallel-size 8 "
                                                "--num-query-groups 4"),
                        "--num-query-groups (4) must be divisible by --tensor-model-parallel-size");
  // What training refuses, the plan refuses in the same words.
  expect_one_line_error(run_omnitron("plan gpt2_124m --vocab-size 50257 --machine H100 --gpus 2 "
                                     "--mtp-num-layers 1 --pipeline-model-parallel-size 2"),
                        "--position-embedding-type learned_absolute and "
                        "--pipeline-model-parallel-size 2");
}

}  // namespace
