// One step of the model under a parallel layout on in-process ranks, shared by the CPU layout
// tests (parallel/test_model_parallel.cpp, test_moe_layouts.cpp, float64) and the GPU ones
// (gpu/test_gpu_layouts.cpp, the one model on emulated GPU ranks): a tiny GPT-2, Llama-style or
// mixture-of-experts model, four micro-batches through the pipeline schedule, split over the
// data-parallel ranks, and each rank's parameters and gradients copied to the host, with the
// partial gradients the layout leaves (tensor-parallel norms, context- and data-parallel parts,
// experts' parts over their expert-data-parallel group, tied embeddings across stages) summed.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/local_communicator.h"
#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "model/moe_layer.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/schedules.h"

namespace omni::layout_test {

inline TransformerConfig tiny(bool llama) {
  TransformerConfig c;
  c.num_layers = 8;
  c.hidden_size = llama ? 32 : 16;
  c.num_attention_heads = llama ? 8 : 4;
  c.ffn_hidden_size = llama ? 24 : 0;
  c.seq_length = 8;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 4;
  c.init_method_std = 0.2;
  if (llama) {
    c.group_query_attention = true;
    c.num_query_groups = 4;
    c.normalization = Normalization::RMSNorm;
    c.swiglu = true;
    c.position_embedding_type = PositionEmbedding::Rope;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
    c.qk_layernorm = true;
  }
  c.validate();
  return c;
}

struct Layout {
  int tp = 1, cp = 1, pp = 1, layers_per_virtual_stage = 0;
  bool sp = false;
  bool packed = false;  // two documents per sample (reset positions and attention)
  Recompute::Granularity recompute = Recompute::None;  // of every layer
  bool dropout = false;  // hidden and attention dropout 0.1 (Megatron's defaults)
  bool ulysses = false;  // context parallel by all-to-all (Ulysses) instead of the ring
  // Expert parallelism: MoE layers' experts split over `ep` of the `dp` data-parallel ranks
  // (dp 0: ep), each data-parallel rank running its share of the micro-batches.
  int ep = 1, dp = 0;
  // The experts' own tensor-parallel size (0: tp); 1 under tp > 1: each tp rank routes its
  // sequence-parallel rows to whole experts over the expert grid's ep group (then dp must be
  // given: the expert grid etp x ep x edp spans the tp x dp ranks); a multiple of tp: each
  // rank's routed rows gathered over etp ranks of several data-parallel replicas.
  int etp = 0;
  int data_parallel() const { return dp > 0 ? dp : ep; }
};

// The model of a layout test: with Layout::dropout, Megatron's dropout 0.1 on.
inline TransformerConfig layout_config(bool llama, const Layout& layout) {
  TransformerConfig c = tiny(llama);
  if (layout.dropout) c.hidden_dropout = c.attention_dropout = 0.1;
  return c;
}

// Multi-latent attention (model/mla.h) on four layers of the Llama-style model: value heads (6)
// narrower than the query and key heads (4 + 4 rope), and YaRN's softmax scale.
inline TransformerConfig mla_layout_config(const Layout& layout) {
  TransformerConfig c = layout_config(true, layout);
  c.num_layers = 4;
  c.multi_latent_attention = true;
  c.q_lora_rank = 8, c.kv_lora_rank = 8, c.qk_head_dim = 4, c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.rotary_scaling_factor = 4, c.mscale = c.mscale_all_dim = 0.7;
  c.validate();
  return c;
}

// Four Llama layers, the last three mixture-of-experts layers of four experts (two per token)
// with sigmoid routing, the expert bias, a shared expert and both balancing losses, its tokens
// dispatched by `dispatcher` ("alltoall" or "allgather").
inline TransformerConfig moe_layout_config(const std::string& dispatcher) {
  TransformerConfig c = tiny(true);
  c.num_layers = 4;
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 12;
  c.moe_router_topk = 2;
  c.moe_layer_freq = "[0,1,1,1]";
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_aux_loss_coeff = 0.05;
  c.moe_z_loss_coeff = 0.01;
  c.moe_shared_expert_intermediate_size = 8;
  c.moe_token_dispatcher_type = dispatcher;
  c.validate();
  return c;
}

constexpr int kBatch = 2, kMicroBatches = 4;
constexpr uint64_t kSeed = 7;

struct Data {
  std::vector<std::vector<int32_t>> tokens, labels, positions, key_start;
  std::vector<std::vector<float>> masks;
  std::vector<MicroBatch> batches;
};

inline Data make_data(const TransformerConfig& c, bool packed) {
  Data d;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> id(0, c.vocab_size - 1);
  const int n = kBatch * c.seq_length;
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<int32_t> t(n), l(n);
    std::vector<float> mask(n, 1.0f);
    for (int i = 0; i < n; ++i) t[i] = id(rng), l[i] = id(rng);
    mask[3] = mask[n - 1] = 0.0f;
    d.tokens.push_back(t), d.labels.push_back(l), d.masks.push_back(mask);
  }
  // Packed: the second document of each sample starts at position 3.
  const int S = c.seq_length, doc = 3;
  std::vector<int32_t> pos(n), start(n);
  for (int i = 0; i < n; ++i) {
    pos[i] = i % S < doc ? i % S : i % S - doc;
    start[i] = i % S < doc ? 0 : doc;
  }
  d.positions.assign(kMicroBatches, pos), d.key_start.assign(kMicroBatches, start);
  for (int m = 0; m < kMicroBatches; ++m) {
    d.batches.push_back(MicroBatch{d.tokens[m].data(), d.labels[m].data(), d.masks[m].data(),
                                   kBatch, c.seq_length, packed ? d.positions[m].data() : nullptr,
                                   packed ? d.key_start[m].data() : nullptr});
    d.batches.back().first_sample = m * kBatch, d.batches.back().iteration = 5;  // dropout's key
  }
  return d;
}

// What one rank holds after the step, in host memory.
template <typename T>
struct RankResult {
  int rank = 0;
  bool last_stage = false;
  double loss = 0;
  std::vector<ParamInfo> infos;
  std::vector<T> values;
  std::vector<accum_t<T>> grads;
};

// Every linear bias's elements set from their index in the one-rank tensor (0.1 sin(0.7 i + 1)),
// on the model's device: Megatron's zero biases would not show a bias added twice or on no rank.
template <typename T>
void set_linear_biases(GPTModel<T>& model) {
  for (const ParamInfo& p : model.params().infos()) {
    if (!p.name.ends_with("bias") || p.name.find("expert_bias") != std::string::npos) continue;
    std::vector<T> v(size_t(p.numel));
    ParameterSet<T>::for_each_run(p, [&](int64_t local, int64_t global, int64_t run) {
      for (int64_t i = 0; i < run; ++i)
        v[local + i] = T(0.1 * std::sin(0.7 * double(global + i) + 1));
    });
    ops::upload(model.exec(), model.params().values() + p.offset, v.data(), v.size());
  }
}

// Runs the step on tp * cp * pp * dp ranks; `exec(rank)` is the device rank `rank` runs on (it
// is called on that rank's thread). Every micro-batch's gradient is scaled by 1/kMicroBatches
// (of the global batch), so the data-parallel sum (Megatron's average of each rank's mean) is
// the one-rank gradient: dense parameters' summed over data and context parallelism, experts'
// over their expert-data-parallel group (the ranks holding the same experts), and the loss
// summed over the data-parallel ranks. Returns every rank's result, in rank order.
// `prepare` (when given) changes each rank's model before the step (its values, on the host).
template <typename T>
std::vector<RankResult<T>> run_layout(const TransformerConfig& cfg, const Layout& layout,
                                      const Data& data,
                                      const std::function<ops::Exec(int rank)>& exec,
                                      const std::function<void(GPTModel<T>&)>& prepare = {}) {
  const int dp = layout.data_parallel(), world = layout.tp * layout.cp * layout.pp * dp;
  OMNI_REQUIRE(kMicroBatches % dp == 0, "layout test: data-parallel size ", dp,
               " does not divide the ", kMicroBatches, " micro-batches");
  const int per_rank = kMicroBatches / dp;
  std::vector<RankResult<T>> results(world);
  run_ranks(world, [&](Communicator& w) {
    const ops::Exec x = exec(w.rank());
    ProcessGrid grid(
        w,
        ParallelLayout{
            .tp = layout.tp, .cp = layout.cp, .ep = layout.ep, .pp = layout.pp, .etp = layout.etp});
    PipelineSplit split;
    split.num_layers = cfg.num_layers;
    split.pipeline_model_parallel_size = layout.pp;
    split.num_layers_per_virtual_pipeline_stage = layout.layers_per_virtual_stage;
    ModelParallel mp;
    mp.tp = &grid.tp(), mp.cp = &grid.cp(), mp.sequence_parallel = layout.sp;
    mp.ulysses = layout.ulysses;
    if (layout.ep > 1) mp.ep = &grid.ep();
    if (grid.own_expert_tp()) mp.expert_tp = &grid.expert_tp(), mp.tp_cp = &grid.tp_cp();
    mp.expert_tp_ep = grid.expert_tp_ep();
    for (const LayerRange& r : pipeline_rank_layers(split, grid.pp_rank()))
      mp.chunks.push_back({r.begin, r.end});
    mp.pre_process = grid.is_first_stage(), mp.post_process = grid.is_last_stage();
    GPTModel<T> model(cfg, kBatch, kSeed, mp, x);
    model.set_recompute(Recompute{layout.recompute, 0});
    if (prepare) prepare(model);

    // This data-parallel rank's micro-batches, each this context-parallel rank's part.
    const int first = grid.dp_rank() * per_rank;
    std::vector<ContextParallelBatch> local(per_rank);
    for (int m = 0; m < per_rank; ++m)
      local[m].slice(data.batches[first + m], layout.cp, grid.cp_rank());
    PipelineExecutor<T> pipe(model, grid.pp());
    auto batch = [&](int m) -> const MicroBatch& {
      return layout.cp > 1 ? local[m].batch() : data.batches[first + m];
    };
    double l = pipe.run(per_rank, batch, true, 1.0 / kMicroBatches);
    grid.dp().all_reduce(&l, 1);
    ParameterSet<T>& ps = model.params();
    for (const ParamInfo& p : ps.infos())
      if (p.tp_partial_grad) grid.tp().all_reduce(ps.grads() + p.offset, p.numel);
    // Context- and data-parallel ranks each hold part of every gradient: their sum is the
    // gradient; experts' parts are on the ranks holding the same experts.
    const auto& infos = ps.infos();
    if (std::none_of(infos.begin(), infos.end(),
                     [](const ParamInfo& p) { return is_expert_parameter(p.name); }))
      grid.dp_cp().all_reduce(ps.grads(), ps.size());
    else
      for (const ParamInfo& p : infos)
        (is_expert_parameter(p.name) ? grid.expert_dp() : grid.dp_cp())
            .all_reduce(ps.grads() + p.offset, p.numel);
    if (layout.pp > 1 && ps.has("embedding.word_embeddings.weight") &&
        !cfg.untie_embeddings_and_output_weights) {
      const ParamInfo& e = ps.info("embedding.word_embeddings.weight");
      grid.embedding().all_reduce(ps.grads() + e.offset, e.numel);
    }
    RankResult<T>& r = results[w.rank()];
    r.rank = w.rank(), r.last_stage = grid.is_last_stage(), r.loss = l, r.infos = ps.infos();
    r.values.resize(ps.size()), r.grads.resize(ps.size());
    ops::download(x, r.values.data(), ps.values(), r.values.size());
    ops::download(x, r.grads.data(), ps.grads(), r.grads.size());
  });
  return results;
}

}  // namespace omni::layout_test
