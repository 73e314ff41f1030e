// GPTModel's mixture-of-experts layers (model/gpt_model.h): a layer's MLP replaced by
// MoELayer (model/moe_layer.h) where --moe-layer-freq says so, with Megatron-Core's parameter
// names under "decoder.layers.<i>.mlp.", the aux and z losses' gradients entering the backward
// with Megatron's scale, what the training forwards reported for logging, and the
// aux-loss-free expert bias.
//
// The MoE layers share one set of backward temporaries (MoELayer::Scratch), grown to the
// largest layer's need, so that steps allocate none.
//
// The expert bias (Megatron's router.expert_bias buffer) is kept in the flat ParameterSet as
// "mlp.router.expert_bias" so that checkpoints save and reshard it with the weights; it gets
// no gradient and no weight decay, so optimizers leave it as it is, and only
// update_expert_bias changes it, once per global batch.
//
// Context parallelism: the layer sums its balancing losses' token counts over the cp group
// (MoELayer; in device memory on a GPU); the trainer sums what the layers report (the kept
// rows per expert for logging and for the expert bias, counted on the host from the host
// plan on every device) over dp x cp (train/moe_step.cpp), so every rank updates the bias
// from the global batch's counts.
// Tensor parallelism (expert tensor parallelism of the same size): every tp rank routes the
// gathered tokens with the replicated router and holds its slice of each expert's width;
// layer_forward sums the ranks' outputs as the dense fc2's (reduce-scatter under sequence
// parallelism), layer_backward their input gradients. With linear biases an expert's fc1 bias
// is split with its rows and its fc2 bias is whole on every rank, added by the first
// (MoELayer), under every expert tensor-parallel size below. Float or double on the CPU,
// float, bf16 or f16 on a GPU (MoELayer's ops run where the model's Exec says; a 16-bit
// model's router runs in float32).
//
// Expert tensor parallelism of another size than tp (--expert-tensor-parallel-size ETP
// dividing TP, the experts' own grid: comm/process_grid.h; sequence parallel): each block of
// ETP consecutive tp ranks routes its sequence-parallel rows only (MoELayer), the experts'
// widths are split over the block (whole with ETP 1) on every rank of an expert-parallel
// group of the expert grid, and the figures the layer reports (its block's part of the
// balancing losses, its rows' counts) are summed over tp here, over ETP, so that every tp
// rank reports what ETP = TP would. Without a shared expert the layer's rows are gathered
// and its output summed over the block only (moe_tp_; ETP 1: nothing moves), with one over
// tp, as the shared expert needs.
//
// Expert tensor parallelism wider than tp (ETP a multiple of TP; sequence parallel under
// TP > 1): the expert tensor-parallel group spans whole tp groups of other data-parallel (or
// cp) ranks, each rank routes its own rows (its sequence-parallel ones) and holds 1/ETP of each
// expert's width, and the layer gathers the routed rows over that group and sums the slices'
// outputs back (MoELayer), so its routed rows come back whole: without a shared expert the
// layer takes this rank's rows alone (moe_tp_ of one rank: nothing gathered over tp); with
// one, the micro-batch's rows as under ETP < TP. The reported figures are summed over tp as
// there (each tp rank's own rows: divided by 1).
//
// A 16-bit model keeps the expert bias in its storage type, as the CPU's --bf16/--fp16 runs
// round theirs after each step: the update widens it, adds in float and rounds it back.
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "model/gpt_model.h"
#include "model/moe_layer.h"

namespace omni {

namespace {

// An MoE layer's tensors by name through get (a value or gradient lookup).
template <typename P, typename Get>
MoEParams<P> moe_tensors(const std::string& mlp, Get get) {
  MoEParams<P> m;
  m.router_weight = get(mlp + "router.weight");
  m.router_bias = get(mlp + "router.bias");
  m.fc1_weight = get(mlp + "experts.linear_fc1.weight");
  m.fc1_bias = get(mlp + "experts.linear_fc1.bias");
  m.fc2_weight = get(mlp + "experts.linear_fc2.weight");
  m.fc2_bias = get(mlp + "experts.linear_fc2.bias");
  m.shared_fc1_weight = get(mlp + "shared_experts.linear_fc1.weight");
  m.shared_fc2_weight = get(mlp + "shared_experts.linear_fc2.weight");
  m.shared_gate_weight = get(mlp + "shared_experts.gate_weight");
  return m;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether the experts have their own tensor-parallel group (ETP 1 under TP > 1).
bool own_expert_rows(const ModelParallel& mp, int tp) {
  return mp.expert_tp && mp.expert_tp->size() != tp;
}

}  // namespace

template <typename T>
struct GPTModel<T>::MoEState {
  MoEState(const TransformerConfig& c, Communicator* ep, Communicator* cp, Communicator* tp,
           const ops::Exec& x, Communicator* expert_tp, Communicator* expert_tp_ep)
      : layer(c, ep, cp, tp, x, expert_tp, expert_tp_ep) {}
  MoELayer<T> layer;
  double aux_grad_scale = 0;  // of the last training forward's micro-batch
};

template <typename T>
void GPTModel<T>::add_moe_parameters(std::vector<ParamInfo>& p, const std::string& mlp) const {
  // Megatron's inits: output projections (fc2) scaled by 1/sqrt(2 layers), biases zero.
  // Under expert parallelism the experts' tensors hold this rank's experts, a split of the
  // first dimension; under tensor parallelism (expert tensor parallelism of the same size,
  // Megatron's default) each expert's and the shared expert's fc1 are split by output rows
  // (SwiGLU: this rank's gate rows, then its up rows) and fc2 by input columns, as the dense
  // MLP's, while the router is replicated (initialised, saved and resharded as the one-rank
  // tensor's slices).
  const int ranks = parallel_.ep ? parallel_.ep->size() : 1, tp = tp_.size(), r = tp_.rank();
  // The experts' own tensor-parallel group (ETP < TP): their widths split over its etp ranks
  // (ETP 1: whole experts on every tp rank, split over ep only).
  const bool own = own_expert_rows(parallel_, tp);
  const int etp = own ? parallel_.expert_tp->size() : tp;
  const int etp_rank = own ? parallel_.expert_tp->rank() : r;
  OMNI_REQUIRE(!own || expert_tensor_parallel_built(tp, etp), "--expert-tensor-parallel-size ", etp,
               " with --tensor-model-parallel-size ", tp,
               ": not built yet: experts split over a number of ranks that neither divides nor "
               "is a multiple of the tensor-parallel ones");
  OMNI_REQUIRE(cfg_.num_moe_experts % ranks == 0, "--num-experts (", cfg_.num_moe_experts,
               ") must be divisible by --expert-model-parallel-size (", ranks, ")");
  const int64_t local = cfg_.num_moe_experts / ranks;
  const int64_t first = local * (parallel_.ep ? parallel_.ep->rank() : 0);
  // The width F of an fc1 ([.., F1, C]) or fc2 ([.., C, F]) split over n ranks (this rank
  // the r-th).
  auto split = [&](ParamInfo& e, int dim, int64_t F, bool fc1, int n, int r) {
    const int64_t Fl = F / n;
    if (e.global_shape.empty()) e.global_shape = e.shape;
    e.shard_dim = dim;
    e.segments = {{0, r * Fl, Fl}};
    if (fc1 && cfg_.swiglu) e.segments.push_back({Fl, F + r * Fl, Fl});
    e.shape[dim] = fc1 && cfg_.swiglu ? 2 * Fl : Fl;
  };
  const int64_t F = cfg_.moe_ffn_size(), Fs = cfg_.moe_shared_expert_intermediate_size;
  for (const MoEParamInfo& m : moe_parameter_layout(cfg_)) {
    const bool bias = ends_with(m.name, "bias");
    const ParamInit init = bias                                     ? ParamInit::Zeros
                           : ends_with(m.name, "linear_fc2.weight") ? ParamInit::ScaledNormal
                                                                    : ParamInit::Normal;
    p.emplace_back(mlp + m.name, Shape(m.shape.begin(), m.shape.end()), init, !bias);
    ParamInfo& e = p.back();
    const bool expert = is_expert_parameter(e.name);
    if (ranks > 1 && expert) {
      e.global_shape = e.shape;
      e.shape[0] = local;
      e.shard_dim = 0;
      e.segments = {{0, first, local}};
    }
    if (expert ? etp == 1 : tp == 1) continue;
    if (expert && ends_with(m.name, "linear_fc1.weight"))
      split(e, 1, F, true, etp, etp_rank);
    else if (expert && ends_with(m.name, "linear_fc1.bias"))
      split(e, 1, F, true, etp, etp_rank);
    else if (expert && ends_with(m.name, "linear_fc2.weight"))
      split(e, 2, F, false, etp, etp_rank);
    else if (expert && ends_with(m.name, "linear_fc2.bias"))
      // Whole on every slice's rank with the same gradient (MoELayer): under ETP = TP that is
      // the dense tp group's replicated tensor, counted and saved once there; under its own
      // group counted and saved by its first rank (expert_grads.cpp, Trainer::rank_state).
      e.etp_replicated = true, e.tp_replicated = !own;
    else if (ends_with(m.name, "shared_experts.linear_fc1.weight"))
      split(e, 0, Fs, true, tp, r);
    else if (ends_with(m.name, "shared_experts.linear_fc2.weight"))
      split(e, 1, Fs, false, tp, r);
    else  // the router, the shared expert's gate: each rank's gradient is its part's
      e.tp_replicated = e.tp_partial_grad = true;
    if (e.shard_dim > 0 && ranks > 1 && expert) e.dim0_start = first;
  }
  if (cfg_.moe_router_enable_expert_bias) {
    p.emplace_back(mlp + "router.expert_bias", Shape{cfg_.num_moe_experts}, ParamInit::Zeros,
                   false);
    p.back().tp_replicated = tp > 1;
  }
}

template <typename T>
void GPTModel<T>::init_moe_rows() {
  moe_tp_ = tp_;
  const int tp = tp_.size();
  if (cfg_.num_moe_experts == 0 || !own_expert_rows(parallel_, tp)) return;
  const int etp = parallel_.expert_tp->size();
  OMNI_REQUIRE(sp_ || tp == 1, "--expert-tensor-parallel-size ", etp,
               etp < tp ? " below" : " above", " --tensor-model-parallel-size ", tp,
               " needs --sequence-parallel");
  if (!moe_takes_block_rows(cfg_, tp, etp)) return;
  if (etp < tp) {
    moe_tp_ = TensorParallel<T>(parallel_.expert_tp, true, cfg_.hidden_size, x_);
  } else if (tp > 1) {  // this rank's own rows
    moe_self_ = make_self_communicator("moe_rows");
    moe_tp_ = TensorParallel<T>(moe_self_.get(), true, cfg_.hidden_size, x_);
  }
}

template <typename T>
void GPTModel<T>::moe_forward(int layer, LayerActivations& a, const T* x, T* out,
                              const MicroBatch& mb, const Geometry& g) {
  {
    if (!a.moe) {
      const bool own = own_expert_rows(parallel_, tp_.size());
      a.moe = std::make_shared<MoEState>(cfg_, parallel_.ep, own ? parallel_.tp_cp : cp_,
                                         parallel_.tp, x_, own ? parallel_.expert_tp : nullptr,
                                         parallel_.expert_tp_ep);
      using Scratch = typename MoELayer<T>::Scratch;  // one for every MoE layer
      if (!moe_scratch_) moe_scratch_ = a.moe->layer.scratch();
      a.moe->layer.share_scratch(std::static_pointer_cast<Scratch>(moe_scratch_));
    }
    MoELayer<T>& m = a.moe->layer;
    const int E = cfg_.num_moe_experts;
    const std::string mlp = layer_prefix(layer) + "mlp.";
    if (cfg_.moe_router_enable_expert_bias) {
      const T* bias = params_.value(mlp + "router.expert_bias");
      if constexpr (std::is_same_v<T, Grad>) {
        ops::download(x_, m.expert_bias().data(), bias, E);
      } else {
        std::vector<T> stored(E);
        ops::download(x_, stored.data(), bias, E);
        for (int e = 0; e < E; ++e) m.expert_bias()[e] = to_float(stored[e]);
      }
    }
    const bool train = moe_training_;
    const MoEStats& s = m.forward(
        out, x, g.tokens, g.seq,
        moe_tensors<T>(mlp, [&](const std::string& n) { return params_.value_or_null(n); }), train,
        moe_recomputing_);
    if (!train) return;
    // Megatron's MoEAuxLossAutoScaler: the losses' gradients are scaled as the language-model
    // loss's (loss scale over micro-batches), without its division by the micro-batch's
    // tokens; with --calculate-per-token-loss the global token count divides both.
    a.moe->aux_grad_scale =
        mb.loss_divisor > 0 ? moe_grad_scale_ / mb.loss_divisor : moe_grad_scale_;
    if (moe_recomputing_) return;  // reported and counted by the first forward
    MoEReport& r = moe_report_;
    const size_t L = size_t(cfg_.num_layers + cfg_.mtp_num_layers);  // MTP's layers last
    if (r.load_balancing_loss.empty()) {
      r.load_balancing_loss.assign(L, 0.0);
      r.z_loss.assign(L, 0.0);
      r.tokens_per_expert.assign(L * E, 0.0);
    }
    // Rows routed to each expert and kept (capacity padding left out), as Megatron counts
    // its routing map after dropping; then the balancing losses.
    const ops::MoEDispatchPlan& plan = m.plan();
    std::vector<double> figures(size_t(E) + 2);
    for (int e = 0; e < E; ++e)
      for (int32_t row = plan.expert_offsets[e]; row < plan.expert_offsets[e + 1]; ++row)
        figures[e] += plan.row_slot[row] >= 0;
    figures[E] = s.aux_loss, figures[E + 1] = s.z_loss;
    if (own_expert_rows(parallel_, tp_.size()) && tp_.size() > 1) {
      // Each block of tp ranks' rows (every rank of the block with the same figures; the
      // block is etp ranks under etp < tp, one above): summed over tp (in the Exec's memory),
      // over the block's size.
      MoEBuffer<double> sum(x_, figures.size());
      ops::upload(x_, sum.data(), figures.data(), figures.size());
      parallel_.tp->all_reduce(sum.data(), figures.size());
      ops::download(x_, figures.data(), sum.data(), figures.size());
      const int block = moe_routing_block(tp_.size(), parallel_.expert_tp->size());
      for (double& f : figures) f /= block;
    }
    if (cfg_.moe_aux_loss_coeff > 0)
      r.load_balancing_loss[layer] += figures[E] / cfg_.moe_aux_loss_coeff;
    if (cfg_.moe_z_loss_coeff > 0) r.z_loss[layer] += figures[E + 1] / cfg_.moe_z_loss_coeff;
    for (int e = 0; e < E; ++e) {
      r.tokens_per_expert[size_t(layer) * E + e] += figures[e];
      if (cfg_.moe_router_enable_expert_bias) expert_tokens_[size_t(layer) * E + e] += figures[e];
    }
  }
}

template <typename T>
void GPTModel<T>::moe_backward(int layer, LayerActivations& a, const T* dy, T* dx) {
  {
    OMNI_CHECK(a.moe, "[gpt] MoE backward without its forward (layer ", layer, ")");
    const std::string mlp = layer_prefix(layer) + "mlp.";
    a.moe->layer.backward(
        dx, dy, moe_tensors<T>(mlp, [&](const std::string& n) { return params_.value_or_null(n); }),
        moe_tensors<Grad>(mlp, [&](const std::string& n) { return params_.grad_or_null(n); }),
        a.moe->aux_grad_scale);
  }
}

template <typename T>
int64_t GPTModel<T>::moe_activation_bytes(const LayerActivations& a) const {
  return a.moe ? a.moe->layer.activation_bytes() : 0;
}

template <typename T>
int64_t GPTModel<T>::moe_scratch_bytes() const {
  using Scratch = typename MoELayer<T>::Scratch;
  return moe_scratch_ ? std::static_pointer_cast<Scratch>(moe_scratch_)->bytes() : 0;
}

template <typename T>
typename GPTModel<T>::MoEReport GPTModel<T>::take_moe_report() {
  MoEReport r = std::move(moe_report_);
  moe_report_ = MoEReport{};
  const size_t L = size_t(cfg_.num_layers + cfg_.mtp_num_layers), E = size_t(cfg_.num_moe_experts);
  if (r.load_balancing_loss.empty()) {  // no training forward: zeros, the same size on every rank
    r.load_balancing_loss.assign(L, 0.0);
    r.z_loss.assign(L, 0.0);
    r.tokens_per_expert.assign(L * E, 0.0);
  }
  return r;
}

template <typename T>
void GPTModel<T>::update_expert_bias() {
  if (!cfg_.moe_router_enable_expert_bias) return;
  const int E = cfg_.num_moe_experts;
  MoEBuffer<Grad> wide(x_, std::is_same_v<T, Grad> ? 0 : E);
  auto update = [&](int layer) {
    if (!cfg_.is_moe_layer(layer)) return;
    T* bias = params_.value(layer_prefix(layer) + "mlp.router.expert_bias");
    const double* counts = expert_tokens_.data() + size_t(layer) * E;
    if constexpr (std::is_same_v<T, Grad>) {
      ops::moe_expert_bias_update(x_, bias, counts, E, cfg_.moe_router_bias_update_rate);
    } else {
      ops::to_float(x_, wide.data(), bias, E);
      ops::moe_expert_bias_update(x_, wide.data(), counts, E, cfg_.moe_router_bias_update_rate);
      ops::from_float(x_, bias, wide.data(), E);
    }
  };
  for (const auto& [first, end] : chunks_)
    for (int layer = first; layer < end; ++layer) update(layer);
  // Multi-token prediction's MoE layers (the last stage's), as Megatron updates every router.
  if (parallel_.post_process)
    for (int k = 0; k < cfg_.mtp_num_layers; ++k) update(cfg_.num_layers + k);
  std::fill(expert_tokens_.begin(), expert_tokens_.end(), 0.0);
}

#define OMNI_INSTANTIATE(T)                                                                       \
  template void GPTModel<T>::init_moe_rows();                                                     \
  template void GPTModel<T>::add_moe_parameters(std::vector<ParamInfo>&, const std::string&)      \
      const;                                                                                      \
  template void GPTModel<T>::moe_forward(int, LayerActivations&, const T*, T*, const MicroBatch&, \
                                         const Geometry&);                                        \
  template void GPTModel<T>::moe_backward(int, LayerActivations&, const T*, T*);                  \
  template int64_t GPTModel<T>::moe_activation_bytes(const LayerActivations&) const;              \
  template int64_t GPTModel<T>::moe_scratch_bytes() const;                                        \
  template GPTModel<T>::MoEReport GPTModel<T>::take_moe_report();                                 \
  template void GPTModel<T>::update_expert_bias();
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(double)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

}  // namespace omni
