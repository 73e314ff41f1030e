// Pipeline, context- and tensor-parallel layouts of a mixture-of-experts model against the
// one-rank model, in float64 on in-process ranks (parallel/layout_run.h): MoE layers on
// several stages, micro-batches in flight through 1F1B and the interleaved schedule (each
// keeps its own routing for its backward), with and without full recompute; sequences split
// over cp ranks; experts split by width over tp ranks, or over their own expert
// tensor-parallel ranks (ETP 1 or 2 under TP 2 or 4; ETP 2 or 4 above TP 1 or 2, over ranks
// of several data-parallel replicas); the experts' linear biases (set non-zero) under all of
// these splits. The parameters must be the one-rank model's
// values, and the gradients (the aux and z losses' included) and the loss equal to rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "parallel/layout_run.h"

namespace omni {
namespace {

using namespace layout_test;

// layout_run.h's MoE model on eight layers, every other one an MoE layer from layer 1, with the
// default dispatcher.
TransformerConfig tiny_moe() {
  TransformerConfig c = moe_layout_config(TransformerConfig{}.moe_token_dispatcher_type);
  c.num_layers = 8;
  c.moe_layer_freq = "[0,1,0,1,0,1,1,1]";
  c.validate();
  return c;
}

void check_moe_layout(const Layout& layout, const TransformerConfig& cfg = tiny_moe()) {
  const Data data = make_data(cfg, false);
  GPTModel<double> ref(cfg, kBatch, kSeed);
  if (cfg.add_bias_linear) set_linear_biases(ref);
  double ref_loss = 0;
  for (const MicroBatch& mb : data.batches)
    ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches);
  const std::vector<RankResult<double>> ranks = run_layout<double>(
      cfg, layout, data, [](int) { return ops::Exec{}; },
      cfg.add_bias_linear ? set_linear_biases<double> : std::function<void(GPTModel<double>&)>{});
  double loss = NAN, worst_grad = 0;
  size_t seen = 0;  // elements compared
  std::map<std::string, std::vector<bool>> held_by;
  for (const RankResult<double>& r : ranks) {
    if (r.last_stage) loss = r.loss;
    for (const ParamInfo& p : r.infos) {
      const ParamInfo& full = ref.params().info(p.name);
      // The vocabulary's padding rows differ between layouts: compared up to the real rows.
      const int64_t real =
          p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight"
              ? int64_t(cfg.vocab_size) * cfg.hidden_size
              : full.numel;
      // This rank's slices (tensor parallelism) of the one-rank tensor.
      ParameterSet<double>::for_each_run(p, [&](int64_t local, int64_t global, int64_t run) {
        const int64_t n = std::clamp<int64_t>(real - global, 0, run);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(r.values[p.offset + local + i], ref.params().values()[full.offset + global + i])
              << p.name;
          const double g = ref.params().grads()[full.offset + global + i];
          worst_grad = std::max(worst_grad,
                                std::abs(r.grads[p.offset + local + i] - g) / (std::abs(g) + 1e-3));
        }
        seen += size_t(n);
        std::vector<bool>& h = held_by[p.name];
        h.resize(size_t(full.numel));
        std::fill_n(h.begin() + global, n, true);
      });
    }
  }
  EXPECT_GT(seen, 0u);
  for (const ParamInfo& p : ref.params().infos())
    EXPECT_EQ(size_t(std::count(held_by[p.name].begin(), held_by[p.name].end(), true)),
              size_t(std::min<int64_t>(p.numel, p.name.find("embedding") != std::string::npos ||
                                                        p.name == "output_layer.weight"
                                                    ? int64_t(cfg.vocab_size) * cfg.hidden_size
                                                    : p.numel)))
        << p.name << ": not every element held";
  EXPECT_NEAR(loss, ref_loss, 1e-12 * std::abs(ref_loss));
  EXPECT_LT(worst_grad, 1e-9);
}

TEST(MoELayouts, Pipeline2) {
  check_moe_layout({.pp = 2});
}
TEST(MoELayouts, Pipeline4Interleaved) {
  check_moe_layout({.pp = 4, .layers_per_virtual_stage = 1});
}
TEST(MoELayouts, Pipeline2FullRecompute) {
  check_moe_layout({.pp = 2, .recompute = Recompute::Full});
}

// Context parallelism: each rank routes its chunks of every sequence; the balancing losses'
// token counts are the whole sequences' (summed over the cp ranks), per sequence for
// seq_aux_loss, and the z-loss is each rank's part of the mean.
TEST(MoELayouts, Context2) {
  check_moe_layout({.cp = 2});
}
TEST(MoELayouts, Context2SequenceAuxLoss) {
  TransformerConfig cfg = tiny_moe();
  cfg.moe_router_load_balancing_type = MoELoadBalancing::SeqAuxLoss;
  cfg.moe_router_score_function = MoEScoreFunction::Softmax;
  cfg.moe_router_enable_expert_bias = false;
  check_moe_layout({.cp = 2}, cfg);
}

// Tensor parallelism (expert tensor parallelism of the same size): the router replicated,
// each expert's and the shared expert's width split, with and without sequence parallelism;
// the gated shared expert's gate and the router get each rank's part of their gradients.
TEST(MoELayouts, Tensor2SequenceParallel) {
  TransformerConfig cfg = tiny_moe();
  cfg.moe_shared_expert_gate = true;
  check_moe_layout({.tp = 2, .sp = true}, cfg);
}
TEST(MoELayouts, Tensor2Context2) {
  check_moe_layout({.tp = 2, .cp = 2});
}

// Expert parallelism with tensor parallelism on four ranks: two data-parallel ranks, each
// running two of the four micro-batches, split the experts; each expert's width split over the
// tp pair (layout_run.h reduces experts' gradients over their expert-data-parallel group).
TEST(MoELayouts, Expert2Tensor2SequenceParallel) {
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    TransformerConfig cfg = tiny_moe();
    cfg.moe_token_dispatcher_type = dispatcher;
    check_moe_layout({.tp = 2, .sp = true, .ep = 2}, cfg);
  }
}

// Expert tensor parallelism of its own under TP + SP, with both dispatchers and the gated
// shared expert at EP 2, then at EP 1 (the experts' data-parallel group spanning the block
// rows' ranks).
void check_expert_tensor_layout(Layout layout) {
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    TransformerConfig cfg = tiny_moe();
    cfg.moe_token_dispatcher_type = dispatcher;
    cfg.moe_shared_expert_gate = true;
    check_moe_layout(layout, cfg);
  }
  layout.ep = 1;
  check_moe_layout(layout);
}

// ETP 1 under TP 2 + SP (Megatron's most used MoE layout): each tp rank routes its own
// sequence-parallel rows to whole experts. On 2 ranks with EP 2 the expert-parallel group is
// the tp pair; with EP 1 the tp pair holds the same whole experts and sums their gradients as
// their expert-data-parallel group; on 4 ranks EP 2 x DP 2 (expert-data-parallel groups
// across the data-parallel ranks).
TEST(MoELayouts, ExpertTensor1UnderTensor2SequenceParallel) {
  check_expert_tensor_layout({.tp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1});
}
TEST(MoELayouts, ExpertTensor1Expert2Data2UnderTensor2SequenceParallel) {
  check_moe_layout({.tp = 2, .sp = true, .ep = 2, .dp = 2, .etp = 1});
}
// ETP 2 under TP 4 + SP: each pair of tp ranks routes its rows to experts split over the pair
// (EP 2: the expert-parallel groups [0,2] [1,3]; EP 1: every rank's experts its pair's half).
TEST(MoELayouts, ExpertTensor2UnderTensor4SequenceParallel) {
  check_expert_tensor_layout({.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 2});
}
// With the pipeline (MoE layers on both stages) and with context parallelism (the balancing
// losses' counts summed over the tp x cp ranks).
TEST(MoELayouts, ExpertTensor1UnderTensor2SequenceParallelPipeline2) {
  check_moe_layout({.tp = 2, .pp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1});
}
TEST(MoELayouts, ExpertTensor1UnderTensor2SequenceParallelContext2) {
  check_moe_layout({.tp = 2, .cp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1});
}

// seq_aux_loss under ETP < TP: a block's rows are a run of the micro-batch's batch-major rows
// (2 sequences of 8): whole sequences at ETP 1 under TP 2 and ETP 2 under TP 4, half
// sequences at ETP 1 under TP 4 (each sequence's counts summed over the two blocks that hold
// it), a sequence's chunks at ETP 1 under TP 2 x CP 2 (summed with the other cp rank's).
TransformerConfig sequence_aux_loss() {
  TransformerConfig cfg = tiny_moe();
  cfg.moe_router_load_balancing_type = MoELoadBalancing::SeqAuxLoss;
  return cfg;
}
TEST(MoELayouts, ExpertTensor1UnderTensor2SequenceParallelSequenceAuxLoss) {
  check_moe_layout({.tp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1}, sequence_aux_loss());
}
TEST(MoELayouts, ExpertTensor1UnderTensor4SequenceParallelSequenceAuxLoss) {
  TransformerConfig cfg = sequence_aux_loss();
  cfg.moe_router_score_function = MoEScoreFunction::Softmax;
  cfg.moe_router_enable_expert_bias = false;
  check_moe_layout({.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 1}, cfg);
}
TEST(MoELayouts, ExpertTensor2UnderTensor4SequenceParallelSequenceAuxLoss) {
  check_moe_layout({.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 2}, sequence_aux_loss());
}
TEST(MoELayouts, ExpertTensor1UnderTensor2SequenceParallelContext2SequenceAuxLoss) {
  check_moe_layout({.tp = 2, .cp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1},
                   sequence_aux_loss());
}

// Without a shared expert under ETP < TP the layer takes its block's rows only, gathered and
// summed over the block (ETP 1: the rank's own rows; test_moe_tp_bytes.cpp counts the bytes):
// ETP 1 and 2 under TP 4 with both dispatchers, then with dropout (the MLP output's mask applied
// to a copy of the rows' gradient, which the layer reads while writing its own), full
// recompute and seq_aux_loss over half sequences.
TransformerConfig without_shared_expert(TransformerConfig cfg = tiny_moe()) {
  cfg.moe_shared_expert_intermediate_size = 0;
  cfg.validate();
  return cfg;
}
TEST(MoELayouts, ExpertTensor1And2UnderTensor4SequenceParallelWithoutSharedExpert) {
  for (const int etp : {1, 2})
    for (const char* dispatcher : {"alltoall", "allgather"}) {
      SCOPED_TRACE(std::string(dispatcher) + " etp " + std::to_string(etp));
      TransformerConfig cfg = tiny_moe();
      cfg.moe_token_dispatcher_type = dispatcher;
      check_moe_layout({.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = etp},
                       without_shared_expert(cfg));
    }
}
TEST(MoELayouts, ExpertTensor1UnderTensor2SequenceParallelWithoutSharedExpertDropoutRecompute) {
  TransformerConfig cfg = tiny_moe();
  cfg.hidden_dropout = cfg.attention_dropout = 0.1;
  check_moe_layout({.tp = 2, .sp = true, .ep = 1, .dp = 1, .etp = 1}, without_shared_expert(cfg));
  check_moe_layout({.tp = 2, .sp = true, .recompute = Recompute::Full, .ep = 2, .dp = 1, .etp = 1},
                   without_shared_expert());
}
TEST(MoELayouts, ExpertTensor1UnderTensor4SequenceParallelWithoutSharedExpertSequenceAuxLoss) {
  check_moe_layout({.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 1},
                   without_shared_expert(sequence_aux_loss()));
}

// Expert tensor parallelism wider than TP (ETP a multiple of TP): the expert tensor-parallel
// group spans data-parallel replicas with other micro-batches; each rank routes its own rows,
// which are gathered over the group (alltoall: after the exchange over ep; allgather: the
// tokens over the expert tp x ep group), each rank runs its 1/ETP of every expert's width on
// all of them and the partial outputs are summed back to their ranks; the experts'
// gradients are then whole over the group (expert data parallelism of world / (ETP EP)).
// With and without the shared expert (whose width stays split over tp), both dispatchers.
void check_wide_expert_tensor_layout(const Layout& layout) {
  for (const bool shared : {true, false})
    for (const char* dispatcher : {"alltoall", "allgather"}) {
      SCOPED_TRACE(std::string(dispatcher) + (shared ? " shared expert" : ""));
      TransformerConfig cfg = tiny_moe();
      cfg.moe_token_dispatcher_type = dispatcher;
      cfg.moe_shared_expert_gate = shared;
      check_moe_layout(layout, shared ? cfg : without_shared_expert(cfg));
    }
}
// TP 1, ETP 2 on 2 ranks (DP 2): the two data-parallel ranks split every expert's width.
TEST(MoELayouts, ExpertTensor2OverData2) {
  check_wide_expert_tensor_layout({.ep = 1, .dp = 2, .etp = 2});
}
// TP 1, ETP 2, EP 2 on 4 ranks: expert-parallel groups [0,2] [1,3], ETP groups [0,1] [2,3].
TEST(MoELayouts, ExpertTensor2Expert2OverData4) {
  check_wide_expert_tensor_layout({.ep = 2, .dp = 4, .etp = 2});
}
// ETP 2 over the context-parallel pair (each rank's chunks of the sequences; the balancing
// losses' counts summed over cp) and over DP 2 on two pipeline stages (alltoall).
TEST(MoELayouts, ExpertTensor2OverContext2AndOverData2Pipeline2) {
  check_moe_layout({.cp = 2, .ep = 1, .dp = 1, .etp = 2});
  check_moe_layout({.pp = 2, .ep = 1, .dp = 2, .etp = 2});
}
// TP 2 + SP, ETP 4 on 4 ranks (DP 2): each tp rank routes its sequence-parallel rows, the
// group of four gathers them; then seq_aux_loss over each rank's rows (whole sequences).
TEST(MoELayouts, ExpertTensor4UnderTensor2SequenceParallel) {
  check_wide_expert_tensor_layout({.tp = 2, .sp = true, .ep = 1, .dp = 2, .etp = 4});
  check_moe_layout({.tp = 2, .sp = true, .ep = 1, .dp = 2, .etp = 4},
                   without_shared_expert(sequence_aux_loss()));
}

// The experts' linear biases (GPT-2's default, without a shared expert, which Megatron builds
// without biases) on layout_run.h's four layers: fc1's split with its rows (SwiGLU: gate and up
// halves), fc2's whole on every slice's rank and added by the first: ETP = TP 2 without and
// with SP (EP 2, both dispatchers), ETP 1 and 2 under TP 2 and 4 (SP, EP 2), ETP 2 over DP 2
// and DP 4 (EP 2; the exchange and the gather over etp) and ETP 4 over TP 2 + SP.
TransformerConfig with_biases() {
  TransformerConfig cfg = moe_layout_config(TransformerConfig{}.moe_token_dispatcher_type);
  cfg.moe_shared_expert_intermediate_size = 0;
  cfg.add_bias_linear = true;
  cfg.validate();
  return cfg;
}
TEST(MoELayouts, ExpertBiasesUnderTensorParallelism) {
  check_moe_layout({.tp = 2}, with_biases());
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    TransformerConfig cfg = with_biases();
    cfg.moe_token_dispatcher_type = dispatcher;
    check_moe_layout({.tp = 2, .sp = true, .ep = 2}, cfg);
  }
}
TEST(MoELayouts, ExpertBiasesUnderExpertTensorBelowTensor) {
  check_moe_layout({.tp = 2, .sp = true, .ep = 2, .dp = 1, .etp = 1}, with_biases());
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    TransformerConfig cfg = with_biases();
    cfg.moe_token_dispatcher_type = dispatcher;
    check_moe_layout({.tp = 4, .sp = true, .ep = 2, .dp = 1, .etp = 2}, cfg);
  }
}
TEST(MoELayouts, ExpertBiasesUnderExpertTensorAboveTensor) {
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    TransformerConfig cfg = with_biases();
    cfg.moe_token_dispatcher_type = dispatcher;
    check_moe_layout({.ep = 1, .dp = 2, .etp = 2}, cfg);
    check_moe_layout({.ep = 2, .dp = 4, .etp = 2}, cfg);
  }
  check_moe_layout({.tp = 2, .sp = true, .ep = 1, .dp = 2, .etp = 4}, with_biases());
}

}  // namespace
}  // namespace omni
