#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "backend/ops.h"
#include "base/error.h"

namespace omni {

void validate_moe_config(const TransformerConfig& c) {
  const int E = c.num_moe_experts, k = c.moe_router_topk;
  OMNI_REQUIRE(E > 0, "an MoE layer needs --num-experts (got ", E, ")");
  OMNI_REQUIRE(k >= 1 && k <= E, "--moe-router-topk (", k,
               ") must be between 1 and --num-experts (", E, ")");
  OMNI_REQUIRE(c.moe_ffn_size() > 0, "--moe-ffn-hidden-size must be positive (got ",
               c.moe_ffn_hidden_size, ")");
  const bool softmax = c.moe_router_score_function == MoEScoreFunction::Softmax;
  // Megatron's rule: a softmax over one selected logit is 1 and has no gradient.
  OMNI_REQUIRE(!(k == 1 && softmax && !c.moe_router_pre_softmax),
               "--moe-router-topk 1 with --moe-router-score-function softmax needs "
               "--moe-router-pre-softmax (a softmax over one expert is constant)");
  // The real-valued flags: NaN fails every comparison and would slip past a `< 0` test
  // (a NaN or negative capacity factor read as dropless, an infinite loss weight as a
  // non-finite gradient at the first step), so each is asked to be finite and not negative.
  const auto finite_not_negative = [](const char* flag, double v, const char* zero) {
    OMNI_REQUIRE(std::isfinite(v) && v >= 0, flag, " must be a finite number, 0 or more (", zero,
                 "; got ", v, ")");
  };
  finite_not_negative("--moe-router-topk-scaling-factor", c.moe_router_topk_scaling_factor,
                      "0: no scaling");
  finite_not_negative("--moe-expert-capacity-factor", c.moe_expert_capacity_factor,
                      "0: dropless");
  finite_not_negative("--moe-aux-loss-coeff", c.moe_aux_loss_coeff, "0: off");
  finite_not_negative("--moe-z-loss-coeff", c.moe_z_loss_coeff, "0: off");
  finite_not_negative("--moe-router-bias-update-rate", c.moe_router_bias_update_rate,
                      "0: a fixed bias");
  if (c.moe_router_group_topk > 0) {
    const int G = c.moe_router_num_groups, g = c.moe_router_group_topk;
    OMNI_REQUIRE(G > 0, "--moe-router-group-topk (", g, ") needs --moe-router-num-groups");
    OMNI_REQUIRE(E % G == 0, "--moe-router-num-groups (", G, ") must divide --num-experts (", E,
                 ")");
    OMNI_REQUIRE(g <= G, "--moe-router-group-topk (", g,
                 ") must be at most --moe-router-num-groups (", G, ")");
    OMNI_REQUIRE(k >= g, "--moe-router-topk (", k, ") must be at least --moe-router-group-topk (",
                 g, "): each selected group is scored by its top topk/group-topk experts");
    OMNI_REQUIRE(k / g <= E / G && k <= g * (E / G), "--moe-router-topk (", k, ") needs more than ",
                 "the ", E / G, " experts in each of the --moe-router-group-topk (", g, ") groups");
  }
  OMNI_REQUIRE(!c.moe_router_enable_expert_bias || !softmax,
               "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid "
               "(Megatron's aux-loss-free balancing biases sigmoid scores only)");
  OMNI_REQUIRE(!c.moe_pad_expert_input_to_capacity || c.moe_expert_capacity_factor > 0,
               "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  // Megatron ignores the gate without a shared expert; a run asking for it would silently
  // train without the gated shared expert it names.
  OMNI_REQUIRE(!c.moe_shared_expert_gate || c.moe_shared_expert_intermediate_size != 0,
               "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size (there is "
               "no shared expert to gate)");
  if (c.moe_shared_expert_intermediate_size != 0) {
    OMNI_REQUIRE(c.moe_shared_expert_intermediate_size > 0,
                 "--moe-shared-expert-intermediate-size must be positive (got ",
                 c.moe_shared_expert_intermediate_size, ")");
    OMNI_REQUIRE(!c.add_bias_linear,
                 "--moe-shared-expert-intermediate-size needs --disable-bias-linear (Megatron's "
                 "shared experts have no biases)");
  }
}

bool moe_takes_block_rows(const TransformerConfig& c, int tp, int etp) {
  return etp != tp && c.moe_shared_expert_intermediate_size == 0;
}

bool is_expert_parameter(const std::string& name) {
  return name.find("mlp.experts.") != std::string::npos || name.rfind("experts.", 0) == 0;
}

int64_t MoEParamInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
// Shapes in the flat order; `present` false leaves a parameter out.
struct ParamSlot {
  const char* name;
  std::vector<int64_t> shape;
  bool present;
};

template <typename T>
std::vector<std::pair<ParamSlot, T * MoEParams<T>::*>> param_slots(const TransformerConfig& c) {
  const int64_t E = c.num_moe_experts, C = c.hidden_size, F = c.moe_ffn_size();
  const int64_t F1 = c.swiglu ? 2 * F : F, Fs = c.moe_shared_expert_intermediate_size;
  const int64_t Fs1 = c.swiglu ? 2 * Fs : Fs;
  const bool bias = c.add_bias_linear, shared = Fs > 0;
  using P = MoEParams<T>;
  return {
      {{"router.weight", {E, C}, true}, &P::router_weight},
      {{"router.bias", {E}, bias}, &P::router_bias},
      {{"experts.linear_fc1.weight", {E, F1, C}, true}, &P::fc1_weight},
      {{"experts.linear_fc1.bias", {E, F1}, bias}, &P::fc1_bias},
      {{"experts.linear_fc2.weight", {E, C, F}, true}, &P::fc2_weight},
      {{"experts.linear_fc2.bias", {E, C}, bias}, &P::fc2_bias},
      {{"shared_experts.linear_fc1.weight", {Fs1, C}, shared}, &P::shared_fc1_weight},
      {{"shared_experts.linear_fc2.weight", {C, Fs}, shared}, &P::shared_fc2_weight},
      {{"shared_experts.gate_weight", {1, C}, shared && c.moe_shared_expert_gate},
       &P::shared_gate_weight},
  };
}

GeluForm gelu_form_of(const TransformerConfig& c) {
  return c.openai_gelu ? GeluForm::Tanh : GeluForm::Erf;
}

// The MLP activation of `rows` rows: SwiGLU on [rows, 2F] or GELU on [rows, F].
template <typename T>
void activation_forward(const ops::Exec& e, T* out, const T* in, int rows, int F,
                        const TransformerConfig& c) {
  if (c.swiglu)
    ops::swiglu_forward(e, out, in, rows, F);
  else
    ops::gelu_forward(e, out, in, static_cast<size_t>(rows) * F, gelu_form_of(c));
}
template <typename T>
void activation_backward(const ops::Exec& e, T* din, const T* dout, const T* in, int rows, int F,
                         const TransformerConfig& c) {
  if (c.swiglu)
    ops::swiglu_backward(e, din, dout, in, rows, F);
  else
    ops::gelu_backward(e, din, dout, in, static_cast<size_t>(rows) * F, gelu_form_of(c));
}
}  // namespace

std::vector<MoEParamInfo> moe_parameter_layout(const TransformerConfig& c) {
  std::vector<MoEParamInfo> out;
  int64_t offset = 0;
  for (const auto& [slot, member] : param_slots<float>(c)) {
    (void)member;
    if (!slot.present) continue;
    out.push_back({slot.name, slot.shape, offset});
    offset += out.back().numel();
  }
  return out;
}

int64_t moe_parameter_count(const TransformerConfig& c) {
  const auto layout = moe_parameter_layout(c);
  return layout.empty() ? 0 : layout.back().offset + layout.back().numel();
}

template <typename T>
MoEParams<T> moe_param_views(T* flat, const TransformerConfig& c) {
  MoEParams<T> p;
  int64_t offset = 0;
  for (const auto& [slot, member] : param_slots<T>(c)) {
    if (!slot.present) continue;
    p.*member = flat + offset;
    offset += MoEParamInfo{"", slot.shape, 0}.numel();
  }
  return p;
}

template <typename T>
MoELayer<T>::MoELayer(const TransformerConfig& config, Communicator* ep, Communicator* cp,
                      Communicator* tp, const ops::Exec& exec, Communicator* expert_tp,
                      Communicator* expert_tp_ep)
    : cfg_(config),
      ep_(ep),
      cp_(cp && cp->size() > 1 ? cp : nullptr),
      tp_size_(tp ? tp->size() : 1),
      tp_rank_(tp ? tp->rank() : 0),
      gather_(ep),
      exec_(exec) {
  validate_moe_config(cfg_);
  E_ = cfg_.num_moe_experts;
  const int ranks = ep ? ep->size() : 1;
  OMNI_REQUIRE(E_ % ranks == 0, "--num-experts (", E_,
               ") must be divisible by --expert-model-parallel-size (", ranks, ")");
  aux_counts_.set_exec(exec);
  for (MoEBuffer<Router>* b :
       {&device_bias_, &logits_, &probs_, &aux_dlogits_, &aux_scaled_, &x_router_, &w_router_})
    b->set_exec(exec);
  for (MoEBuffer<T>* b :
       {&probs_t_, &local_out_, &permuted_, &fc1_out_, &act_, &expert_out_, &row_weight_,
        &shared_fc1_out_, &shared_act_, &shared_out_, &shared_gate_})
    b->set_exec(exec);
  indices_.set_exec(exec);
  local_experts_ = E_ / ranks;
  first_expert_ = (ep ? ep->rank() : 0) * local_experts_;
  C_ = cfg_.hidden_size;
  const int tp_ranks = tp_size_;
  own_rows_ = expert_tp && expert_tp->size() != tp_size_;
  if (own_rows_) {
    etp_size_ = expert_tp->size();
    OMNI_REQUIRE(expert_tensor_parallel_built(tp_ranks, etp_size_),
                 "--expert-tensor-parallel-size ", etp_size_, " with --tensor-model-parallel-size ",
                 tp_ranks,
                 ": not built yet: experts split over a number of ranks that neither divides "
                 "nor is a multiple of the tensor-parallel ones");
    block_size_ = moe_routing_block(tp_ranks, etp_size_);
    if (etp_size_ < tp_ranks) {
      block_rank_ = expert_tp->rank();
      OMNI_CHECK(block_rank_ == tp_rank_ % etp_size_,
                 "[moe] the expert tensor-parallel group is not a block of consecutive "
                 "tensor-parallel ranks");
    } else {  // whole tp groups, each rank routing its own rows
      OMNI_CHECK(expert_tp->rank() % tp_ranks == tp_rank_,
                 "[moe] the expert tensor-parallel group is not whole tensor-parallel groups");
      etp_ = expert_tp;
      gather_ = expert_tp_ep ? expert_tp_ep : expert_tp;
      OMNI_CHECK(gather_->size() == etp_size_ * (ep ? ep->size() : 1),
                 "[moe] the expert tp x ep group has ", gather_->size(), " ranks, not ", etp_size_,
                 " x ", ep ? ep->size() : 1);
    }
    block_rows_ = moe_takes_block_rows(cfg_, tp_ranks, etp_size_);
  }
  const int expert_ranks = own_rows_ ? etp_size_ : tp_ranks;
  OMNI_REQUIRE(cfg_.moe_ffn_size() % expert_ranks == 0, "--moe-ffn-hidden-size (",
               cfg_.moe_ffn_size(), ") must be divisible by --expert-tensor-parallel-size (",
               expert_ranks, ")");
  OMNI_REQUIRE(cfg_.moe_shared_expert_intermediate_size % tp_ranks == 0,
               "--moe-shared-expert-intermediate-size (", cfg_.moe_shared_expert_intermediate_size,
               ") must be divisible by --tensor-model-parallel-size (", tp_ranks, ")");
  // fc2's bias, whole on every slice's rank, is added by the first slice's only: the sum of
  // the slices' partial outputs (the caller's over tp or the block, the exchange's or the
  // gather's reduce-scatter over etp) then holds it once, as Megatron's row-parallel fc2 adds
  // it after the reduction.
  fc2_bias_here_ = (own_rows_ ? (etp_ ? etp_->rank() : block_rank_) : tp_rank_) == 0;
  F_ = cfg_.moe_ffn_size() / expert_ranks;
  F1_ = cfg_.swiglu ? 2 * F_ : F_;
  Fs_ = cfg_.moe_shared_expert_intermediate_size / tp_ranks;
  Fs1_ = cfg_.swiglu ? 2 * Fs_ : Fs_;
  K_ = cfg_.moe_router_topk;
  routing_.experts = E_;
  routing_.topk = K_;
  routing_.score_function = cfg_.moe_router_score_function;
  routing_.pre_softmax = cfg_.moe_router_pre_softmax;
  routing_.num_groups = cfg_.moe_router_num_groups;
  routing_.group_topk = cfg_.moe_router_group_topk;
  routing_.scaling_factor = cfg_.moe_router_topk_scaling_factor;
  expert_bias_.assign(E_, Router(0));
  scratch_ = std::make_shared<MoEScratch<T, Router>>(exec);
  local_tokens_.assign(E_, 0.0);
}

template <typename T>
const MoEStats& MoELayer<T>::forward(T* y, const T* x, int tokens, int seq_length,
                                     const MoEParams<T>& p, bool train, bool recomputing) {
  const int E = E_, C = C_, K = K_;
  shared_x_ = x;
  shared_tokens_ = tokens;
  T* const y_whole = y;
  if (own_rows_) {  // this rank's block's sequence-parallel rows
    OMNI_REQUIRE(tokens % tp_size_ == 0, "[moe] ", tokens, " tokens do not split over ", tp_size_,
                 " tensor-parallel ranks");
    tokens /= tp_size_ / block_size_;
    if (!block_rows_) {  // within the whole rows, zeros in the others
      ops::zero(exec_, y, size_t(shared_tokens_) * C);
      x += size_t(block()) * tokens * C;
      y += size_t(block()) * tokens * C;
    }
  }
  x_ = x;
  tokens_ = tokens;
  trained_ = train;
  stats_ = MoEStats{};

  // Router.
  const ops::Exec& ex = exec_;
  router_forward(x, p);
  probs_.resize(static_cast<size_t>(tokens) * K);
  indices_.resize(static_cast<size_t>(tokens) * K);
  routing_.tokens = tokens;
  if (cfg_.moe_router_enable_expert_bias) {
    device_bias_.resize(E);
    ops::upload(ex, device_bias_.data(), expert_bias_.data(), E);
  }
  ops::moe_topk_routing_forward(
      ex, probs_.data(), indices_.data(), logits_.data(),
      cfg_.moe_router_enable_expert_bias ? device_bias_.data() : static_cast<Router*>(nullptr),
      routing_);
  if (train) {
    // The losses' gradients with respect to the logits, for a unit gradient of each loss.
    aux_dlogits_.assign_zeros(logits_.size());
    if (cfg_.moe_router_load_balancing_type != MoELoadBalancing::None &&
        cfg_.moe_aux_loss_coeff > 0) {
      ops::MoEAuxLossArgs a;
      a.tokens = tokens;
      a.experts = E;
      a.topk = K;
      a.score_function = cfg_.moe_router_score_function;
      a.type = cfg_.moe_router_load_balancing_type;
      a.seq_length = seq_length;
      a.coeff = cfg_.moe_aux_loss_coeff;
      // (Under ETP < TP the sequences are those of every block's rows: sum_aux_counts.)
      OMNI_REQUIRE(a.type != MoELoadBalancing::SeqAuxLoss ||
                       (seq_length > 0 && shared_tokens_ % seq_length == 0),
                   "seq_aux_loss: ", shared_tokens_, " tokens are not whole sequences of ",
                   seq_length);
      if (cp_) sum_aux_counts(a);
      stats_.aux_loss = ops::moe_aux_loss(ex, aux_dlogits_.data(), logits_.data(), a, 1.0);
    }
    // Under context parallelism this rank's part of the mean over the whole sequences
    // (Megatron divides the coefficient by the tp_cp size; the ranks' tokens are equal).
    if (cfg_.moe_z_loss_coeff > 0)
      stats_.z_loss =
          ops::moe_z_loss(ex, aux_dlogits_.data(), logits_.data(), tokens, E,
                          cfg_.moe_z_loss_coeff / (cp_ ? cp_->size() / block_size_ : 1), 1.0);
  }

  // Dispatch, experts, combine.
  ops::MoECapacityArgs cap;
  cap.capacity_factor = cfg_.moe_expert_capacity_factor;
  cap.drop_policy = cfg_.moe_token_drop_policy;
  cap.pad_to_capacity = cfg_.moe_pad_expert_input_to_capacity;
  plan_ = ops::moe_dispatch_plan(ex, indices_.data(), probs_.data(), tokens, E, K, cap);
  a2a_.reset();
  exchange_.reset();
  const int El = local_experts_;
  if (allgather()) {
    // Every rank's routing in one all-gather (it checks that their token counts agree), then
    // their tokens; the plan is built on the host.
    const int n = gather_->size();
    const GatheredRouting<Router> routing =
        gather_routing(*gather_, probs_.host().data(), indices_.host().data(), tokens, K);
    x_all_.resize(size_t(n) * tokens * C);
    gather_->all_gather(x_all_.data(), x, size_t(tokens) * C);
    probs_all_.resize(routing.probs.size());  // every rank's combine_probs()
    if constexpr (std::is_same_v<T, Router>) {
      ops::upload(ex, probs_all_.data(), routing.probs.data(), routing.probs.size());
    } else {  // rounded to T as combine_probs() rounds them (the scratch is free here)
      MoEBuffer<Router>& wide = scratch_->probs_wide;
      wide.resize(routing.probs.size());
      ops::upload(ex, wide.data(), routing.probs.data(), wide.size());
      ops::from_float(ex, probs_all_.data(), wide.data(), wide.size());
    }
    gathered_plan_ =
        ops::MoEPlan(ex, expert_allgather_plan(routing.indices.data(), routing.probs.data(), tokens,
                                               n, E, K, cap, first_expert_, El));
  } else if (expert_parallel()) {
    a2a_.emplace(*ep_, plan_.host(), E);
  }
  const ops::MoEPlan& rows_plan = allgather() ? gathered_plan_ : plan_;
  // This rank's rows for its experts (after the exchange over ep), then under etp > tp with
  // alltoall every etp rank's (the experts run on those).
  const int R_own = a2a_ ? a2a_->expert_rows() : rows_plan.host().rows();
  const int32_t* own_offsets =
      a2a_ ? a2a_->expert_offsets().data() : rows_plan.host().expert_offsets.data();
  if (tensor_exchange()) exchange_.emplace(*etp_, own_offsets, El);
  const int R = exchange_ ? exchange_->rows() : R_own;
  const int32_t* offsets = exchange_ ? exchange_->expert_offsets().data() : own_offsets;
  permuted_.resize(static_cast<size_t>(R) * C);
  fc1_out_.resize(static_cast<size_t>(R) * F1_);
  act_.resize(static_cast<size_t>(R) * F_);
  expert_out_.resize(static_cast<size_t>(R) * C);
  // On the CPU, when the experts run one per thread and without an exchange, each expert's
  // task gathers its own rows (below): one pass over them less, and they are in its cache.
  const bool cpu_rows = !is_16bit<T> && !ex.on_gpu() && !a2a_ && !exchange_ &&
                        ops::moe_experts_run_whole(offsets, El);
  const T* x_rows = allgather() ? x_all_.data() : x;
  // The exchange over etp gathers from this rank's own rows (in the scratch's rows_in, free
  // outside a backward).
  MoEBuffer<T>& own_rows = scratch_->rows_in;
  if (exchange_) own_rows.resize(static_cast<size_t>(R_own) * C);
  T* const expert_in = exchange_ ? own_rows.data() : permuted_.data();
  if (a2a_) {
    MoEBuffer<T>& rows = scratch_->rows;
    rows.resize(static_cast<size_t>(plan_.host().rows()) * C);
    ops::moe_permute(ex, rows.data(), x, plan_, C);
    a2a_->dispatch(expert_in, rows.data(), C, ex, staging(size_t(R_own) * C));
  } else if (!cpu_rows) {
    ops::moe_permute(ex, expert_in, x_rows, rows_plan, C);
  }
  if (exchange_)
    exchange_->gather(permuted_.data(), own_rows.data(), C, ex,
                      staging(size_t(exchange_->staging_rows()) * C));
  // Experts [e, e + n) (rows offsets[e] to offsets[e + n]): all at once on a GPU; on the CPU
  // one expert at a time per thread, its rows hot in that core's cache between the steps.
  auto experts_forward = [&](int e, int n) {
    const size_t r0 = offsets[e];
    if constexpr (!is_16bit<T>)  // (the CPU has no 16-bit MoE ops)
      if (cpu_rows)
        ops::moe_permute_rows(permuted_.data(), x_rows, rows_plan.host(), C, offsets[e],
                              offsets[e + n]);
    ops::moe_grouped_linear_forward(
        ex, fc1_out_.data(), permuted_.data(), p.fc1_weight + size_t(e) * F1_ * C,
        p.fc1_bias ? p.fc1_bias + size_t(e) * F1_ : nullptr, offsets + e, n, C, F1_);
    activation_forward(ex, act_.data() + r0 * F_, fc1_out_.data() + r0 * F1_,
                       offsets[e + n] - offsets[e], F_, cfg_);
    ops::moe_grouped_linear_forward(
        ex, expert_out_.data(), act_.data(), p.fc2_weight + size_t(e) * C * F_,
        p.fc2_bias && fc2_bias_here_ ? p.fc2_bias + size_t(e) * C : nullptr, offsets + e, n, F_, C);
  };
  if (ex.on_gpu())
    experts_forward(0, El);
  else
    ops::moe_for_each_expert(offsets, El, [&](int e) { experts_forward(e, 1); });
  const T* out_rows = expert_out_.data();
  if (exchange_) {  // the slices' partial outputs summed back to this rank's own rows
    MoEBuffer<T>& own_out = a2a_ ? own_rows : local_out_;
    own_out.resize(static_cast<size_t>(R_own) * C);
    exchange_->reduce_scatter(own_out.data(), expert_out_.data(), C, ex,
                              staging(size_t(exchange_->staging_rows()) * C));
    out_rows = own_out.data();
  }
  if (a2a_) {
    local_out_.resize(static_cast<size_t>(plan_.host().rows()) * C);
    a2a_->combine(local_out_.data(), out_rows, C, ex, staging(size_t(R_own) * C));
  }
  if (a2a_ || exchange_) out_rows = local_out_.data();
  row_weight_.resize(rows_plan.host().rows());
  ops::moe_row_weights(ex, row_weight_.data(), allgather() ? probs_all_.data() : combine_probs(),
                       rows_plan);
  if (allgather()) {  // this rank's experts' part of every gathered token, summed back
    MoEBuffer<T>& y_all = scratch_->rows_out;  // free outside a backward
    y_all.resize(x_all_.size());
    ops::moe_unpermute(ex, y_all.data(), out_rows, row_weight_.data(), rows_plan, C);
    gather_->reduce_scatter(y, y_all.data(), static_cast<size_t>(tokens) * C);
  } else {
    ops::moe_unpermute(ex, y, out_rows, row_weight_.data(), plan_, C);
  }
  if (Fs_ > 0) shared_expert_forward(y_whole, shared_x_, p);

  const ops::MoEDispatchPlan& plan = plan_.host();
  stats_.tokens_per_expert.resize(E);
  for (int e = 0; e < E; ++e) stats_.tokens_per_expert[e] = plan.expert_rows(e);
  stats_.dropped = plan.dropped;
  if (train && !recomputing && cfg_.moe_router_enable_expert_bias)
    for (int e = 0; e < E; ++e) local_tokens_[e] += double(plan.expert_rows(e));
  return stats_;
}

template <typename T>
void MoELayer<T>::router_forward(const T* x, const MoEParams<T>& p) {
  const ops::Exec& ex = exec_;
  const int N = tokens_, C = C_, E = E_;
  logits_.resize(static_cast<size_t>(N) * E);
  if constexpr (std::is_same_v<T, Router>) {
    ops::linear_forward(ex, logits_.data(), x, p.router_weight, p.router_bias, N, C, E);
  } else {  // widened to float, the weights' copy kept for the backward (bias after weight)
    const size_t nx = size_t(N) * C, nw = size_t(E) * C;
    x_router_.resize(nx);
    w_router_.resize(nw + (p.router_bias ? E : 0));
    ops::to_float(ex, x_router_.data(), x, nx);
    ops::to_float(ex, w_router_.data(), p.router_weight, nw);
    if (p.router_bias) ops::to_float(ex, w_router_.data() + nw, p.router_bias, size_t(E));
    ops::linear_forward(ex, logits_.data(), x_router_.data(), w_router_.data(),
                        p.router_bias ? w_router_.data() + nw : static_cast<Router*>(nullptr), N, C,
                        E);
  }
}

template <typename T>
void MoELayer<T>::router_backward(T* dx, const Router* dlogits, const MoEParams<T>& p,
                                  const MoEParams<Router>& g) {
  const ops::Exec& ex = exec_;
  const int N = tokens_, C = C_, E = E_;
  if constexpr (std::is_same_v<T, Router>) {
    ops::linear_backward(ex, dx, g.router_weight, g.router_bias, dlogits, x_, p.router_weight, N, C,
                         E);
  } else {  // dx in float, rounded once
    MoEBuffer<Router>& dx_wide = scratch_->x_wide;
    dx_wide.resize(size_t(N) * C);
    ops::linear_backward(ex, dx_wide.data(), g.router_weight, g.router_bias, dlogits,
                         x_router_.data(), w_router_.data(), N, C, E);
    ops::from_float(ex, dx, dx_wide.data(), dx_wide.size());
  }
}

template <typename T>
T* MoELayer<T>::staging(size_t n) {
  scratch_->exchange.resize(n);
  return scratch_->exchange.data();
}

template <typename T>
const T* MoELayer<T>::combine_probs() {
  if constexpr (std::is_same_v<T, Router>) {
    return probs_.data();
  } else {
    probs_t_.resize(probs_.size());
    ops::from_float(exec_, probs_t_.data(), probs_.data(), probs_.size());
    return probs_t_.data();
  }
}

template <typename T>
void MoELayer<T>::shared_expert_forward(T* y, const T* x, const MoEParams<T>& p) {
  const int N = shared_tokens_, C = C_;
  shared_fc1_out_.resize(static_cast<size_t>(N) * Fs1_);
  shared_act_.resize(static_cast<size_t>(N) * Fs_);
  shared_out_.resize(static_cast<size_t>(N) * C);
  const ops::Exec& ex = exec_;
  ops::linear_forward(ex, shared_fc1_out_.data(), x, p.shared_fc1_weight, static_cast<T*>(nullptr),
                      N, C, Fs1_);
  activation_forward(ex, shared_act_.data(), shared_fc1_out_.data(), N, Fs_, cfg_);
  ops::linear_forward(ex, shared_out_.data(), shared_act_.data(), p.shared_fc2_weight,
                      static_cast<T*>(nullptr), N, Fs_, C);
  const T* add = shared_out_.data();
  MoEBuffer<T>& gated = scratch_->rows_out;  // free outside a backward
  if (p.shared_gate_weight) {
    shared_gate_.resize(N);
    gated.resize(shared_out_.size());
    ops::moe_shared_gate_forward(ex, gated.data(), shared_gate_.data(), shared_out_.data(), x,
                                 p.shared_gate_weight, N, C);
    add = gated.data();
  }
  ops::add(ex, y, y, add, static_cast<size_t>(N) * C);
}

template <typename T>
void MoELayer<T>::backward(T* dx, const T* dy, const MoEParams<T>& p, const MoEParams<Router>& g,
                           double aux_loss_grad_scale) {
  OMNI_CHECK(trained_, "MoELayer::backward needs a training forward just before it");
  const int N = tokens_, C = C_, K = K_;
  const T* const dy_whole = dy;
  T* const dx_whole = dx;
  if (own_rows_ && !block_rows_) {  // the block's rows of the whole ones, zeros in the others
    ops::zero(exec_, dx, size_t(shared_tokens_) * C);  // (the shared expert's added below)
    dx += size_t(block()) * N * C;
    dy += size_t(block()) * N * C;
  }

  // Combine and experts: the gradients of the experts' output rows and of their weights.
  const ops::Exec& ex = exec_;
  const int El = local_experts_, n = allgather() ? gather_->size() : 1;
  const ops::MoEPlan& rows_plan = allgather() ? gathered_plan_ : plan_;
  const int R = int(permuted_.size() / size_t(C));
  const int R_own = exchange_ ? exchange_->own_rows() : R;
  const int32_t* offsets = exchange_ ? exchange_->expert_offsets().data()
                           : a2a_    ? a2a_->expert_offsets().data()
                                     : rows_plan.host().expert_offsets.data();
  MoEScratch<T, Router>& s = *scratch_;
  MoEBuffer<T>&d_expert_out = s.rows_out, &d_row_weight = s.row_weight;
  d_expert_out.resize(static_cast<size_t>(R) * C);
  d_row_weight.resize(rows_plan.host().rows());
  // As in the forward, each expert's task computes its rows' output gradients.
  const bool cpu_rows = !is_16bit<T> && !ex.on_gpu() && !a2a_ && !exchange_ &&
                        ops::moe_experts_run_whole(offsets, El);
  const T* dy_rows = dy;
  if (allgather()) {
    MoEBuffer<T>& dy_all = s.rows;
    dy_all.resize(static_cast<size_t>(n) * N * C);
    gather_->all_gather(dy_all.data(), dy, static_cast<size_t>(N) * C);
    dy_rows = dy_all.data();
  }
  // Under the exchange over etp: this rank's own rows' output gradients (rows_in, free until
  // the experts' backward), then every etp rank's.
  MoEBuffer<T>& d_own = s.rows_in;
  if (exchange_) d_own.resize(static_cast<size_t>(R_own) * C);
  T* const d_expert_own = exchange_ ? d_own.data() : d_expert_out.data();
  if (allgather() && !cpu_rows) {
    ops::moe_unpermute_backward(ex, d_expert_out.data(), d_row_weight.data(), dy_rows,
                                expert_out_.data(), row_weight_.data(), rows_plan, C);
  } else if (a2a_) {
    MoEBuffer<T>& d_rows = s.rows;
    d_rows.resize(static_cast<size_t>(plan_.host().rows()) * C);
    ops::moe_unpermute_backward(ex, d_rows.data(), d_row_weight.data(), dy, local_out_.data(),
                                row_weight_.data(), plan_, C);
    a2a_->dispatch(d_expert_own, d_rows.data(), C, ex, staging(size_t(R_own) * C));
  } else if (exchange_) {
    ops::moe_unpermute_backward(ex, d_expert_own, d_row_weight.data(), dy, local_out_.data(),
                                row_weight_.data(), plan_, C);
  } else if (!cpu_rows) {
    ops::moe_unpermute_backward(ex, d_expert_out.data(), d_row_weight.data(), dy,
                                expert_out_.data(), row_weight_.data(), plan_, C);
  }
  if (exchange_)
    exchange_->gather(d_expert_out.data(), d_own.data(), C, ex,
                      staging(size_t(exchange_->staging_rows()) * C));
  MoEBuffer<T>&d_act = s.act, &d_fc1 = s.fc1;
  d_act.resize(static_cast<size_t>(R) * F_);
  d_fc1.resize(static_cast<size_t>(R) * F1_);
  MoEBuffer<T>& d_permuted = s.rows_in;
  d_permuted.resize(static_cast<size_t>(R) * C);
  auto experts_backward = [&](int e, int n) {  // as experts_forward
    const size_t r0 = offsets[e], w1 = size_t(e) * F1_ * C, w2 = size_t(e) * C * F_;
    if constexpr (!is_16bit<T>)
      if (cpu_rows)
        ops::moe_unpermute_backward_rows(d_expert_out.data(), d_row_weight.data(), dy_rows,
                                         expert_out_.data(), row_weight_.data(),
                                         rows_plan.host(), C, offsets[e], offsets[e + n]);
    ops::moe_grouped_linear_backward(
        ex, d_act.data(), g.fc2_weight + w2, g.fc2_bias ? g.fc2_bias + size_t(e) * C : nullptr,
        d_expert_out.data(), act_.data(), p.fc2_weight + w2, offsets + e, n, F_, C);
    activation_backward(ex, d_fc1.data() + r0 * F1_, d_act.data() + r0 * F_,
                        fc1_out_.data() + r0 * F1_, offsets[e + n] - offsets[e], F_, cfg_);
    ops::moe_grouped_linear_backward(ex, d_permuted.data(), g.fc1_weight + w1,
                                     g.fc1_bias ? g.fc1_bias + size_t(e) * F1_ : nullptr,
                                     d_fc1.data(), permuted_.data(), p.fc1_weight + w1, offsets + e,
                                     n, C, F1_);
  };
  if (ex.on_gpu())
    experts_backward(0, El);
  else
    ops::moe_for_each_expert(offsets, El, [&](int e) { experts_backward(e, 1); });

  // Back to this rank's tokens: the routing probabilities' gradient and the input rows'.
  MoEBuffer<T>& dprobs = s.probs;
  MoEBuffer<Router>& dlogits = s.logits;
  dprobs.resize(static_cast<size_t>(N) * K);
  dlogits.resize(logits_.size());
  const T* dx_experts = nullptr;  // allgather: this rank's tokens' part from every rank
  const T* d_rows_in = d_permuted.data();
  if (allgather()) {  // the rows' gradients (s.rows), then the tokens' (s.rows_out: free)
    MoEBuffer<T>&dx_all = s.rows, &dprobs_all = s.exchange, &dx_mine = s.rows_out;
    dx_all.resize(x_all_.size());
    dprobs_all.resize(probs_all_.size());
    dx_mine.resize(static_cast<size_t>(N) * C);
    ops::moe_row_weights_backward(ex, dprobs_all.data(), d_row_weight.data(), rows_plan);
    // The probabilities' gradients travel while the rows' are summed per token; both sums
    // then complete together (one wait for the other ranks, not two).
    const std::unique_ptr<CommRequest> probs_sum =
        gather_->ireduce_scatter(dprobs.data(), dprobs_all.data(), dprobs.size(), dtype_of<T>());
    ops::moe_permute_backward(ex, dx_all.data(), d_permuted.data(), rows_plan, C, false);
    gather_->reduce_scatter(dx_mine.data(), dx_all.data(), dx_mine.size());
    probs_sum->wait();
    dx_experts = dx_mine.data();
  } else {
    ops::moe_row_weights_backward(ex, dprobs.data(), d_row_weight.data(), plan_);
    if (exchange_) {  // the slices' parts of this rank's rows' input gradients summed
      MoEBuffer<T>& d_rows = a2a_ ? s.rows_out : s.rows;  // (rows_out is free here)
      d_rows.resize(static_cast<size_t>(R_own) * C);
      exchange_->reduce_scatter(d_rows.data(), d_permuted.data(), C, ex,
                                staging(size_t(exchange_->staging_rows()) * C));
      d_rows_in = d_rows.data();
    }
    if (a2a_) {
      MoEBuffer<T>& d_rows = s.rows;
      d_rows.resize(static_cast<size_t>(plan_.host().rows()) * C);
      a2a_->combine(d_rows.data(), d_rows_in, C, ex, staging(size_t(R_own) * C));
      d_rows_in = d_rows.data();
    }
  }
  const Router* dprobs_r = nullptr;
  MoEBuffer<Router>& dprobs_wide = s.probs_wide;
  if constexpr (std::is_same_v<T, Router>) {
    dprobs_r = dprobs.data();
  } else {
    dprobs_wide.resize(dprobs.size());
    ops::to_float(ex, dprobs_wide.data(), dprobs.data(), dprobs.size());
    dprobs_r = dprobs_wide.data();
  }
  ops::moe_topk_routing_backward(ex, dlogits.data(), dprobs_r, logits_.data(), indices_.data(),
                                 routing_);
  // Once over the tensor-parallel ranks, unless each routes its own rows.
  if (!aux_dlogits_.empty() && (own_rows_ ? block_rank_ : tp_rank_) == 0) {
    if (ex.on_gpu()) {  // the aux losses' gradient, scaled in a copy (it stays the forward's)
      aux_scaled_.resize(aux_dlogits_.size());
      ops::copy(ex, aux_scaled_.data(), aux_dlogits_.data(), aux_dlogits_.size());
      ops::scale(ex, aux_scaled_.data(), aux_loss_grad_scale, aux_scaled_.size());
      ops::add(ex, dlogits.data(), dlogits.data(), aux_scaled_.data(), dlogits.size());
    } else {
      const Router w = Router(aux_loss_grad_scale);
      for (size_t i = 0; i < dlogits.size(); ++i) dlogits.data()[i] += w * aux_dlogits_.data()[i];
    }
  }
  router_backward(dx, dlogits.data(), p, g);
  if (allgather())
    ops::add(ex, dx, dx, dx_experts, static_cast<size_t>(N) * C);
  else
    ops::moe_permute_backward(ex, dx, d_rows_in, plan_, C, /*accumulate=*/true);
  if (Fs_ > 0) shared_expert_backward(dx_whole, dy_whole, p, g);
}

template <typename T>
void MoELayer<T>::shared_expert_backward(T* dx, const T* dy, const MoEParams<T>& p,
                                         const MoEParams<Router>& g) {
  const int N = shared_tokens_, C = C_;
  const ops::Exec& ex = exec_;
  MoEBuffer<T>& d_out = scratch_->rows_out;  // the routed experts' are done
  const T* d_shared = dy;
  if (p.shared_gate_weight) {
    d_out.resize(static_cast<size_t>(N) * C);
    ops::moe_shared_gate_backward(ex, d_out.data(), dx, g.shared_gate_weight, dy,
                                  shared_out_.data(), shared_gate_.data(), shared_x_,
                                  p.shared_gate_weight, N, C);
    d_shared = d_out.data();
  }
  MoEBuffer<T>&d_act = scratch_->act, &d_fc1 = scratch_->fc1;
  d_act.resize(static_cast<size_t>(N) * Fs_);
  d_fc1.resize(static_cast<size_t>(N) * Fs1_);
  ops::linear_backward(ex, d_act.data(), g.shared_fc2_weight, static_cast<Router*>(nullptr),
                       d_shared, shared_act_.data(), p.shared_fc2_weight, N, Fs_, C);
  activation_backward(ex, d_fc1.data(), d_act.data(), shared_fc1_out_.data(), N, Fs_, cfg_);
  ops::linear_backward(ex, dx, g.shared_fc1_weight, static_cast<Router*>(nullptr), d_fc1.data(),
                       shared_x_, p.shared_fc1_weight, N, C, Fs1_, /*accumulate_dx=*/true);
}

template <typename T>
int64_t MoELayer<T>::activation_bytes() const {
  int64_t b = 0;
  for (const MoEBuffer<Router>* v : {&logits_, &probs_, &aux_dlogits_, &x_router_, &w_router_})
    b += int64_t(v->size() * sizeof(Router));
  for (const MoEBuffer<T>* v :
       {&probs_t_, &permuted_, &fc1_out_, &act_, &expert_out_, &row_weight_, &shared_fc1_out_,
        &shared_act_, &shared_out_, &shared_gate_, &local_out_})
    b += int64_t(v->size() * sizeof(T));
  b += int64_t((x_all_.size() + probs_all_.size()) * sizeof(T));
  const ops::MoEDispatchPlan& plan = plan_.host();
  b += int64_t(indices_.size() * sizeof(int32_t));
  for (const std::vector<int32_t>* v : {&plan.expert_offsets, &plan.row_token, &plan.row_slot,
                                        &plan.token_offsets, &plan.token_rows})
    b += int64_t(v->size() * sizeof(int32_t));
  return b;
}

template <typename T>
void MoELayer<T>::update_expert_bias(const double* global_tokens_per_expert) {
  ops::moe_expert_bias_update(
      expert_bias_.data(),
      global_tokens_per_expert ? global_tokens_per_expert : local_tokens_.data(), E_,
      cfg_.moe_router_bias_update_rate);
  std::fill(local_tokens_.begin(), local_tokens_.end(), 0.0);
}

template struct MoEParams<float>;
template struct MoEParams<double>;
template MoEParams<float> moe_param_views<float>(float*, const TransformerConfig&);
template MoEParams<double> moe_param_views<double>(double*, const TransformerConfig&);
template struct MoEParams<bf16>;
template struct MoEParams<f16>;
template MoEParams<bf16> moe_param_views<bf16>(bf16*, const TransformerConfig&);
template MoEParams<f16> moe_param_views<f16>(f16*, const TransformerConfig&);

template <typename T>
void MoELayer<T>::sum_aux_counts(ops::MoEAuxLossArgs& a) {
  const ops::Exec& ex = exec_;
  const int E = E_;
  if (!own_rows_ || a.type != MoELoadBalancing::SeqAuxLoss) {
    // Every rank's rows are its part of each sequence (context parallelism), or of the
    // micro-batch (aux_loss): the counts summed where they are (device memory on a GPU). A
    // block's etp ranks hold the same rows: each row is counted etp times, which the
    // coefficient takes back (the loss is linear in the counts; no double op on a GPU).
    const bool per_seq = a.type == MoELoadBalancing::SeqAuxLoss;
    aux_counts_.resize(size_t(per_seq ? a.tokens / a.seq_length : 1) * E);
    ops::moe_aux_loss_counts(ex, aux_counts_.data(), logits_.data(), a);
    cp_->all_reduce(aux_counts_.data(), aux_counts_.size());
    a.shards = cp_->size() / block_size_;
    a.coeff /= block_size_;
    a.counts = aux_counts_.data();
    return;
  }
  // seq_aux_loss under ETP < TP: this block's rows are a run of this cp rank's batch-major
  // rows, which may start or end inside a sequence. Cut all those rows into pieces of g rows,
  // g = gcd(block rows, sequence), each inside one sequence; each block counts its pieces
  // into its slots of every piece's counts, summed over the tp x cp ranks (the cp ranks' same
  // pieces are parts of the same sequences); each piece's sequence's counts are the sum over
  // its S/g pieces (on the host: a few rows of E). The kernel then sees this block's pieces as
  // sequences of g rows split in S/g x cp shards, its mean over pieces made the mean over
  // the micro-batch's sequences, the etp ranks' repeated counts taken back.
  const int S = a.seq_length, all = shared_tokens_;
  const int g = std::gcd(a.tokens, S), pieces = a.tokens / g, per_seq = S / g;
  a.seq_length = g;
  aux_counts_.assign_zeros(size_t(all / g) * E);
  ops::moe_aux_loss_counts(ex, aux_counts_.data() + size_t(block()) * pieces * E, logits_.data(),
                           a);
  cp_->all_reduce(aux_counts_.data(), aux_counts_.size());
  const std::vector<double> sums = aux_counts_.host();  // a copy: resized below
  std::vector<double> mine(size_t(pieces) * E, 0.0);
  for (int j = 0; j < pieces; ++j) {
    const int first = (block() * pieces + j) / per_seq * per_seq;  // its sequence's first piece
    for (int i = first; i < first + per_seq; ++i)
      for (int e = 0; e < E; ++e) mine[size_t(j) * E + e] += sums[size_t(i) * E + e];
  }
  aux_counts_.resize(mine.size());
  ops::upload(ex, aux_counts_.data(), mine.data(), mine.size());
  a.shards = per_seq * (cp_->size() / tp_size_);
  a.coeff *= double(pieces) * S / (double(all) * block_size_);
  a.counts = aux_counts_.data();
}

template class MoELayer<float>;
template class MoELayer<double>;
template class MoELayer<bf16>;
template class MoELayer<f16>;

}  // namespace omni
