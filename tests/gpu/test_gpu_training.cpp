// Training on the GPU is the CPU's training with the ops on the device: the Trainer with
// --device cuda (float32) runs the one GPTModel, its optimizer, gradient clipping, data-parallel
// buckets and pipeline buffers on the GPU backend (here the emulator, one device per in-process
// rank), and its losses are the CPU trainer's.
//
// Tolerance, stated before measuring: each step's loss within 1e-4 relative of the CPU run's
// (float arithmetic in other orders, through six AdamW steps). Resuming from a checkpoint gives
// the uninterrupted run's losses exactly (the device's arithmetic is deterministic). The
// layouts' ranks: tensor (+ sequence), pipeline and data parallel, and all three at once.
// Where the trained parameters are compared too (MoE under context parallelism), each within
// 1e-4 absolute of the CPU's (Adam moves them by about 1e-2 a step).
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "comm/local_communicator.h"
#if defined(OMNITRON_NCCL)
#include "comm/nccl_communicator.h"
#endif
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "gpu/gpu_test.h"
#include "model/gpt_model.h"
#include "train/trainer.h"

namespace omni {
namespace {

Options tiny_options(const std::vector<std::string>& extra, int world = 1) {
  Options o;
  std::vector<std::string> args = {"--mock-data",
                                   "--vocab-size",
                                   "97",
                                   "--num-layers",
                                   "2",
                                   "--hidden-size",
                                   "32",
                                   "--num-attention-heads",
                                   "4",
                                   "--seq-length",
                                   "16",
                                   "--micro-batch-size",
                                   "2",
                                   "--train-iters",
                                   "6",
                                   "--eval-iters",
                                   "0",
                                   "--lr",
                                   "1e-2",
                                   "--log-interval",
                                   "100",
                                   "--no-progress",
                                   "--global-batch-size",
                                   "4"};
  args.insert(args.end(), extra.begin(), extra.end());
  parse_options(args, o);
  const int layout =
      o.tensor_model_parallel_size * o.pipeline_model_parallel_size * o.context_parallel_size;
  o.data_parallel_size = world / layout;
  finalize(o);
  return o;
}

// The Llama family's options, with qk-layernorm (which the CPU trainer's tests leave out).
// clang-format off
const std::vector<std::string> kLlama = {
    "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
    "--disable-bias-linear", "--group-query-attention", "--num-query-groups", "2",
    "--untie-embeddings-and-output-weights", "--qk-layernorm"};
// clang-format on

// Each step's loss on `world` in-process ranks (rank 0's), on the CPU or the emulated GPU;
// `after` sees rank 0's trainer at the end.
std::vector<double> losses(const Options& o, int world = 1,
                           const std::function<void(Trainer&)>& after = {}) {
  std::vector<double> result;
  std::mutex mu;
  run_ranks(world, [&](Communicator& w) {
    if (o.device != "cpu") gpu::set_device(w.rank());
    Trainer t(o, make_mock_data(o.model.vocab_size, static_cast<uint64_t>(o.seed)), 0, std::nullopt,
              &w);
    MetricsSink sink(o, nullptr);
    const TrainResult r = t.run(sink);
    std::lock_guard<std::mutex> lock(mu);
    if (w.rank() == 0) result = r.train_losses;
    if (w.rank() == 0 && after) after(t);
  });
  return result;
}

class GpuTraining : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(OMNITRON_GPU_EMULATE)
    GTEST_SKIP() << "in-process ranks share host memory, which only the emulated device is";
#endif
    set_gpu_backend(&gpu::backend());
  }
};

// Rank 0's trained parameters, in host memory, by name (one tensor-parallel rank: its
// tensors are whole but for the experts split over expert-parallel ranks).
std::map<std::string, std::vector<float>> parameters(Trainer& t) {
  EXPECT_EQ(t.grid().tp_size(), 1) << "a tensor-parallel rank's shards are not the CPU's start";
  GPTModel<float>& m = t.model();
  std::map<std::string, std::vector<float>> out;
  for (const ParamInfo& p : m.params().infos()) {
    std::vector<float>& v = out[p.name];
    v.resize(size_t(p.numel));
    ops::download(m.exec(), v.data(), m.params().value(p.name), v.size());
  }
  return out;
}

// `model` on one CPU rank, against `model` + `layout` on `world` emulated GPU ranks, each step's
// loss within `tolerance` (relative). With param_atol > 0, also rank 0's trained parameters
// within param_atol of the CPU's (a tensor split over expert-parallel ranks: rank 0's first
// experts, the start of the CPU's).
void expect_same_losses(const std::vector<std::string>& model,
                        const std::vector<std::string>& layout, int world, double tolerance = 1e-4,
                        double param_atol = 0) {
  std::vector<std::string> gpu_flags = model;
  gpu_flags.insert(gpu_flags.end(), layout.begin(), layout.end());
  gpu_flags.insert(gpu_flags.end(), {"--device", "cuda"});
  std::map<std::string, std::vector<float>> cpu_params, gpu_params;
  auto keep = [&](std::map<std::string, std::vector<float>>& into) {
    return [&into, param_atol](Trainer& t) {
      if (param_atol > 0) into = parameters(t);
    };
  };
  const std::vector<double> cpu = losses(tiny_options(model, 1), 1, keep(cpu_params));
  const std::vector<double> gpu = losses(tiny_options(gpu_flags, world), world, keep(gpu_params));
  if (param_atol > 0) {
    ASSERT_EQ(gpu_params.size(), cpu_params.size());
    double worst = 0;
    for (const auto& [name, want] : cpu_params) {
      const std::vector<float>& got = gpu_params[name];
      ASSERT_LE(got.size(), want.size()) << name;
      ASSERT_FALSE(got.empty()) << name;
      double diff = 0;
      for (size_t i = 0; i < got.size(); ++i)
        diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
      EXPECT_LT(diff, param_atol) << name;
      worst = std::max(worst, diff);
    }
    std::printf("%zu parameters: worst absolute difference from the CPU %.2e\n", cpu_params.size(),
                worst);
  }
  ASSERT_EQ(gpu.size(), cpu.size());
  // The steps updated the model (an fp16 run whose every step overflowed would not).
  EXPECT_NE(gpu.front(), gpu.back());
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double rel = std::abs(gpu[i] - cpu[i]) / std::abs(cpu[i]);
    EXPECT_LT(rel, tolerance) << "step " << i + 1 << ": GPU " << gpu[i] << ", CPU " << cpu[i];
    worst = std::max(worst, rel);
  }
  std::printf("%d rank(s): losses %.6f .. %.6f, worst relative difference from the CPU %.2e\n",
              world, gpu.front(), gpu.back(), worst);
}

TEST_F(GpuTraining, OneRankGpt2MatchesTheCpu) {
  expect_same_losses({}, {}, 1);
}
TEST_F(GpuTraining, OneRankLlamaMatchesTheCpu) {
  expect_same_losses(kLlama, {}, 1);
}
// DeepSeek-shaped MoE layers (model/moe_layer.h through the MoE ops' seam): sigmoid routing
// within groups, the aux-loss-free expert bias updated after every step from the token counts,
// seq_aux_loss and z-loss, a shared expert.
std::vector<std::string> deepseek_moe() {
  std::vector<std::string> moe = kLlama;
  // clang-format off
  moe.insert(moe.end(), {
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24",
      "--moe-router-score-function", "sigmoid", "--moe-router-num-groups", "2",
      "--moe-router-group-topk", "1", "--moe-router-enable-expert-bias",
      "--moe-router-bias-update-rate", "0.01", "--moe-router-load-balancing-type", "seq_aux_loss",
      "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3",
      "--moe-shared-expert-intermediate-size", "32"});
  // clang-format on
  return moe;
}
TEST_F(GpuTraining, OneRankMoEMatchesTheCpu) {
  expect_same_losses(deepseek_moe(), {}, 1);
}
// Expert parallelism on the GPU: the experts' rows exchanged (alltoall) over the
// expert-parallel group of two emulated ranks (which also split the batch as data-parallel
// ranks). Three steps; Megatron's default dispatcher, allgather, trains the same way (its rows
// through the same device buffers: measured equal too, left out for test time).
TEST_F(GpuTraining, ExpertParallel2MatchesOneCpuRank) {
  std::vector<std::string> model = deepseek_moe();
  model.insert(model.end(), {"--train-iters", "3"});
  expect_same_losses(
      model, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}, 2);
}
// Tensor parallelism (expert tensor parallelism of the same size) with sequence parallelism:
// each rank routes the gathered tokens and holds half of every expert's width. Two steps.
TEST_F(GpuTraining, MoETensorParallel2SequenceParallelMatchesOneCpuRank) {
  std::vector<std::string> model = deepseek_moe();
  model.insert(model.end(), {"--train-iters", "2"});
  expect_same_losses(model, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2);
}
// Context parallelism: each rank routes its half of every sequence; the balancing losses' token
// counts (seq_aux_loss: per sequence) are summed over the cp group in device memory, the
// z-loss is each rank's part, and the expert bias moves with the global batch's counts (summed
// over dp x cp). Three steps; the trained parameters (expert bias included) too.
TEST_F(GpuTraining, MoEContextParallel2MatchesOneCpuRank) {
  std::vector<std::string> model = deepseek_moe();
  model.insert(model.end(), {"--train-iters", "3"});
  expect_same_losses(model, {"--context-parallel-size", "2"}, 2, 1e-4, 1e-4);
}
// Expert parallelism composed with context parallelism on four ranks (cp 2, dp 2, the experts
// split over ep 2 of the dp x cp ranks), Megatron's default allgather dispatcher. Two steps.
TEST_F(GpuTraining, ExpertParallel2ContextParallel2MatchesOneCpuRank) {
  std::vector<std::string> model = deepseek_moe();
  model.insert(model.end(), {"--train-iters", "2"});
  expect_same_losses(model,
                     {"--context-parallel-size", "2", "--expert-model-parallel-size", "2",
                      "--moe-token-dispatcher-type", "allgather"},
                     4, 1e-4, 1e-4);
}
TEST_F(GpuTraining, TensorParallel2SequenceParallelMatchesOneCpuRank) {
  expect_same_losses(kLlama, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2);
}
TEST_F(GpuTraining, DataParallel2MatchesOneCpuRank) {
  expect_same_losses({}, {}, 2);
}
TEST_F(GpuTraining, DataParallel2DistributedOptimizerMatchesOneCpuRank) {
  expect_same_losses({}, {"--use-distributed-optimizer"}, 2);
}
// ZeRO's flat buffers in the emulated GPU's releasable memory, where a touch of a released
// granule faults as on a GPU.
TEST_F(GpuTraining, DataParallel2ZeroStage2MatchesOneCpuRank) {  // gradients sharded
  expect_same_losses({}, {"--zero-stage", "2"}, 2);
}
// Gradients and parameters sharded; an evaluation (forward only: its prefetch for a backward
// that does not come is ended) just before each save, which reads the parameter buffer.
TEST_F(GpuTraining, DataParallel2ZeroStage3MatchesOneCpuRank) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("omni_gpu_zero3_" + std::to_string(getpid()));
  expect_same_losses({},
                     {"--zero-stage", "3", "--eval-interval", "3", "--eval-iters", "1", "--save",
                      dir.string(), "--save-interval", "3"},
                     2);
  std::filesystem::remove_all(dir);
}
// ZeRO 2 and 3 of the GPU's bf16 model: float gradients reduce-scattered per bucket into the
// rank's shard, stage 3's 16-bit values all-gathered per layer and released after use, the fp32
// master and Adam's states for the shard only. Against the one-rank bf16 GPU run (the same
// 16-bit arithmetic; the gradients summed in another order), each step's loss within 1e-5
// relative; stage 3's checkpoint (the fp32 master, written by shards) resumes at one rank.
TEST_F(GpuTraining, Bf16ZeroStages2And3MatchOneGpuRank) {
  const std::vector<std::string> bf16 = {"--bf16", "--device",     "cuda", "--train-iters",
                                         "4",      "--num-layers", "1"};
  const std::vector<double> one = losses(tiny_options(bf16, 1), 1);
  ASSERT_EQ(one.size(), 4u);
  EXPECT_NE(one.front(), one.back());
  auto expect_close = [&](const std::vector<double>& run, size_t first, const char* what) {
    ASSERT_EQ(run.size() + first, one.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < run.size(); ++i)
      worst = std::max(worst, std::abs(run[i] - one[i + first]) / std::abs(one[i + first]));
    std::printf("bf16 %s: worst relative difference from one GPU rank %.2e\n", what, worst);
    EXPECT_LE(worst, 1e-5) << what;
  };
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("omni_gpu_bf16_zero_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  const int64_t size = GPTModel<float>(tiny_options(bf16).model, 1, 1).params().size();
  for (const char* stage : {"2", "3"}) {
    std::filesystem::remove_all(dir);  // stage 3's checkpoints are resumed below
    std::vector<std::string> flags = bf16;
    flags.insert(flags.end(), {"--zero-stage", stage, "--save", dir, "--save-interval", "2"});
    // The fp32 master (values, gradients) and Adam's two states: each rank holds about half
    // of their 16 bytes per parameter, and the partial pages at its ranges' ends (0.59 of the
    // whole here; 0.68 if the master is kept whole).
    double held = 0;
    auto memory = [&](Trainer& t) { held = double(t.held_memory().optimizer) / (16.0 * size); };
    expect_close(losses(tiny_options(flags, 2), 2, memory), 0,
                 stage[0] == '2' ? "stage 2" : "stage 3");
    std::printf("stage %s: master and Adam states held %.2f of the whole\n", stage, held);
    EXPECT_LT(held, 0.635) << "stage " << stage;
  }
  std::vector<std::string> resume = bf16;
  resume.insert(resume.end(), {"--load", dir});
  // The last save (stage 3's, iteration 4) holds the trained model: resume from iteration 2.
  std::ofstream(dir + "/latest_checkpointed_iteration.txt") << 2;
  expect_close(losses(tiny_options(resume, 1), 1), 2, "stage 3 resumed at one rank");
  std::filesystem::remove_all(dir);
}
TEST_F(GpuTraining, Pipeline2MatchesOneCpuRank) {
  expect_same_losses({}, {"--pipeline-model-parallel-size", "2"}, 2);
}
TEST_F(GpuTraining, TensorParallel2Pipeline2DataParallel2MatchesOneCpuRank) {
  expect_same_losses(
      kLlama, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, 8);
}

// --bf16 and --fp16: the GPU stores weights and activations in 16 bits, the CPU computes in
// float with 16-bit values, so each step's loss differs by the activations' rounding (about
// 2^-8 relative per rounding in bf16, 2^-11 in fp16), well inside 1e-2 over these few steps.
TEST_F(GpuTraining, Bf16OneRankLlamaTracksTheCpu) {
  std::vector<std::string> model = kLlama;
  model.push_back("--bf16");
  expect_same_losses(model, {}, 1, 1e-2);
}
TEST_F(GpuTraining, Bf16TensorParallel2Pipeline2SequenceParallelTracksOneCpuRank) {
  expect_same_losses({"--bf16"},
                     {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                      "--sequence-parallel"},
                     4, 1e-2);
}
// The MoE layers in 16 bits (the router in float32, the experts' GEMMs in 16 bits with float
// accumulation; the expert bias rounded after each update as the CPU's), fp16 with the loss
// scaler, which scales the aux and z losses' gradients too (initial scale as
// Fp16WithTheLossScalerTracksTheCpu's). Two steps each (test time).
TEST_F(GpuTraining, Bf16AndFp16OneRankMoETrackTheCpu) {
  for (const std::vector<std::string>& precision :
       {std::vector<std::string>{"--bf16"}, {"--fp16", "--initial-loss-scale", "128"}}) {
    std::vector<std::string> model = deepseek_moe();
    model.insert(model.end(), precision.begin(), precision.end());
    model.insert(model.end(), {"--train-iters", "2"});
    expect_same_losses(model, {}, 1, 1e-2);
  }
}
// The parameters' norm and the gradients' zeros are counted on the device (the counts
// themselves: GpuOptimizer.CountZerosMatchesCpu).
TEST_F(GpuTraining, LoggingParamsNormAndZerosInGradKeepsTheLosses) {
  expect_same_losses({"--log-params-norm", "--log-num-zeros-in-grad", "--log-interval", "1"},
                     {"--use-distributed-optimizer"}, 2);
}
// Shampoo sharded by whole tensors under the distributed optimizer (its roots on the host).
TEST_F(GpuTraining, ShampooDataParallel2DistributedOptimizerMatchesOneCpuRank) {
  const std::vector<std::string> shampoo = {"--optimizer", "shampoo",       "--shampoo-update-freq",
                                            "2",           "--shampoo-eps", "1e-4"};
  expect_same_losses(shampoo, {"--use-distributed-optimizer"}, 2);
}
// GaLore and Shampoo on tensor-parallel slices: each split tensor assembled on the device over
// the tp pair and stepped whole (optim/optimizer_zoo.h's WholeTensorStates).
TEST_F(GpuTraining, GaLoreAndShampooTensorParallel2MatchOneCpuRank) {
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  expect_same_losses({"--optimizer", "shampoo", "--shampoo-update-freq", "2", "--shampoo-eps",
                      "1e-4"},
                     tp2, 2, 1e-6);
  expect_same_losses({"--optimizer", "galoreadamw8bit", "--galore-rank", "4",
                      "--galore-update-proj-gap", "2", "--adam8bit-min-8bit-size", "256"},
                     tp2, 2, 1e-6);
}
TEST_F(GpuTraining, SgdWithMomentumMatchesTheCpu) {
  expect_same_losses({"--optimizer", "sgd", "--sgd-momentum", "0.9"}, {}, 1);
}
// The dynamic scaler starts at 128, not Megatron's 2^32, so that the few steps here update
// the model instead of skipping on overflow.
TEST_F(GpuTraining, Fp16WithTheLossScalerTracksTheCpu) {
  expect_same_losses({"--fp16", "--initial-loss-scale", "128"}, {}, 1, 1e-2);
}

// Four steps, saved (--exit-interval 2) with `flags` + `save`, resumed with `flags` + `load`, on
// `world` ranks: the resumed steps are the uninterrupted (`flags` + `load`) run's, bit for bit.
void expect_exact_resume(const std::vector<std::string>& flags, int world = 1,
                         const std::vector<std::string>& save = {},
                         const std::vector<std::string>& load = {}) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("omnitron_gpu_resume_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  auto with = [&](std::vector<std::string> more, const std::vector<std::string>& stage) {
    more.insert(more.begin(), flags.begin(), flags.end());
    more.insert(more.end(), stage.begin(), stage.end());
    more.insert(more.end(), {"--train-iters", "4"});
    return tiny_options(more, world);
  };
  const std::vector<double> whole = losses(with({}, load), world);
  losses(with({"--save", dir, "--exit-interval", "2"}, save), world);
  const std::vector<double> rest = losses(with({"--load", dir}, load), world);
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(rest[i], whole[i + 2]) << "step " << i + 3;
  std::filesystem::remove_all(dir);
}

TEST_F(GpuTraining, ResumeFromACheckpointIsExact) {
  expect_exact_resume({"--device", "cuda"});
}
// A stage 2 checkpoint resumed at stage 3 on two ranks: the load commits only this rank's
// shard of the parameter buffer (the rest faults if the read touches it).
TEST_F(GpuTraining, ZeroStage2CheckpointResumesAtStage3) {
  expect_exact_resume({"--device", "cuda"}, 2, {"--zero-stage", "2"}, {"--zero-stage", "3"});
}
// The checkpoint holds the fp32 master weights and the loss scaler; the 16-bit model is
// rounded from them on load, so the resumed run is the uninterrupted one, bit for bit.
TEST_F(GpuTraining, Bf16AndFp16ResumeFromACheckpointIsExact) {
  expect_exact_resume({"--device", "cuda", "--bf16"});
  expect_exact_resume({"--device", "cuda", "--fp16", "--initial-loss-scale", "128"});
}

#if defined(OMNITRON_NCCL) && !defined(OMNITRON_GPU_EMULATE)
// On a real GPU, the Trainer over a one-rank NCCL world (what `omnitron train` builds for GPU
// ranks) is the Trainer alone, bit for bit: its host-side sums (losses, token counts, norms,
// found-inf) and a sharded checkpoint's metadata cross NCCL through device memory. Several
// ranks need several GPUs: scripts/gpu_check.sh runs the layouts under mpirun.
std::vector<double> losses_over(const Options& o, Communicator* world) {
  Trainer t(o, make_mock_data(o.model.vocab_size, static_cast<uint64_t>(o.seed)), 0, std::nullopt,
            world);
  MetricsSink sink(o, nullptr);
  return t.run(sink).train_losses;
}

TEST(GpuTrainingOverNccl, AOneRankNcclWorldTrainsSavesAndResumesAsNoWorld) {
  OMNI_REQUIRE_GPU();
  set_gpu_backend(&gpu::backend());
  std::unique_ptr<Communicator> self = make_self_communicator();
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(*self);
  ASSERT_TRUE(nccl->device_memory());
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("omnitron_nccl_resume_" + std::to_string(getpid())))
                              .string();
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--device", "cuda", "--use-distributed-optimizer"},
        std::vector<std::string>{"--device", "cuda", "--bf16", "--clip-grad", "0.5"}}) {
    std::filesystem::remove_all(dir);
    auto with = [&](std::vector<std::string> more) {
      more.insert(more.begin(), flags.begin(), flags.end());
      return tiny_options(more);
    };
    const std::vector<double> whole = losses_over(with({}), nullptr);
    const std::vector<double> first =
        losses_over(with({"--save", dir, "--exit-interval", "3"}), nccl.get());
    const std::vector<double> rest = losses_over(with({"--load", dir}), nullptr);
    ASSERT_EQ(first.size(), 3u);
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(first[i], whole[i]) << flags[2] << ": step " << i + 1 << " over NCCL";
      EXPECT_EQ(rest[i], whole[i + 3]) << flags[2] << ": step " << i + 4 << " resumed";
    }
  }
  std::filesystem::remove_all(dir);
}
#endif

// Expert parallelism 2 inside data parallelism 4 (two ranks hold each expert: experts'
// gradients reduced over the expert-data-parallel pair, dense ones over all four) with the
// distributed optimizer, which shards the dense and the expert parameters over their own
// groups. One micro-batch of the four per rank; two steps.
TEST_F(GpuTraining, ExpertParallel2DataParallel4DistributedOptimizerMatchesOneCpuRank) {
  std::vector<std::string> model = deepseek_moe();
  model.insert(model.end(), {"--train-iters", "2", "--micro-batch-size", "1"});
  expect_same_losses(model,
                     {"--expert-model-parallel-size", "2", "--use-distributed-optimizer",
                      "--moe-token-dispatcher-type", "alltoall"},
                     4);
}
// The same at ZeRO stage 3, in the emulated GPU's releasable memory (a touch of a released
// granule faults): the experts' gradients and values sharded over the expert-data-parallel
// pairs, the dense ones over all four; the expert bias's update writes the whole bias on every
// rank (backed for it).
TEST_F(GpuTraining, ExpertParallel2DataParallel4ZeroStage3MatchesOneCpuRank) {
  std::vector<std::string> model = deepseek_moe();
  model.insert(model.end(), {"--train-iters", "2", "--micro-batch-size", "1"});
  expect_same_losses(model,
                     {"--expert-model-parallel-size", "2", "--zero-stage", "3",
                      "--moe-token-dispatcher-type", "alltoall"},
                     4);
}
// And of the GPU's bf16 model: the 16-bit values of the experts all-gathered over their pairs,
// the fp32 master kept for both shards, the expert bias rounded to bf16 after its update.
// Against stage 1 (the distributed optimizer, the same layout), each step's loss within 1e-5
// relative, as the dense bf16 test bounds it.
TEST_F(GpuTraining, Bf16ExpertParallel2DataParallel4ZeroStage3MatchesStage1) {
  std::vector<std::string> flags = deepseek_moe();
  flags.insert(flags.end(), {"--train-iters", "2", "--micro-batch-size", "1", "--bf16", "--device",
                             "cuda", "--expert-model-parallel-size", "2",
                             "--moe-token-dispatcher-type", "alltoall", "--zero-stage"});
  std::vector<std::string> stage1 = flags, stage3 = flags;
  stage1.push_back("1"), stage3.push_back("3");
  const std::vector<double> one = losses(tiny_options(stage1, 4), 4);
  const std::vector<double> three = losses(tiny_options(stage3, 4), 4);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(three.size(), one.size());
  EXPECT_NE(one.front(), one.back());
  double worst = 0;
  for (size_t i = 0; i < one.size(); ++i)
    worst = std::max(worst, std::abs(three[i] - one[i]) / std::abs(one[i]));
  std::printf("bf16 MoE EP 2 x DP 4, ZeRO stage 3 against stage 1: worst relative %.2e\n", worst);
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace omni
