// One plan: each rank's memory and the step's time, each figure with where it comes from.
#include "train/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "comm/process_grid.h"
#include "parallel/data_parallel.h"
#include "train/flops.h"

namespace omni {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string sfmt(const char* fmt, auto... args) {
  char text[512];
  std::snprintf(text, sizeof text, fmt, args...);
  return text;
}

std::string gib(double bytes) {
  return bytes >= kGiB ? sfmt("%.2f GiB", bytes / kGiB) : sfmt("%.2f MiB", bytes / (1 << 20));
}
// "3.2 TFLOP", "410 GFLOP" (rates: append "/s").
std::string flop(double f) {
  return f >= 1e15   ? sfmt("%.3g PFLOP", f / 1e15)
         : f >= 1e12 ? sfmt("%.3g TFLOP", f / 1e12)
                     : sfmt("%.3g GFLOP", f / 1e9);
}
std::string millions(double n) {
  return n >= 1e9 ? sfmt("%.2f B", n / 1e9) : sfmt("%.1f M", n / 1e6);
}

// Bytes per parameter of this rank's model, gradient and optimizer state. On a GPU, Megatron's
// table (docs/source/api-guide/dist_optimizer.md): fp16 2 + 2 + 16, bf16 2 + 4 (fp32 main
// gradients) + 12, fp32 4 + 4 + 8, the last term divided among the data-parallel ranks by
// the distributed optimizer. On the CPU, omnitron's trainer: float storage for every precision,
// AdamW's two moments (sharded by the distributed optimizer), and with --bf16/--fp16 an fp32
// master copy with its gradients (MixedPrecision), sharded under ZeRO 2 and 3 only. ZeRO 2 and 3
// divide the gradients (3: and the parameters) among the same ranks on either.
struct StateBytes {
  double param, grad, optim;
  std::string param_why, grad_why, optim_why;
};

StateBytes state_bytes(const PlanLayout& l, const PlanDevice& d) {
  const double shards = l.distributed_optimizer ? double(l.dp) * l.cp : 1.0;
  const std::string over =
      l.distributed_optimizer ? sfmt(" / %d (distributed optimizer over DP x CP)", l.dp * l.cp)
                              : std::string(" (no distributed optimizer: every DP rank holds all)");
  const bool mixed = l.precision != "fp32";
  StateBytes s;
  if (d.host_memory) {
    // The CPU's fp32 master (with --bf16/--fp16) keeps the rank's shard under ZeRO 2 and 3.
    const double master = !mixed ? 0 : l.zero_stage >= 2 ? 8 / shards : 8;
    s = {4, 4, 8 / shards + master, "", "", ""};
    s.param_why =
        mixed ? "float storage holding " + l.precision + " values (the CPU backend)" : "fp32";
    s.grad_why = "fp32 gradients, as the CPU backend stores them";
    s.optim_why = "AdamW's two fp32 moments, 8 B" + over +
                  (!mixed              ? ""
                   : l.zero_stage >= 2 ? "; + fp32 master values and gradients, 8 B" + over
                                       : "; + fp32 master values and gradients, 8 B (not sharded)");
  } else if (l.precision == "bf16") {
    s = {2,
         4,
         12 / shards,
         "bf16",
         "fp32 main gradients (Megatron's default with --bf16)",
         "fp32 master, AdamW's two moments: 12 B" + over};
  } else if (l.precision == "fp16") {
    s = {2,      2,      16 / shards,
         "fp16", "fp16", "fp32 gradient copy, master and AdamW's two moments: 16 B" + over};
  } else {
    s = {4, 4, 8 / shards, "fp32", "fp32", "AdamW's two fp32 moments: 8 B" + over};
  }
  // ZeRO 2 and 3 keep 1/(DP x CP) of the gradients (and stage 3 of the parameters) between uses.
  if (l.zero_stage >= 3) {
    s.param /= shards;
    s.param_why += sfmt(" / %d (ZeRO stage 3; + one layer gathered)", l.dp * l.cp);
  }
  if (l.zero_stage >= 2) {
    s.grad /= shards;
    s.grad_why += sfmt(" / %d (ZeRO stage %d; + one layer's before its reduce-scatter)",
                       l.dp * l.cp, l.zero_stage);
  }
  return s;
}

int activation_element_bytes(const PlanLayout& l, const PlanDevice& d) {
  return d.host_memory || l.precision == "fp32" ? 4 : 2;
}

// Ring collectives over `n` ranks moving `bytes` per rank, at `gbps` (one direction).
double all_reduce_seconds(double bytes, int n, double gbps) {
  return n > 1 ? 2.0 * (n - 1) / n * bytes / (gbps * 1e9) : 0.0;
}
double gather_seconds(double bytes, int n, double gbps) {  // all-gather or reduce-scatter
  return n > 1 ? double(n - 1) / n * bytes / (gbps * 1e9) : 0.0;
}

// The link a group uses: within a node when its ranks (the group's span in the rank order
// tp-cp-dp-pp, leftmost fastest, its members `stride` apart) fit in one, else the network. A
// group with k members in each node crosses nodes over k NICs at once (NCCL and RCCL spread
// a ring's channels over the node's NICs), up to the node's own links.
double link_gbps(const PlanDevice& d, int span, int stride, std::string* which) {
  const bool intra = span <= d.ranks_per_node;
  const int k = std::max(1, std::min(span / stride, d.ranks_per_node / stride));
  const double bw = intra ? d.intra_gbps : std::min(d.intra_gbps, k * d.inter_gbps);
  *which = intra   ? sfmt("%.0f GB/s in the node", bw * d.link_efficiency)
           : k > 1 ? sfmt("%.1f GB/s across nodes (%d NICs of the group's node)",
                          bw * d.link_efficiency, k)
                   : sfmt("%.1f GB/s across nodes", bw * d.link_efficiency);
  return bw * d.link_efficiency;
}

int recomputed_layers(const PlanLayout& l, const std::vector<LayerRange>& chunks) {
  int n = 0;
  for (const LayerRange& r : chunks)
    for (int i = 0; i < r.size(); ++i) n += plan_layer_recomputed(l, i);
  return n;
}

// Megatron's matrix products and memory-bound passes of one layer for one micro-batch on one
// rank, on a GPU: the efficiency of each product by its size (the device's curve), and the
// bytes that the elementwise kernels and a materialised attention move.
struct LayerCost {
  bool flat = true;  // one fraction of peak, no traffic (the CPU, --compute-efficiency)
  double gemm_eff = 1, logits_eff = 1;
  double elementwise_fwd = 0, scores_fwd = 0, scores_bwd = 0;  // bytes
  std::string gemm_why, traffic_why;
};

double curve_efficiency(const PlanDevice& d, double flops) {
  for (const auto& [gflop, eff] : d.gemm_efficiency)
    if (flops >= gflop * 1e9) return eff;
  return d.gemm_efficiency.back().second;
}

bool materialised_attention(const PlanLayout& l) {
  return l.attention_backend == "local" || l.attention_backend == "unfused";
}

// One matrix product of a layer on one rank: `flops` executed, `counted` of them in the model's
// FLOP count (flops.h): less for products every TP rank repeats (MLA's down-projections, the
// router) or rows padded to the experts' capacity.
struct Product {
  double flops, counted;
  double times = 1;  // how many such products (an MoE layer's experts)
};

// The forward products of one micro-batch on one rank (the backward's have the same shapes),
// per kind of layer: attention (MLA's or grouped-query), a dense MLP, an MoE layer.
std::vector<Product> attention_products(const TransformerConfig& c, const PlanLayout& l) {
  const double N = double(l.micro_batch) * c.seq_length / l.cp, h = c.hidden_size;
  const double heads = c.num_attention_heads / l.tp, tp = l.tp;
  const double scores = double(l.micro_batch) * heads * (c.seq_length / l.cp) * c.seq_length;
  if (c.multi_latent_attention) {
    // The down-projections and latent norms are replicated over TP (model/mla.h): each rank
    // computes the whole product, of which the model counts 1/TP.
    const double qk = c.qk_head_dim, pe = c.qk_pos_emb_head_dim, v = c.v_head_dim;
    std::vector<Product> f;
    if (c.q_lora_rank > 0) {
      f.push_back({2 * N * h * c.q_lora_rank, 2 * N * h * c.q_lora_rank / tp});
      f.push_back(
          {2 * N * c.q_lora_rank * heads * (qk + pe), 2 * N * c.q_lora_rank * heads * (qk + pe)});
    } else {
      f.push_back({2 * N * h * heads * (qk + pe), 2 * N * h * heads * (qk + pe)});
    }
    const double down = 2 * N * h * (c.kv_lora_rank + pe);
    f.push_back({down, down / tp});
    const double up = 2 * N * c.kv_lora_rank * heads * (qk + v);
    f.push_back({up, up});
    f.push_back({2 * N * heads * v * h, 2 * N * heads * v * h});
    f.push_back({2 * scores * (qk + pe), 2 * scores * (qk + pe)});
    f.push_back({2 * scores * v, 2 * scores * v});
    return f;
  }
  const double Hd = heads * c.head_dim(), Gd = double(c.query_groups() / l.tp) * c.head_dim();
  const double qkv = 2 * N * h * (Hd + 2 * Gd), proj = 2 * N * Hd * h;
  const double core = 2 * scores * c.head_dim();
  return {{qkv, qkv}, {proj, proj}, {core, core}, {core, core}};
}

// fc1 (twice as wide under SwiGLU) and fc2 of `rows` tokens through an MLP `width` wide.
void mlp_products(std::vector<Product>& f, const TransformerConfig& c, double rows, double width,
                  double counted_share, double times = 1) {
  const double fc1 = 2 * rows * c.hidden_size * width * (c.swiglu ? 2 : 1);
  const double fc2 = 2 * rows * width * c.hidden_size;
  f.push_back({fc1, fc1 * counted_share, times});
  f.push_back({fc2, fc2 * counted_share, times});
}

// An MoE layer: the router (every TP rank scores all b s/CP tokens, its block's TP/ETP-th
// under ETP < TP, its own 1/TP under ETP > TP; flops.h leaves it out), each of this rank's
// E/EP experts on its rows -- top-k x routed tokens / E from each of the EP ranks when
// dropless (the expected share), its capacity from each with padding, from each of the ETP
// ranks under ETP > TP -- 1/ETP of the experts' width, and the shared expert 1/TP wide on
// every token.
std::vector<Product> moe_products(const TransformerConfig& c, const PlanLayout& l,
                                  double* rows_total) {
  const double N = double(l.micro_batch) * c.seq_length / l.cp;
  const double Nr = N / l.routing_blocks();  // the tokens this rank routes
  const double E = c.num_moe_experts, K = c.moe_router_topk;
  std::vector<Product> f = {{2 * Nr * c.hidden_size * E, 0}};
  // Under ETP > TP the rows of the ETP ranks (ETP/TP dense tensor-parallel groups) meet at
  // each slice: ETP x as many rows, 1/ETP of the width.
  const double X = l.expert_gather();
  double rows = K * Nr / E * l.ep * X, share = 1;
  if (c.moe_expert_capacity_factor > 0 && c.moe_pad_expert_input_to_capacity) {
    const double capacity = std::ceil(Nr * K / E * c.moe_expert_capacity_factor);
    share = std::min(1.0, K * Nr / (E * capacity));
    rows = capacity * l.ep * X;
  }
  const double width = double(c.moe_ffn_size()) / l.expert_tp();
  mlp_products(f, c, rows, width, share, E / l.ep);
  *rows_total = rows * E / l.ep;
  if (c.moe_shared_expert_intermediate_size > 0)
    mlp_products(f, c, N, double(c.moe_shared_expert_intermediate_size) / l.tp, 1);
  return f;
}

LayerCost layer_cost(const TransformerConfig& c, const PlanLayout& l, const PlanDevice& d, int eb) {
  LayerCost k;
  if (d.host_memory || d.gemm_efficiency.empty()) {
    k.gemm_eff = k.logits_eff = l.precision == "bf16" && d.bf16_compute_efficiency > 0
                                    ? d.bf16_compute_efficiency
                                    : d.compute_efficiency;
    return k;
  }
  k.flat = false;
  const double N = double(l.micro_batch) * c.seq_length / l.cp, h = c.hidden_size;
  const double F = double(c.ffn_size()) / l.tp;
  const double heads = c.num_attention_heads / l.tp;
  const double score_elems = double(l.micro_batch) * heads * (c.seq_length / l.cp) * c.seq_length;
  // The model's layers: every one's attention, the dense layers' MLP, the MoE layers'. The
  // efficiency is the counted FLOPs over the products' time at each one's own size, so that
  // many small experts, a small router and products repeated on every TP rank take longer
  // per counted FLOP; the FLOP count itself stays the model's (flops.h).
  int moe_layers = 0;
  if (c.num_moe_experts > 0)
    for (int is_moe : c.moe_layer_pattern()) moe_layers += is_moe != 0;
  const int dense_layers = c.num_layers - moe_layers;
  std::vector<Product> dense_mlp;
  mlp_products(dense_mlp, c, N, F, 1);
  double expert_rows = 0;
  const std::vector<Product> moe =
      moe_layers > 0 ? moe_products(c, l, &expert_rows) : std::vector<Product>{};
  double counted = 0, time = 0, largest = 0, smallest = 0;
  auto add = [&](const std::vector<Product>& f, double layers) {
    if (layers <= 0) return;
    for (const Product& x : f) {
      counted += layers * x.times * x.counted;
      time += layers * x.times * x.flops / curve_efficiency(d, x.flops);
      largest = std::max(largest, x.flops);
      smallest = smallest == 0 ? x.flops : std::min(smallest, x.flops);
    }
  };
  add(attention_products(c, l), c.num_layers);
  add(dense_mlp, dense_layers);
  add(moe, moe_layers);
  k.gemm_eff = counted / time;
  const double logit_f = 2 * N * h * c.padded_vocab_size() / l.tp;
  k.logits_eff = curve_efficiency(d, logit_f);
  k.gemm_why =
      moe_layers > 0 || c.multi_latent_attention
          ? sfmt(
                "counted FLOPs over the time of products of %.3g to %.3g GFLOP per "
                "micro-batch%s%s",
                smallest / 1e9, largest / 1e9,
                c.multi_latent_attention ? ", MLA's down/up projections" : "",
                moe_layers > 0 ? sfmt(", %d expert%s of %.0f rows each", c.num_moe_experts / l.ep,
                                      c.num_moe_experts / l.ep == 1 ? "" : "s",
                                      expert_rows * l.ep / c.num_moe_experts)
                                     .c_str()
                               : "")
          : sfmt("FLOP-weighted over products of up to %.3g GFLOP per micro-batch", largest / 1e9);
  // Elementwise, forward: two norms (read, write), two bias-dropout-adds (read the output and
  // the residual, write; a 1-byte mask with dropout) over N h (N h / TP under SP), the
  // activation over N F' (GELU reads and writes; SwiGLU reads two halves).
  // MoE layers' activation runs over their expert rows and the shared expert's tokens instead.
  const double rows = N * h / (l.sequence_parallel ? l.tp : 1);
  const double act = c.swiglu ? 3 : 2;
  const double moe_act = (expert_rows * c.moe_ffn_size() / l.expert_tp() +
                          N * double(c.moe_shared_expert_intermediate_size) / l.tp) *
                         eb * act;
  k.elementwise_fwd = rows * (10.0 * eb + (c.hidden_dropout > 0 ? 2 : 0)) +
                      (dense_layers * N * F * eb * act + moe_layers * moe_act) / c.num_layers;
  k.traffic_why = "norms, bias-dropout-adds, activation";
  if (materialised_attention(l)) {
    // The QK^T product writes the scores; the fused scale-mask-softmax reads and writes them;
    // dropout reads them and writes its output and a 1-byte mask; the PV product reads it.
    // Backward: the PV product writes dP and reads P for dV; dropout's backward reads dP and
    // the mask and writes; softmax's reads the gradient and P and writes dS; dQ and dK read it.
    const bool drop = c.attention_dropout > 0;
    k.scores_fwd = score_elems * (drop ? 6.0 * eb + 1 : 4.0 * eb);
    k.scores_bwd = score_elems * (drop ? 9.0 * eb + 1 : 7.0 * eb);
    k.traffic_why += sfmt(", the %s score matrix (--attention-backend %s)",
                          millions(score_elems).c_str(), l.attention_backend.c_str());
  }
  return k;
}
// What the activations figure assumes of the MoE layers' expert rows.
std::string moe_rows_note(const TransformerConfig& c, const PlanLayout& l) {
  if (c.num_moe_experts == 0) return "";
  const double N = double(l.micro_batch) * c.seq_length / l.cp / l.routing_blocks();
  const double E = c.num_moe_experts, K = c.moe_router_topk;
  if (c.moe_expert_capacity_factor > 0 && c.moe_pad_expert_input_to_capacity)
    return sfmt("; MoE layers: %.0f expert rows each (%sE x capacity %.0f, exact)",
                l.expert_gather() * E * std::ceil(N * K / E * c.moe_expert_capacity_factor),
                l.expert_gather() > 1 ? sfmt("ETP %d x ", l.expert_gather()).c_str() : "",
                std::ceil(N * K / E * c.moe_expert_capacity_factor));
  const int X = l.expert_gather();
  return sfmt(
      "; MoE layers: %.0f expert rows each (%stop-%d x %.0f tokens%s%s%s)", X * N * K,
      X > 1 ? sfmt("ETP %d ranks' ", X).c_str() : "", c.moe_router_topk, N,
      X > 1 ? (l.tp > 1 ? sfmt(", this rank's own 1/%d", l.tp).c_str() : "")
      : l.routing_blocks() > 1
          ? sfmt(", this rank's block's 1/%d under ETP %d", l.routing_blocks(), l.expert_tp())
                .c_str()
          : "",
      c.moe_expert_capacity_factor > 0 ? ", at most: tokens over capacity are dropped"
                                       : ", dropless",
      l.ep > 1
          ? sfmt(", the mean over EP %d: a rank's peak follows the routing balance", l.ep).c_str()
          : "");
}

}  // namespace

std::string PlanLayout::describe() const {
  std::string s = sfmt("TP %d x CP %d%s x PP %d", tp, cp, ulysses() ? " (Ulysses)" : "", pp);
  if (vp > 1) s += sfmt(" (VPP %d)", vp);
  if (first_stage_layers > 0 || last_stage_layers > 0)
    s += sfmt(" (layers: first stage %s, last %s)",
              first_stage_layers > 0 ? std::to_string(first_stage_layers).c_str() : "even",
              last_stage_layers > 0 ? std::to_string(last_stage_layers).c_str() : "even");
  if (ep > 1) s += sfmt(" (EP %d)", ep);
  if (etp > 0 && etp != tp) s += sfmt(" (ETP %d)", etp);
  s += sfmt(" x DP %d, micro-batch %d, global batch %d (%d micro-batch%s), %s", dp, micro_batch,
            global_batch, micro_batches(), micro_batches() == 1 ? "" : "es", precision.c_str());
  if (sequence_parallel) s += ", SP";
  if (distributed_optimizer)
    s += zero_stage >= 2 ? sfmt(", ZeRO stage %d", zero_stage)
                         : std::string(", distributed optimizer");
  s += recompute.empty() ? ", no recompute" : ", recompute " + recompute;
  if (recompute == "full" && recompute_method == "block")
    s += sfmt(" (block, %d layers)", recompute_num_layers);
  return s;
}

bool Plan::fits() const {
  return memory_bytes() <= device.memory_gib * kGiB;
}

double Plan::tokens_per_second() const {
  return double(layout.global_batch) * model.seq_length / step_seconds();
}

double Plan::model_tflops_per_rank() const {
  return narayanan_flops_per_iteration(model, layout.global_batch) / step_seconds() / layout.gpus /
         1e12;
}

PlanLayout plan_layout(const Options& o, int gpus) {
  PlanLayout l;
  l.gpus = gpus;
  l.tp = o.tensor_model_parallel_size, l.cp = o.context_parallel_size;
  l.cp_comm_type = o.cp_comm_type;
  l.pp = o.pipeline_model_parallel_size;
  l.dp = data_parallel_size(gpus, ParallelLayout{.tp = l.tp, .cp = l.cp, .pp = l.pp});
  l.ep = o.expert_model_parallel_size;
  l.etp = o.model.num_moe_experts > 0 ? o.expert_tensor_parallel_size : 0;
  l.vp = o.num_layers_per_virtual_pipeline_stage > 0
             ? o.model.num_layers / (l.pp * o.num_layers_per_virtual_pipeline_stage)
             : 1;
  l.micro_batch = o.micro_batch_size, l.global_batch = o.global_batch_size;
  l.sequence_parallel = o.sequence_parallel && l.tp > 1;
  l.distributed_optimizer = o.use_distributed_optimizer;
  l.zero_stage = o.zero_stage;
  l.overlap_grad_reduce = o.overlap_grad_reduce;
  l.recompute = o.recompute_granularity, l.recompute_method = o.recompute_method;
  l.recompute_num_layers = o.recompute_num_layers;
  l.first_stage_layers = o.decoder_first_pipeline_num_layers;
  l.last_stage_layers = o.decoder_last_pipeline_num_layers;
  l.precision = o.bf16 ? "bf16" : o.fp16 ? "fp16" : "fp32";
  l.attention_backend = o.attention_backend;
  return l;
}

PlanExpertTraffic plan_expert_traffic(const TransformerConfig& c, const PlanLayout& l, int stage,
                                      int element_bytes, double grad_bytes) {
  PlanExpertTraffic t;
  if (c.num_moe_experts == 0) return t;
  // The stage's MoE layers, and those a full recompute runs forward again.
  const std::vector<int> moe = c.moe_layer_pattern();
  int layers = 0, again = 0;
  for (const LayerRange& r : plan_stage_layers(c, l, stage))
    for (int i = r.begin; i < r.end; ++i) {
      if (!moe[i]) continue;
      ++layers;
      again += plan_layer_recomputed(l, i - r.begin);
    }
  if (stage == l.pp - 1)
    for (int k = 0; k < c.mtp_num_layers; ++k) layers += c.is_moe_layer(c.num_layers + k);
  t.moe_layers = layers;
  const double M = l.micro_batches(), eb = element_bytes, rb = eb == 2 ? 4 : eb;
  const double Nr = double(l.micro_batch) * c.seq_length / l.cp / l.routing_blocks();
  const double E = c.num_moe_experts, K = c.moe_router_topk, C = c.hidden_size;
  // This rank's (token, k) rows: top-k x its tokens dropless (the experts' rows after the EP
  // exchange are as many on average), E x capacity padded.
  double own = K * Nr;
  if (c.moe_expert_capacity_factor > 0 && c.moe_pad_expert_input_to_capacity)
    own = E * std::ceil(Nr * K / E * c.moe_expert_capacity_factor);
  const int X = l.expert_gather();
  t.gather_ranks = l.ep * X;
  const bool allgather = c.moe_token_dispatcher_type == "allgather";
  const double passes = M * layers, forwards_again = M * again;
  if (allgather && t.gather_ranks > 1) {
    // Forward: the routing (token count, probabilities, indices in the router's type) and
    // the tokens all-gathered, the outputs reduce-scattered; backward: the output gradients
    // gathered, the input gradients and the probabilities' reduce-scattered.
    const double g = t.gather_ranks - 1;
    const double fwd = g * ((1 + 2 * Nr * K) * rb + 2 * Nr * C * eb);
    const double bwd = g * (2 * Nr * C + Nr * K) * eb;
    t.gather = passes * (fwd + bwd) + forwards_again * fwd;
  } else {
    if (l.ep > 1)  // dispatch and combine, forward and backward
      t.ep = (4 * passes + 2 * forwards_again) * double(l.ep - 1) / l.ep * own * C * eb;
    if (X > 1) {
      // ExpertTensorExchange: the counts of the E/EP local experts (f64) all-gathered, then
      // the rank's rows (those its experts hold after the EP exchange) sent to each other rank
      // by the gather and, summed by slice, received back by the reduce-scatter: ETP - 1
      // sends of its rows' worth each, twice forward, twice backward.
      const double fwd = (X - 1) * (E / l.ep * 8 + 2 * own * C * eb);
      const double bwd = (X - 1) * 2 * own * C * eb;
      t.expert_tp = passes * (fwd + bwd) + forwards_again * fwd;
    }
  }
  // The experts' gradients over their data-parallel group, when they have one of their own.
  const int edp = l.expert_dp();
  if ((l.ep > 1 || l.expert_tp() != l.tp) && edp > 1) {
    const double Pe = double(plan_rank_expert_parameters(c, l, stage));
    t.expert_dp = (l.distributed_optimizer ? 1.0 : 2.0) * (edp - 1) / edp * Pe * grad_bytes;
  }
  return t;
}

double plan_ulysses_bytes(const TransformerConfig& c, const PlanLayout& l, int stage,
                          int element_bytes) {
  if (!l.ulysses()) return 0;
  const std::vector<LayerRange> chunks = plan_stage_layers(c, l, stage);
  int layers = 0;
  for (const LayerRange& r : chunks) layers += r.size();
  if (stage == l.pp - 1) layers += c.mtp_num_layers;  // run as decoder layers, not recomputed
  const int again = recomputed_layers(l, chunks);
  // One pass's four all-to-alls: q [N, H hd], k [N, G hd], v [N, G vd] and the output
  // [N, H vd] (backward: their gradients), (CP-1)/CP of each leaving the rank.
  const double N = double(l.micro_batch) * c.seq_length / l.cp;
  const double H = c.num_attention_heads / l.tp, G = c.query_groups() / l.tp;
  const double hd = c.head_dim(), vd = c.value_head_dim();
  const double pass = double(l.cp - 1) / l.cp * N * (H + G) * (hd + vd) * element_bytes;
  return double(l.micro_batches()) * (2.0 * layers + again) * pass;
}

Plan make_plan(const TransformerConfig& c, const PlanLayout& l, const PlanDevice& d) {
  Plan p;
  p.model = c, p.layout = l, p.device = d;
  const int G = c.query_groups(), F = c.ffn_size();
  OMNI_REQUIRE(G % l.tp == 0,
               c.group_query_attention ? "--num-query-groups (" : "--num-attention-heads (", G,
               ") must be divisible by --tensor-model-parallel-size (", l.tp, ")");
  OMNI_REQUIRE(F % l.tp == 0, "the MLP width (--ffn-hidden-size, ", F,
               ") must be divisible by --tensor-model-parallel-size (", l.tp, ")");
  OMNI_REQUIRE(l.cp == 1 || c.seq_length % (2 * l.cp) == 0, "--seq-length (", c.seq_length,
               ") must be divisible by twice --context-parallel-size (", l.cp, ")");
  // Ulysses gives each tensor- and context-parallel rank whole heads (config/options.cpp's
  // finalize_layout, GPTModel).
  OMNI_REQUIRE(l.cp_comm_type == "p2p" || l.cp_comm_type == "a2a",
               "--cp-comm-type: '", l.cp_comm_type, "' is not one of p2p, a2a");
  OMNI_REQUIRE(!l.ulysses() || (c.num_attention_heads % (l.tp * l.cp) == 0 &&
                                G % (l.tp * l.cp) == 0),
               "--cp-comm-type a2a (Ulysses) splits the heads: --num-attention-heads (",
               c.num_attention_heads, ") and --num-query-groups (", G,
               ") must divide by --tensor-model-parallel-size (", l.tp,
               ") x --context-parallel-size (", l.cp, ")");
  OMNI_REQUIRE(!l.sequence_parallel || (int64_t(l.micro_batch) * c.seq_length / l.cp) % l.tp == 0,
               "--sequence-parallel: the micro-batch's tokens must divide among the ", l.tp,
               " tensor-parallel ranks");
  OMNI_REQUIRE(l.global_batch % (l.micro_batch * l.dp) == 0, "--global-batch-size (",
               l.global_batch, ") must be a positive multiple of --micro-batch-size (",
               l.micro_batch, ") x data-parallel size (", l.dp, ")");
  OMNI_REQUIRE(l.vp == 1 || l.micro_batches() % l.pp == 0,
               "the interleaved schedule needs the micro-batches (", l.micro_batches(),
               ") to be a multiple of --pipeline-model-parallel-size (", l.pp, ")");
  OMNI_REQUIRE(l.ep == 1 || (c.num_moe_experts > 0 && c.num_moe_experts % l.ep == 0),
               "--expert-model-parallel-size (", l.ep, ") must divide --num-experts (",
               c.num_moe_experts, ")");
  // Training's world rule (ProcessGrid): TP x CP x PP and, for the experts' own grid,
  // ETP x EP x PP divide the GPUs; the experts' tensor parallelism as finalize() checks it.
  try {
    data_parallel_size(l.gpus, ParallelLayout{.tp = l.tp,
                                              .cp = l.cp,
                                              .ep = l.ep,
                                              .pp = l.pp,
                                              .etp = c.num_moe_experts > 0 ? l.etp : 0});
  } catch (const UsageError& e) {
    throw UsageError("--gpus " + std::to_string(l.gpus) + ": " + e.what());
  }
  if (c.num_moe_experts > 0)
    check_expert_tensor_parallel(c, l.tp, l.etp, l.sequence_parallel);
  // MoE layers under TP, as `omnitron train` checks them (config/options_moe.cpp, MoELayer).
  OMNI_REQUIRE(c.num_moe_experts == 0 || (c.moe_ffn_size() % l.expert_tp() == 0 &&
                                          c.moe_shared_expert_intermediate_size % l.tp == 0),
               "--moe-ffn-hidden-size (", c.moe_ffn_size(),
               ") and --moe-shared-expert-intermediate-size (",
               c.moe_shared_expert_intermediate_size,
               ") must be divisible by --tensor-model-parallel-size (", l.tp, ")");
  OMNI_REQUIRE(c.mtp_num_layers == 0 || l.pp == 1 ||
                   c.position_embedding_type != PositionEmbedding::LearnedAbsolute,
               "--mtp-num-layers ", c.mtp_num_layers,
               " with --position-embedding-type learned_absolute and "
               "--pipeline-model-parallel-size ",
               l.pp,
               ": training refuses it (the last stage holds no copy of the position "
               "embeddings)");
  const StateBytes sb = state_bytes(l, d);
  const int eb = activation_element_bytes(l, d);
  const int M = l.micro_batches();

  // The routed experts' optimizer states are sharded over the expert-data-parallel group
  // (gpus / (ETP x EP x PP) ranks) instead of DP x CP: what that adds per expert parameter.
  const int edp = c.num_moe_experts > 0 ? l.expert_dp() : l.dp * l.cp;
  const bool own_edp = edp != l.dp * l.cp;  // the experts' group differs from the dense one
  const double expert_extra =
      l.distributed_optimizer && own_edp
          ? (d.host_memory ? 8.0 / (l.dp * l.cp) : sb.optim) * (double(l.dp) * l.cp / edp - 1)
          : 0.0;
  // ZeRO 2 and 3 shard the experts' gradients (3: values too) over that group as well.
  const double edp_ratio = own_edp ? double(l.dp) * l.cp / edp - 1 : 0.0;
  const double expert_grad_extra = l.zero_stage >= 2 ? sb.grad * edp_ratio : 0.0;
  const double expert_param_extra = l.zero_stage >= 3 ? sb.param * edp_ratio : 0.0;
  auto over_edp = [&](double extra, double experts) {
    return extra != 0 && experts > 0
               ? sfmt("; the experts' %s over the %d expert-data-parallel ranks",
                      millions(experts).c_str(), edp)
               : std::string();
  };
  // Memory: the pipeline rank that needs the most.
  double best = -1;
  for (int stage = 0; stage < l.pp; ++stage) {
    const double params = double(plan_rank_parameters(c, l, stage));
    const double total = params * (sb.param + sb.grad + sb.optim) +
                         double(plan_rank_expert_parameters(c, l, stage)) *
                             (expert_extra + expert_grad_extra + expert_param_extra) +
                         double(plan_activation_bytes(c, l, stage, eb)) +
                         double(plan_workspace_bytes(c, l, stage, eb, d.host_memory));
    if (total > best) best = total, p.stage = stage;
  }
  const int s = p.stage;
  const double P = double(plan_rank_parameters(c, l, s));
  const std::vector<LayerRange> chunks = plan_stage_layers(c, l, s);
  int layers = 0;
  for (const LayerRange& r : chunks) layers += r.size();
  const bool last = s == l.pp - 1, mtp = last && c.mtp_num_layers > 0;
  const std::string where = sfmt(
      "%d layers%s%s%s", layers, s == 0 ? " + embedding" : "",
      last ? (c.untie_embeddings_and_output_weights ? " + output layer" : " + final norm") : "",
      mtp ? sfmt(" + %d MTP depth%s%s", c.mtp_num_layers, c.mtp_num_layers == 1 ? "" : "s",
                 s > 0 ? " and their embedding copy" : "")
                .c_str()
          : "");
  auto mem = [&](std::string name, double v, std::string why, std::string formula) {
    p.memory.push_back({std::move(name), v, std::move(why), std::move(formula)});
  };
  const double Pe = double(plan_rank_expert_parameters(c, l, s));
  mem("parameters", P * sb.param + Pe * expert_param_extra,
      sfmt("%s parameters x %g B (%s): 1/TP %d of each matrix, %s%s", millions(P).c_str(), sb.param,
           sb.param_why.c_str(), l.tp, where.c_str(), over_edp(expert_param_extra, Pe).c_str()),
      "P_rank x bytes(param); P_rank = the stage's layers x (QKV + proj + fc1 + fc2)/TP + norms "
      "(+ vocab/TP x h on the first/last stage)");
  mem("gradients", P * sb.grad + Pe * expert_grad_extra,
      sfmt("%s x %g B (%s%s)", millions(P).c_str(), sb.grad, sb.grad_why.c_str(),
           over_edp(expert_grad_extra, Pe).c_str()),
      "P_rank x bytes(grad)");
  mem("optimizer", P * sb.optim + Pe * expert_extra,
      sfmt(
          "%s x %.3g B: %s%s", millions(P).c_str(), sb.optim, sb.optim_why.c_str(),
          Pe > 0 && own_edp
              ? sfmt("; the experts' %s (E/EP %d of %d%s) over the %d expert-data-parallel "
                     "ranks%s",
                     millions(Pe).c_str(), c.num_moe_experts / l.ep, c.num_moe_experts,
                     l.expert_tp() != l.tp ? sfmt(", 1/ETP %d wide", l.expert_tp()).c_str() : "",
                     edp, l.distributed_optimizer ? "" : " (not sharded: no distributed optimizer)")
                    .c_str()
              : ""),
      "P_rank x (state bytes / (DP x CP) with --use-distributed-optimizer)");
  const std::vector<int> slots = plan_slots_in_flight(l, s);
  const double act = double(plan_activation_bytes(c, l, s, eb));
  std::string flight;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (k) flight += '+';
    flight += std::to_string(slots[k]);
  }
  const int rc = recomputed_layers(l, chunks);
  mem("activations", act,
      sfmt("%d layers' kept tensors x %s micro-batch%s in flight (%s%s), %d B each%s%s", layers,
           flight.c_str(), flight == "1" ? "" : "es",
           l.pp == 1   ? "no pipeline"
           : l.vp == 1 ? sfmt("1F1B on stage %d: min(PP - stage, M)", s).c_str()
                       : "interleaved 1F1B warm-up",
           l.pp == 1 ? "" : ", counted in the trainer's schedule", eb,
           rc ? sfmt("; %d of them recomputed keep only their input", rc).c_str() : "",
           l.sequence_parallel ? "; SP: norms and residuals 1/TP" : "") +
          (l.ulysses()  ? "; Ulysses: q, k, v and output of H/CP heads over the whole sequence"
           : l.cp > 1 ? "; ring: every CP rank's keys and values"
                      : "") +
          moe_rows_note(c, l),
      "per layer and micro-batch: N(4 C' + 2 + Hd + Gd + Gv + H + Hv + C' + F' + F) with N = b "
      "s/CP tokens, C' = C/TP under SP, H, G, F per TP rank, d the query/key and v the value "
      "head width (per-row statistics in float under 16-bit storage); CP > 1 adds the ring's "
      "gathered keys and values CP N G (d + v), or Ulysses' whole-sequence q, k, v and output "
      "of H/CP heads N (H + G)(d + v); MLA adds the latents "
      "N(q_lora + kv_lora + rope + kv_lora) (their norms' copies), the up-projected N H (qk + v) "
      "and the rope key; an MoE layer adds its routing "
      "(2 N E + N k router floats), the expert rows (expected k N dropless, E x capacity padded; "
      "each 2C + F_e'/ETP (x2 SwiGLU) + F_e/ETP) and the shared expert's N (F_s' + F_s + C)/TP, "
      "every TP rank routing all N tokens (EP allgather: + EP N (C + k) gathered); x "
      "micro-batches in flight; recomputed layers keep N C' + one scratch layer");
  mem("workspace", double(plan_workspace_bytes(c, l, s, eb, d.host_memory)),
      sfmt("the model's scratch for one micro-batch (QKV, gradients of the layer in flight)%s%s%s",
           l.ulysses() ? " + Ulysses' exchange blocks and whole-sequence gradients"
           : l.cp > 1  ? " + the ring's blocks in flight"
                       : "",
           last ? " + final norm per micro-batch in flight" : "",
           mtp ? " + the MTP depths' activations" : ""),
      "N((H+2G)d + 2C + F + F' + H(d+v) + G(d+v)) + 2 N C' + N float losses + 20 N B of staged "
      "ids per micro-batch in flight + the rope tables (2 s rot/2 floats on a GPU, doubles on "
      "the CPU); qk-layernorm adds N (H + G) d, MLA its scratch gradients, MoE the layers' shared "
      "backward scratch, the last stage its final norm per micro-batch in flight; the CP ring "
      "N H (d + v) + 3 N G (d + v) + N H floats + 8 N B of key bounds; Ulysses its send and "
      "receive blocks 2 N H max(d, v), the whole sequence's gradients N (H + G)(d + v) and "
      "8 N CP B of gathered first keys");
  double comm = 0;
  std::string comm_why;
  if (l.pp > 1) {
    const double rows =
        double(l.micro_batch) * c.seq_length / l.cp / (l.sequence_parallel ? l.tp : 1);
    comm += 4 * rows * c.hidden_size * eb;
    comm_why = "pipeline send/receive buffers, 4 x [rows, hidden]";
  }
  // On the CPU: the distributed optimizer reduce-scatters into a buffer of its own shard
  // (DataParallelBuckets; Megatron's reduces inside its gradient buffer), and MPI's
  // non-blocking collectives copy each bucket they reduce; every bucket's request is started
  // before the step waits for any, so the copies add up to the whole gradient (measured: DP 2,
  // CP 2 and the distributed optimizer's runs peak 60-83 MiB above the plan with one bucket of
  // 10 MiB counted, at a gradient of 81 MiB; one bucket of the whole gradient peaks the same).
  // ZeRO 2/3 (buckets closed at each layer) keep the one bucket counted before: not measured.
  if (d.host_memory && l.dp * l.cp > 1) {
    const double bucket = std::min(P, double(default_bucket_size(int64_t(P), l.dp * l.cp))) * 4;
    const double copies = l.zero_stage >= 2 ? bucket : P * 4;
    comm += copies;
    if (l.distributed_optimizer && l.zero_stage < 2) comm += P / (l.dp * l.cp) * 4;
    comm_why += sfmt(
        "%sMPI's copies of %s (%s)%s", comm_why.empty() ? "" : "; ",
        l.zero_stage >= 2 ? "one gradient bucket" : "every gradient bucket", gib(copies).c_str(),
        l.distributed_optimizer ? "; this rank's reduce-scattered gradient shard" : "");
  }
  mem("comm buffers", comm,
      comm_why.empty() ? "none: no pipeline, gradients reduced in place" : comm_why,
      "PP: 4 x rows x hidden x bytes; on the CPU with DP x CP > 1, P_rank x 4 B (ZeRO 2/3: "
      "min(P_rank, bucket) x 4 B) (+ P_rank/(DP x CP) x 4 B with the distributed optimizer)");
  // The CPU's: `omnitron train` of a one-layer model of hidden size 16 peaks at 64 MiB of RSS.
  const double reserve = d.host_memory ? 64.0 * (1 << 20) : 2.0 * kGiB;
  mem("runtime", reserve,
      d.host_memory ? "the program, its libraries, threads and data (a one-layer model's peak RSS)"
                    : "CUDA/HIP context, NCCL/RCCL and the allocator's fragmentation (assumed)",
      "a fixed allowance");
  double total = 0;
  for (const PlanFigure& f : p.memory) total += f.value;
  mem("total", total,
      sfmt("of %s on %s (%s)", gib(d.memory_gib * kGiB).c_str(), d.name.c_str(),
           total <= d.memory_gib * kGiB ? "fits" : "does not fit"),
      "sum of the above");

  // Time: the slowest stage's compute, exposed communication, the bubble, the optimizer.
  const double V = c.padded_vocab_size();
  const double flops = narayanan_flops_per_iteration(c, l.global_batch);
  const double logits = 6.0 * l.global_batch * double(c.seq_length) * c.hidden_size * V;
  const double per_layer = (flops - logits) / c.num_layers;
  const bool fp32_products = l.precision == "fp32" || (d.host_memory && l.precision == "fp16");
  const double peak = (fp32_products ? d.fp32_tflops : d.bf16_tflops) * 1e12;
  const double split = double(l.tp) * l.cp * l.dp;
  const LayerCost lc = layer_cost(c, l, d, eb);
  const double hbm = d.hbm_gbps * 1e9 * d.hbm_efficiency;
  // One layer over the step's micro-batches on one rank: its matrix products and its memory
  // traffic (forward, backward), and what a recomputed forward adds.
  const double layer_s = per_layer / split / (peak * lc.gemm_eff) +
                         M * (3 * lc.elementwise_fwd + lc.scores_fwd + lc.scores_bwd) / hbm;
  const double recompute_s =
      per_layer / split / 3 / (peak * lc.gemm_eff) + M * (lc.elementwise_fwd + lc.scores_fwd) / hbm;
  const double logits_s = logits / split / (peak * lc.logits_eff);
  double t_compute = 0, slowest = 0, t_all_stages = 0;
  int slow_stage = 0, slow_layers = 0, slow_rc = 0;
  for (int stage = 0; stage < l.pp; ++stage) {
    const std::vector<LayerRange> ch = plan_stage_layers(c, l, stage);
    int n = 0;
    for (const LayerRange& r : ch) n += r.size();
    const int rcs = recomputed_layers(l, ch);
    const bool last = stage == l.pp - 1;
    const double t = n * layer_s + rcs * recompute_s + (last ? logits_s : 0);
    t_all_stages += t;
    if (t > t_compute) {
      t_compute = t, slow_stage = stage, slow_layers = n, slow_rc = rcs;
      slowest = (per_layer * (n + rcs / 3.0) + (last ? logits : 0)) / split;
    }
  }
  const double traffic =
      M * (slow_layers * (3 * lc.elementwise_fwd + lc.scores_fwd + lc.scores_bwd) +
           slow_rc * (lc.elementwise_fwd + lc.scores_fwd));
  auto tim = [&](std::string name, double v, std::string why, std::string formula) {
    p.time.push_back({std::move(name), v, std::move(why), std::move(formula)});
  };
  const std::string stage_what =
      sfmt("%s on stage %d (%d layers%s%s)", flop(slowest).c_str(), slow_stage, slow_layers,
           slow_rc ? sfmt(", %d recomputed", slow_rc).c_str() : "",
           slow_stage == l.pp - 1 ? " + logits" : "");
  tim("compute", t_compute,
      lc.flat ? sfmt("%s at %.0f%% of %s/s %s", stage_what.c_str(), 100 * lc.gemm_eff,
                     flop(peak).c_str(), l.precision.c_str())
              : sfmt("%s at %.0f%% of %s/s %s (%s); + %s of memory-bound traffic (%s) at %.0f "
                     "GB/s",
                     stage_what.c_str(), 100 * lc.gemm_eff, flop(peak).c_str(), l.precision.c_str(),
                     lc.gemm_why.c_str(), gib(traffic).c_str(), lc.traffic_why.c_str(), hbm / 1e9),
      "Megatron's 24 B s h^2 L (1 + G/H + s/h + F'/h) + 6 B s h V split over TP x CP x DP, x 4/3 "
      "for recomputed layers, at the matrix products' efficiency (GPUs: by each product's GFLOP "
      "per micro-batch, FLOP-weighted; CPU: one measured fraction); GPUs add per layer and "
      "micro-batch the elementwise passes (norms, bias-dropout-adds, activation: forward, x2 "
      "backward, again when recomputed) and, with --attention-backend local/unfused, the b (H/TP) "
      "s^2 score matrix's writes and reads, at the memory bandwidth");
  const double tokens = double(l.micro_batch) * c.seq_length / l.cp;
  // Dropout's masks, where the device draws them outside its matrix products: per layer and
  // micro-batch the causal half of the attention probabilities of this rank's heads and
  // queries, and the attention block's and MLP's outputs (each TP rank all its tokens'
  // unless SP), drawn in the forward, again in the backward and in a recomputed forward.
  const double attn_masks = c.attention_dropout > 0
                                ? tokens * (c.num_attention_heads / l.tp) * (c.seq_length + 1) / 2.0
                                : 0.0;
  const double hidden_masks =
      c.hidden_dropout > 0 ? 2 * tokens * c.hidden_size / (l.sequence_parallel ? l.tp : 1) : 0.0;
  const double masks = double(M) * (2 * slow_layers + slow_rc) * (attn_masks + hidden_masks);
  const bool drops = masks > 0 && d.dropout_gelems > 0;
  tim("dropout", drops ? masks / (d.dropout_gelems * 1e9) : 0.0,
      masks == 0 ? "none: --hidden-dropout and --attention-dropout 0"
      : !drops   ? "fused into the attention and bias-dropout-add kernels: not counted"
                 : sfmt("%.0fM mask elements (%d micro-batches x %d layers%s) at %.2f G/s",
                        masks / 1e6, M, slow_layers,
                      slow_rc ? sfmt(", %d recomputed", slow_rc).c_str() : "", d.dropout_gelems),
      "per layer: b s/CP (H/TP) (s+1)/2 attention probabilities + 2 b s/CP h outputs (/TP under "
      "SP), forward, backward and recomputed forward, at the measured mask rate");
  const double act_bytes = tokens * c.hidden_size * eb;
  std::string tp_link, cp_link, dp_link, pp_link;
  const double tp_bw = link_gbps(d, l.tp, 1, &tp_link);
  const int ar_per_layer = 4 + (slow_rc ? 2 : 0);
  double t_tp =
      double(M) * slow_layers * ar_per_layer * all_reduce_seconds(act_bytes, l.tp, tp_bw);
  // An MoE layer at ETP < TP (with SP) without a shared expert gathers its input and reduces
  // its output over its block of ETP ranks only (model/moe_layer.h, moe_takes_block_rows):
  // its MLP's pairs move b s/CP h x ETP/TP over ETP ranks, nothing at ETP 1; at ETP > TP each
  // rank's routed rows come back whole: nothing over TP.
  const int etp = l.expert_tp();
  std::string block_note;
  if (c.num_moe_experts > 0 && l.sequence_parallel && etp != l.tp &&
      c.moe_shared_expert_intermediate_size == 0) {
    int moe_layers = 0;
    for (int is_moe : c.moe_layer_pattern()) moe_layers += is_moe != 0;
    std::string etp_link;
    const double block =
        etp > 1 && etp < l.tp
            ? all_reduce_seconds(act_bytes * etp / l.tp, etp, link_gbps(d, etp, 1, &etp_link))
            : 0.0;
    const double mlp_pairs = double(M) * slow_layers * moe_layers / c.num_layers * (slow_rc ? 3 : 2);
    t_tp -= mlp_pairs * (all_reduce_seconds(act_bytes, l.tp, tp_bw) - block);
    block_note =
        etp > l.tp ? sfmt("; the MoE layers' MLP pairs: none (ETP %d: each rank's rows whole)", etp)
                   : sfmt("; the MoE layers' MLP pairs over their ETP %d block%s", etp,
                          etp == 1 ? ": none"
                                   : sfmt(" (%s of rows)", gib(act_bytes * etp / l.tp).c_str())
                                         .c_str());
  }
  tim("TP/SP comm", t_tp,
      l.tp == 1
          ? "none: TP 1"
          : sfmt("%d micro-batches x %d layers x %d %s of %s at %s%s", M, slow_layers,
                 ar_per_layer,
                 l.sequence_parallel ? "all-gather+reduce-scatter pairs" : "all-reduces",
                 gib(act_bytes).c_str(), tp_link.c_str(), block_note.c_str()),
      "per layer: 2 forward + 2 backward all-reduces (SP: all-gather + reduce-scatter, the same "
      "bytes) of b s/CP h, + 2 under full recompute; an MoE layer's as the dense MLP's (its "
      "input gathered, its experts' partial outputs reduced), except at ETP != TP without a "
      "shared expert: its MLP's over the ETP block, of ETP/TP of the rows (none at ETP 1), "
      "none at ETP > TP; "
      "ring: 2 (n-1)/n x bytes / bandwidth; not overlapped");
  const double kv_bytes = tokens * (c.query_groups() / l.tp) * c.head_dim() * eb * 2;
  const double cp_bw = link_gbps(d, l.tp * l.cp, l.tp, &cp_link);
  // Ulysses: the blocking all-to-alls of plan_ulysses_bytes (training overlaps none of them
  // with compute), over the same CP group and link as the ring's; on GPUs (where the plan
  // counts memory-bound passes) each exchange's two copies of the whole buffer besides, the
  // packing by destination and the reorder into sequence order (a read and a write each).
  const double a2a_bytes = plan_ulysses_bytes(c, l, slow_stage, eb);
  const double a2a_copies = l.ulysses() && !lc.flat ? 4.0 * a2a_bytes * l.cp / (l.cp - 1) : 0.0;
  const double t_cp = l.ulysses() ? a2a_bytes / (cp_bw * 1e9) + a2a_copies / hbm
                      : l.cp > 1  ? double(M) * slow_layers * (3 + (slow_rc ? 1 : 0)) *
                                       (l.cp - 1) * kv_bytes / (cp_bw * 1e9)
                                  : 0.0;
  const int mtp_layers = slow_stage == l.pp - 1 ? c.mtp_num_layers : 0;
  tim("CP comm", t_cp,
      l.cp == 1 ? "none: CP 1"
      : l.ulysses()
          ? sfmt("Ulysses: %d micro-batches x (%d layers%s x 8%s) all-to-alls of q, k, v, the "
                 "output and their gradients (this rank's b s/CP rows, %s a pass), (CP-1)/CP "
                 "of each leaving the rank: %s sent at %s%s",
                 M, slow_layers + mtp_layers, mtp_layers ? " with MTP" : "",
                 slow_rc ? sfmt(" + %d recomputed x 4", slow_rc).c_str() : "",
                 gib(tokens * (c.num_attention_heads + c.query_groups()) / l.tp *
                     (c.head_dim() + c.value_head_dim()) * eb)
                     .c_str(),
                 gib(a2a_bytes).c_str(), cp_link.c_str(),
                 a2a_copies > 0 ? sfmt("; + %s of packing and reordering copies at %.0f GB/s",
                                       gib(a2a_copies).c_str(), hbm / 1e9)
                                      .c_str()
                                : "")
          : sfmt("ring attention: %d x %d layers x %d passes x (CP-1) blocks of keys and "
                 "values, %s each, at %s",
                 M, slow_layers, 3 + (slow_rc ? 1 : 0), gib(kv_bytes).c_str(), cp_link.c_str()),
      "ring (--cp-comm-type p2p): the forward passes K,V (CP-1) times, the backward K,V and "
      "their gradients; Ulysses (a2a): per layer and micro-batch 4 all-to-alls forward (q, k, v "
      "to heads, the output back) and 4 backward, + 4 per recomputed forward, of b s/CP x "
      "(H + G)/TP x (d + v) x bytes in all, (CP-1)/CP of it sent, and on GPUs 4 x the whole in "
      "copies (pack, reorder: a read and a write each) at the memory bandwidth; counted as "
      "exposed");
  const int dp_group = l.dp * l.cp;
  const double dp_bw = link_gbps(d, l.tp * l.cp * l.dp, l.tp * l.cp, &dp_link);
  // The routed experts' gradients reduce over the expert-data-parallel group instead (each
  // of its members ETP x EP ranks apart in the expert grid's order).
  const double grad_bytes = (P - Pe) * (d.host_memory ? 4.0 : sb.grad);
  const double param_bytes = (P - Pe) * (d.host_memory ? 4.0 : sb.param);
  std::string edp_link;
  const double edp_bw = link_gbps(d, l.gpus / l.pp, l.expert_tp() * l.ep, &edp_link);
  const double egrad = Pe * (d.host_memory ? 4.0 : sb.grad);
  const double eparam = Pe * (d.host_memory ? 4.0 : sb.param);
  const double t_dp_full = l.distributed_optimizer
                               ? gather_seconds(grad_bytes, dp_group, dp_bw) +
                                     gather_seconds(param_bytes, dp_group, dp_bw) +
                                     gather_seconds(egrad, edp, edp_bw) +
                                     gather_seconds(eparam, edp, edp_bw)
                               : all_reduce_seconds(grad_bytes, dp_group, dp_bw) +
                                     all_reduce_seconds(egrad, edp, edp_bw);
  const double backward_one = t_compute / M * 2.0 / 3.0;
  const double t_dp = l.overlap_grad_reduce ? std::max(0.0, t_dp_full - backward_one) : t_dp_full;
  tim("DP grad reduce", t_dp,
      dp_group == 1 && edp == 1
          ? "none: DP x CP 1"
          : sfmt("%s %s of %s over %d ranks at %s%s%s",
                 l.distributed_optimizer ? "reduce-scatter + parameter all-gather" : "all-reduce",
                 "of the gradients", gib(grad_bytes).c_str(), dp_group, dp_link.c_str(),
                 Pe > 0 && own_edp
                     ? sfmt("; the experts' %s over the %d expert-data-parallel ranks at %s",
                            gib(egrad).c_str(), edp, edp_link.c_str())
                           .c_str()
                     : "",
                 l.overlap_grad_reduce ? ", less the last micro-batch's backward it overlaps"
                                       : ", after the backward (no --overlap-grad-reduce)"),
      "ring all-reduce 2 (n-1)/n x bytes / bandwidth, or (n-1)/n each for reduce-scatter and "
      "all-gather; --overlap-grad-reduce hides up to the last backward");
  const double p2p_bytes = act_bytes / (l.sequence_parallel ? l.tp : 1);
  const double pp_bw = link_gbps(d, l.gpus, l.gpus, &pp_link);
  // Megatron 2021's scatter/gather: each TP rank sends 1/TP over its own NIC, the next stage
  // all-gathers the pieces in its node.
  const bool sg = l.scatter_gather_p2p && l.tp > 1 && !l.sequence_parallel;
  std::string tp_intra;
  const double one_p2p = sg ? p2p_bytes / l.tp / (pp_bw * 1e9) +
                                  gather_seconds(p2p_bytes, l.tp, link_gbps(d, 1, 1, &tp_intra))
                            : p2p_bytes / (pp_bw * 1e9);
  const double t_pp = l.pp > 1 ? 2.0 * l.vp * (M + l.pp - 1) * one_p2p : 0.0;
  tim("PP p2p", t_pp,
      l.pp == 1 ? "none: PP 1"
                : sfmt("2 x %d chunk%s x (M + PP - 1 = %d) transfers of %s at %s%s", l.vp,
                       l.vp > 1 ? "s" : "", M + l.pp - 1, gib(p2p_bytes).c_str(), pp_link.c_str(),
                       sg ? sfmt(", scattered over the %d TP ranks' links and all-gathered at %s",
                                 l.tp, tp_intra.c_str())
                                .c_str()
                          : ""),
      "each forward and backward step of the schedule waits for one activation or gradient "
      "of b s/CP h (/TP under SP; with --scatter-gather-p2p 1/TP per link + an all-gather in "
      "the node), not overlapped");
  // The slowest stage waits while the first micro-batch's forward reaches it and the last
  // one's backward leaves the stages before it: one micro-batch (chunk) on every other stage.
  const double t_bubble = (t_all_stages - t_compute) / (l.vp * M);
  tim("bubble", t_bubble,
      l.pp == 1 ? "none: PP 1"
                : sfmt("the other %d stage%s' compute / (VPP x M = %d x %d)", l.pp - 1,
                       l.pp > 2 ? "s" : "", l.vp, M),
      "Narayanan et al. 2021's 1F1B bubble, (p-1)/(v m) of the ideal time when the stages are "
      "equal; with unequal stages (the last one holds the logits) the slowest stage idles for "
      "one micro-batch (one chunk with interleaving) of each other stage");
  const double opt_elems = l.distributed_optimizer ? (P - Pe) / dp_group + Pe / edp : P;
  const double t_opt = opt_elems * 32.0 / (d.hbm_gbps * 1e9);
  tim("optimizer", t_opt,
      sfmt("AdamW over %s parameters, about 32 B read and written each at %.0f GB/s",
           millions(opt_elems).c_str(), d.hbm_gbps),
      "memory-bound: elements x 32 B / memory bandwidth");
  // Expert parallelism: each MoE layer's dispatch and combine, forward and backward (and a
  // recomputed forward's), as plan_expert_traffic counts the bytes. alltoall: the
  // micro-batch's top-k rows, of which (EP-1)/EP leave the rank, over the expert grid's EP
  // group (ETP apart, inside a node's TP ranks with ETP 1 and EP <= TP); allgather: every
  // rank's tokens and routing all-gathered (forward: x, backward: dy) and the outputs (input
  // gradients) reduce-scattered, over the EP ranks, or under ETP > TP the ETP x EP ranks of
  // the expert grid's tp-ep group. Every TP rank moves its whole micro-batch (the MoE layer
  // routes the tokens SP gathered), its block's ETP/TP-th under ETP < TP, its own 1/TP under
  // ETP > TP; the routing's own gather and the output's reduce-scatter over TP (kept under
  // ETP < TP) are in "TP/SP comm".
  const PlanExpertTraffic et = plan_expert_traffic(c, l, slow_stage, eb);
  const int moe_layers = et.moe_layers;
  std::string ep_link, gather_link;
  const double ep_bw = link_gbps(d, l.expert_tp() * l.ep, l.expert_tp(), &ep_link);
  const double gather_bw =
      l.expert_gather() > 1 ? link_gbps(d, et.gather_ranks, 1, &gather_link) : ep_bw;
  if (l.expert_gather() == 1) gather_link = ep_link;
  const bool gathers = c.moe_token_dispatcher_type == "allgather";
  const double rows_bytes = tokens / l.routing_blocks() * c.hidden_size * eb;
  const double t_ep = et.ep / (ep_bw * 1e9) + et.gather / (gather_bw * 1e9);
  tim("EP dispatch", t_ep,
      gathers && et.gather_ranks > 1
          ? sfmt("allgather: %d micro-batches x %d MoE layers, all-gathers/reduce-scatters of %s "
                 "per rank's tokens (and their routing) over %d ranks%s: %s sent at %s",
                 M, moe_layers, gib(rows_bytes).c_str(), et.gather_ranks,
                 l.expert_gather() > 1 ? sfmt(" (ETP %d x EP %d)", l.expert_gather(), l.ep).c_str()
                                       : "",
                 gib(et.gather).c_str(), gather_link.c_str())
      : l.ep == 1 ? "none: EP 1"
                  : sfmt("alltoall: %d micro-batches x %d MoE layers x 4 all-to-alls%s of %s "
                         "(top-%d rows), %d/%d of it leaving the rank: %s sent at %s",
                         M, moe_layers, slow_rc ? " (+2 recomputed)" : "",
                         gib(rows_bytes * c.moe_router_topk).c_str(), c.moe_router_topk,
                         l.ep - 1, l.ep, gib(et.ep).c_str(), ep_link.c_str()),
      "per MoE layer and micro-batch: dispatch and combine, forward and backward (+2 when "
      "recomputed); alltoall: b s/CP x top-k x h x bytes, (EP-1)/EP of it sent; allgather: "
      "all-gather / reduce-scatter of b s/CP x h x bytes per rank (+ the routing), (n-1) x that "
      "sent over its n = EP ranks (ETP x EP under ETP > TP); every TP rank its whole "
      "micro-batch (ETP < TP: its block's ETP/TP of it; ETP > TP: its own 1/TP); not overlapped");
  // Expert tensor parallelism above TP under alltoall: ExpertTensorExchange gathers the
  // experts' rows over the ETP ranks and reduce-scatters the slices' outputs back, forward
  // and backward, over the expert grid's ETP group (consecutive ranks).
  std::string etp_link;
  const double etp_bw = l.expert_gather() > 1 ? link_gbps(d, l.expert_gather(), 1, &etp_link) : 1;
  const double t_etp = et.expert_tp > 0 ? et.expert_tp / (etp_bw * 1e9) : 0.0;
  tim("ETP exchange", t_etp,
      et.expert_tp == 0
          ? (c.num_moe_experts == 0 ? "none: no experts"
             : l.expert_gather() == 1
                 ? sfmt("none: ETP %d within the TP ranks", l.expert_tp())
                 : "none: allgather gathers the tokens over ETP x EP (EP dispatch)")
          : sfmt("%d micro-batches x %d MoE layers x 4 gathers/reduce-scatters%s of the %.0f "
                 "rows at this rank's experts (%s) with %d other ETP rank%s: %s sent at %s",
                 M, moe_layers, slow_rc ? " (+2 recomputed)" : "",
                 tokens / l.routing_blocks() * c.moe_router_topk,
                 gib(tokens / l.routing_blocks() * c.moe_router_topk * c.hidden_size * eb).c_str(),
                 l.expert_gather() - 1, l.expert_gather() == 2 ? "" : "s",
                 gib(et.expert_tp).c_str(), etp_link.c_str()),
      "ETP > TP, alltoall: per MoE layer and micro-batch the rows at this rank's experts "
      "(top-k x b s/(CP TP) dropless, their mean under EP) gathered over the ETP group and the "
      "slices' partial outputs reduce-scattered back, forward and backward (+2 when "
      "recomputed): (ETP-1) x rows x h x bytes each, + the E/EP experts' row counts; not "
      "overlapped");
  double step = 0;
  for (const PlanFigure& f : p.time) step += f.value;
  tim("step", step,
      sfmt("%.0f tokens/s, %s/s per rank (Megatron's count), MFU %.1f%%",
           double(l.global_batch) * c.seq_length / step, flop(flops / step / l.gpus).c_str(),
           100.0 * flops / step / l.gpus / peak),
      "sum of the above");
  return p;
}

}  // namespace omni
