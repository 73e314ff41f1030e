// Expert parallelism through the Trainer (train/expert_grads.h) on in-process ranks, each a
// thread with its own Trainer: a tiny MoE model trained a few steps at EP 2, EP 4, EP 2 x DP 2,
// EP 2 x PP 2, EP 2 x CP 2, EP 2 x TP 2 + SP and EP 2 with the distributed optimizer, for
// both token dispatchers, against one rank: the losses within 1e-5 relative and the final
// parameters (each rank's experts, the expert bias) the one-rank run's within 1e-5 of the largest.
// The experts' own tensor-parallel size (ETP 1 under TP 2 + SP, ETP 2 under TP 4 + SP; ETP 2
// above TP 1, ETP 4 above TP 2 + SP) too, and the experts' linear biases under ETP = TP, below
// and above it (the parameters and the gradient norm one rank's).
// ZeRO stages 2 and 3 (the experts' gradients and parameters sharded over their own
// expert-data-parallel group) at EP 2 x DP 2, EP 4, EP 1 x DP 2 and ETP 1 under TP 2 + SP.
// Checkpoints: an EP 2 save writes every element once, and state saved at EP 2 loads at one rank
// and back bit for bit; likewise between ETP 1 and ETP = TP; a stage 3 save resumes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"
#include "checkpoint/sharded_checkpoint.h"
#include "comm/local_communicator.h"
#include "data/datasets/dataset.h"
#include "model/moe_layer.h"
#include "parallel/zero_sharding.h"
#include "train/trainer.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

// While one is alive, options() builds the model with linear biases (GPT-2's default) and
// without the shared expert (Megatron builds it without biases).
bool g_linear_biases = false;
struct LinearBiases {
  LinearBiases() { g_linear_biases = true; }
  ~LinearBiases() { g_linear_biases = false; }
  LinearBiases(const LinearBiases&) = delete;
  LinearBiases& operator=(const LinearBiases&) = delete;
};

// Four Llama layers, three of them MoE layers of four experts (sigmoid routing, the expert
// bias, both balancing losses, a shared expert), trained three steps of 4 micro-batches of 2.
Options options(int ranks, const std::vector<std::string>& extra) {
  Options o;
  std::vector<std::string> args = {"--mock-data",
                                   "--vocab-size",
                                   "64",
                                   "--num-layers",
                                   "4",
                                   "--hidden-size",
                                   "32",
                                   "--num-attention-heads",
                                   "4",
                                   "--seq-length",
                                   "8",
                                   "--micro-batch-size",
                                   "2",
                                   "--global-batch-size",
                                   "8",
                                   "--train-iters",
                                   "3",
                                   "--eval-iters",
                                   "0",
                                   "--lr",
                                   "1e-2",
                                   "--log-interval",
                                   "5",
                                   "--no-progress",
                                   "--normalization",
                                   "RMSNorm",
                                   "--swiglu",
                                   "--ffn-hidden-size",
                                   "48",
                                   "--position-embedding-type",
                                   "rope",
                                   "--disable-bias-linear",
                                   "--untie-embeddings-and-output-weights",
                                   "--num-experts",
                                   "4",
                                   "--moe-ffn-hidden-size",
                                   "16",
                                   "--moe-layer-freq",
                                   "[0,1,1,1]",
                                   "--moe-router-score-function",
                                   "sigmoid",
                                   "--moe-router-enable-expert-bias",
                                   "--moe-router-bias-update-rate",
                                   "0.01",
                                   "--moe-aux-loss-coeff",
                                   "0.01",
                                   "--moe-z-loss-coeff",
                                   "0.001",
                                   "--moe-shared-expert-intermediate-size",
                                   "16"};
  if (g_linear_biases) {
    std::erase(args, "--disable-bias-linear");
    args.insert(args.end(), {"--moe-shared-expert-intermediate-size", "0"});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  parse_options(args, o);
  o.data_parallel_size = ranks / (o.pipeline_model_parallel_size * o.tensor_model_parallel_size *
                                  o.context_parallel_size);
  finalize(o);
  return o;
}

struct Run {
  std::vector<double> losses;
  // The one-rank model's parameter values, assembled from the ranks' slices.
  std::vector<std::pair<std::string, std::vector<float>>> params;
  int64_t written = 0;  // checkpoint bytes, all ranks together
};

Run train(int ranks, const std::vector<std::string>& extra, bool save = false) {
  Run run;
  const Options one = options(1, {});
  GPTModel<float> whole(one.model, 1, 1);
  for (const ParamInfo& p : whole.params().infos())
    run.params.push_back({p.name, std::vector<float>(size_t(p.numel), NAN)});
  std::mutex mu;
  std::set<std::string> names;  // the layout's parameters (its model flags may leave some out)
  run_ranks(ranks, [&](Communicator& world) {
    checkpoint_io_stats() = {};
    const Options o = options(ranks, extra);
    Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &world);
    MetricsSink sink("", false, nullptr);
    const TrainResult r = t.run(sink);
    if (save) t.save(sink);
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == ranks - 1) run.losses = r.train_losses;
    run.written += checkpoint_io_stats().bytes_written;
    const ParameterSet<float>& ps = t.model().params();
    for (const ParamInfo& p : ps.infos()) {
      names.insert(p.name);
      auto it = std::find_if(run.params.begin(), run.params.end(),
                             [&](const auto& e) { return e.first == p.name; });
      // (Tensor parallelism pads the vocabulary further: the rows past one rank's are left.)
      const int64_t whole = int64_t(it->second.size());
      ParameterSet<float>::for_each_run(p, [&](int64_t local, int64_t global, int64_t n) {
        std::copy_n(ps.values() + p.offset + local, std::clamp<int64_t>(whole - global, 0, n),
                    it->second.begin() + std::min(global, whole));
      });
    }
  });
  std::erase_if(run.params, [&](const auto& e) { return !names.count(e.first); });
  return run;
}

const Run& reference() {
  static const Run r = train(1, {});
  return r;
}

// `got`'s last losses (relative) and parameters (of the largest) against `ref`'s, within
// `tolerance`.
void expect_close(const Run& got, const Run& ref, const std::string& label, double tolerance) {
  double worst_loss = 0, worst_param = 0, largest = 0;
  const size_t skip = ref.losses.size() - got.losses.size();  // a resumed run's: the last ones
  for (size_t i = 0; i < got.losses.size(); ++i)
    worst_loss =
        std::max(worst_loss, std::abs(got.losses[i] - ref.losses[skip + i]) / ref.losses[skip + i]);
  for (size_t t = 0; t < ref.params.size(); ++t)
    for (size_t i = 0; i < ref.params[t].second.size(); ++i) {
      if (std::isnan(ref.params[t].second[i])) continue;  // a vocabulary padded less: no row
      ASSERT_FALSE(std::isnan(got.params[t].second[i])) << got.params[t].first << " unheld";
      worst_param = std::max(worst_param,
                             double(std::abs(got.params[t].second[i] - ref.params[t].second[i])));
      largest = std::max(largest, double(std::abs(ref.params[t].second[i])));
    }
  std::printf("%s: loss %.3g (relative), parameter %.3g (of max %.3g)\n", label.c_str(),
              worst_loss, worst_param, largest);
  EXPECT_LE(worst_loss, tolerance) << label;
  EXPECT_LE(worst_param, tolerance * largest) << label;
}

// `model`: flags of both runs (the one-rank reference trained with them too); `tolerance`: of
// the losses (relative) and the parameters (of the largest).
void expect_matches_one_rank(int ranks, const std::vector<std::string>& layout,
                             const std::vector<std::string>& model = {},
                             const std::vector<const char*>& dispatchers = {"alltoall",
                                                                            "allgather"},
                             double tolerance = 1e-5) {
  // One reference run per model (its flags, with or without linear biases).
  static std::map<std::pair<bool, std::vector<std::string>>, Run> references;
  const auto key = std::make_pair(bool(g_linear_biases), model);
  if (!model.empty() && !references.count(key)) references[key] = train(1, model);
  const Run& ref = model.empty() ? reference() : references[key];
  for (const char* dispatcher : dispatchers) {
    std::vector<std::string> flags = model;
    flags.insert(flags.end(), layout.begin(), layout.end());
    flags.insert(flags.end(), {"--moe-token-dispatcher-type", dispatcher});
    const Run got = train(ranks, flags);
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << dispatcher;
    expect_close(got, ref,
                 std::to_string(ranks) + " ranks " + (layout.empty() ? "" : layout[0]) + " " +
                     dispatcher,
                 tolerance);
  }
}

TEST(ExpertParallelTraining, Ep2MatchesOneRank) {
  expect_matches_one_rank(2, {"--expert-model-parallel-size", "2"});
}
TEST(ExpertParallelTraining, Ep4MatchesOneRank) {
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "4"});
}
TEST(ExpertParallelTraining, Ep2TimesDp2MatchesOneRank) {
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "2"});
}
TEST(ExpertParallelTraining, Ep2TimesPipeline2MatchesOneRank) {
  expect_matches_one_rank(
      4, {"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"});
}
TEST(ExpertParallelTraining, Ep2TimesContext2MatchesOneRank) {
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "2", "--context-parallel-size", "2"});
}
TEST(ExpertParallelTraining, Ep2TimesTp2SequenceParallelMatchesOneRank) {
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size",
                              "2", "--sequence-parallel"});
}
TEST(ExpertParallelTraining, Ep2DistributedOptimizerMatchesOneRank) {
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"});
}

// Expert tensor parallelism 1 under TP 2 + SP (the experts' own grid): each tp rank routes its
// sequence-parallel rows to whole experts. EP 2 on 2 ranks (the expert-parallel group is the
// tp pair); EP 1 on 2 ranks (the tp pair the experts' data-parallel group); EP 2 x DP 2 on 4
// ranks with the distributed optimizer (the experts' states sharded over the pairs across
// data-parallel ranks).
const std::vector<std::string> kTp2Sp = {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                         "--expert-tensor-parallel-size", "1"};
std::vector<std::string> with_tp2_etp1(std::vector<std::string> flags) {
  flags.insert(flags.begin(), kTp2Sp.begin(), kTp2Sp.end());
  return flags;
}
TEST(ExpertParallelTraining, Etp1UnderTp2SequenceParallelMatchesOneRank) {
  expect_matches_one_rank(2, with_tp2_etp1({"--expert-model-parallel-size", "2"}));
  expect_matches_one_rank(2, with_tp2_etp1({}));
}
// (Context parallelism: parallel/test_moe_layouts.cpp in float64; here, in float32 through
// Adam, its parameters come within 1.0e-5 of the largest, at the bound.)
TEST(ExpertParallelTraining, Etp1UnderTp2SpEp2Pipeline2MatchesOneRank) {
  expect_matches_one_rank(4, with_tp2_etp1({"--expert-model-parallel-size", "2",
                                            "--pipeline-model-parallel-size", "2"}));
}
// ETP 2 under TP 4 + SP, EP 2: each pair of tp ranks routes its rows to experts split over it.
TEST(ExpertParallelTraining, Etp2UnderTp4SequenceParallelEp2MatchesOneRank) {
  expect_matches_one_rank(
      4, {"--tensor-model-parallel-size", "4", "--sequence-parallel",
          "--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2"});
}
// Without a shared expert the MoE layers under ETP < TP take their block's rows only (ETP 1:
// each rank's own rows, nothing gathered; model/gpt_layer.cpp): ETP 1 and 2 under TP 4 + SP.
// (In float32 through Adam these layouts' parameters are 1.3e-5 of the largest from one rank
// with oneDNN's sgemm, the same figures as when every row was gathered over tp; in float64:
// parallel/test_moe_layouts.cpp.)
TEST(ExpertParallelTraining, Etp1AndEtp2UnderTp4SpWithoutSharedExpertMatchOneRank) {
  const std::vector<std::string> model = {"--moe-shared-expert-intermediate-size", "0"};
  for (const char* etp : {"1", "2"})
    expect_matches_one_rank(
        4,
        {"--tensor-model-parallel-size", "4", "--sequence-parallel",
         "--expert-tensor-parallel-size", etp, "--expert-model-parallel-size", "2"},
        model, {"alltoall"}, 3e-5);
}
TEST(ExpertParallelTraining, Etp1UnderTp2SpEp2Dp2DistributedOptimizerMatchesOneRank) {
  expect_matches_one_rank(
      4, with_tp2_etp1({"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}));
}
// ZeRO stages 2 and 3 (parallel/zero_sharding.h): the dense parameters' gradients (and at
// stage 3 values) sharded over the data-parallel ranks, the experts' over the ranks holding
// the same experts (EP 2 x DP 2 and ETP 1 under TP 2 + SP x EP 2: pairs; EP 4: each rank
// alone, its gradients still scaled by 1/dp; EP 1: the experts are dense parameters). Stage 3
// holds only its shards, so the parameters are read from the checkpoint each run saves at its
// end (each rank writes its shards of both), against one rank's within the bounds above.
void expect_zero_matches_one_rank(int ranks, const std::vector<std::string>& layout) {
  const Run& ref = reference();
  const std::string dir = ::testing::TempDir() + "omnitron_ep_zero_" + std::to_string(getpid());
  for (const char* stage : {"2", "3"}) {
    fs::remove_all(dir);
    std::vector<std::string> flags = layout;
    flags.insert(flags.end(), {"--zero-stage", stage, "--save", dir});
    const Run got = train(ranks, flags);
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << stage;
    double worst_loss = 0, worst_param = 0, largest = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i)
      worst_loss = std::max(worst_loss, std::abs(got.losses[i] - ref.losses[i]) / ref.losses[i]);
    const auto saved = CheckpointReader(dir).read_whole();
    for (const auto& [name, values] : ref.params) {
      const auto it =
          std::find_if(saved.begin(), saved.end(), [&](const auto& e) { return e.first == name; });
      ASSERT_NE(it, saved.end()) << name << " not saved";
      // (TP 2 pads the vocabulary further: rows past the one-rank model's.)
      ASSERT_GE(it->second.size(), values.size()) << name;
      for (size_t i = 0; i < values.size(); ++i) {
        worst_param = std::max(worst_param, double(std::abs(it->second[i] - values[i])));
        largest = std::max(largest, double(std::abs(values[i])));
      }
    }
    std::string name;
    for (const std::string& f : layout) name += " " + f;
    std::printf("%d ranks%s, ZeRO stage %s: loss %.3g (relative), parameter %.3g (of max %.3g)\n",
                ranks, name.c_str(), stage, worst_loss, worst_param, largest);
    EXPECT_LE(worst_loss, 1e-5) << "stage " << stage;
    EXPECT_LE(worst_param, 1e-5 * largest) << "stage " << stage;
  }
  fs::remove_all(dir);
}
TEST(ExpertParallelTraining, ZeroStages2And3AtEp2TimesDp2AndEp4MatchOneRank) {
  expect_zero_matches_one_rank(4, {"--expert-model-parallel-size", "2"});
  expect_zero_matches_one_rank(4, {"--expert-model-parallel-size", "4"});
}
// The dense parameters over DP x CP 2, the experts over the expert-data-parallel group (of one).
// (The layout's own figure, allgather's at stage 0 above: 8.5e-6 of the largest parameter.)
TEST(ExpertParallelTraining, ZeroStages2And3AtEp2TimesCp2MatchOneRank) {
  expect_zero_matches_one_rank(
      4, {"--expert-model-parallel-size", "2", "--context-parallel-size", "2"});
}
// --bf16 on the CPU (float values rounded to bf16, an fp32 master kept for the rank's shards of
// both sets, the expert bias's update copied into it) at EP 2 x DP 2: stages 2 and 3 against
// stage 1, the same layout, each step's loss within 1e-5 relative.
TEST(ExpertParallelTraining, Bf16ZeroStages2And3MatchStage1) {
  const std::vector<std::string> bf16 = {"--bf16", "--expert-model-parallel-size", "2"};
  std::vector<std::string> flags = bf16;
  flags.insert(flags.end(), {"--zero-stage", "1"});
  const std::vector<double> one = train(4, flags).losses;
  ASSERT_EQ(one.size(), 3u);
  for (const char* stage : {"2", "3"}) {
    flags = bf16;
    flags.insert(flags.end(), {"--zero-stage", stage});
    const std::vector<double> got = train(4, flags).losses;
    ASSERT_EQ(got.size(), one.size());
    double worst = 0;
    for (size_t i = 0; i < one.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - one[i]) / one[i]);
    std::printf("--bf16 EP 2 x DP 2, ZeRO stage %s against stage 1: loss %.3g (relative)\n", stage,
                worst);
    EXPECT_LE(worst, 1e-5) << "stage " << stage;
  }
}
TEST(ExpertParallelTraining, ZeroStages2And3WithReplicatedExpertsMatchOneRank) {
  expect_zero_matches_one_rank(2, {});
}
TEST(ExpertParallelTraining, ZeroStages2And3AtEtp1UnderTp2SpEp2MatchOneRank) {
  expect_zero_matches_one_rank(4, with_tp2_etp1({"--expert-model-parallel-size", "2"}));
}
// ETP 2 x EP 2 over DP 4 (TP 1; ETP above TP): the dense parameters over DP 4, each expert
// slice over its expert-data-parallel group (of one).
TEST(ExpertParallelTraining, ZeroStages2And3AtEtp2Ep2OverDp4MatchOneRank) {
  expect_zero_matches_one_rank(4, {"--expert-tensor-parallel-size", "2",
                                   "--expert-model-parallel-size", "2"});
}

// The memory the stages save with MoE, measured (Trainer::held_memory: the resident pages of
// the flat buffers at their peak during the steps) at EP 2 x DP 2 on eight MoE layers whose
// experts hold most of the parameters: each rank keeps a quarter of the dense parameters'
// gradients (stage 2; and values, stage 3) and half of its experts', plus at most two
// layers' whole (the one in flight, its neighbour's prefetch or gradients) and 64 pages
// (the partial pages at ranges' ends; measured: 7.6 MiB of gradients at stage 2 and 8.6 MiB of
// values at stage 3 against a bound of 10.4 MiB, 12.6 MiB with whole experts). Experts sharded over
// the data-parallel group as the dense ones are (1/4: the ranks hold different experts) or not at
// all (1/1) would both be wrong; the second exceeds it.
TEST(ExpertParallelTraining, ZeroStages2And3HoldTheirShardOfTheExperts) {
  const std::vector<std::string> wide = {"--num-layers",
                                         "8",
                                         "--hidden-size",
                                         "128",
                                         "--num-experts",
                                         "8",
                                         "--moe-ffn-hidden-size",
                                         "256",
                                         "--moe-layer-freq",
                                         "1",
                                         "--train-iters",
                                         "2",
                                         "--expert-model-parallel-size",
                                         "2"};
  for (const char* stage : {"2", "3"}) {
    std::vector<std::string> flags = wide;
    flags.insert(flags.end(), {"--zero-stage", stage});
    std::mutex mu;
    run_ranks(4, [&](Communicator& world) {
      const Options o = options(4, flags);
      Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &world);
      t.track_memory_peak();
      MetricsSink sink("", false, nullptr);
      t.run(sink);
      const Trainer::HeldMemory held = t.held_memory();
      const std::vector<ParamInfo>& infos = t.model().params().infos();
      int64_t dense = 0, experts = 0, layer = 0, largest = 0;
      std::vector<int64_t> starts = zero_bucket_boundaries(infos);
      starts.push_back(t.model().params().size());
      for (size_t i = 0, unit = 0; i < infos.size(); ++i) {
        (is_expert_parameter(infos[i].name) ? experts : dense) += infos[i].numel;
        if (infos[i].offset >= starts[unit]) largest = std::max(largest, layer), layer = 0, ++unit;
        layer += infos[i].numel;
      }
      largest = std::max(largest, layer);
      const int64_t bound = 4 * (dense / 4 + experts / 2 + 2 * largest) + 64 * 4096;
      const int64_t held_bytes = std::string(stage) == "2" ? held.grads : held.params;
      std::lock_guard<std::mutex> lock(mu);
      std::printf(
          "rank %d, ZeRO stage %s: %s %.2f MiB held, bound %.2f MiB (dense %.2f, "
          "experts %.2f, largest layer %.2f MiB whole)\n",
          world.rank(), stage, std::string(stage) == "2" ? "gradients" : "parameters",
          held_bytes / 1048576.0, bound / 1048576.0, dense * 4 / 1048576.0, experts * 4 / 1048576.0,
          largest * 4 / 1048576.0);
      EXPECT_LE(held_bytes, bound) << "stage " << stage << " rank " << world.rank();
      EXPECT_LT(bound, 4 * (dense / 4 + experts)) << "the experts' whole must exceed the bound";
    });
  }
}

// seq_aux_loss (DeepSeek's) at ETP 1 under TP 2 + SP, EP 2, micro-batches of one sequence:
// each tp rank routes half of it, the sequence's counts summed over the pair. (In float32
// through Adam this layout at micro-batches of one is 1.76e-5 of the largest parameter from
// one rank with aux_loss too; parallel/test_moe_layouts.cpp checks seq_aux_loss in float64.)
TEST(ExpertParallelTraining, Etp1UnderTp2SpSequenceAuxLossMatchesOneRank) {
  expect_matches_one_rank(
      2, with_tp2_etp1({"--expert-model-parallel-size", "2"}),
      {"--moe-router-load-balancing-type", "seq_aux_loss", "--micro-batch-size", "1"}, {"alltoall"},
      3e-5);
}
// The zoo at ETP 1 under TP 2 + SP (EP 1; LAMB and adam8bit at EP 2 below): LAMB's
// per-tensor norms count the whole experts once (counted on both tp ranks, a trust ratio
// off by sqrt 2, the parameters would be ~1e-3 off; LAMB at TP 2 = ETP 2 is itself 9.4e-5
// of the largest parameter from one rank in float32, the same figure); Muon orthogonalises
// the tp-split shared expert's matrices and steps the expert tensors as Adam; Lion per
// element, at EP 2.
TEST(ExpertParallelTraining, Etp1UnderTp2SpOptimizerZooMatchesOneRank) {
  expect_matches_one_rank(2, with_tp2_etp1({}), {"--optimizer", "lamb"}, {"alltoall"}, 2e-4);
  expect_matches_one_rank(2, with_tp2_etp1({}), {"--optimizer", "muon"}, {"alltoall"});
  expect_matches_one_rank(2, with_tp2_etp1({"--expert-model-parallel-size", "2"}),
                          {"--optimizer", "lion", "--lr", "1e-3"}, {"alltoall"});
}

// Muon orthogonalises each expert's matrix on its own (optim/zoo_muon.cpp), so it runs where
// the experts are split: whole over EP 2 (each rank its own experts' matrices), by width over
// TP 2 + SP (each expert assembled over the tp pair), over ETP 2 across data-parallel ranks
// (over the expert tensor-parallel pair), and ETP 2 x EP 2 over DP 4 under the distributed
// optimizer (the experts' momentum gathered over their expert-data-parallel group first). With
// the experts stepped as one [experts, rows, cols] matrix or by AdamW, each layout still
// matches its own one-rank run: OptimizerZoo.MuonShampooAndGaLoreTakeEachExpertsMatrixOnItsOwn
// pins the arithmetic, this the assembly.
TEST(ExpertParallelTraining, MuonPerExpertMatchesOneRankWhereverTheExpertsLie) {
  const std::vector<std::string> muon = {"--optimizer", "muon"};
  expect_matches_one_rank(2, {"--expert-model-parallel-size", "2"}, muon, {"alltoall"});
  expect_matches_one_rank(2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, muon,
                          {"alltoall"});
  expect_matches_one_rank(2, {"--expert-tensor-parallel-size", "2"}, muon, {"allgather"});
  expect_matches_one_rank(4,
                          {"--expert-tensor-parallel-size", "2", "--expert-model-parallel-size",
                           "2", "--use-distributed-optimizer"},
                          muon, {"alltoall"});
}
// Shampoo and GaLore take each expert's matrix apart, so they run at EP 2 (each rank its own
// experts' blocks and projections), with the distributed optimizer over EP 2 x DP 2 too (each
// whole expert tensor stepped by the ranks holding pieces of it): 3e-6 of the largest
// parameter. Shampoo's epsilon is its other tests' 1e-4: at the default 1e-12 the inverse roots
// of the rank-deficient factors magnify the layouts' rounding differences to 5.3e-4.
TEST(ExpertParallelTraining, ShampooAndGaLorePerExpertMatchOneRankAtExpertParallelism) {
  const std::vector<std::string> shampoo = {"--optimizer", "shampoo", "--shampoo-update-freq",
                                            "2", "--shampoo-eps", "1e-4"};
  expect_matches_one_rank(2, {"--expert-model-parallel-size", "2"}, shampoo, {"alltoall"});
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"},
                          shampoo, {"allgather"});
  const std::vector<std::string> galore = {"--optimizer", "galoreadamw", "--galore-rank", "4",
                                           "--galore-update-proj-gap", "2"};
  expect_matches_one_rank(2, {"--expert-model-parallel-size", "2"}, galore, {"alltoall"});
  expect_matches_one_rank(4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"},
                          galore, {"alltoall"});
}

// GaLore's and Shampoo's states under tensor parallelism are the whole matrices' (each rank of
// a slices group holding the same copy), which checkpoints store as the one-rank states,
// each rank writing its slice: stopped after 2 of 3 steps at TP 2 + SP and resumed at one rank,
// and stopped at one rank and resumed at TP 2 + SP, the last loss and the parameters are the
// straight one-rank run's within the layout tests' 1e-5. GaLore projects once (gap 4), so the
// third step uses the checkpoint's P; Shampoo's roots of step 2 precondition step 3. The
// vocabulary is padded alike at both (64 rows: Shampoo's embedding blocks are the padded
// tensor's, and a checkpoint padded otherwise is refused by its fingerprint).
TEST(ExpertParallelTraining, GaLoreAndShampooResumeAcrossTensorParallelLayouts) {
  const std::string dir = ::testing::TempDir() + "omnitron_zoo_tp_ckpt";
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  for (const std::vector<std::string>& opt : std::vector<std::vector<std::string>>{
           {"--optimizer", "galoreadamw", "--galore-rank", "4", "--galore-update-proj-gap", "4"},
           {"--optimizer", "galoreadamw8bit", "--galore-rank", "4", "--galore-update-proj-gap", "4",
            "--adam8bit-min-8bit-size", "256"},
           {"--optimizer", "shampoo", "--shampoo-update-freq", "2", "--shampoo-eps", "1e-4",
            "--make-vocab-size-divisible-by", "32"}}) {
    const auto straight = train(1, opt);
    for (const bool from_tp2 : {true, false}) {
      fs::remove_all(dir);
      auto flags = [&](bool at_tp2, std::vector<std::string> extra) {
        extra.insert(extra.begin(), opt.begin(), opt.end());
        if (at_tp2) extra.insert(extra.end(), tp2.begin(), tp2.end());
        return extra;
      };
      train(from_tp2 ? 2 : 1, flags(from_tp2, {"--exit-interval", "2", "--save", dir}));
      const auto tail = train(from_tp2 ? 1 : 2, flags(!from_tp2, {"--load", dir}));
      ASSERT_EQ(tail.losses.size(), 1u);
      expect_close(tail, straight, opt[1] + (from_tp2 ? " TP 2 -> 1" : " TP 1 -> 2"), 1e-5);
    }
  }
  fs::remove_all(dir);
}

// GaLore and Shampoo on tensor-parallel slices: each split tensor's whole gradient assembled
// over the ranks holding its slices (an expert's over the expert tensor-parallel ranks),
// stepped whole and identically on each, its slice kept (WholeTensorStates,
// optim/optimizer_zoo.h): TP 2 + SP (the dense matrices, the shared expert and the experts split
// by width over the tp pair), TP 2 + SP with the distributed optimizer over DP 2, and ETP 2
// across data-parallel ranks (the experts' slices over the expert tensor-parallel pair), and
// ETP 4 under TP 2 + SP (the experts' slices over 4 ranks, across the dense tp pairs), and
// ETP 2 x EP 2 over DP 4 under the distributed optimizer (the experts' gradients gathered over
// their expert-data-parallel group first). Without the assembly (each slice stepped as a matrix
// of its own) every layout is 0.004 to 0.07 of the largest parameter off.
// galoreadamw8bit's blocks are the whole tensors' too (every split tensor assembled).
void expect_whole_matrix_zoo_matches_one_rank(const std::vector<std::string>& optimizer) {
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  std::vector<std::string> tp2_dp2 = tp2;
  tp2_dp2.push_back("--use-distributed-optimizer");
  expect_matches_one_rank(2, tp2, optimizer, {"alltoall"});
  expect_matches_one_rank(4, tp2_dp2, optimizer, {"alltoall"});
  expect_matches_one_rank(2, {"--expert-tensor-parallel-size", "2"}, optimizer, {"allgather"});
  expect_matches_one_rank(4,
                          {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                           "--expert-tensor-parallel-size", "4"},
                          optimizer, {"alltoall"});
  expect_matches_one_rank(4,
                          {"--expert-tensor-parallel-size", "2", "--expert-model-parallel-size",
                           "2", "--use-distributed-optimizer"},
                          optimizer, {"alltoall"});
}
TEST(ExpertParallelTraining, ShampooOnTensorParallelSlicesMatchesOneRank) {
  expect_whole_matrix_zoo_matches_one_rank(
      {"--optimizer", "shampoo", "--shampoo-update-freq", "2", "--shampoo-eps", "1e-4"});
}
TEST(ExpertParallelTraining, GaLoreOnTensorParallelSlicesMatchesOneRank) {
  expect_whole_matrix_zoo_matches_one_rank(
      {"--optimizer", "galoreadamw", "--galore-rank", "4", "--galore-update-proj-gap", "2"});
  expect_whole_matrix_zoo_matches_one_rank({"--optimizer", "galoreadamw8bit", "--galore-rank", "4",
                                            "--galore-update-proj-gap", "2",
                                            "--adam8bit-min-8bit-size", "256"});
}

// LAMB and adam8bit under the distributed optimizer (adam8bit through --zero-stage 1, which is
// it) at ETP 1 under TP 2 + SP (the whole experts' states sharded over the tp pair) and ETP 2
// under TP 4 + SP (each slice's over the expert-data-parallel pair), against one rank: LAMB
// within its own tensor-parallel figures (9.4e-5 of the largest parameter at TP 2, 2.3e-4 at
// TP 4, as without the distributed optimizer), adam8bit within 5e-5 (a code or two of its
// 8-bit states rounded otherwise: 2.4e-5 at both layouts under oneDNN's sgemm, 4.1e-6 at TP 2
// and 2.3e-5 at TP 4 under OpenBLAS's; at TP 4, with fc2 quantised too
// (--adam8bit-min-8bit-size 256, below), 1.5e-4 with each slice's own block maxima).
TEST(ExpertParallelTraining, ExpertTensorParallelDistributedOptimizerZooMatchesOneRank) {
  const std::vector<std::string> lamb = {"--optimizer", "lamb"},
                                 adam8bit = {"--optimizer", "adam8bit"};
  expect_matches_one_rank(2, with_tp2_etp1({"--use-distributed-optimizer"}), lamb, {"alltoall"},
                          2e-4);
  expect_matches_one_rank(2, with_tp2_etp1({"--zero-stage", "1"}), adam8bit, {"alltoall"}, 5e-5);
  const std::vector<std::string> tp4 = {"--tensor-model-parallel-size", "4", "--sequence-parallel",
                                        "--expert-tensor-parallel-size", "2"};
  std::vector<std::string> tp4_distributed = tp4, tp4_zero1 = tp4;
  tp4_distributed.push_back("--use-distributed-optimizer");
  tp4_zero1.insert(tp4_zero1.end(), {"--zero-stage", "1"});
  expect_matches_one_rank(4, tp4_distributed, lamb, {"alltoall"}, 3e-4);
  expect_matches_one_rank(4, tp4_zero1,
                          {"--optimizer", "adam8bit", "--adam8bit-min-8bit-size", "256"},
                          {"alltoall"}, 5e-5);
}

// Expert tensor parallelism wider than TP (ETP a multiple of TP): the expert tensor-parallel
// group spans data-parallel replicas, each rank's routed rows are gathered over it and every
// rank runs its 1/ETP of each expert's width (model/moe_layer.h). ETP 2 over DP 2 (TP 1, 2
// ranks), with and without the distributed optimizer (each slice's states whole on its rank:
// the expert-data-parallel group is one rank); ETP 2 x EP 2 over DP 4 with it; ETP 4 under
// TP 2 + SP; LAMB under the distributed optimizer at ETP 2 over DP 2 (its norms over the
// slices' group).
TEST(ExpertParallelTraining, Etp2OverDp2MatchesOneRank) {
  expect_matches_one_rank(2, {"--expert-tensor-parallel-size", "2"});
  expect_matches_one_rank(2, {"--expert-tensor-parallel-size", "2", "--use-distributed-optimizer"},
                          {}, {"alltoall"});
}
TEST(ExpertParallelTraining, Etp2Ep2OverDp4DistributedOptimizerMatchesOneRank) {
  expect_matches_one_rank(4, {"--expert-tensor-parallel-size", "2", "--expert-model-parallel-size",
                              "2", "--use-distributed-optimizer"});
}
TEST(ExpertParallelTraining, Etp4UnderTp2SequenceParallelMatchesOneRank) {
  expect_matches_one_rank(4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                              "--expert-tensor-parallel-size", "4"});
}
TEST(ExpertParallelTraining, Etp2OverDp2DistributedOptimizerLambMatchesOneRank) {
  expect_matches_one_rank(2, {"--expert-tensor-parallel-size", "2", "--use-distributed-optimizer"},
                          {"--optimizer", "lamb"}, {"alltoall"}, 2e-4);
}

// Between two runs of the same model: the largest relative loss difference, the largest
// parameter difference, and the largest parameter of `a`.
struct Difference {
  double loss = 0, param = 0, largest = 0;
};
Difference difference(const Run& a, const Run& b) {
  Difference d;
  EXPECT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i)
    d.loss = std::max(d.loss, std::abs(a.losses[i] - b.losses[i]) / a.losses[i]);
  for (size_t t = 0; t < a.params.size(); ++t)
    for (size_t i = 0; i < a.params[t].second.size(); ++i) {
      d.param = std::max(d.param, double(std::abs(a.params[t].second[i] - b.params[t].second[i])));
      d.largest = std::max(d.largest, double(std::abs(a.params[t].second[i])));
    }
  return d;
}

// LAMB and adam8bit as the two tests below run them, so that a slice's own norms or block maxima
// would show: LAMB's trust ratio unclamped (--lamb-min-coeff 1e-4: the first steps' ratio,
// about 0.006, would be clamped to 0.01 for a slice and the whole tensor alike) at --lr 0.1,
// and adam8bit quantising fc2 too (--adam8bit-min-8bit-size 256: fc1's 256-element blocks each
// lie in one slice, fc2's straddle both).
const std::vector<std::vector<std::string>> kSliceRevealingZoo = {
    {"--optimizer", "lamb", "--lamb-min-coeff", "1e-4", "--lr", "0.1"},
    {"--optimizer", "adam8bit", "--adam8bit-min-8bit-size", "256"}};

// LAMB and adam8bit at ETP 2 under TP 4 + SP: each expert slice is on two tp ranks, so the
// zoo's sums over tp hold both norms of LAMB's trust ratio twice (the ratio the same) and its
// block maxima are maxima still: the parameters those of ETP = TP 4, LAMB's to 2.2e-7 of the
// largest. adam8bit's 8-bit states turn the GEMMs' other split of the experts (two slices, not
// four) into a code or two: 3.2e-6 of the largest under oneDNN's sgemm, hence 2e-5 for it,
// against 1.5e-4 with a slice's own block maxima (the mutation the sharded test below catches;
// its runs are bit-identical to this one's ETP 2 run).
TEST(ExpertParallelTraining, Etp2UnderTp4LambAndAdam8bitMatchEtp4) {
  const std::vector<std::string> tp4 = {"--tensor-model-parallel-size", "4", "--sequence-parallel"};
  for (const std::vector<std::string>& opt : kSliceRevealingZoo) {
    std::vector<std::string> same = tp4, etp2 = tp4;
    same.insert(same.end(), opt.begin(), opt.end());
    etp2.insert(etp2.end(), opt.begin(), opt.end());
    etp2.insert(etp2.end(), {"--expert-tensor-parallel-size", "2"});
    const Difference d = difference(train(4, same), train(4, etp2));
    std::printf("%s: ETP 2 vs ETP 4 under TP 4: loss %.3g, parameter %.3g (of max %.3g)\n",
                opt[1].c_str(), d.loss, d.param, d.largest);
    EXPECT_LE(d.param, (opt[1] == "lamb" ? 1e-6 : 2e-5) * d.largest) << opt[1];
  }
}

// The same under the distributed optimizer (and --zero-stage 1, which is it): the experts' own
// optimizer (train/expert_grads.h) holds a shard of each slice over the expert-data-parallel
// pair and reduces LAMB's norms and adam8bit's block maxima over that pair and the
// expert-tensor-parallel pair, so the parameters are those without it (ETP 4's, above), with
// kSliceRevealingZoo's flags.
TEST(ExpertParallelTraining, Etp2UnderTp4DistributedOptimizerLambAndAdam8bitMatchUnsharded) {
  const std::vector<std::string> tp4 = {"--tensor-model-parallel-size", "4", "--sequence-parallel",
                                        "--expert-tensor-parallel-size", "2"};
  const std::vector<std::vector<std::string>> shardings = {{"--use-distributed-optimizer"},
                                                           {"--zero-stage", "1"}};
  for (const std::vector<std::string>& opt : kSliceRevealingZoo) {
    std::vector<std::string> whole = tp4;
    whole.insert(whole.end(), opt.begin(), opt.end());
    const auto a = train(4, whole);
    for (const std::vector<std::string>& sharding : shardings) {
      std::vector<std::string> sharded = whole;
      sharded.insert(sharded.end(), sharding.begin(), sharding.end());
      const Difference d = difference(a, train(4, sharded));
      std::printf(
          "%s %s: ETP 2 under TP 4, sharded vs not: loss %.3g (relative), parameter "
          "%.3g (of max %.3g)\n",
          opt[1].c_str(), sharding[0].c_str(), d.loss, d.param, d.largest);
      EXPECT_LE(d.loss, 1e-6) << opt[1] << " " << sharding[0];
      EXPECT_LE(d.param, 1e-6 * d.largest) << opt[1] << " " << sharding[0];
    }
  }
}

// LAMB and adam8bit at ETP 2 over DP 2 (TP 1) without the distributed optimizer: each rank
// holds half of every expert's width, and the zoo sums LAMB's norms and takes adam8bit's block
// maxima over the expert tensor-parallel pair (optimizer_zoo.h), so the parameters are those
// of the distributed optimizer's run, whose experts' optimizer reduces them over the same pair
// (kSliceRevealingZoo's flags: a slice's own norms or maxima would show); also with linear
// biases, the experts' fc2 biases whole on both ranks. LAMB's parameters are also one rank's,
// within 4e-5 of the largest (2.4e-7 and 1.0e-5 with biases, the GEMMs' other split rounded
// through the unclamped ratio at lr 0.1), where each expert's norms summed over the pair for
// the first expert only (a per-expert sum left to a slice) are 1.1e-4 and 1.3e-4 off.
TEST(ExpertParallelTraining, Etp2OverDp2LambAndAdam8bitMatchDistributedOptimizer) {
  for (const bool with_biases : {false, true}) {
    std::optional<LinearBiases> biases;
    std::vector<std::string> etp2 = {"--expert-tensor-parallel-size", "2"};
    if (with_biases) {
      biases.emplace();
      etp2.insert(etp2.end(), {"--moe-shared-expert-intermediate-size", "0"});
    }
    for (const std::vector<std::string>& opt : kSliceRevealingZoo) {
      std::vector<std::string> whole = etp2;
      whole.insert(whole.end(), opt.begin(), opt.end());
      std::vector<std::string> sharded = whole;
      sharded.insert(sharded.end(), {"--use-distributed-optimizer"});
      const auto unsharded = train(2, whole);
      const Difference d = difference(train(2, sharded), unsharded);
      std::printf(
          "%s%s: ETP 2 over DP 2, without the distributed optimizer vs with: loss %.3g, "
          "parameter %.3g (of max %.3g)\n",
          opt[1].c_str(), with_biases ? " with biases" : "", d.loss, d.param, d.largest);
      EXPECT_LE(d.loss, 1e-6) << opt[1] << with_biases;
      EXPECT_LE(d.param, 1e-6 * d.largest) << opt[1] << with_biases;
      if (opt[1] != "lamb") continue;
      std::vector<std::string> one = opt;
      if (with_biases) one.insert(one.end(), {"--moe-shared-expert-intermediate-size", "0"});
      const Difference r = difference(train(1, one), unsharded);
      std::printf("lamb%s: ETP 2 over DP 2 vs one rank: loss %.3g, parameter %.3g (of max %.3g)\n",
                  with_biases ? " with biases" : "", r.loss, r.param, r.largest);
      EXPECT_LE(r.param, 4e-5 * r.largest) << with_biases;
    }
  }
}

// LAMB and adam8bit at EP 2 (each rank two whole experts) and at EP 2 x DP 2 under the
// distributed optimizer (the experts' states sharded over each expert-data-parallel pair)
// against one rank, with kSliceRevealingZoo's flags: each expert is a tensor of its own to
// LAMB's trust ratio and adam8bit's blocks (optimizer_zoo.h), as DeepSpeed-MoE's one tensor
// per expert, so a rank's experts step as one rank's do: LAMB's parameters 1.2e-7 of the
// largest (1.07) off, where one ratio for a rank's two experts (the whole stacked tensor's)
// puts them 4.7e-5 off; adam8bit's within its 5e-5 (a code or two: 9.8e-5 of 4.3).
TEST(ExpertParallelTraining, Ep2LambAndAdam8bitMatchOneRank) {
  for (const std::vector<std::string>& opt : kSliceRevealingZoo) {
    const double tolerance = opt[1] == "lamb" ? 1e-6 : 5e-5;
    expect_matches_one_rank(2, {"--expert-model-parallel-size", "2"}, opt, {"alltoall"}, tolerance);
    expect_matches_one_rank(4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"},
                            opt, {"alltoall"}, tolerance);
  }
}

// The gradient norm, the parameters' norm and the gradients' zeros (the experts' parts added
// to the dense parts before one collective per group): each step's on the last rank, as the
// metrics file has them. At EP 2 x DP 2 (the experts' replicas), with the distributed
// optimizer and at ZeRO stage 3 (every rank a shard of both) and at EP 2 x PP 2 (a sum over
// the stages too).
std::vector<std::vector<double>> step_statistics(int ranks, std::vector<std::string> flags) {
  const std::string file =
      ::testing::TempDir() + "omnitron_ep_stats_" + std::to_string(getpid()) + ".jsonl";
  fs::remove(file);
  flags.insert(flags.end(),
               {"--log-params-norm", "--log-num-zeros-in-grad", "--log-interval", "1"});
  run_ranks(ranks, [&](Communicator& world) {
    Options o = options(ranks, flags);
    Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &world);
    if (world.rank() == ranks - 1) o.metrics_file = file;
    MetricsSink sink(o, nullptr);
    t.run(sink);
  });
  std::vector<std::vector<double>> steps;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const json::Value v = json::parse(line, file);
    steps.push_back({v.find("grad_norm")->num(), v.find("params_norm")->num(),
                     v.find("num_zeros_in_grad")->num()});
  }
  fs::remove(file);
  return steps;
}

TEST(ExpertParallelTraining, GradientAndParameterNormsAndZerosAreOneRanks) {
  const std::vector<std::vector<double>> one = step_statistics(1, {});
  ASSERT_EQ(one.size(), 3u);
  // ETP 1 under TP 2 + SP against ETP = TP 2 (TP 2 pads the vocabulary further, with rows
  // initialised but without gradients): without and with the distributed optimizer.
  const std::vector<std::vector<double>> tp2 =
      step_statistics(4, {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                          "--sequence-parallel"});
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--expert-model-parallel-size", "2"},
        {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"},
        {"--expert-model-parallel-size", "2", "--zero-stage", "3"},
        {"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"},
        with_tp2_etp1({"--expert-model-parallel-size", "2"}),
        with_tp2_etp1({"--expert-model-parallel-size", "2", "--use-distributed-optimizer"})}) {
    const std::vector<std::vector<double>> got = step_statistics(4, layout);
    const std::vector<std::vector<double>>& ref = layout[0] == kTp2Sp[0] ? tp2 : one;
    ASSERT_EQ(got.size(), ref.size()) << layout.back();
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(got[i][0], ref[i][0], 1e-5 * ref[i][0]) << layout.back() << " step " << i;
      EXPECT_NEAR(got[i][1], ref[i][1], 1e-5 * ref[i][1]) << layout.back() << " step " << i;
      EXPECT_EQ(got[i][2], ref[i][2]) << layout.back() << " step " << i;
    }
  }
  EXPECT_NEAR(tp2[0][0], one[0][0], 1e-5 * one[0][0]) << "the gradient norm at TP 2";
}

// The same statistics with the experts' slices on ranks of several data-parallel replicas
// (ETP 2 x EP 2 over DP 4, TP 1), without and with the distributed optimizer: each expert
// element counted once over the expert grid's tp-ep-pp ranks.
TEST(ExpertParallelTraining, NormsAndZerosAtExpertTensorAboveTensorAreOneRanks) {
  const std::vector<std::vector<double>> one = step_statistics(1, {});
  ASSERT_EQ(one.size(), 3u);
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--expert-tensor-parallel-size", "2",
                                 "--expert-model-parallel-size", "2"},
        {"--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2",
         "--use-distributed-optimizer"}}) {
    const std::vector<std::vector<double>> got = step_statistics(4, layout);
    ASSERT_EQ(got.size(), one.size()) << layout.back();
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(got[i][0], one[i][0], 1e-5 * one[i][0]) << layout.back() << " step " << i;
      EXPECT_NEAR(got[i][1], one[i][1], 1e-5 * one[i][1]) << layout.back() << " step " << i;
      EXPECT_EQ(got[i][2], one[i][2]) << layout.back() << " step " << i;
    }
  }
}

// The experts' linear biases: fc1's split with its rows, fc2's whole on every expert
// tensor-parallel rank, added once, its gradient the same on each and counted once. Trained
// against one rank at ETP = TP 2 + SP x EP 2 and ETP 2 over DP 2 with the distributed optimizer
// (alltoall; ETP < TP: parallel/test_moe_layouts.cpp); the gradient norm (and, without TP's
// padded vocabulary, the parameters' norm and the zeros) one rank's at ETP = TP 2 + SP at EP 1
// (the dense tp group's replicated tensor) and EP 2, and at ETP 2 over DP 2 and ETP 2 x EP 2
// over DP 4 with the distributed optimizer and ETP 2 over DP 4 at ZeRO stage 3 (the expert
// grid's sums). (The losses agree within
// 3e-9; in float32 through Adam the parameters come within 2e-5 of the largest, the dense
// tensors' as far off as the experts': 3e-5 as above.)
TEST(ExpertParallelTraining, ExpertBiasesMatchOneRank) {
  const LinearBiases biases;
  const std::vector<std::string> model = {"--moe-shared-expert-intermediate-size", "0"};
  expect_matches_one_rank(4,
                          {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                           "--expert-model-parallel-size", "2"},
                          model, {"alltoall"}, 3e-5);
  expect_matches_one_rank(2, {"--expert-tensor-parallel-size", "2", "--use-distributed-optimizer"},
                          model, {"alltoall"}, 3e-5);
}
TEST(ExpertParallelTraining, ExpertBiasesCountOnceInTheNorms) {
  const LinearBiases biases;
  const std::vector<std::vector<double>> one = step_statistics(1, {});
  ASSERT_EQ(one.size(), 3u);
  for (const auto& [ranks, layout] : std::vector<std::pair<int, std::vector<std::string>>>{
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {4,
            {"--tensor-model-parallel-size", "2", "--sequence-parallel",
             "--expert-model-parallel-size", "2"}},
           {2, {"--expert-tensor-parallel-size", "2"}},
           {4, {"--expert-tensor-parallel-size", "2", "--zero-stage", "3"}},
           {4,
            {"--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2",
             "--use-distributed-optimizer"}}}) {
    const std::vector<std::vector<double>> got = step_statistics(ranks, layout);
    const bool tp = layout[0] == "--tensor-model-parallel-size";
    ASSERT_EQ(got.size(), one.size()) << layout.back();
    for (size_t i = 0; i < (tp ? 1 : one.size()); ++i) {
      EXPECT_NEAR(got[i][0], one[i][0], 1e-5 * one[i][0]) << layout.back() << " step " << i;
      if (tp) continue;
      EXPECT_NEAR(got[i][1], one[i][1], 1e-5 * one[i][1]) << layout.back() << " step " << i;
      EXPECT_EQ(got[i][2], one[i][2]) << layout.back() << " step " << i;
    }
  }
}

std::vector<std::pair<std::string, std::vector<float>>> everything(const std::string& dir) {
  const CheckpointReader reader(dir);
  auto model = reader.read_whole(), optimizer = reader.read_whole("optimizer.");
  model.insert(model.end(), optimizer.begin(), optimizer.end());
  return model;
}

void expect_same_state(const std::string& a, const std::string& b) {
  const auto x = everything(a), y = everything(b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].first, y[i].first);
    ASSERT_EQ(x[i].second.size(), y[i].second.size()) << x[i].first;
    EXPECT_EQ(std::memcmp(x[i].second.data(), y[i].second.data(), x[i].second.size() * 4), 0)
        << x[i].first << " differs between " << a << " and " << b;
  }
}

// Saved at EP 2 x DP 2 (4 ranks: each expert-parallel rank's experts written by one of its two
// replicas), loaded at one rank and saved, loaded at EP 2 with the distributed optimizer and
// saved: the same state each time, bit for bit, each element written once.
TEST(ExpertParallelTraining, CheckpointsReshardBetweenExpertLayouts) {
  const std::string base = ::testing::TempDir() + "omnitron_ep_ckpt_";
  const std::string ep2 = base + "ep2", one = base + "one", back = base + "back";
  for (const std::string& d : {ep2, one, back}) fs::remove_all(d);
  const int64_t written = train(4, {"--expert-model-parallel-size", "2", "--save", ep2}).written;
  EXPECT_EQ(written, train(1, {"--load", ep2, "--save", one}, true).written)
      << "each element of the model and its states is written once";
  train(2,
        {"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--load", one,
         "--save", back},
        true);
  expect_same_state(ep2, one);
  expect_same_state(ep2, back);
  EXPECT_TRUE(fs::exists(back + "/iter_0000003/optimizer_rank00001.bin"));
}

// Saved at EP 2 x TP 2 + SP (each rank its experts' halves of their widths), loaded at one
// rank and saved: the same state, each element written once.
TEST(ExpertParallelTraining, CheckpointsSavedAtExpertAndTensorParallelLoadAtOneRank) {
  const std::string base = ::testing::TempDir() + "omnitron_ep_tp_ckpt_";
  const std::string ep_tp = base + "ep2tp2", one = base + "one";
  for (const std::string& d : {ep_tp, one}) fs::remove_all(d);
  const int64_t written =
      train(4, {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                "--sequence-parallel", "--save", ep_tp})
          .written;
  EXPECT_EQ(written, train(1, {"--load", ep_tp, "--save", one}, true).written)
      << "each element of the model and its states is written once";
  expect_same_state(ep_tp, one);
}

// Saved at ETP 1 under TP 2 + SP with EP 1 (2 ranks holding the same whole experts: one
// writes them), loaded at ETP = TP 2 x EP 2 (4 ranks, the experts split by width) and saved,
// loaded at one rank and saved, loaded at ETP 1 x EP 2 (2 ranks) and saved: the same state
// each time, bit for bit, each element written once.
TEST(ExpertParallelTraining, CheckpointsReshardBetweenExpertTensorLayouts) {
  const std::string base = ::testing::TempDir() + "omnitron_etp_ckpt_";
  const std::string etp1 = base + "etp1", etp2 = base + "etp2", one = base + "one",
                    back = base + "back";
  for (const std::string& d : {etp1, etp2, one, back}) fs::remove_all(d);
  const int64_t written = train(2, with_tp2_etp1({"--save", etp1})).written;
  train(4,
        {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
         "--sequence-parallel", "--load", etp1, "--save", etp2},
        true);
  EXPECT_EQ(written, train(1, {"--load", etp2, "--save", one}, true).written)
      << "each element of the model and its states is written once";
  train(2, with_tp2_etp1({"--expert-model-parallel-size", "2", "--load", one, "--save", back}),
        true);
  expect_same_state(etp1, etp2);
  expect_same_state(etp1, one);
  expect_same_state(etp1, back);
}

// The largest difference between any rank's copy of any parameter after `flags` and the
// one-rank model `ref` (each rank's values, not one assembled copy: ranks holding the same
// experts must all hold them).
double worst_rank_param_difference(int ranks, const std::vector<std::string>& flags,
                                   const Run& ref) {
  double worst = 0;
  std::mutex mu;
  run_ranks(ranks, [&](Communicator& world) {
    const Options o = options(ranks, flags);
    Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &world);
    MetricsSink sink("", false, nullptr);
    t.run(sink);
    std::lock_guard<std::mutex> lock(mu);
    const ParameterSet<float>& ps = t.model().params();
    for (const ParamInfo& p : ps.infos()) {
      auto it = std::find_if(ref.params.begin(), ref.params.end(),
                             [&](const auto& e) { return e.first == p.name; });
      if (it == ref.params.end()) continue;
      const int64_t whole = int64_t(it->second.size());
      ParameterSet<float>::for_each_run(p, [&](int64_t local, int64_t global, int64_t n) {
        for (int64_t i = 0; i < n && global + i < whole; ++i)
          worst = std::max(worst, double(std::abs(ps.values()[p.offset + local + i] -
                                                  it->second[size_t(global + i)])));
      });
    }
  });
  return worst;
}

// Resumed at layouts where several ranks hold the same experts (ETP 1 under TP 2: each tp
// rank whole experts; EP 2 x DP 2: each expert-parallel rank's experts on two replicas):
// every such rank reads them and their optimizer states, not only the one that writes them,
// so one more step lands where the straight one-rank run does. (Each rank past the writer
// kept its initial experts and moments: its tokens saw stale experts, its Adam a fresh start.)
TEST(ExpertParallelTraining, EveryRankHoldingTheExpertsReadsThemOnResume) {
  const std::string one = ::testing::TempDir() + "omnitron_ep_every_reader_one";
  fs::remove_all(one);
  const auto straight = train(1, {"--lr-decay-style", "constant", "--train-iters", "4"});
  train(1, {"--lr-decay-style", "constant", "--save", one});
  double largest = 0;
  for (const auto& [name, values] : straight.params)
    for (float v : values) largest = std::max(largest, double(std::abs(v)));
  for (const auto& [ranks, layout] : std::vector<std::pair<int, std::vector<std::string>>>{
           {2, with_tp2_etp1({})}, {4, {"--expert-model-parallel-size", "2"}}}) {
    for (const bool distributed : {false, true}) {
      std::vector<std::string> flags = {"--lr-decay-style", "constant", "--train-iters", "4",
                                        "--load", one};
      flags.insert(flags.begin(), layout.begin(), layout.end());
      if (distributed) flags.push_back("--use-distributed-optimizer");
      const double worst = worst_rank_param_difference(ranks, flags, straight);
      EXPECT_LE(worst, 1e-5 * largest) << layout[0] << (distributed ? " distributed" : "");
    }
  }
  fs::remove_all(one);
}

// Saved at ETP 2 over DP 2 (TP 1: each rank writes its slice of every expert, the first the
// dense tensors), loaded at one rank and saved, loaded at `back` (4 ranks) and saved: the same
// state bit for bit each time, each element written once (at `back` too with `back_once`).
void expect_reshards_from_wide_expert_tensor(const std::string& tag, std::vector<std::string> back,
                                             bool back_once) {
  const std::string base = ::testing::TempDir() + "omnitron_" + tag + "_ckpt_";
  const std::string wide = base + "wide", one = base + "one", again = base + "back";
  for (const std::string& d : {wide, one, again}) fs::remove_all(d);
  const int64_t written = train(2, {"--expert-tensor-parallel-size", "2", "--save", wide}).written;
  EXPECT_GT(written, 0);
  EXPECT_EQ(written, train(1, {"--load", wide, "--save", one}, true).written)
      << "each element of the model and its states is written once";
  back.insert(back.end(), {"--load", one, "--save", again});
  const int64_t back_written = train(4, back, true).written;
  if (back_once) {
    EXPECT_EQ(written, back_written) << "each element written once at the last layout";
  }
  expect_same_state(wide, one);
  expect_same_state(wide, again);
  for (const std::string& d : {wide, one, again}) fs::remove_all(d);
}
// Back at ETP 2 x EP 2 over DP 4 with the distributed optimizer.
TEST(ExpertParallelTraining, CheckpointsReshardFromExpertTensorAboveTensor) {
  expect_reshards_from_wide_expert_tensor(
      "wide_etp",
      {"--expert-tensor-parallel-size", "2", "--expert-model-parallel-size", "2",
       "--use-distributed-optimizer"},
      false);
}
// With the experts' linear biases (fc2's written by the first etp rank only), back at ETP 2
// over DP 4 at ZeRO stage 3.
TEST(ExpertParallelTraining, CheckpointsWithExpertBiasesReshardFromExpertTensorAboveTensor) {
  const LinearBiases biases;
  expect_reshards_from_wide_expert_tensor(
      "etp_bias", {"--expert-tensor-parallel-size", "2", "--zero-stage", "3"}, true);
}

// Saved at ZeRO stage 3, EP 2 x DP 2, after two steps (each rank its shards of the dense
// parameters, the experts' and their states), resumed for the third: the state of three steps
// straight, bit for bit.
TEST(ExpertParallelTraining, ZeroStage3CheckpointResumes) {
  const std::string base = ::testing::TempDir() + "omnitron_ep_zero3_ckpt_";
  const std::string first = base + "first", resumed = base + "resumed",
                    straight = base + "straight";
  for (const std::string& d : {first, resumed, straight}) fs::remove_all(d);
  const std::vector<std::string> z3 = {"--expert-model-parallel-size", "2", "--zero-stage", "3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), z3.begin(), z3.end());
    return extra;
  };
  const auto whole = train(4, with({"--save", straight}));
  train(4, with({"--exit-interval", "2", "--save", first}));
  const auto tail = train(4, with({"--load", first, "--save", resumed}));
  ASSERT_EQ(tail.losses.size(), 1u);
  EXPECT_EQ(tail.losses[0], whole.losses[2]);
  expect_same_state(straight, resumed);
  for (const std::string& d : {first, resumed, straight}) fs::remove_all(d);
}

TEST(ExpertParallelTraining, BadLayoutsAreOneLineNamingTheFlagsAndNumbers) {
  auto error_of = [](const std::vector<std::string>& args) {
    Options o;
    try {
      parse_options(args, o);
      finalize(o);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of({"--mock-data", "--vocab-size", "64", "--num-experts", "6",
                      "--expert-model-parallel-size", "4"}),
            "--num-experts (6) must be divisible by --expert-model-parallel-size (4)");
  EXPECT_EQ(error_of({"--mock-data", "--vocab-size", "64", "--expert-model-parallel-size", "2"}),
            "--expert-model-parallel-size 2 needs --num-experts (a dense model has no experts to "
            "split)");
  // The experts' own tensor-parallel size: TP or a divisor of it with sequence parallelism,
  // whose experts' width it divides.
  std::string grid = "not thrown";
  const std::vector<std::string> moe = {"--mock-data",
                                        "--vocab-size",
                                        "64",
                                        "--num-experts",
                                        "4",
                                        "--disable-bias-linear",
                                        "--tensor-model-parallel-size",
                                        "4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return extra;
  };
  EXPECT_EQ(error_of(with({"--sequence-parallel", "--expert-tensor-parallel-size", "3"})),
            "--expert-tensor-parallel-size 3 with --tensor-model-parallel-size 4: not built yet: "
            "experts split over a number of ranks that neither divides nor is a multiple of "
            "--tensor-model-parallel-size");
  EXPECT_EQ(error_of(with({"--sequence-parallel", "--expert-tensor-parallel-size", "6"})),
            "--expert-tensor-parallel-size 6 with --tensor-model-parallel-size 4: not built yet: "
            "experts split over a number of ranks that neither divides nor is a multiple of "
            "--tensor-model-parallel-size");
  // ETP above TP: sequence parallelism under TP > 1; GaLore, Shampoo (each expert's matrix
  // assembled over its slices) and LAMB, with and without the distributed optimizer, built.
  EXPECT_EQ(error_of(with({"--expert-tensor-parallel-size", "8"})),
            "--expert-tensor-parallel-size 8 with --tensor-model-parallel-size 4 needs "
            "--sequence-parallel (Megatron's MoE under tensor parallelism: each rank routes its "
            "sequence-parallel tokens)");
  for (const std::string opt : {"lamb", "shampoo", "galoreadamw8bit"})
    for (const std::string sharded : {"", "--use-distributed-optimizer"}) {
      std::vector<std::string> zoo = {"--sequence-parallel", "--expert-tensor-parallel-size", "8",
                                      "--optimizer", opt};
      if (!sharded.empty()) zoo.insert(zoo.end(), sharded);
      EXPECT_EQ(error_of(with(zoo)), "") << opt << " " << sharded;
    }
  EXPECT_EQ(error_of(with({"--sequence-parallel", "--expert-tensor-parallel-size", "2",
                           "--moe-ffn-hidden-size", "15"})),
            "--moe-ffn-hidden-size (15) must be divisible by --expert-tensor-parallel-size (2)");
  EXPECT_EQ(error_of(with({"--expert-tensor-parallel-size", "1"})),
            "--expert-tensor-parallel-size 1 with --tensor-model-parallel-size 4 needs "
            "--sequence-parallel (Megatron's MoE under tensor parallelism: each rank routes its "
            "sequence-parallel tokens)");
  // LAMB and adam8bit under the distributed optimizer (--zero-stage 1 is it) are built at
  // ETP != TP, and ZeRO stages 2 and 3 with MoE at any ETP (the zoo's refusal of them their
  // own: options_optimizer_zoo.cpp).
  for (const std::string opt : {"lamb", "adam8bit"})
    for (const std::string dist : {"--use-distributed-optimizer", "--zero-stage=1"})
      EXPECT_EQ(error_of(with({"--sequence-parallel", "--expert-tensor-parallel-size", "2", dist,
                               "--optimizer", opt})),
                "")
          << opt << " " << dist;
  for (const std::string stage : {"2", "3"})
    EXPECT_EQ(error_of(with({"--sequence-parallel", "--expert-tensor-parallel-size", "1",
                             "--zero-stage", stage})),
              "")
        << stage;
  EXPECT_EQ(error_of(with({"--expert-tensor-parallel-size", "-1"})),
            "--expert-tensor-parallel-size must be positive (got -1)");
  // The expert grid (ETP x EP x PP) must divide the world too.
  try {
    data_parallel_size(4, ParallelLayout{.tp = 2, .ep = 3, .etp = 1});
    grid.clear();
  } catch (const UsageError& e) {
    grid = e.what();
  }
  EXPECT_NE(
      grid.find("the world of 4 ranks is not divisible by --expert-tensor-parallel-size (1) "
                "x --expert-model-parallel-size (3) x --pipeline-model-parallel-size (1) = 3"),
      std::string::npos)
      << grid;
  // Expert-parallel ranks are data-parallel ranks: EP must divide them.
  grid.clear();
  try {
    data_parallel_size(6, ParallelLayout{.ep = 4, .pp = 1});
  } catch (const UsageError& e) {
    grid = e.what();
  }
  EXPECT_NE(grid.find("the world of 6 ranks is not divisible by --tensor-model-parallel-size (1) x "
                      "--context-parallel-size (1) x --expert-model-parallel-size (4)"),
            std::string::npos)
      << grid;
}

}  // namespace
}  // namespace omni
