// The memory half of `omnitron plan`: parameter counts as GPTModel lays them out, the
// activations it keeps per micro-batch, and how many micro-batches the pipeline schedule holds
// at once (parallel/schedules.h, the schedule the trainer runs).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "base/error.h"
#include "model/moe_layer.h"
#include "parallel/schedules.h"
#include "train/plan.h"

namespace omni {

namespace {

PipelineSplit split_of(const TransformerConfig& c, const PlanLayout& l) {
  PipelineSplit s;
  s.num_layers = c.num_layers;
  s.pipeline_model_parallel_size = l.pp;
  s.num_layers_per_virtual_pipeline_stage = l.vp > 1 ? c.num_layers / (l.pp * l.vp) : 0;
  if (l.first_stage_layers > 0) s.decoder_first_pipeline_num_layers = l.first_stage_layers;
  if (l.last_stage_layers > 0) s.decoder_last_pipeline_num_layers = l.last_stage_layers;
  return s;
}

// One micro-batch's sizes on a rank: N tokens (after CP), R rows of the residual stream
// (N/TP under SP), and this rank's heads, groups and MLP columns; hd the query and key head
// width, vd the value's (multi-latent attention: qk + rope and v_head_dim, one group per head).
struct RankShape {
  int64_t N, R, C, hd, vd, H, G, F, fc1_out;
  bool sp;
};

RankShape rank_shape(const TransformerConfig& c, const PlanLayout& l) {
  RankShape r;
  r.sp = l.sequence_parallel && l.tp > 1;
  r.N = int64_t(l.micro_batch) * c.seq_length / l.cp, r.R = r.sp ? r.N / l.tp : r.N;
  r.C = c.hidden_size, r.hd = c.head_dim(), r.vd = c.value_head_dim();
  r.H = c.num_attention_heads / l.tp, r.G = c.query_groups() / l.tp, r.F = c.ffn_size() / l.tp;
  r.fc1_out = c.swiglu ? 2 * r.F : r.F;
  return r;
}

// Per-row statistics (norms' means and reciprocal stds, the attention's log-sum-exp) are the
// model's Grad type: float for 16-bit storage.
int64_t stat_bytes(int element_bytes) {
  return element_bytes == 2 ? 4 : element_bytes;
}

// Bytes one layer keeps for its backward (GPTModel::allocate_layer), per micro-batch. An MoE
// layer keeps the dense MLP's fc1 and activation tensors too (allocate_layer makes them for
// every layer), its routing and experts besides (plan_moe_layer_bytes).
int64_t layer_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes) {
  const auto [N, R, C, hd, vd, H, G, F, fc1_out, sp] = rank_shape(c, l);
  int64_t e = 2 * R * C, stats = 4 * R;       // ln1, ln2; their means and reciprocal stds
  if (sp) e += 2 * N * C;                     // ln1_full, ln2_full: the gathered rows
  e += N * H * hd + N * G * hd + N * G * vd;  // q, k, v
  if (c.qk_layernorm) e += N * H * hd + N * G * hd, stats += 2 * N * H + 2 * N * G;
  if (l.ulysses())  // this rank's H/CP heads over the whole sequence: q_all, out_all, k_all, v_all
    e += N * H * (hd + vd) + N * G * (hd + vd);
  else if (l.cp > 1)
    e += N * l.cp * G * (hd + vd);  // every rank's keys and values (ring attention)
  stats += N * H;                               // log-sum-exp
  e += N * H * vd;                              // attention output
  e += R * C;                                   // residual stream after attention
  e += N * fc1_out + N * F;                     // fc1 and the activation
  return e * element_bytes + stats * stat_bytes(element_bytes) +
         plan_mla_layer_bytes(c, l, element_bytes);
}

// The expected rows at a rank's experts and this rank's own (token, k) rows per MoE layer and
// micro-batch of N tokens: top-k x N dropless (each rank's experts receive that on average
// under EP), E x capacity when padded to capacity (exact on every rank).
struct MoERows {
  int64_t expert, own;
};

MoERows moe_rows(const TransformerConfig& c, int64_t N) {
  const int64_t E = c.num_moe_experts, K = c.moe_router_topk;
  if (c.moe_expert_capacity_factor > 0 && c.moe_pad_expert_input_to_capacity) {
    const int64_t cap = int64_t(std::ceil(double(N) * K / E * c.moe_expert_capacity_factor));
    return {E * cap, E * cap};
  }
  return {N * K, N * K};  // dropping without padding keeps at most this
}

// Elements of one MoE tensor on a rank (GPTModel::add_moe_parameters): the experts' split over
// the EP ranks; each expert's fc1 rows (and fc1 biases) and fc2 columns over the ETP ranks
// (expert_tp()), the shared expert's over TP, as the dense MLP's; the router, the
// gate and the experts' fc2 biases whole.
int64_t moe_rank_numel(const MoEParamInfo& p, const PlanLayout& l) {
  auto ends = [&](const char* tail) {
    const std::string t = tail;
    return p.name.size() >= t.size() && p.name.compare(p.name.size() - t.size(), t.size(), t) == 0;
  };
  const bool expert = is_expert_parameter(p.name);
  int64_t n = expert ? p.numel() / l.ep : p.numel();
  if (expert)  // the routed experts' width over the expert-tensor-parallel ranks
    return ends("linear_fc1.weight") || ends("linear_fc1.bias") || ends("linear_fc2.weight")
               ? n / l.expert_tp()
               : n;
  const bool split =
      ends("shared_experts.linear_fc1.weight") || ends("shared_experts.linear_fc2.weight");
  return split ? n / l.tp : n;
}

}  // namespace

// MoELayer::Scratch, one set for the model's MoE layers, each buffer grown to the largest use
// (model/moe_buffer.h): the backward's gradients of the experts' rows, of the shared expert's,
// the exchange's staging, the router's gradients. Under ETP > TP the experts' rows are the
// ETP ranks' gathered (alltoall; the staging of the exchange's reduce-scatter as large), or
// the tokens are gathered over the ETP x EP ranks (allgather).
int64_t plan_moe_scratch_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes) {
  const int64_t eb = element_bytes, rb = eb == 2 ? 4 : eb;
  const int64_t N = int64_t(l.micro_batch) * c.seq_length / l.cp;  // the shared expert's tokens
  const int64_t Nr = N / l.routing_blocks();                       // the routed ones
  const int64_t E = c.num_moe_experts, K = c.moe_router_topk, C = c.hidden_size;
  const int64_t F = c.moe_ffn_size() / l.expert_tp(), F1 = c.swiglu ? 2 * F : F;
  const int64_t Fs = c.moe_shared_expert_intermediate_size / l.tp, Fs1 = c.swiglu ? 2 * Fs : Fs;
  const int64_t X = l.expert_gather(), gathered = int64_t(l.ep) * X;
  const bool allgather = gathered > 1 && c.moe_token_dispatcher_type == "allgather";
  const bool ep = (l.ep > 1 || X > 1) && !allgather;  // alltoall's (and the exchange's) rows
  const MoERows rows = moe_rows(c, Nr);
  const int64_t R = rows.expert * X, all = gathered * Nr;
  int64_t e = std::max({R * C, Fs > 0 ? N * C : 0, allgather ? all * C : 0});  // rows_out
  e += allgather ? R : rows.own;                                               // row_weight
  e += std::max(R * F, N * Fs) + std::max(R * F1, N * Fs1) + R * C + Nr * K;   // act .. probs
  // allgather: the gathered rows' gradients and probabilities'; alltoall: this rank's rows
  // and the exchange's staging.
  e += allgather ? all * C + all * K
       : ep      ? (rows.own + std::max<int64_t>(1, 2 * X - 3) * rows.expert) * C
                 : 0;
  // (ETP > TP under alltoall: `rows` this rank's own; the staging the other ETP ranks' rows and
  // their parts of this rank's but one's: ExpertTensorExchange::staging_rows(), 2 ETP - 3 x
  // this rank's experts' rows.)
  int64_t b = e * eb + Nr * E * rb;                              // + the logits' gradient
  if (eb == 2) b += (Nr * C + (allgather ? all : Nr) * K) * rb;  // the router's float copies
  return b;
}

bool plan_layer_recomputed(const PlanLayout& l, int index_in_chunk) {
  return l.recompute == "full" &&
         (l.recompute_method != "block" || index_in_chunk < l.recompute_num_layers);
}

std::vector<LayerRange> plan_stage_layers(const TransformerConfig& c, const PlanLayout& l,
                                          int stage) {
  return pipeline_rank_layers(split_of(c, l), stage);
}

std::vector<int> plan_slots_in_flight(const PlanLayout& l, int stage) {
  std::vector<int> held(l.vp, 0), most(l.vp, 0);
  const int m = l.micro_batches();
  for (const PipelineOp& op : pipeline_schedule(l.pp, stage, m, l.vp)) {
    int& h = held[op.chunk];
    h += op.pass == PipelinePass::Forward ? 1 : -1;
    most[op.chunk] = std::max(most[op.chunk], h);
  }
  return most;
}

int64_t plan_rank_expert_parameters(const TransformerConfig& c, const PlanLayout& l, int stage) {
  if (c.num_moe_experts == 0) return 0;
  int64_t per_layer = 0;
  for (const MoEParamInfo& p : moe_parameter_layout(c))
    if (is_expert_parameter(p.name)) per_layer += (moe_rank_numel(p, l) + 15) / 16 * 16;
  const std::vector<int> moe = c.moe_layer_pattern();
  int64_t n = 0;
  for (const LayerRange& r : plan_stage_layers(c, l, stage))
    for (int i = r.begin; i < r.end; ++i) n += moe[i] ? per_layer : 0;
  if (stage == l.pp - 1)  // multi-token prediction's MoE layers
    for (int k = 0; k < c.mtp_num_layers; ++k)
      n += c.is_moe_layer(c.num_layers + k) ? per_layer : 0;
  return n;
}

int64_t plan_rank_parameters(const TransformerConfig& c, const PlanLayout& l, int stage) {
  const int64_t tp = l.tp, C = c.hidden_size, hd = c.head_dim(), vd = c.value_head_dim();
  const int64_t H = c.num_attention_heads, G = c.query_groups(), F = c.ffn_size();
  const int64_t qkv_rows = G / tp * (H / G + 2) * hd, Hl = H / tp, Fl = F / tp;
  const int64_t multiple = int64_t(c.make_vocab_size_divisible_by) * tp;
  const int64_t vocab_rows = (c.vocab_size + multiple - 1) / multiple * multiple / tp;
  const bool pre = stage == 0, post = stage == l.pp - 1;
  const bool tied = !c.untie_embeddings_and_output_weights;
  // ParameterSet starts every tensor at a multiple of 16 elements.
  auto tensor = [](int64_t n) { return (n + 15) / 16 * 16; };
  auto norm = [&](int64_t width) { return tensor(width) * (c.norm_has_bias() ? 2 : 1); };
  int64_t n = 0;
  // The last stage's copy of the word embeddings: the classifier's when tied, multi-token
  // prediction's embedding of the shifted tokens (GPTModel::parameter_layout).
  if (pre || (post && (tied || c.mtp_num_layers > 0))) n += tensor(vocab_rows * C);
  if (pre && c.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    n += tensor(int64_t(c.max_positions()) * C);
  const int64_t fc1_rows = c.swiglu ? 2 * Fl : Fl;
  int64_t layer = 2 * norm(C) + tensor(C * Hl * vd) + tensor(fc1_rows * C) + tensor(C * Fl);
  if (c.multi_latent_attention) {  // GPTModel::add_mla_parameters: the up-projections split
    const int64_t qk = c.qk_head_dim, pe = c.qk_pos_emb_head_dim;
    const int64_t ql = c.q_lora_rank, kvl = c.kv_lora_rank;
    if (ql > 0)
      layer += tensor(ql * C) + (c.qk_layernorm ? norm(ql) : 0) + tensor(Hl * (qk + pe) * ql);
    else
      layer += tensor(Hl * (qk + pe) * C);
    layer +=
        tensor((kvl + pe) * C) + (c.qk_layernorm ? norm(kvl) : 0) + tensor(Hl * (qk + vd) * kvl);
  } else {
    layer += tensor(qkv_rows * C);
    if (c.qkv_bias()) layer += tensor(qkv_rows);
    if (c.qk_layernorm) layer += 2 * norm(hd);
  }
  if (c.add_bias_linear) layer += 2 * tensor(C) + tensor(fc1_rows);
  // An MoE layer holds its router and experts (and the expert bias) in place of the MLP.
  int64_t moe_instead = 0;
  if (c.num_moe_experts > 0) {
    // Under expert parallelism the routed experts' tensors hold E/EP experts.
    for (const MoEParamInfo& p : moe_parameter_layout(c))
      moe_instead += tensor(moe_rank_numel(p, l));
    if (c.moe_router_enable_expert_bias) moe_instead += tensor(c.num_moe_experts);
    moe_instead -= tensor(fc1_rows * C) + tensor(C * Fl);
    if (c.add_bias_linear) moe_instead -= tensor(C) + tensor(fc1_rows);
  }
  const std::vector<int> moe = c.moe_layer_pattern();
  for (const LayerRange& r : plan_stage_layers(c, l, stage))
    for (int i = r.begin; i < r.end; ++i) n += layer + (moe[i] ? moe_instead : 0);
  if (post) n += norm(C) + (tied ? 0 : tensor(vocab_rows * C));
  // Multi-token prediction's depths on the last stage (model/mtp.cpp): enorm, hnorm, eh_proj
  // [C, 2C] whole on every rank, a layer of the last decoder layer's kind, final_layernorm.
  if (post)
    for (int k = 0; k < c.mtp_num_layers; ++k)
      n += 3 * norm(C) + tensor(2 * C * C) + layer +
           (c.is_moe_layer(c.num_layers + k) ? moe_instead : 0);
  return n;
}

int64_t plan_mla_layer_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes) {
  if (!c.multi_latent_attention) return 0;
  // GPTModel::allocate_mla: the down-projections and latent norms are replicated over TP (each
  // rank keeps the whole latents of the micro-batch's tokens, also under SP: they are made
  // from the gathered ln1 rows), the up-projection's keys and values are this rank's heads'.
  const int64_t N = int64_t(l.micro_batch) * c.seq_length / l.cp;
  const int64_t H = c.num_attention_heads / l.tp, qk = c.qk_head_dim, vd = c.v_head_dim;
  const int64_t pe = c.qk_pos_emb_head_dim, ql = c.q_lora_rank, kvl = c.kv_lora_rank;
  const bool normed = c.qk_layernorm;
  int64_t e = 0, stats = 0;
  if (ql > 0) e += N * ql + (normed ? N * ql : 0);    // cq (+ normed)
  e += N * (kvl + pe) + N * kvl;                      // ckv, its latent part c
  if (normed) e += N * kvl;                           // cn
  if (normed) stats += (ql > 0 ? 2 * N : 0) + 2 * N;  // the latent norms' means and rstds
  e += N * H * (qk + vd) + N * pe;                    // kv per head, the rope key
  return e * element_bytes + stats * stat_bytes(element_bytes);
}

int64_t plan_moe_layer_bytes(const TransformerConfig& c, const PlanLayout& l, int element_bytes) {
  if (c.num_moe_experts == 0) return 0;
  const int64_t eb = element_bytes, rb = eb == 2 ? 4 : eb, ib = 4;  // storage, router, int32
  // Every TP rank's tokens, for the shared expert; the routed ones: all of them, or under
  // ETP < TP its block's sequence-parallel rows, under ETP > TP its own.
  const int64_t Ns = int64_t(l.micro_batch) * c.seq_length / l.cp;
  const int64_t N = Ns / l.routing_blocks();
  const int64_t E = c.num_moe_experts, K = c.moe_router_topk, C = c.hidden_size;
  const int64_t F = c.moe_ffn_size() / l.expert_tp(), F1 = c.swiglu ? 2 * F : F;
  const int64_t Fs = c.moe_shared_expert_intermediate_size / l.tp, Fs1 = c.swiglu ? 2 * Fs : Fs;
  // Under ETP > TP the experts run the rows of X = ETP ranks: alltoall gathers them over the
  // ETP group (ExpertTensorExchange), allgather the tokens over the ETP x EP ranks.
  const int64_t X = l.expert_gather(), gathered = int64_t(l.ep) * X;
  const bool allgather = gathered > 1 && c.moe_token_dispatcher_type == "allgather";
  const bool returned = (l.ep > 1 || X > 1) && !allgather;  // alltoall's outputs brought back
  MoERows rows = moe_rows(c, N);
  rows.expert *= X;
  // The router: logits, the balancing losses' gradient, probabilities; 16-bit storage keeps
  // its float copies of x and of the router's weights, and the probabilities rounded for the
  // combine (not under allgather, whose gathered probabilities are rounded instead).
  int64_t b = (2 * N * E + N * K) * rb;
  if (eb == 2) {
    b += (N * C + E * C + (c.add_bias_linear ? E : 0)) * rb;
    if (!allgather) b += N * K * eb;
  }
  // The routing plan (int32): indices, expert offsets, each row's token and slot, the tokens'
  // offsets, the tokens' rows (as many as rows, padding included).
  b += (N * K + (E + 1) + 3 * rows.own + (N + 1)) * ib;
  // The experts' rows: input, fc1 output, activation, output; the combine's weights (of the
  // rows the combine reads: this rank's own, or under allgather its experts' of every rank).
  b += rows.expert * (2 * C + F1 + F) * eb + (allgather ? rows.expert : rows.own) * eb;
  if (returned) b += rows.own * C * eb;                         // alltoall: the outputs returned
  if (allgather) b += gathered * N * C * eb + gathered * N * K * eb;  // every rank's tokens, probs
  if (Fs > 0) b += Ns * (Fs1 + Fs + C) * eb + (c.moe_shared_expert_gate ? Ns * eb : 0);
  return b;
}

int64_t plan_activation_bytes(const TransformerConfig& c, const PlanLayout& l, int stage,
                              int element_bytes) {
  const int64_t R = rank_shape(c, l).R;
  const int64_t per_layer = layer_bytes(c, l, element_bytes);
  // An MoE layer keeps its routing and experts' rows besides (model/moe_layer.h).
  const std::vector<int> moe = c.moe_layer_pattern();
  const int64_t per_moe = plan_moe_layer_bytes(c, l, element_bytes);
  const std::vector<LayerRange> chunks = plan_stage_layers(c, l, stage);
  const std::vector<int> slots = plan_slots_in_flight(l, stage);
  int64_t b = 0;
  bool any_recomputed = false, moe_recomputed = false;
  for (size_t k = 0; k < chunks.size(); ++k) {
    // residual streams
    int64_t per_slot = int64_t(chunks[k].size() + 1) * R * c.hidden_size * element_bytes;
    for (int i = 0; i < chunks[k].size(); ++i) {
      const bool is_moe = moe[chunks[k].begin + i] != 0;
      if (plan_layer_recomputed(l, i)) {
        any_recomputed = true;
        moe_recomputed = moe_recomputed || is_moe;
      } else {
        per_slot += per_layer + (is_moe ? per_moe : 0);
      }
    }
    b += slots[k] * per_slot;
  }
  // The scratch layer a recomputed forward refills.
  if (any_recomputed) b += per_layer + (moe_recomputed ? per_moe : 0);
  return b;
}

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
// Table 2, bytes per layer: sbh(34 + 5as/h) with no parallelism; sbh(10 + 24/t + 5as/(ht))
// with tensor parallelism; sbh/t (34 + 5as/h) with sequence parallelism too; selective
// recompute drops the 5as/h term; full recompute keeps 2sbh. Their s, b, h, a, t; context
// parallelism divides s.
double korthikanti_layer_bytes(const TransformerConfig& c, const PlanLayout& l) {
  const double s = double(c.seq_length) / l.cp, b = l.micro_batch, h = c.hidden_size;
  const double a = c.num_attention_heads, t = l.tp;
  if (l.recompute == "full") return 2 * s * b * h / (l.sequence_parallel ? t : 1);
  const double scores = l.recompute == "selective" ? 0 : 5 * a * s / h;
  if (l.sequence_parallel && t > 1) return s * b * h / t * (34 + scores);
  return s * b * h * (10 + 24 / t + scores / t);
}

// Scratch that GPTModel allocates once per model (its constructor's buffers) plus the
// final norm's tensors per micro-batch in flight on the last stage, and the micro-batch's
// staged token ids: what activation_bytes() leaves out. GPTModel::workspace_bytes() counts the
// same tensors (tests/train/test_plan.cpp checks the two agree).
int64_t plan_workspace_bytes(const TransformerConfig& c, const PlanLayout& l, int stage,
                             int element_bytes, bool host_tables) {
  const auto [N, R, C, hd, vd, H, G, F, fc1_out, sp] = rank_shape(c, l);
  // e: elements of the storage type; stats: of the gradient type (per-row statistics, losses,
  // the attention's log-sum-exp); ints: bytes of int32 arrays.
  // qkv, full, d_full, d_resid, d_rows, d_ffn, d_fc1, d_attn, dq, dk, dv; token losses
  int64_t e = N * (H + 2 * G) * hd + 2 * N * C + 2 * R * C + N * F + N * fc1_out + N * H * vd +
              N * H * hd + N * G * hd + N * G * vd;
  int64_t stats = N, ints = 0, tables = 0;
  if (c.qk_layernorm) e += N * H * hd + N * G * hd;  // dq_raw, dk_raw
  if (c.layernorm_zero_centered_gamma) e += 2 * C;   // ones, gamma (w + 1)
  // The rope tables: cos and sin of S x rotary/2 angles, double on the host (CPU), float in a
  // GPU's memory (the host's copies are not the device's).
  if (c.position_embedding_type == PositionEmbedding::Rope)
    tables =
        2 * int64_t(c.seq_length) * int64_t(c.rotary_inv_freq().size()) * (host_tables ? 8 : 4);
  // Ulysses (UlyssesAttention's constructor): one exchange's send and receive blocks, the
  // backward's whole-sequence d(out), d(q), d(k), d(v) of this rank's heads and the gathered
  // first keys (two int32 copies); the ring (RingAttention's): one block's output, dq and
  // log-sum-exp, dk, dv and two key/value gradient accumulators in flight, each row's key
  // bounds (two int32).
  if (l.ulysses())
    e += 2 * N * H * std::max(hd, vd) + N * H * (hd + vd) + N * G * (hd + vd),
        ints += 2 * N * l.cp * 4;
  else if (l.cp > 1)
    e += N * H * (vd + hd) + 3 * N * G * (hd + vd), stats += N * H, ints += 2 * N * 4;
  if (c.multi_latent_attention) {  // gpt_mla.cpp's scratch gradients, made once
    const int64_t ql = c.q_lora_rank, kvl = c.kv_lora_rank, pe = c.qk_pos_emb_head_dim;
    e += (c.q_lora_rank > 0 ? 2 * N * ql : 0) + N * H * (c.qk_head_dim + c.v_head_dim) +
         2 * N * pe + 2 * N * kvl + N * (kvl + pe);
  }
  const std::vector<int> slots = plan_slots_in_flight(l, stage);
  int in_flight = 0;
  for (int s : slots) in_flight += s;
  ints += int64_t(in_flight) * 5 * N * 4;  // each slot's staged tokens, labels, positions, ...
  const bool last = stage == l.pp - 1;
  if (last)  // final_norm, d_final (final_full: all rows under SP); mean and rstd
    e += slots.back() * (2 * R * C + (sp ? N * C : 0)), stats += slots.back() * 2 * R;
  int64_t mtp_bytes = 0;
  bool moe_here = false;
  if (last && c.mtp_num_layers > 0) {  // model/mtp.cpp's MTPState, made once
    e += 5 * N * C;                    // shared scratch: t, d_h0, d_full, d_cat
    for (int k = 0; k < c.mtp_num_layers; ++k) {
      // emb, x, out, h, dh, cat [N, 2C], six norm statistics and the depth's layer
      e += 7 * N * C, stats += 6 * N;
      mtp_bytes += layer_bytes(c, l, element_bytes);
      if (c.is_moe_layer(c.num_layers + k))
        mtp_bytes += plan_moe_layer_bytes(c, l, element_bytes), moe_here = true;
      ints += 4 * N * 4;  // rolled ids, labels, mask, positions
    }
  }
  const std::vector<int> moe = c.moe_layer_pattern();
  for (const LayerRange& r : plan_stage_layers(c, l, stage))
    for (int i = r.begin; i < r.end; ++i) moe_here = moe_here || moe[i];
  return e * element_bytes + stats * stat_bytes(element_bytes) + ints + tables + mtp_bytes +
         (moe_here ? plan_moe_scratch_bytes(c, l, element_bytes) : 0);
}

}  // namespace omni
