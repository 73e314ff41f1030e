// The one model on GPU ranks: every parallel layout of parallel/test_model_parallel.cpp run by
// GPTModel<float> through the GPU half of the op seam (backend/gpu/backend.cu), each rank on its
// own (emulated) device, against the one-rank float64 CPU model. This is the GPU's proof that
// the model is one: the same code, its ops dispatched to the kernels, gives the CPU's numbers in
// every layout (tensor + sequence, context ring with packed documents, pipeline 1F1B and
// interleaved, recompute, qk-layernorm, grouped-query attention).
//
// Tolerances, stated before measuring: parameters within float rounding of the float64 ones
// (1e-7 relative); the loss within 1e-5 relative; each gradient tensor within 1e-4 of its
// largest float64 magnitude (float accumulation in different orders: flash attention's
// blocks, the kernels' reductions).
//
// In-process ranks talk through host memory, which is the emulated device's memory; on a
// real GPU the same layouts run as processes over NCCL (scripts/gpu_check.sh), so the device
// build of this file skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "parallel/layout_run.h"

namespace omni {
namespace {

using namespace layout_test;

struct Worst {
  double value = 0, grad = 0;
};

// How close a layout in storage type T stays to the float64 one-rank model.
struct Tolerance {
  double value, grad, loss;
};
// float: rounding in another order. bf16: weights rounded once (up to 2^-8 relative) and
// every activation rounded, so gradients move by several percent of a tensor's largest
// element: the one-rank bf16 Llama measures 9.4e-2 (its qk-layernorm weights), the layouts
// 3e-2 to 1.2e-1 (context parallel merges each key block's output in bf16). A wrong gradient
// is off by its own size.
constexpr Tolerance kFloat{1e-7, 1e-4, 1e-5}, kBf16{4e-3, 0.15, 1e-2};

template <typename T>
double as_double(T v) {
  if constexpr (is_16bit<T>)
    return to_float(v);
  else
    return double(v);
}

template <typename T = float>
void check_gpu_layout_of(const TransformerConfig& cfg, const Layout& layout,
                         const Tolerance& tol = kFloat) {
#if !defined(OMNITRON_GPU_EMULATE)
  GTEST_SKIP() << "in-process ranks share host memory, which only the emulated device is; on "
                  "GPUs the layouts run under mpirun over NCCL (scripts/gpu_check.sh)";
#endif
  const Data data = make_data(cfg, layout.packed);
  GPTModel<double> ref(cfg, kBatch, kSeed);
  // An MoE model with linear biases: every bias non-zero (layout_run.h), on every rank alike.
  const bool biases = cfg.add_bias_linear && cfg.num_moe_experts > 0;
  if (biases) set_linear_biases(ref);
  double ref_loss = 0;
  for (const MicroBatch& mb : data.batches)
    ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches);

  const auto results = run_layout<T>(
      cfg, layout, data,
      [](int rank) {
        gpu::set_device(rank);
        return ops::Exec{&gpu::backend()};
      },
      biases ? set_linear_biases<T> : std::function<void(GPTModel<T>&)>{});
  Worst worst;
  double loss = NAN;
  std::vector<std::string> seen;
  for (const RankResult<T>& r : results) {
    if (r.last_stage) loss = r.loss;
    for (const ParamInfo& p : r.infos) {
      const ParamInfo& full = ref.params().info(p.name);
      const double* ref_values = ref.params().values() + full.offset;
      const double* ref_grads = ref.params().grads() + full.offset;
      double scale = 0, value_err = 0, grad_err = 0;
      for (int64_t i = 0; i < full.numel; ++i) scale = std::max(scale, std::abs(ref_grads[i]));
      ParameterSet<float>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          if (g + i >= full.numel) continue;  // padded vocabulary rows beyond one rank's
          const double v = ref_values[g + i];
          value_err = std::max(value_err, std::abs(as_double(r.values[p.offset + l + i]) - v) /
                                              (std::abs(v) + 1e-30));
          grad_err = std::max(grad_err, std::abs(r.grads[p.offset + l + i] - ref_grads[g + i]));
        }
      });
      grad_err /= std::max(scale, 1e-30);
      EXPECT_LT(value_err, tol.value) << p.name << " on rank " << r.rank;
      EXPECT_LT(grad_err, tol.grad) << p.name << " on rank " << r.rank;
      worst.value = std::max(worst.value, value_err), worst.grad = std::max(worst.grad, grad_err);
      seen.push_back(p.name);
    }
  }
  const double loss_err = std::abs(loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LT(loss_err, tol.loss);
  std::printf("loss %.9f (float64 %.9f, relative %.2e); worst value %.2e, gradient %.2e\n", loss,
              ref_loss, loss_err, worst.value, worst.grad);
  for (const ParamInfo& p : ref.params().infos())
    EXPECT_NE(std::find(seen.begin(), seen.end(), p.name), seen.end()) << p.name;
  // Expert parallelism split the experts: each one is held by its expert-data-parallel group
  // (tp * cp * dp / (etp * ep) ranks), its width split over the etp ranks (fc2's bias whole on
  // each: counted as its 1/etp).
  const int etp = layout.etp > 0 ? layout.etp : layout.tp;
  int64_t experts = 0, held = 0;
  for (const ParamInfo& p : ref.params().infos())
    if (is_expert_parameter(p.name)) experts += p.numel;
  for (const RankResult<T>& r : results)
    for (const ParamInfo& p : r.infos)
      if (is_expert_parameter(p.name)) held += p.etp_replicated ? p.numel / etp : p.numel;
  EXPECT_EQ(held, experts * layout.tp * layout.cp * layout.data_parallel() / (etp * layout.ep));
}

template <typename T = float>
void check_gpu_layout(bool llama, const Layout& layout, const Tolerance& tol = kFloat) {
  check_gpu_layout_of<T>(layout_config(llama, layout), layout, tol);
}

class GpuLayouts : public ::testing::TestWithParam<bool> {};

TEST_P(GpuLayouts, OneRank) {
  check_gpu_layout(GetParam(), {});
}
TEST_P(GpuLayouts, TensorParallel2) {
  check_gpu_layout(GetParam(), {.tp = 2});
}
TEST_P(GpuLayouts, TensorParallel2SequenceParallelPackedDocuments) {
  check_gpu_layout(GetParam(), {.tp = 2, .sp = true, .packed = true});
}
TEST_P(GpuLayouts, ContextParallel2PackedDocuments) {
  check_gpu_layout(GetParam(), {.cp = 2, .packed = true});
}
TEST_P(GpuLayouts, Pipeline2) {
  check_gpu_layout(GetParam(), {.pp = 2});
}
TEST_P(GpuLayouts, Pipeline4Interleaved) {
  check_gpu_layout(GetParam(), {.pp = 4, .layers_per_virtual_stage = 1});
}
TEST_P(GpuLayouts, TensorParallel2Pipeline2SequenceParallel) {
  check_gpu_layout(GetParam(), {.tp = 2, .pp = 2, .sp = true});
}
TEST_P(GpuLayouts, ContextParallel2TensorParallel2) {
  check_gpu_layout(GetParam(), {.tp = 2, .cp = 2});
}
TEST_P(GpuLayouts, FullRecomputePipeline2) {
  check_gpu_layout(GetParam(), {.pp = 2, .recompute = Recompute::Full});
}
TEST_P(GpuLayouts, SelectiveRecompute) {
  check_gpu_layout(GetParam(), {.recompute = Recompute::Selective});
}
// Dropout 0.1: the GPU kernels draw the CPU's masks (backend/dropout_mask.h) in every layout.
TEST_P(GpuLayouts, OneRankWithDropout) {
  check_gpu_layout(GetParam(), {.dropout = true});
}
TEST_P(GpuLayouts, TensorParallel2SequenceParallelWithDropout) {
  check_gpu_layout(GetParam(), {.tp = 2, .sp = true, .dropout = true});
}
TEST_P(GpuLayouts, ContextParallel2PackedDocumentsWithDropout) {
  check_gpu_layout(GetParam(), {.cp = 2, .packed = true, .dropout = true});
}

// DeepSpeed-Ulysses (parallel/ulysses.h): the all-to-alls and row reorders are copies on the
// device, the attention the one-rank kernel over the whole sequence. Llama only (rope,
// grouped-query attention), with packed documents and dropout.
TEST(GpuLayoutsUlysses, Llama2PackedDocumentsWithDropout) {
  check_gpu_layout(true, {.cp = 2, .packed = true, .dropout = true, .ulysses = true});
}

// Multi-latent attention: values narrower than the keys through the padded flash kernels and
// the ring's merge of each key block's output.
TEST(GpuLayoutsMla, ContextParallel2TensorParallel2PackedDocuments) {
  const Layout layout{.tp = 2, .cp = 2, .packed = true};
  check_gpu_layout_of(mla_layout_config(layout), layout);
}

INSTANTIATE_TEST_SUITE_P(Gpt2AndLlama, GpuLayouts, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt2"; });

// Expert parallelism (mixture-of-experts layers, layout_run.h's moe_layout_config): experts split
// over ep data-parallel ranks, each running its share of the micro-batches, tokens dispatched to
// their experts' ranks by all-to-all or all-gather on the device; with tensor parallelism the
// experts are split by width too and the router replicated, with the pipeline the MoE layers
// on both stages. Each rank's experts are its slice of the one-rank model's.
class GpuLayoutsMoE : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuLayoutsMoE, ExpertParallel2) {
  check_gpu_layout_of(moe_layout_config(GetParam()), {.ep = 2});
}
TEST_P(GpuLayoutsMoE, ExpertParallel4) {
  check_gpu_layout_of(moe_layout_config(GetParam()), {.ep = 4});
}
// The balancing losses' gradient reaches the replicated router once over the tensor-parallel
// ranks (moe_layer.cpp adds it on tp rank 0; the ranks' router gradients are then summed):
// added on both, the router weights' gradients measure 0.75 of their size off.
TEST_P(GpuLayoutsMoE, ExpertParallel2TensorParallel2SequenceParallel) {
  check_gpu_layout_of(moe_layout_config(GetParam()), {.tp = 2, .sp = true, .ep = 2});
}
// Expert tensor parallelism 1 under TP 2 + SP (the experts' own grid): each tp rank routes its
// sequence-parallel rows to whole experts over the tp pair (the expert grid's ep group).
TEST_P(GpuLayoutsMoE, ExpertTensor1ExpertParallel2TensorParallel2SequenceParallel) {
  check_gpu_layout_of(moe_layout_config(GetParam()),
                      {.tp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1});
}
TEST_P(GpuLayoutsMoE, ExpertParallel2Pipeline2) {
  check_gpu_layout_of(moe_layout_config(GetParam()), {.pp = 2, .ep = 2});
}

INSTANTIATE_TEST_SUITE_P(Dispatchers, GpuLayoutsMoE, ::testing::Values("alltoall", "allgather"),
                         [](const auto& info) { return std::string(info.param); });

// ETP 2 under TP 4 + SP (one dispatcher): each pair of tp ranks routes its rows to experts
// split over the pair, the balancing losses' counts summed over the four ranks.
TEST(GpuLayoutsMoEExpertTensor, ExpertTensor2ExpertParallel2TensorParallel4SequenceParallel) {
  check_gpu_layout_of(moe_layout_config("allgather"),
                      {.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 2});
}

// seq_aux_loss at ETP 1 under TP 4 + SP: each tp rank routes half a sequence, the counts of
// the sequences' pieces summed over the four ranks in device memory and folded on the host.
TEST(GpuLayoutsMoEExpertTensor, SequenceAuxLossExpertTensor1ExpertParallel2TensorParallel4) {
  TransformerConfig cfg = moe_layout_config("alltoall");
  cfg.moe_router_load_balancing_type = MoELoadBalancing::SeqAuxLoss;
  check_gpu_layout_of(cfg, {.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 1});
}

// Without a shared expert, ETP 1 and 2 under TP 4 + SP: the layer takes its block's rows only,
// gathered and summed over the block in device memory (ETP 1: its own rows, nothing moved).
TEST(GpuLayoutsMoEExpertTensor, ExpertTensor1And2TensorParallel4WithoutSharedExpert) {
  TransformerConfig cfg = moe_layout_config("alltoall");
  cfg.moe_shared_expert_intermediate_size = 0;
  cfg.validate();
  check_gpu_layout_of(cfg, {.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 1});
  cfg.moe_token_dispatcher_type = "allgather";
  check_gpu_layout_of(cfg, {.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 2});
}

// The experts' linear biases (no shared expert) in device memory: fc2's added by each
// expert's first slice only, at ETP = TP 2 + SP x EP 2 and ETP 2 over DP 2 (TP 1: the exchange
// over etp); ETP < TP: parallel/test_moe_layouts.cpp.
TEST(GpuLayoutsMoEExpertTensor, ExpertBiasesUnderTensorAndExpertTensorParallelism) {
  TransformerConfig cfg = moe_layout_config("alltoall");
  cfg.moe_shared_expert_intermediate_size = 0;
  cfg.add_bias_linear = true;
  cfg.validate();
  check_gpu_layout_of(cfg, {.tp = 2, .sp = true, .ep = 2});
  check_gpu_layout_of(cfg, {.ep = 1, .dp = 2, .etp = 2});
}

// Expert tensor parallelism wider than TP (the group spanning data-parallel replicas): TP 1,
// ETP 2 x EP 2 over DP 4 with alltoall (each rank's rows after the exchange over ep gathered
// over its ETP pair by the group's sends and receives in device memory, the slices' outputs
// summed back there); TP 2 + SP, ETP 4 over DP 2 without a shared expert with allgather (the
// tokens over the expert tp x ep group).
TEST(GpuLayoutsMoEExpertTensor, ExpertTensor2ExpertParallel2OverDataParallel4) {
  check_gpu_layout_of(moe_layout_config("alltoall"), {.ep = 2, .dp = 4, .etp = 2});
}
TEST(GpuLayoutsMoEExpertTensor, ExpertTensor4TensorParallel2WithoutSharedExpert) {
  TransformerConfig cfg = moe_layout_config("allgather");
  cfg.moe_shared_expert_intermediate_size = 0;
  cfg.validate();
  check_gpu_layout_of(cfg, {.tp = 2, .sp = true, .ep = 1, .dp = 2, .etp = 4});
}

// bf16 weights and activations with fp32 gradients (--bf16 on a GPU): the tensor-parallel
// all-reduces and reduce-scatters sum bf16 activations, as NCCL does.
class GpuLayoutsBf16 : public ::testing::TestWithParam<bool> {};

TEST_P(GpuLayoutsBf16, OneRank) {
  check_gpu_layout<bf16>(GetParam(), {}, kBf16);
}
TEST_P(GpuLayoutsBf16, TensorParallel2SequenceParallelPackedDocuments) {
  check_gpu_layout<bf16>(GetParam(), {.tp = 2, .sp = true, .packed = true}, kBf16);
}
TEST_P(GpuLayoutsBf16, ContextParallel2PackedDocuments) {
  check_gpu_layout<bf16>(GetParam(), {.cp = 2, .packed = true}, kBf16);
}
TEST_P(GpuLayoutsBf16, Pipeline4InterleavedFullRecompute) {
  check_gpu_layout<bf16>(
      GetParam(), {.pp = 4, .layers_per_virtual_stage = 1, .recompute = Recompute::Full}, kBf16);
}

INSTANTIATE_TEST_SUITE_P(Gpt2AndLlama, GpuLayoutsBf16, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt2"; });

}  // namespace
}  // namespace omni
