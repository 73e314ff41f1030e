// Megatron's mixture-of-experts flags (its "moe" group and the MoE fields of its transformer
// configuration), with Megatron's defaults, onto TransformerConfig's MoE fields
// (model/moe_layer.h checks them). In the group "model": stored with a checkpoint's weights.
// What is not built (expert tensor parallelism that does not divide TP, other score functions
// and balancing losses) is refused naming the flag.
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/option_rows.h"
#include "optim/optimizer.h"
#include "optim/optimizer_zoo.h"

namespace omni::option_rows {

namespace {

std::vector<std::string> words(const std::string& v) {
  std::istringstream in(v);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Megatron takes one coefficient per load-balancing type; one of each is built.
std::string single(const std::string& flag, const std::string& v) {
  const std::vector<std::string> w = words(v);
  if (w.size() > 1) throw NotBuiltError(flag + " " + v, "several load-balancing losses at once");
  if (w.empty()) throw UsageError(flag + " expects a value");
  return w[0];
}

template <typename E>
OptionDef choice(std::string flag, std::string metavar, std::string help,
                 E TransformerConfig::*field, std::vector<std::pair<std::string, E>> values,
                 std::string not_built_feature = "",
                 std::vector<std::string> not_built_values = {}) {
  auto set = [=](Options& o, const std::string& raw) {
    const std::string v = single(flag, raw);
    for (const auto& [name, value] : values)
      if (v == name) return void(o.model.*field = value);
    for (const std::string& n : not_built_values)
      if (v == n) throw NotBuiltError(flag + " " + v, not_built_feature);
    std::string all;
    for (const auto& [name, value] : values) all += (all.empty() ? "" : ", ") + name;
    for (const std::string& n : not_built_values) all += ", " + n;
    throw UsageError(flag + ": '" + v + "' is not one of " + all);
  };
  auto get = [=](const Options& o) {
    for (const auto& [name, value] : values)
      if (o.model.*field == value) return name;
    return std::string();
  };
  OptionDef d{std::move(flag), std::move(metavar), "model", std::move(help), set, get};
  return d;
}

const char* const kRouterVariants =
    "MoE router variants (fp64 router, forced or biased balancing, quantile balancing, input "
    "jitter)";
const char* const kExpertVariants =
    "MoE expert variants (latent experts, probabilities applied to the input, interleaved GLU, "
    "per-rank capacity)";
const char* const kUpcycling = "MoE upcycling from a dense checkpoint and routing replay";

struct MoEVariant {
  const char *flag, *metavar, *feature;
};
const MoEVariant kMoEVariants[] = {
    {"--moe-router-force-load-balancing", "", kRouterVariants},
    {"--moe-router-force-biased", "X", kRouterVariants},
    {"--moe-input-jitter-eps", "X", kRouterVariants},
    {"--moe-latent-size", "N", kExpertVariants},
    {"--moe-apply-probs-on-input", "", kExpertVariants},
    {"--moe-shared-expert-glu-interleave-size", "N", kExpertVariants},
    {"--moe-mlp-glu-interleave-size", "N", kExpertVariants},
    {"--moe-expert-rank-capacity-factor", "X", kExpertVariants},
    {"--moe-use-upcycling", "", kUpcycling},
    {"--moe-enable-routing-replay", "", kUpcycling},
};

std::string moe_variant_note(const std::string& feature) {
  return "only MoE layers read it, and " + feature +
         " are not built yet (refused with --num-experts)";
}

}  // namespace
}  // namespace omni::option_rows

namespace omni {
int built_expert_tensor_parallel_size(const Options& o) {
  const int etp = o.expert_tensor_parallel_size, tp = o.tensor_model_parallel_size;
  return expert_tensor_parallel_built(tp, etp) ? etp : 0;
}

void check_expert_tensor_parallel(const TransformerConfig& m, int tp, int etp,
                                  bool sequence_parallel) {
  OMNI_REQUIRE(etp >= 0, "--expert-tensor-parallel-size must be positive (got ", etp, ")");
  if (etp == 0 || etp == tp) return;
  // Built: ETP dividing TP > 1 with sequence parallelism (each block of ETP ranks routes
  // its own rows to experts split over it, over the expert grid's expert-parallel group:
  // comm/process_grid.h), and ETP a multiple of TP (sequence parallel under TP > 1: each
  // rank routes its own rows, gathered over the expert tensor-parallel group, which spans
  // data- or context-parallel ranks: model/moe_layer.h). At every ZeRO stage the experts'
  // shards (optimizer states; at stages 2 and 3 their gradients and parameters too) follow the
  // expert grid's data-parallel group (train/expert_grads.h, parallel/zero_sharding.h), at
  // any ETP.
  const std::string what = "--expert-tensor-parallel-size " + std::to_string(etp) +
                           " with --tensor-model-parallel-size " + std::to_string(tp);
  if (!expert_tensor_parallel_built(tp, etp))
    throw NotBuiltError(what,
                        "experts split over a number of ranks that neither divides nor is a "
                        "multiple of --tensor-model-parallel-size");
  OMNI_REQUIRE(m.moe_ffn_size() % etp == 0, "--moe-ffn-hidden-size (", m.moe_ffn_size(),
               ") must be divisible by --expert-tensor-parallel-size (", etp, ")");
  OMNI_REQUIRE(sequence_parallel || tp == 1, what,
               " needs --sequence-parallel (Megatron's MoE under tensor parallelism: each "
               "rank routes its sequence-parallel tokens)");
}
}  // namespace omni

namespace omni::option_rows {

void finalize_moe(Options& o) {
  const int ep = o.expert_model_parallel_size;
  OMNI_REQUIRE(ep >= 1, "--expert-model-parallel-size must be at least 1 (got ", ep, ")");
  OMNI_REQUIRE(ep == 1 || o.model.num_moe_experts > 0, "--expert-model-parallel-size ", ep,
               " needs --num-experts (a dense model has no experts to split)");
  if (o.model.num_moe_experts == 0) return;
  OMNI_REQUIRE(ep == 1 || !o.use_tp_pp_dp_mapping, "--expert-model-parallel-size ", ep,
               " with --use-tp-pp-dp-mapping: not built yet: expert parallelism in the "
               "tp-cp-ep-pp-dp rank order");
  OMNI_REQUIRE(o.model.num_moe_experts % ep == 0, "--num-experts (", o.model.num_moe_experts,
               ") must be divisible by --expert-model-parallel-size (", ep, ")");

  // The variants a dense model may carry, now that they would change the MoE layers.
  for (const MoEVariant& v : kMoEVariants) {
    const std::string tail = " no effect here: " + moe_variant_note(v.feature);
    for (const std::string& n : o.notes)
      if (n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0 &&
          (n.find(std::string(" ") + v.flag + ",") != std::string::npos ||
           n.find(std::string(" ") + v.flag + " ha") != std::string::npos))
        throw NotBuiltError(std::string(v.flag) + " with --num-experts", v.feature);
  }
  const int tp = o.tensor_model_parallel_size;
  check_expert_tensor_parallel(o.model, tp, o.expert_tensor_parallel_size, o.sequence_parallel);
  // A capacity factor where each rank routes its own share of a micro-batch (context
  // parallelism; ETP below TP, each block of ETP ranks its sequence-parallel rows) counts the
  // capacity over that rank's tokens, as Megatron-Core's router does: not a one-rank run's
  // drops. Where the ranks route whole micro-batches (TP = ETP gathers them, ETP above TP, EP,
  // PP) the drops are one rank's.
  const int etp_set = o.expert_tensor_parallel_size;
  if (o.model.moe_expert_capacity_factor > 0 &&
      (o.context_parallel_size > 1 || (etp_set > 0 && etp_set < tp))) {
    std::string layout;
    if (o.context_parallel_size > 1)
      layout = "--context-parallel-size " + std::to_string(o.context_parallel_size);
    if (etp_set > 0 && etp_set < tp)
      layout += (layout.empty() ? "" : " and ") + std::string("--expert-tensor-parallel-size ") +
                std::to_string(etp_set) + " below --tensor-model-parallel-size " +
                std::to_string(tp);
    const std::string note =
        "note: --moe-expert-capacity-factor " + format_number(o.model.moe_expert_capacity_factor) +
        " with " + layout +
        ": each rank counts its capacity over the tokens it routes (its share of each "
        "micro-batch), as Megatron-Core does, so which tokens an expert drops differs from a "
        "one-rank run";
    add_note_once(o.notes, note);
  }
}

void add_moe_options(std::vector<OptionDef>& t) {
  const std::string M = "model";
  t.push_back(number<int>("--num-experts", "N", M,
                          "routed experts of each MoE layer (0: dense MLPs, Megatron's None)",
                          [](Options& o) -> int& { return o.model.num_moe_experts; }));
  t.push_back(text("--moe-layer-freq", "V", M,
                   "which layers are MoE layers: N (every N-th, from layer 0) or a 0/1 list per "
                   "layer, [1,0,1] or ([0]*3+[1]*29)",
                   [](Options& o) -> std::string& { return o.model.moe_layer_freq; }));
  t.push_back(number<int>("--moe-ffn-hidden-size", "N", M,
                          "each expert's MLP width (0: --ffn-hidden-size)",
                          [](Options& o) -> int& { return o.model.moe_ffn_hidden_size; }));
  t.push_back(number<int>("--moe-router-topk", "N", M, "experts each token is routed to",
                          [](Options& o) -> int& { return o.model.moe_router_topk; }));
  t.push_back(choice<MoEScoreFunction>(
      "--moe-router-score-function", "softmax|sigmoid", "the router's scores",
      &TransformerConfig::moe_router_score_function,
      {{"softmax", MoEScoreFunction::Softmax}, {"sigmoid", MoEScoreFunction::Sigmoid}},
      "the sqrtsoftplus router score function", {"sqrtsoftplus"}));
  t.push_back(toggle("--moe-router-pre-softmax", M, "softmax over all experts before the top-k",
                     [](Options& o) -> bool& { return o.model.moe_router_pre_softmax; }));
  t.push_back(number<double>(
      "--moe-router-topk-scaling-factor", "X", M, "scale of the top-k probabilities (0: none)",
      [](Options& o) -> double& { return o.model.moe_router_topk_scaling_factor; }));
  t.push_back(number<int>("--moe-router-num-groups", "N", M,
                          "expert groups for group-limited routing (0: none)",
                          [](Options& o) -> int& { return o.model.moe_router_num_groups; }));
  t.push_back(number<int>("--moe-router-group-topk", "N", M,
                          "groups each token may route into (0: no group limit)",
                          [](Options& o) -> int& { return o.model.moe_router_group_topk; }));
  OptionDef balancing = choice<MoELoadBalancing>(
      "--moe-router-load-balancing-type", "V...", "the load-balancing loss",
      &TransformerConfig::moe_router_load_balancing_type,
      {{"aux_loss", MoELoadBalancing::AuxLoss},
       {"seq_aux_loss", MoELoadBalancing::SeqAuxLoss},
       {"none", MoELoadBalancing::None}},
      "load-balancing types other than aux_loss, seq_aux_loss and none",
      {"sinkhorn", "global_aux_loss"});
  balancing.many = true;
  t.push_back(balancing);
  OptionDef coeff{"--moe-aux-loss-coeff",
                  "X...",
                  M,
                  "weight of the load-balancing loss (0: off)",
                  [](Options& o, const std::string& v) {
                    o.model.moe_aux_loss_coeff = parse_number<double>(
                        "--moe-aux-loss-coeff", single("--moe-aux-loss-coeff", v));
                  },
                  [](const Options& o) { return format_number(o.model.moe_aux_loss_coeff); }};
  coeff.many = true;
  t.push_back(coeff);
  t.push_back(number<double>("--moe-z-loss-coeff", "X", M, "weight of the router z-loss (0: off)",
                             [](Options& o) -> double& { return o.model.moe_z_loss_coeff; }));
  t.push_back(toggle("--moe-router-enable-expert-bias", M,
                     "DeepSeek-V3's aux-loss-free balancing: a per-expert bias on the sigmoid "
                     "scores, updated once per global batch",
                     [](Options& o) -> bool& { return o.model.moe_router_enable_expert_bias; }));
  t.push_back(
      number<double>("--moe-router-bias-update-rate", "X", M, "step of the expert bias's update",
                     [](Options& o) -> double& { return o.model.moe_router_bias_update_rate; }));
  t.push_back(
      number<double>("--moe-expert-capacity-factor", "X", M,
                     "each expert's capacity in tokens, times the mean (0: dropless)",
                     [](Options& o) -> double& { return o.model.moe_expert_capacity_factor; }));
  t.push_back(choice<MoETokenDropPolicy>(
      "--moe-token-drop-policy", "probs|position", "which tokens an over-full expert drops",
      &TransformerConfig::moe_token_drop_policy,
      {{"probs", MoETokenDropPolicy::Probs}, {"position", MoETokenDropPolicy::Position}}));
  t.push_back(toggle("--moe-pad-expert-input-to-capacity", M,
                     "pad every expert's input to its capacity",
                     [](Options& o) -> bool& { return o.model.moe_pad_expert_input_to_capacity; }));
  t.push_back(
      number<int>("--moe-shared-expert-intermediate-size", "N", M,
                  "width of the shared expert every token passes through (0: none)",
                  [](Options& o) -> int& { return o.model.moe_shared_expert_intermediate_size; }));
  t.push_back(toggle("--moe-shared-expert-gate", M, "a sigmoid gate on the shared expert's output",
                     [](Options& o) -> bool& { return o.model.moe_shared_expert_gate; }));
  t.push_back(toggle("--moe-grouped-gemm", M,
                     "the experts as one grouped GEMM (always so here; changes no number)",
                     [](Options& o) -> bool& { return o.model.moe_grouped_gemm; }));
  t.push_back(OptionDef{"--moe-token-dispatcher-type", "allgather|alltoall", M,
                        "how tokens reach their experts' ranks (one rank: the same computation)",
                        [](Options& o, const std::string& v) {
                          if (v == "flex")
                            throw NotBuiltError("--moe-token-dispatcher-type flex",
                                                "the flex token dispatcher (DeepEP, HybridEP)");
                          if (v != "allgather" && v != "alltoall")
                            throw UsageError("--moe-token-dispatcher-type: '" + v +
                                             "' is not one of allgather, alltoall, flex");
                          o.model.moe_token_dispatcher_type = v;
                        },
                        [](const Options& o) { return o.model.moe_token_dispatcher_type; }});
  t.push_back(number<int>("--expert-model-parallel-size", "N", "parallelism",
                          "ranks that split each MoE layer's experts, carved out of the "
                          "data-parallel ranks (each keeps its own micro-batches)",
                          [](Options& o) -> int& { return o.expert_model_parallel_size; }));
  t.push_back(number<int>("--expert-tensor-parallel-size", "N", "parallelism",
                          "ranks that split each expert's width, the experts' own grid "
                          "(default: --tensor-model-parallel-size; a divisor or a multiple of "
                          "it is built too, with --sequence-parallel under TP > 1)",
                          [](Options& o) -> int& { return o.expert_tensor_parallel_size; }));
  // Router and expert variants that change the numbers: Megatron's defaults are accepted;
  // other values of these are refused at once.
  t.push_back(not_built("--moe-router-dtype", "fp32|fp64", "fp32", kRouterVariants));
  t.push_back(not_built("--moe-router-quantile-balancing-ema", "X", "0.0", kRouterVariants));
  t.push_back(not_built("--moe-upcycling-granularity", "N", "1", kUpcycling));
  // These only Megatron's MoE layers read: a dense model ignores them (Primus's dense
  // experiments set some), and finalize_moe refuses them with --num-experts.
  for (const MoEVariant& v : kMoEVariants)
    t.push_back(plumbing(v.flag, v.metavar, moe_variant_note(v.feature)));
}

}  // namespace omni::option_rows
