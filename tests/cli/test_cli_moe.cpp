// Mixture of experts through the binary: the tiny Mixtral of the zoo trains on a text and
// its loss falls; the load-balancing and z losses are logged beside lm loss (console, JSONL,
// TensorBoard) with each MoE layer's tokens per expert; the aux-loss-free expert bias is
// saved with the checkpoint and a resumed run continues exactly where the straight run goes;
// what is not built is refused in one line naming the flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "cli/process.h"
#include "config/options.h"
#include "model/gpt_model.h"
#include "train/event_file_reader.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

std::string text_file() {
  const std::string path = ::testing::TempDir() + "omnitron_cli_moe_text.txt";
  std::ofstream out(path);
  for (int i = 0; i < 300; ++i) out << "In the beginning God created the heaven and the earth. ";
  return path;
}

std::vector<double> values_of(const std::string& metrics, const std::string& key) {
  std::vector<double> v;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"" + key + "\": ");
    if (at != std::string::npos) v.push_back(std::stod(line.substr(at + key.size() + 4)));
  }
  return v;
}

TEST(CliMoE, TinyMixtralTrainsAndLogsItsBalancingLossesBesideLmLoss) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_moe_run";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string metrics = dir + "/metrics.jsonl";
  const ProcessResult r = run_omnitron(
      "train --model tiny_mixtral --train-text " + text_file() +
      " --seq-length 32 --micro-batch-size 4 --global-batch-size 8 --train-iters 40 --lr 1e-2 "
      "--log-interval 10 --eval-iters 0 --max-new-tokens 0 --no-progress --metrics-file " +
      metrics + " --tensorboard-dir " + dir + "/tb");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Megatron's console names, after lm loss.
  const size_t line = r.output.find(" iteration       40/");
  ASSERT_NE(line, std::string::npos) << r.output;
  const std::string last = r.output.substr(line, r.output.find('\n', line) - line);
  EXPECT_LT(last.find("lm loss:"), last.find("load_balancing_loss:")) << last;
  EXPECT_LT(last.find("load_balancing_loss:"), last.find("z_loss:")) << last;
  EXPECT_NE(r.output.find("MoE tokens per expert (min/max, max/mean) | layer 1: "),
            std::string::npos)
      << r.output;
  // The loss falls from ln 256 (5.5) on a repeated sentence.
  const std::vector<double> lm = values_of(metrics, "lm_loss");
  ASSERT_EQ(lm.size(), 4u) << r.output;
  EXPECT_LT(lm.back(), lm.front() - 1.0) << r.output;
  EXPECT_LT(lm.back(), 3.5) << r.output;
  // The balancing loss without its coefficient: 1 when perfectly balanced, E at collapse.
  const std::vector<double> aux = values_of(metrics, "load_balancing_loss");
  ASSERT_EQ(aux.size(), 4u);
  for (double a : aux) EXPECT_TRUE(a >= 1.0 - 1e-6 && a <= 4.0) << a;
  EXPECT_EQ(values_of(metrics, "z_loss").size(), 4u);
  // TensorBoard: the same names, every step.
  std::string events;
  for (const auto& e : fs::directory_iterator(dir + "/tb")) events = e.path().string();
  ASSERT_FALSE(events.empty());
  const std::vector<event_file::Event> ev = event_file::read_event_file(events);
  EXPECT_EQ(event_file::series(ev, "load_balancing_loss").size(), 40u);
  EXPECT_EQ(event_file::series(ev, "z_loss").size(), 40u);
  EXPECT_EQ(event_file::series(ev, "moe/tokens_per_expert_max_layer_1").size(), 4u);
}

const std::string kBiased =
    "train --model tiny_mixtral --mock-data --vocab-size 64 --seq-length 16 --micro-batch-size 2 "
    "--global-batch-size 4 --lr 3e-3 --log-interval 1 --eval-iters 0 --max-new-tokens 0 "
    "--no-progress --moe-router-score-function sigmoid --moe-router-enable-expert-bias "
    "--moe-router-bias-update-rate 0.01 --train-iters 8 ";

TEST(CliMoE, TheExpertBiasIsSavedAndAResumedRunGoesOnAsTheStraightOne) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_moe_bias";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const ProcessResult straight =
      run_omnitron(kBiased + "--metrics-file " + dir + "/straight.jsonl");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const ProcessResult first = run_omnitron(kBiased + "--exit-interval 4 --save " + dir +
                                           "/ckpt --metrics-file " + dir + "/first.jsonl");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // The checkpoint holds each MoE layer's bias, moved off zero by four updates.
  Options o;
  load_checkpoint_model_options(dir + "/ckpt", o);
  GPTModel<float> model(o.model, 1, 1);
  load_checkpoint(dir + "/ckpt", model.params(), nullptr);
  const ParamInfo& bias = model.params().info("decoder.layers.1.mlp.router.expert_bias");
  double moved = 0;
  for (int64_t e = 0; e < bias.numel; ++e)
    moved = std::max(moved, double(std::abs(model.params().value(bias.name)[e])));
  EXPECT_GT(moved, 0.005);
  EXPECT_LE(moved, 4 * 0.01 + 1e-6);
  const ProcessResult second =
      run_omnitron(kBiased + "--load " + dir + "/ckpt --metrics-file " + dir + "/second.jsonl");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<double> all = values_of(dir + "/straight.jsonl", "lm_loss");
  const std::vector<double> resumed = values_of(dir + "/second.jsonl", "lm_loss");
  ASSERT_EQ(all.size(), 8u);
  ASSERT_EQ(resumed.size(), 4u) << second.output;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], all[4 + i]) << "iteration " << 5 + i;
  // No Hugging Face MoE class routes some layers without q/k norms or biases: refused,
  // nothing half-written.
  const ProcessResult hf =
      run_omnitron("convert --load " + dir + "/ckpt --save " + dir + "/hf --to hf");
  EXPECT_EQ(hf.exit_code, 2) << hf.output;
  EXPECT_NE(hf.output.find("--num-experts 4) has no Hugging Face equivalent"), std::string::npos)
      << hf.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/hf/model.safetensors"));
}

// A checkpoint of an MoE model holds the zoo's states with each expert a tensor of its own,
// and says so ("optimizer_experts separate"); one without that line came from before, when
// adam8bit's blocks ran across the experts (and Muon and GaLore stepped them with AdamW), and
// resuming its states is refused rather than read in the wrong layout. galoreadamw8bit's
// projected 8-bit moments restarted their blocks at each expert later ("optimizer_experts
// separate blocks"): its checkpoints saying only "separate" are refused likewise, adam8bit's
// resume.
TEST(CliMoE, ZooStatesOfTheEarlierExpertLayoutAreRefusedOnResume) {
  for (const auto& [optimizer, earlier, refusal] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"adam8bit", "", "stepped each MoE expert as a tensor of its own"},
           {"adam8bit", "optimizer_experts separate\n", ""},
           {"galoreadamw8bit --galore-rank 4 --adam8bit-min-8bit-size 16",
            "optimizer_experts separate\n", "restarted its 8-bit blocks at each MoE expert"}}) {
    const std::string dir = ::testing::TempDir() + "omnitron_cli_moe_zoo_layout";
    fs::remove_all(dir);
    const std::string run =
        "train --model tiny_mixtral --mock-data --vocab-size 64 --seq-length 16 --optimizer " +
        optimizer + " --eval-iters 0 --no-progress ";
    ASSERT_EQ(run_omnitron(run + "--train-iters 2 --save " + dir).exit_code, 0);
    const ProcessResult resumed = run_omnitron(run + "--train-iters 3 --load " + dir);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    // The same checkpoint as an earlier omnitron wrote it.
    const std::string md = dir + "/iter_0000002/metadata.txt";
    std::ifstream in(md);
    std::stringstream text;
    text << in.rdbuf();
    std::string lines = text.str();
    const std::string line = "optimizer_experts separate blocks\n";
    ASSERT_NE(lines.find(line), std::string::npos) << lines.substr(0, 200);
    lines.replace(lines.find(line), line.size(), earlier);
    in.close();
    std::ofstream(md) << lines;
    const ProcessResult again = run_omnitron(run + "--train-iters 3 --load " + dir);
    if (refusal.empty()) {
      EXPECT_EQ(again.exit_code, 0) << optimizer << " " << earlier << again.output;
      continue;
    }
    EXPECT_EQ(again.exit_code, 2) << again.output;
    const std::string name = optimizer.substr(0, optimizer.find(' '));
    EXPECT_NE(again.output.find("holds " + name + " state from before omnitron " + refusal),
              std::string::npos)
        << again.output;
    EXPECT_EQ(run_omnitron(run + "--train-iters 3 --no-load-optim --load " + dir).exit_code, 0);
  }
}

TEST(CliMoE, WhatIsNotBuiltIsRefusedInOneLineNamingTheFlags) {
  const std::string base =
      "train --print-config --model tiny_mixtral --mock-data --vocab-size 64 --seq-length 16 ";
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--expert-model-parallel-size 2",
            "the world of 1 ranks is not divisible by --tensor-model-parallel-size (1) x "
            "--context-parallel-size (1) x --expert-model-parallel-size (2)"},
           {"--expert-tensor-parallel-size 2",
            "the world of 1 ranks is not divisible by --expert-tensor-parallel-size (2) x "
            "--expert-model-parallel-size (1) x --pipeline-model-parallel-size (1) = 2"},
           {"--moe-router-topk 5", "--moe-router-topk (5) must be between 1 and --num-experts (4)"},
           {"--moe-layer-freq '[1,0,1]'",
            "--moe-layer-freq: '[1,0,1]' names 3 layers, but --num-layers is 2"},
       }) {
    const ProcessResult r = run_omnitron(base + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

// One process given the experts' own tensor-parallel size: the ranks to start are what both
// grids divide (TP 2 ETP 1 EP 2: 2, not TP x EP; TP 1 ETP 2: 2).
TEST(CliMoE, OneProcessWithExpertTensorParallelismSaysHowManyRanks) {
  const ProcessResult r = run_omnitron(
      "train --model tiny_mixtral --mock-data --vocab-size 64 --seq-length 16 "
      "--disable-bias-linear --tensor-model-parallel-size 2 --sequence-parallel "
      "--expert-model-parallel-size 2 --expert-tensor-parallel-size 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tensor-model-parallel-size 2 x --expert-model-parallel-size 2 with "
                          "--expert-tensor-parallel-size 1 needs 2 ranks, and this is a single "
                          "process"),
            std::string::npos)
      << r.output;
  // ETP above TP (TP 1): the expert grid alone sets the ranks.
  const ProcessResult wide = run_omnitron(
      "train --model tiny_mixtral --mock-data --vocab-size 64 --seq-length 16 "
      "--disable-bias-linear --expert-tensor-parallel-size 2");
  EXPECT_EQ(wide.exit_code, 2) << wide.output;
  EXPECT_NE(wide.output.find("error: --expert-tensor-parallel-size 2 needs 2 ranks, and this is a "
                             "single process"),
            std::string::npos)
      << wide.output;
#ifdef OMNITRON_MPIRUN
  // On two ranks it trains, and the start says how the experts lie over them.
  const ProcessResult two = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 120 " +
      std::string(OMNITRON_MPIRUN) + " --oversubscribe -np 2 " + OMNITRON_BINARY +
      " train --model tiny_mixtral --mock-data --vocab-size 64 --seq-length 16 "
      "--disable-bias-linear --expert-tensor-parallel-size 2 --micro-batch-size 1 "
      "--global-batch-size 2 --train-iters 1 --eval-iters 0 --no-progress");
  EXPECT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("MoE: 1 of 2 layers, 4 experts (top 2, ffn 96), alltoall dispatcher"),
            std::string::npos)
      << two.output;
  EXPECT_NE(two.output.find("experts: 2 ranks a stage = expert tensor 2 x expert 1 x expert data "
                            "1 (4 experts a rank)"),
            std::string::npos)
      << two.output;
#endif
}

// Layouts the MoE layers do not build are refused by finalize(), before any rank starts.
// Context parallelism and tensor parallelism with expert tensor parallelism of the same size,
// or of a divisor or a multiple of it with sequence parallelism, are built; other expert
// tensor-parallel sizes are refused by finalize, in one line naming the flags; the experts'
// linear biases are built under all of them.
TEST(CliMoE, WhatTensorParallelismDoesNotBuildIsRefusedByFinalize) {
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--context-parallel-size 2", ""},
           {"--tensor-model-parallel-size 2 --disable-bias-linear", ""},
           {"--tensor-model-parallel-size 2 --disable-bias-linear --expert-tensor-parallel-size 2",
            ""},
           {"--tensor-model-parallel-size 2 --disable-bias-linear --expert-tensor-parallel-size 1",
            "--expert-tensor-parallel-size 1 with --tensor-model-parallel-size 2 needs "
            "--sequence-parallel (Megatron's MoE under tensor parallelism: each rank routes its "
            "sequence-parallel tokens)"},
           {"--tensor-model-parallel-size 2 --disable-bias-linear --sequence-parallel "
            "--expert-tensor-parallel-size 1",
            ""},
           {"--tensor-model-parallel-size 4 --disable-bias-linear --sequence-parallel "
            "--expert-tensor-parallel-size 2",
            ""},
           {"--tensor-model-parallel-size 4 --disable-bias-linear --sequence-parallel "
            "--expert-tensor-parallel-size 8",
            ""},
           {"--disable-bias-linear --expert-tensor-parallel-size 2", ""},
           {"--tensor-model-parallel-size 2 --disable-bias-linear --expert-tensor-parallel-size 4",
            "--expert-tensor-parallel-size 4 with --tensor-model-parallel-size 2 needs "
            "--sequence-parallel (Megatron's MoE under tensor parallelism: each rank routes its "
            "sequence-parallel tokens)"},
           {"--tensor-model-parallel-size 4 --disable-bias-linear --sequence-parallel "
            "--expert-tensor-parallel-size 6",
            "--expert-tensor-parallel-size 6 with --tensor-model-parallel-size 4: not built yet: "
            "experts split over a number of ranks that neither divides nor is a multiple of "
            "--tensor-model-parallel-size"},
           {"--expert-tensor-parallel-size 2", ""},
           {"--tensor-model-parallel-size 2", ""},
           {"--tensor-model-parallel-size 4 --sequence-parallel --expert-tensor-parallel-size 2",
            ""}}) {
    Options o;
    std::vector<std::string> args = {"--num-experts", "4", "--mock-data", "--vocab-size", "64"};
    std::istringstream in(flags);
    for (std::string a; in >> a;) args.push_back(a);
    parse_options(args, o);
    std::string error;
    try {
      finalize(o);
    } catch (const UsageError& e) {
      error = e.what();
    }
    EXPECT_EQ(error, message) << flags;
  }
}

// A capacity factor where ranks route their own share of each micro-batch (context
// parallelism; expert tensor parallelism below the tensor-parallel size) counts each rank's
// capacity over its own tokens, as Megatron-Core does: the drops are not one rank's, and the
// start says so in one note. Where the ranks route the whole micro-batch (TP = ETP, ETP above
// TP, EP, PP) they are one rank's, and there is no note.
TEST(CliMoE, ACapacityFactorOverRanksRoutingTheirOwnTokensIsNoted) {
  const std::string tail =
      ": each rank counts its capacity over the tokens it routes (its share of each "
      "micro-batch), as Megatron-Core does, so which tokens an expert drops differs from a "
      "one-rank run";
  const std::string head = "note: --moe-expert-capacity-factor 1.5 with ";
  for (const auto& [flags, layout] : std::vector<std::pair<std::string, std::string>>{
           {"--context-parallel-size 2", "--context-parallel-size 2"},
           {"--tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1",
            "--expert-tensor-parallel-size 1 below --tensor-model-parallel-size 2"},
           {"--tensor-model-parallel-size 2 --sequence-parallel", ""},
           {"--expert-tensor-parallel-size 2", ""},
           {"--expert-model-parallel-size 2", ""}}) {
    Options o;
    std::vector<std::string> args = {"--num-experts", "4", "--mock-data", "--vocab-size", "64",
                                     "--disable-bias-linear", "--moe-expert-capacity-factor",
                                     "1.5"};
    std::istringstream in(flags);
    for (std::string a; in >> a;) args.push_back(a);
    parse_options(args, o);
    finalize(o);
    const auto noted = [&](const std::string& n) { return n.rfind(head, 0) == 0; };
    EXPECT_EQ(std::count_if(o.notes.begin(), o.notes.end(), noted), layout.empty() ? 0 : 1)
        << flags;
    if (!layout.empty()) {
      EXPECT_EQ(*std::find_if(o.notes.begin(), o.notes.end(), noted), head + layout + tail);
    }
  }
}

}  // namespace
}  // namespace omni
