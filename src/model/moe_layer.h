// MoELayer: Megatron-Core's MoE layer (megatron/core/transformer/moe/moe_layer.py) in place of
// a transformer layer's MLP, with an explicit forward and backward over [tokens, hidden]:
//   router: logits = x W_router^T (+ bias), top-k routing (softmax or sigmoid scores,
//           pre-softmax, scaling, group limits, the aux-loss-free expert bias), the
//           load-balancing loss (aux_loss or seq_aux_loss) and the z-loss;
//   dispatch: the capacity (dropless by default) and the permutation into expert order;
//   experts: fc1 -> GELU or SwiGLU -> fc2 per expert, as one grouped GEMM;
//   combine: each token's expert outputs weighted by its routing probabilities and summed;
//   shared expert: a dense MLP of moe_shared_expert_intermediate_size on every token (times
//           sigmoid(x . gate_weight) with --moe-shared-expert-gate), added to the output.
// Megatron scales an expert's activation by the token's probability before fc2 and adds its
// fc2 bias times the probability; weighting the expert's output in the combine, as here, is
// the same function.
//
// The aux and z losses are not part of y: as Megatron's MoEAuxLossAutoScaler attaches them,
// their gradients enter the backward with the weight `aux_loss_grad_scale` (Megatron sets it
// to the loss scale over the number of micro-batches), and their values are reported for
// logging.
//
// The experts' weights are one [E, ...] tensor each, run as one grouped GEMM (on the CPU a
// gemm per expert's rows) with or without --moe-grouped-gemm, which changes no number;
// Megatron's per-expert tensors (TEGroupedMLP's linear_fc1.weight<i>, SequentialMLP's
// local_experts.<i>) are their slices.
//
// Expert parallelism (parallel/expert_dispatch.h): given the expert-parallel group, this rank
// holds experts [r E/ep, (r+1) E/ep) (the experts' tensors are [E/ep, ...]) and routes its own
// tokens with the whole router; --moe-token-dispatcher-type alltoall or allgather moves their
// rows to the experts' ranks and back. forward and backward are then collective over the group.
//
// On the CPU in float or double (the float64 finite-difference checks), or on a GPU in float,
// bf16 or f16 through the ops' Exec (backend/moe_ops.h; the activations are then device
// memory, the routing plan is built on the host), expert and context parallelism included
// (the rows move through the ep communicator and the balancing losses' counts are summed over
// the cp one, each of which must move the Exec's memory: MPI on the CPU, NCCL/RCCL or the
// emulator's in-process ranks on a GPU).
// With 16-bit storage the router runs in float32, as Megatron-Core's with
// --moe-router-dtype fp32: x and the router's weights are widened for its GEMM, the logits,
// scores, top-k, probabilities and the aux and z losses are float, and the probabilities are
// rounded to the storage type only where they weight the experts' rows; the experts' GEMMs
// run in 16 bits with float accumulation and float parameter gradients (accum_t<T>).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <optional>

#include "backend/moe_ops.h"
#include "comm/communicator.h"
#include "model/moe_buffer.h"
#include "model/transformer_config.h"
#include "parallel/expert_dispatch.h"

namespace omni {

// Throws UsageError naming the flags when the MoE fields of `c` cannot be built, e.g.
// "--moe-router-topk (9) must be between 1 and --num-experts (8)".
void validate_moe_config(const TransformerConfig& c);

// Whether `name` is a routed expert's tensor ("...mlp.experts.linear_fc1.weight"; not the
// router's or the shared expert's): split over the expert-parallel ranks, its gradient
// reduced over the expert-data-parallel group.
bool is_expert_parameter(const std::string& name);

// One MoE layer's parameters (or their gradients): views into the caller's memory, with
// Megatron-Core's names and shapes (E experts, C hidden, F = moe_ffn_size(), F1 = 2F with
// SwiGLU ([gate | up], Megatron's chunk order) else F, Fs the shared expert's width).
// Pointers of absent parameters are null.
template <typename T>
struct MoEParams {
  T* router_weight = nullptr;       // router.weight [E, C]
  T* router_bias = nullptr;         // router.bias [E] (add_bias_linear)
  T* fc1_weight = nullptr;          // experts.linear_fc1.weight [E, F1, C]
  T* fc1_bias = nullptr;            // experts.linear_fc1.bias [E, F1] (add_bias_linear)
  T* fc2_weight = nullptr;          // experts.linear_fc2.weight [E, C, F]
  T* fc2_bias = nullptr;            // experts.linear_fc2.bias [E, C] (add_bias_linear)
  T* shared_fc1_weight = nullptr;   // shared_experts.linear_fc1.weight [Fs1, C]
  T* shared_fc2_weight = nullptr;   // shared_experts.linear_fc2.weight [C, Fs]
  T* shared_gate_weight = nullptr;  // shared_experts.gate_weight [1, C]
};

struct MoEParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements into the flat buffer
  int64_t numel() const;
};
// The layer's parameters in one flat buffer, in the order above (absent ones left out).
std::vector<MoEParamInfo> moe_parameter_layout(const TransformerConfig& c);
int64_t moe_parameter_count(const TransformerConfig& c);
// Views of a flat buffer laid out by moe_parameter_layout.
template <typename T>
MoEParams<T> moe_param_views(T* flat, const TransformerConfig& c);

// What a training forward reports.
struct MoEStats {
  double aux_loss = 0;  // the load-balancing loss, coefficient included (0 when off)
  double z_loss = 0;    // the z-loss, coefficient included (0 when off)
  std::vector<int64_t> tokens_per_expert;  // rows each expert processed
  int64_t dropped = 0;                     // (token, expert) pairs dropped for capacity
};

// Whether an MoE layer whose experts have their own tensor-parallel group of `etp` ranks
// (other than `tp`; sequence parallel under tp > 1) takes, and gives back, only its block's
// rows (MoELayer): with etp != tp and no shared expert.
bool moe_takes_block_rows(const TransformerConfig& c, int tp, int etp);
// The tensor-parallel ranks that route the same rows with etp != tp: the block of etp ranks
// under etp < tp, each rank alone under etp > tp.
inline int moe_routing_block(int tp, int etp) {
  return etp < tp ? etp : 1;
}

template <typename T>
class MoELayer {
 public:
  using Router = accum_t<T>;  // the router's type: float for 16-bit storage

  // `ep`: the expert-parallel group (null or one rank: every expert here); it must outlive
  // the layer. UsageError when its size does not divide the experts. `cp`: the
  // context-parallel group, whose ranks hold the other parts of this rank's sequences (null
  // or one rank: whole sequences): the load-balancing losses' token counts are summed over
  // it, and this rank's aux and z losses are its part of the whole sequences' (Megatron's
  // tp_cp reductions), so the ranks' losses and gradients sum to the one-rank layer's.
  //
  // `tp`: the tensor-parallel group (expert tensor parallelism of the same size, Megatron's
  // default). Every rank routes the micro-batch's whole tokens (x as gathered under sequence
  // parallelism) with the replicated router, and holds 1/tp of each expert's and the shared
  // expert's width (fc1 split by rows, fc2 by columns; the parameters' views are this rank's
  // slices): y and dx are then this rank's parts, for the caller to sum over the group, and
  // so are the router's and the shared gate's gradients (the balancing losses' gradients
  // enter on rank 0 only). `exec`: where the layer runs (x, y and the parameters are its
  // memory; the cp and ep groups must move it).
  //
  // `expert_tp`: the experts' own tensor-parallel group (--expert-tensor-parallel-size; null
  // or of tp's size: the above), of etp ranks dividing tp, consecutive tp ranks (the expert
  // grid's order), under sequence parallelism. Each block of etp tp ranks routes only its
  // sequence-parallel rows (block b = tp rank / etp: rows [b tokens etp/tp,
  // (b+1) tokens etp/tp)) with the replicated router, sends them to the experts' ranks over
  // `ep` (the expert grid's group) and runs its 1/etp of each expert's width (whole experts
  // with ETP 1, Megatron's most used case). Without a shared expert
  // (moe_takes_block_rows) x, y, dx and dy are those rows only: the caller gathers them over
  // expert_tp (ETP 1: the rank's own rows, nothing gathered) and sums y and dx over it, as
  // Megatron-Core moves them. With one, whose width is split over tp and which needs every
  // row, they are the micro-batch's whole rows: y and dx hold the block's part of its rows'
  // results there and zeros in the other rows, plus the shared expert's part in every row,
  // so the caller's sum over tp is the layer's output (the routed rows ride in the shared
  // expert's gather and sum at no extra bytes). `cp` is then the tp x cp group: the
  // balancing losses' counts are summed over it (over etp: a block's ranks count the same
  // rows), each block's loss is its part, and its gradient enters on the block's first rank.
  //
  // `expert_tp` wider than tp (etp a multiple of tp, Megatron-Core's expert tensor-parallel
  // group spanning ranks of several dense data-parallel replicas or cp ranks: whole tp groups
  // of the expert grid's consecutive ranks): every rank routes its own rows (its
  // sequence-parallel rows under tp > 1, the block of one rank above) and holds 1/etp of each
  // local expert's width. Under alltoall its local experts' rows (after the exchange over
  // `ep`) are gathered over expert_tp (ExpertTensorExchange), it runs its slice on all of
  // them and the partial outputs are reduce-scattered back to their ranks; under allgather
  // the tokens are gathered over `expert_tp_ep` (the expert grid's tp x ep group; null:
  // expert_tp, which it is at EP 1) and the weighted outputs reduce-scattered over it.
  // Either way a rank's routed rows come back complete (no sum over tp for them).
  //
  // Linear biases (add_bias_linear) under any of these splits, as Megatron-Core's experts: fc1's
  // bias is split with fc1's rows (this rank's slice, its gradient this slice's), fc2's is
  // whole on every rank and added by each expert's first slice only (tp, block or etp rank 0),
  // so that the summed partial outputs hold it once; every slice's rank computes its whole
  // gradient from the complete output gradients of its rows, the same on every one (the
  // caller counts it once over the expert tensor-parallel ranks and sums it over none).
  explicit MoELayer(const TransformerConfig& config, Communicator* ep = nullptr,
                    Communicator* cp = nullptr, Communicator* tp = nullptr,
                    const ops::Exec& exec = {}, Communicator* expert_tp = nullptr,
                    Communicator* expert_tp_ep = nullptr);

  const TransformerConfig& config() const { return cfg_; }

  // y [tokens, C] from x [tokens, C] (batch-major rows; seq_length: the tokens of one
  // sequence, for seq_aux_loss; with moe_takes_block_rows, x and y hold the block's
  // tokens etp/tp rows of the micro-batch's `tokens`). With `train`, keeps what backward
  // needs (x is read again there and must not change in between), computes the aux and z
  // losses and counts the tokens per expert for the expert bias; `recomputing` (activation
  // recompute running the forward again before its backward) keeps and computes the same but
  // does not count the tokens twice.
  // The backward's temporaries: the layer's own until it shares another's (every MoE layer
  // of a model sharing one set, which must run one at a time).
  using Scratch = MoEScratch<T, Router>;
  const std::shared_ptr<Scratch>& scratch() const { return scratch_; }
  void share_scratch(std::shared_ptr<Scratch> s) { scratch_ = std::move(s); }

  const MoEStats& forward(T* y, const T* x, int tokens, int seq_length, const MoEParams<T>& p,
                          bool train, bool recomputing = false);
  // dx (overwritten) and the parameters' gradients (added into g) of the last training
  // forward, from dy = d loss / d y.
  void backward(T* dx, const T* dy, const MoEParams<T>& p, const MoEParams<Router>& g,
                double aux_loss_grad_scale);

  // The aux-loss-free balancing state (--moe-router-enable-expert-bias): the bias added to
  // the sigmoid scores when choosing experts (a buffer saved with checkpoints, not a
  // parameter), and the routed rows per expert counted since the last update.
  std::vector<Router>& expert_bias() { return expert_bias_; }
  const std::vector<double>& local_tokens_per_expert() const { return local_tokens_; }
  // bias += rate * sign(mean - count) with the global batch's counts (null: this rank's own),
  // then the local counts restart from 0 (Megatron's finalize_model_grads).
  void update_expert_bias(const double* global_tokens_per_expert = nullptr);

  // The last forward's routing: probs and expert indices [tokens, topk], logits [tokens, E]
  // (host copies).
  const std::vector<Router>& probs() const { return probs_.host(); }
  const std::vector<int32_t>& indices() const { return indices_.host(); }
  const std::vector<Router>& logits() const { return logits_.host(); }
  const ops::MoEDispatchPlan& plan() const { return plan_.host(); }
  // Bytes of what the last forward keeps for the backward (routing, the plan, the experts'
  // and the shared expert's rows); the plan (train/plan_memory.cpp) counts it before one.
  int64_t activation_bytes() const;

 private:
  void router_forward(const T* x, const MoEParams<T>& p);
  // The balancing loss's token counts summed over cp_ into aux_counts_ (the whole sequences',
  // or the whole micro-batch's), and `a` made this rank's part of the loss (moe_types.h).
  void sum_aux_counts(ops::MoEAuxLossArgs& a);
  void router_backward(T* dx, const Router* dlogits, const MoEParams<T>& p,
                       const MoEParams<Router>& g);
  // The probabilities in the storage type (probs_ itself, or its rounded copy probs_t_).
  const T* combine_probs();
  T* staging(size_t n);  // the scratch's exchange, n elements
  void shared_expert_forward(T* y, const T* x, const MoEParams<T>& p);
  void shared_expert_backward(T* dx, const T* dy, const MoEParams<T>& p,
                              const MoEParams<Router>& g);

  bool expert_parallel() const { return ep_ && ep_->size() > 1; }
  // The allgather dispatcher's group: ep_, or the expert tp x ep group under etp > tp.
  bool allgather() const {
    return gather_ && gather_->size() > 1 && cfg_.moe_token_dispatcher_type == "allgather";
  }
  // Under etp > tp with alltoall: the experts' rows gathered over etp_ (exchange_).
  bool tensor_exchange() const { return etp_ && !allgather(); }

  TransformerConfig cfg_;
  int E_, C_, F_, F1_, Fs_, Fs1_, K_;
  Communicator* ep_ = nullptr;
  Communicator* cp_ = nullptr;
  int tp_size_ = 1, tp_rank_ = 0;
  // expert_tp of etp != tp ranks: this rank's block of block_size_ tp ranks (etp under
  // etp < tp, 1 above) routes its rows; x, y, dx and dy are those rows only with
  // block_rows_, else whole. etp_: the expert tensor-parallel group under etp > tp.
  bool own_rows_ = false, block_rows_ = false;
  int etp_size_ = 1, block_size_ = 1, block_rank_ = 0;
  bool fc2_bias_here_ = true;  // this rank's slice is each expert's first: it adds fc2's bias
  int block() const { return tp_rank_ / block_size_; }
  Communicator* etp_ = nullptr;
  Communicator* gather_ = nullptr;
  // The shared expert's input: the whole rows (x_ and tokens_ are the routed ones).
  const T* shared_x_ = nullptr;
  int shared_tokens_ = 0;
  ops::Exec exec_;
  int local_experts_ = 0, first_expert_ = 0;  // this rank's experts
  ops::MoERoutingArgs routing_;
  std::vector<Router> expert_bias_;
  MoEBuffer<Router> device_bias_;  // expert_bias_ where the routing reads it
  std::vector<double> local_tokens_;
  MoEStats stats_;

  // Kept from the training forward.
  const T* x_ = nullptr;
  int tokens_ = 0;
  bool trained_ = false;  // the last forward kept its activations
  MoEBuffer<Router> logits_, probs_, aux_dlogits_;
  MoEBuffer<Router> aux_scaled_;  // the GPU backward's scaled copy of aux_dlogits_
  MoEBuffer<double> aux_counts_;  // under cp_: the whole sequences' counts (sum_aux_counts)
  // 16-bit storage: the router's input and weights (then bias) widened to float, and probs_
  // rounded to T for the combine.
  MoEBuffer<Router> x_router_, w_router_;
  MoEBuffer<T> probs_t_;
  MoEBuffer<int32_t> indices_;
  ops::MoEPlan plan_;
  // The experts' rows here (permuted_ in, expert_out_ out) are plan_'s on one rank; under
  // alltoall those the exchange brings (local_out_: the outputs back in plan_'s rows), and
  // under etp > tp every etp rank's of those (exchange_; local_out_ the summed outputs back
  // in plan_'s rows); under allgather gathered_plan_'s over every rank's tokens of gather_
  // (x_all_, probs_all_).
  std::optional<ExpertAllToAll> a2a_;
  std::optional<ExpertTensorExchange> exchange_;  // tensor_exchange()
  ops::MoEPlan gathered_plan_;
  MoEBuffer<T> x_all_, probs_all_;  // probs_all_: combine_probs() gathered
  MoEBuffer<T> local_out_, permuted_, fc1_out_, act_, expert_out_, row_weight_;
  MoEBuffer<T> shared_fc1_out_, shared_act_, shared_out_, shared_gate_;
  std::shared_ptr<Scratch> scratch_;
};

}  // namespace omni
