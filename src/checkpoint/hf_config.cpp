// config.json <-> omnitron's flags for the Hugging Face architectures of hf_families.h.
//
// Mixture-of-experts fields:
//  - Mixtral: every layer's MLP is routed (num_local_experts, num_experts_per_tok,
//    intermediate_size per expert); the top-k of the softmax over all experts, renormalised,
//    which is Megatron's default router (softmax over the top-k logits).
//  - Qwen2-MoE / Qwen3-MoE: layer i is routed unless it is in mlp_only_layers, and only when
//    (i + 1) % decoder_sparse_step == 0 (--moe-layer-freq as a list); experts of
//    moe_intermediate_size, dense layers of intermediate_size. norm_topk_prob false keeps the
//    top-k of the softmax over all experts unnormalised: Megatron's --moe-router-pre-softmax.
//    Qwen2-MoE adds a shared expert of shared_expert_intermediate_size whose output is scaled
//    by sigmoid(x . shared_expert_gate): --moe-shared-expert-gate.
// The load-balancing coefficient (router_aux_loss_coef) is a training choice, not part of
// the model: it is not read, and written as the model's --moe-aux-loss-coeff.
#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "checkpoint/hf_families.h"
#include "config/options.h"

namespace omni::hf {

namespace {

constexpr FamilyInfo kFamilies[] = {
    {Family::GPT2, "gpt2", "GPT2LMHeadModel", "transformer."},
    {Family::Llama, "llama", "LlamaForCausalLM", "model."},
    {Family::Mistral, "mistral", "MistralForCausalLM", "model."},
    {Family::Qwen2, "qwen2", "Qwen2ForCausalLM", "model."},
    {Family::Qwen3, "qwen3", "Qwen3ForCausalLM", "model."},
    {Family::Mixtral, "mixtral", "MixtralForCausalLM", "model."},
    {Family::Qwen2Moe, "qwen2_moe", "Qwen2MoeForCausalLM", "model."},
    {Family::Qwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM", "model."},
    {Family::DeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM", "model."},
};

// Typed access to config.json's fields; every complaint names the file and the field.
class ConfigReader {
 public:
  ConfigReader(const json::Value& root, std::string path) : root_(root), path_(std::move(path)) {}

  const json::Value* get(const char* field) const {
    const json::Value* v = root_.find(field);
    return v && !v->is_null() ? v : nullptr;
  }
  double number(const char* field) const {
    const json::Value* v = get(field);
    OMNI_REQUIRE(v && v->is_number(), path_, ": field ", field, " should be a number");
    return v->num();
  }
  double number_or(const char* field, double fallback) const {
    return get(field) ? number(field) : fallback;
  }
  int integer(const char* field) const {
    const double d = number(field);
    OMNI_REQUIRE(d >= 1 && d < 2147483648.0 && d == double(int64_t(d)), path_, ": field ", field,
                 " should be a positive integer (got ", format_number(d), ")");
    return int(d);
  }
  int integer_or(const char* field, int fallback) const {
    return get(field) ? integer(field) : fallback;
  }
  bool flag_or(const char* field, bool fallback) const {
    const json::Value* v = get(field);
    if (!v) return fallback;
    OMNI_REQUIRE(v->is_bool(), path_, ": field ", field, " should be true or false");
    return v->boolean();
  }
  std::string text_or(const char* field, const std::string& fallback) const {
    const json::Value* v = get(field);
    if (!v) return fallback;
    OMNI_REQUIRE(v->is_string(), path_, ": field ", field, " should be a string");
    return v->str();
  }
  // A list of layer indices below `layers` (absent: empty).
  std::vector<int> layer_list(const char* field, int layers) const {
    std::vector<int> out;
    const json::Value* v = get(field);
    if (!v) return out;
    OMNI_REQUIRE(v->is_array(), path_, ": field ", field, " should be a list of layer indices");
    for (const json::Value& e : v->arr()) {
      const bool ok =
          e.is_number() && e.num() >= 0 && e.num() < layers && e.num() == double(int64_t(e.num()));
      OMNI_REQUIRE(ok, path_, ": field ", field, " should hold layer indices from 0 to ",
                   layers - 1);
      out.push_back(int(e.num()));
    }
    return out;
  }
  // Refuses a field whose value is other than `expected` (absent counts as `fallback`).
  void require_flag(const char* field, bool fallback, bool expected, const char* why) const {
    OMNI_REQUIRE(flag_or(field, fallback) == expected, path_, ": ", field, " = ",
                 expected ? "false" : "true", " is not supported: ", why);
  }
  void refuse_present(const char* field, const char* why) const {
    OMNI_REQUIRE(!get(field), path_, ": ", field, " is not supported: ", why);
  }
  // A sliding window at least as long as the model's positions changes nothing.
  void require_no_window(const char* field, int positions) const {
    if (get(field))
      OMNI_REQUIRE(number(field) >= positions, path_, ": ", field, " (",
                   format_number(number(field)),
                   ") is not supported: omnitron's attention is causal over the whole sequence");
  }
  const std::string& path() const { return path_; }

 private:
  const json::Value& root_;
  std::string path_;
};

using Args = std::vector<std::string>;

void add(Args& a, const char* flag, const std::string& value) {
  a.push_back(flag);
  a.push_back(value);
}

void gpt2_args(const ConfigReader& c, Args& a) {
  // Hugging Face's GELU names: the tanh approximation (GPT-2's own "gelu_new", the
  // default) is --openai-gelu, the exact erf GELU ("gelu") Megatron's default.
  const std::string act = c.text_or("activation_function", "gelu_new");
  const bool tanh_gelu = act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast";
  OMNI_REQUIRE(tanh_gelu || act == "gelu" || act == "gelu_python", c.path(),
               ": activation_function '", act,
               "' is not supported (omnitron's GPT MLP is GELU: exact as gelu or gelu_python, "
               "the tanh approximation as gelu_new, gelu_pytorch_tanh or gelu_fast)");
  if (tanh_gelu) a.push_back("--openai-gelu");
  c.require_flag("scale_attn_weights", true, true, "omnitron scales attention by 1/sqrt(d)");
  c.require_flag("scale_attn_by_inverse_layer_idx", false, false,
                 "omnitron does not scale attention per layer");
  c.require_flag("add_cross_attention", false, false, "omnitron is decoder-only");
  const int C = c.integer("n_embd"), P = c.integer("n_positions");
  add(a, "--num-layers", std::to_string(c.integer("n_layer")));
  add(a, "--hidden-size", std::to_string(C));
  add(a, "--num-attention-heads", std::to_string(c.integer("n_head")));
  add(a, "--ffn-hidden-size", std::to_string(c.integer_or("n_inner", 4 * C)));
  add(a, "--max-position-embeddings", std::to_string(P));
  add(a, "--seq-length", std::to_string(P));
  add(a, "--vocab-size", std::to_string(c.integer("vocab_size")));
  add(a, "--normalization", "LayerNorm");
  add(a, "--norm-epsilon", format_number(c.number_or("layer_norm_epsilon", 1e-5)));
  add(a, "--position-embedding-type", "learned_absolute");
  if (!c.flag_or("tie_word_embeddings", true)) a.push_back("--untie-embeddings-and-output-weights");
}

// The routed layers and experts of a mixture-of-experts family.
void moe_args(Family f, const ConfigReader& c, int layers, Args& a) {
  if (f == Family::Mixtral) {
    OMNI_REQUIRE(c.number_or("router_jitter_noise", 0) == 0, c.path(),
                 ": router_jitter_noise is not supported: omnitron's router adds no noise");
    add(a, "--num-experts", std::to_string(c.integer("num_local_experts")));
    add(a, "--moe-ffn-hidden-size", std::to_string(c.integer("intermediate_size")));
  } else {
    add(a, "--num-experts", std::to_string(c.integer("num_experts")));
    add(a, "--moe-ffn-hidden-size", std::to_string(c.integer("moe_intermediate_size")));
    const int step = c.integer_or("decoder_sparse_step", 1);
    const std::vector<int> dense = c.layer_list("mlp_only_layers", layers);
    std::string freq = "[";
    bool all = true;
    for (int i = 0; i < layers; ++i) {
      const bool routed =
          std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
      all = all && routed;
      freq += std::string(i ? "," : "") + (routed ? "1" : "0");
    }
    add(a, "--moe-layer-freq", all ? "1" : freq + "]");
    if (!c.flag_or("norm_topk_prob", false)) a.push_back("--moe-router-pre-softmax");
    if (f == Family::Qwen2Moe) {
      add(a, "--moe-shared-expert-intermediate-size",
          std::to_string(c.integer("shared_expert_intermediate_size")));
      a.push_back("--moe-shared-expert-gate");
    }
  }
  add(a, "--moe-router-topk", std::to_string(c.integer("num_experts_per_tok")));
}

// What the Llama-shaped families (Llama, Mistral, Qwen, their MoE forms, DeepSeek-V3) share:
// the MLP's width, P positions, the vocabulary, RMSNorm, SwiGLU and rope.
void llama_body_args(const ConfigReader& c, int P, Args& a) {
  add(a, "--ffn-hidden-size", std::to_string(c.integer("intermediate_size")));
  add(a, "--max-position-embeddings", std::to_string(P));
  add(a, "--seq-length", std::to_string(P));
  add(a, "--vocab-size", std::to_string(c.integer("vocab_size")));
  add(a, "--normalization", "RMSNorm");
  add(a, "--norm-epsilon", format_number(c.number_or("rms_norm_eps", 1e-6)));
  a.push_back("--swiglu");
  add(a, "--position-embedding-type", "rope");
}

void llama_args(Family f, const ConfigReader& c, Args& a) {
  const std::string act = c.text_or("hidden_act", "silu");
  OMNI_REQUIRE(act == "silu", c.path(), ": hidden_act '", act,
               "' is not supported (omnitron's SwiGLU gates with silu)");
  c.refuse_present("rope_scaling", "omnitron's rotary embedding has no frequency scaling");
  OMNI_REQUIRE(c.number_or("partial_rotary_factor", 1.0) == 1.0, c.path(),
               ": partial_rotary_factor is not supported: omnitron rotates whole heads");
  c.require_flag("attention_bias", false, false,
                 "omnitron has no bias on o_proj without biases on the MLP");
  c.require_flag("mlp_bias", false, false, "omnitron has no MLP biases without attention biases");
  const bool qwen =
      f == Family::Qwen2 || f == Family::Qwen3 || f == Family::Qwen2Moe || f == Family::Qwen3Moe;
  if (qwen)
    c.require_flag("use_sliding_window", false, false,
                   "omnitron's attention is causal over the whole sequence");
  const int C = c.integer("hidden_size"), H = c.integer("num_attention_heads");
  const int G = c.integer_or("num_key_value_heads", H), P = c.integer("max_position_embeddings");
  const int hd = c.integer_or("head_dim", C / H), L = c.integer("num_hidden_layers");
  if (f == Family::Mistral || f == Family::Mixtral) c.require_no_window("sliding_window", P);
  add(a, "--num-layers", std::to_string(L));
  add(a, "--hidden-size", std::to_string(C));
  add(a, "--num-attention-heads", std::to_string(H));
  if (G != H) {
    a.push_back("--group-query-attention");
    add(a, "--num-query-groups", std::to_string(G));
  }
  if (hd * H != C) add(a, "--kv-channels", std::to_string(hd));
  llama_body_args(c, P, a);
  add(a, "--rotary-base", format_number(c.number_or("rope_theta", 10000.0)));
  a.push_back("--disable-bias-linear");
  if (has_qkv_bias(f)) a.push_back("--add-qkv-bias");
  if (has_qk_norm(f)) a.push_back("--qk-layernorm");
  if (is_moe(f)) moe_args(f, c, L, a);
  if (!c.flag_or("tie_word_embeddings", false))
    a.push_back("--untie-embeddings-and-output-weights");
}

// DeepSeek-V3: multi-latent attention (latents normed by q_a_layernorm and kv_a_layernorm:
// --qk-layernorm), the first first_k_dense_replace layers dense, the rest routed by sigmoid
// scores with the aux-loss-free bias (e_score_correction_bias) and group-limited top-k (each
// group scored by its top two experts: Megatron's topk / group-topk must be 2), the top-k
// weights normalised and scaled by routed_scaling_factor; n_shared_experts shared experts of
// moe_intermediate_size are one ungated shared expert of their total size.
void deepseek_args(const ConfigReader& c, Config& out) {
  Args& a = out.args;
  const std::string& path = c.path();
  const std::string act = c.text_or("hidden_act", "silu");
  OMNI_REQUIRE(act == "silu", path, ": hidden_act '", act,
               "' is not supported (omnitron's SwiGLU gates with silu)");
  c.require_flag("attention_bias", false, false, "omnitron's multi-latent attention has no biases");
  const int C = c.integer("hidden_size"), H = c.integer("num_attention_heads");
  const int L = c.integer("num_hidden_layers"), P = c.integer("max_position_embeddings");
  OMNI_REQUIRE(c.integer_or("num_key_value_heads", H) == H, path, ": num_key_value_heads (",
               c.integer_or("num_key_value_heads", H),
               ") is not supported: multi-latent attention has num_attention_heads (", H,
               ") key heads");
  const std::string scoring = c.text_or("scoring_func", "sigmoid");
  OMNI_REQUIRE(scoring == "sigmoid", path, ": scoring_func '", scoring,
               "' is not supported (DeepSeek-V3's router is sigmoid)");
  const std::string method = c.text_or("topk_method", "noaux_tc");
  OMNI_REQUIRE(method == "noaux_tc", path, ": topk_method '", method,
               "' is not supported (omnitron routes as noaux_tc: group-limited top-k of the "
               "biased sigmoid scores)");
  c.require_flag("norm_topk_prob", true, true,
                 "Megatron normalises the top-k sigmoid scores (--moe-router-score-function "
                 "sigmoid)");
  OMNI_REQUIRE(c.integer_or("moe_layer_freq", 1) == 1, path,
               ": moe_layer_freq is not supported unless 1 (every layer after "
               "first_k_dense_replace routed)");
  OMNI_REQUIRE(c.number_or("pretraining_tp", 1) == 1, path,
               ": pretraining_tp is not supported unless 1");
  const int E = c.integer("n_routed_experts"), k = c.integer("num_experts_per_tok");
  const int groups = c.integer_or("n_group", 1), group_topk = c.integer_or("topk_group", 1);
  if (groups > 1)
    OMNI_REQUIRE(k == 2 * group_topk, path, ": topk_group (", group_topk,
                 ") is not supported with num_experts_per_tok ", k,
                 ": DeepSeek-V3 scores a group by its top two experts, Megatron by its top "
                 "num_experts_per_tok / topk_group, so the two must equal 2");
  const double dense_layers =
      c.get("first_k_dense_replace") ? c.number("first_k_dense_replace") : 0;
  OMNI_REQUIRE(dense_layers >= 0 && dense_layers <= L && dense_layers == double(int(dense_layers)),
               path, ": first_k_dense_replace should be a layer count from 0 to ", L);
  const int F = c.integer("moe_intermediate_size");
  const double shared = c.get("n_shared_experts") ? c.number("n_shared_experts") : 0;
  OMNI_REQUIRE(shared >= 0 && shared == double(int(shared)), path,
               ": n_shared_experts should be a count of experts");
  add(a, "--num-layers", std::to_string(L));
  add(a, "--hidden-size", std::to_string(C));
  add(a, "--num-attention-heads", std::to_string(H));
  llama_body_args(c, P, a);
  // transformers 5 writes rope_parameters (rope_type, rope_theta and the scaling) in place of
  // rope_scaling and rope_theta.
  const json::Value* params = c.get("rope_parameters");
  OMNI_REQUIRE(!params || params->is_object(), path, ": rope_parameters should be an object");
  static const json::Value kNone;
  const ConfigReader rope(params ? *params : kNone, path + " rope_parameters");
  add(a, "--rotary-base",
      format_number(c.number_or("rope_theta", params ? rope.number_or("rope_theta", 1e4) : 1e4)));
  const json::Value* scaling = c.get("rope_scaling");
  if (!scaling && params && rope.text_or("rope_type", "default") != "default") scaling = params;
  a.push_back("--disable-bias-linear");
  a.push_back("--multi-latent-attention");
  a.push_back("--qk-layernorm");
  if (c.get("q_lora_rank")) add(a, "--q-lora-rank", std::to_string(c.integer("q_lora_rank")));
  add(a, "--kv-lora-rank", std::to_string(c.integer("kv_lora_rank")));
  add(a, "--qk-head-dim", std::to_string(c.integer("qk_nope_head_dim")));
  add(a, "--qk-pos-emb-head-dim", std::to_string(c.integer("qk_rope_head_dim")));
  add(a, "--v-head-dim", std::to_string(c.integer("v_head_dim")));
  if (const json::Value* rs = scaling) {
    OMNI_REQUIRE(rs->is_object(), path, ": rope_scaling should be an object or null");
    const ConfigReader r(*rs, path + " rope_scaling");
    OMNI_REQUIRE(r.number_or("attention_factor", 1) == 1, path,
                 ": rope_scaling attention_factor is not supported unless 1: omnitron does not "
                 "scale rope's cos and sin");
    const std::string type = r.text_or("rope_type", r.text_or("type", ""));
    OMNI_REQUIRE(type == "yarn", path, ": rope_scaling type '", type,
                 "' is not supported (omnitron's multi-latent attention scales rope by yarn)");
    const double mscale = r.number_or("mscale", 1), all = r.number_or("mscale_all_dim", 0);
    OMNI_REQUIRE(mscale == all, path, ": rope_scaling mscale (", format_number(mscale),
                 ") is not supported unless equal to mscale_all_dim (", format_number(all),
                 "): omnitron does not scale rope's cos and sin");
    OMNI_REQUIRE(r.number_or("original_max_position_embeddings", 4096) == 4096 &&
                     r.number_or("beta_fast", 32) == 32 && r.number_or("beta_slow", 1) == 1,
                 path,
                 ": rope_scaling original_max_position_embeddings, beta_fast and beta_slow are "
                 "supported only as 4096, 32 and 1 (Megatron's defaults; no flags set them)");
    r.require_flag("truncate", true, true, "omnitron rounds yarn's correction range");
    add(a, "--rope-type", "yarn");
    add(a, "--rotary-scaling-factor", format_number(r.number("factor")));
    add(a, "--mscale", format_number(mscale));
    add(a, "--mscale-all-dim", format_number(all));
  } else {
    add(a, "--rope-type", "rope");
  }
  add(a, "--num-experts", std::to_string(E));
  add(a, "--moe-ffn-hidden-size", std::to_string(F));
  std::string freq = "[";
  for (int i = 0; i < L; ++i) freq += std::string(i ? "," : "") + (i < dense_layers ? "0" : "1");
  add(a, "--moe-layer-freq", dense_layers == 0 ? "1" : freq + "]");
  if (shared > 0) add(a, "--moe-shared-expert-intermediate-size", std::to_string(int(shared) * F));
  add(a, "--moe-router-topk", std::to_string(k));
  add(a, "--moe-router-score-function", "sigmoid");
  a.push_back("--moe-router-enable-expert-bias");
  if (groups > 1) {
    add(a, "--moe-router-num-groups", std::to_string(groups));
    add(a, "--moe-router-group-topk", std::to_string(group_topk));
  }
  const double scale = c.number_or("routed_scaling_factor", 1.0);
  if (scale != 1.0) add(a, "--moe-router-topk-scaling-factor", format_number(scale));
  if (!c.flag_or("tie_word_embeddings", false))
    a.push_back("--untie-embeddings-and-output-weights");
  out.rope_interleave = c.flag_or("rope_interleave", true);
  if (const json::Value* n = c.get("num_nextn_predict_layers")) {
    OMNI_REQUIRE(n->is_number() && n->num() >= 0, path,
                 ": num_nextn_predict_layers should be a count");
    out.mtp_layers = int(n->num());
  }
}

// The DeepSeek-V3 config.json fields of a model of ours (family_of has checked that it is one).
void deepseek_fields(const TransformerConfig& c,
                     const std::function<void(const char*, const std::string&)>& field) {
  auto num = [&field](const char* k, double v) { field(k, format_number(v)); };
  const int F = c.moe_ffn_size();
  num("hidden_size", c.hidden_size);
  num("intermediate_size", c.ffn_size());
  num("moe_intermediate_size", F);
  num("num_hidden_layers", c.num_layers);
  num("num_attention_heads", c.num_attention_heads);
  num("num_key_value_heads", c.num_attention_heads);
  field("hidden_act", "\"silu\"");
  num("max_position_embeddings", c.max_positions());
  num("rms_norm_eps", c.norm_epsilon);
  num("rope_theta", c.rotary_base);
  field("q_lora_rank", c.q_lora_rank > 0 ? format_number(c.q_lora_rank) : "null");
  num("kv_lora_rank", c.kv_lora_rank);
  num("qk_nope_head_dim", c.qk_head_dim);
  num("qk_rope_head_dim", c.qk_pos_emb_head_dim);
  num("v_head_dim", c.v_head_dim);
  num("head_dim", c.qk_pos_emb_head_dim);
  field("rope_interleave", "true");
  if (c.yarn)
    field("rope_scaling",
          "{\"type\": \"yarn\", \"rope_type\": \"yarn\", \"factor\": " +
              format_number(c.rotary_scaling_factor) + ", \"mscale\": " + format_number(c.mscale) +
              ", \"mscale_all_dim\": " + format_number(c.mscale_all_dim) +
              ", \"original_max_position_embeddings\": " +
              format_number(c.original_max_position_embeddings) + ", \"beta_fast\": " +
              format_number(c.beta_fast) + ", \"beta_slow\": " + format_number(c.beta_slow) + "}");
  else
    field("rope_scaling", "null");
  field("attention_bias", "false");
  num("attention_dropout", 0.0);
  num("n_routed_experts", c.num_moe_experts);
  num("n_shared_experts", c.moe_shared_expert_intermediate_size / F);
  num("num_experts_per_tok", c.moe_router_topk);
  num("n_group", c.moe_router_num_groups > 0 ? c.moe_router_num_groups : 1);
  num("topk_group", c.moe_router_num_groups > 0 ? c.moe_router_group_topk : 1);
  num("routed_scaling_factor",
      c.moe_router_topk_scaling_factor > 0 ? c.moe_router_topk_scaling_factor : 1.0);
  field("scoring_func", "\"sigmoid\"");
  field("topk_method", "\"noaux_tc\"");
  field("norm_topk_prob", "true");
  const std::vector<int> pattern = c.moe_layer_pattern();
  num("first_k_dense_replace",
      double(std::find(pattern.begin(), pattern.end(), 1) - pattern.begin()));
  num("moe_layer_freq", 1);
  num("num_nextn_predict_layers", 0);
  num("aux_loss_alpha", c.moe_aux_loss_coeff);
  num("pretraining_tp", 1);
}

// Why a model of ours with multi-latent attention is no DeepseekV3ForCausalLM, or nullptr.
const char* not_deepseek(const TransformerConfig& c) {
  if (!c.swiglu || c.normalization != Normalization::RMSNorm || !c.qk_layernorm)
    return "multi-latent attention without SwiGLU, RMSNorm and --qk-layernorm";
  if (c.num_moe_experts == 0) return "multi-latent attention without --num-experts";
  const std::vector<int> p = c.moe_layer_pattern();
  if (!std::is_sorted(p.begin(), p.end()))
    return "--moe-layer-freq with a dense layer after a routed one (DeepSeek-V3's dense layers "
           "are the first ones)";
  if (c.moe_shared_expert_intermediate_size % c.moe_ffn_size() != 0)
    return "a shared expert whose size is not a multiple of --moe-ffn-hidden-size";
  if (c.moe_shared_expert_gate) return "--moe-shared-expert-gate";
  if (c.moe_router_score_function != MoEScoreFunction::Sigmoid)
    return "--moe-router-score-function softmax";
  if (!c.moe_router_enable_expert_bias) return "no --moe-router-enable-expert-bias";
  if (c.moe_router_pre_softmax) return "--moe-router-pre-softmax";
  if (c.moe_router_num_groups > 0 && c.moe_router_topk != 2 * c.moe_router_group_topk)
    return "--moe-router-topk other than twice --moe-router-group-topk";
  if (!c.yarn && c.rotary_scaling_factor != 1.0)
    return "--rotary-scaling-factor without --rope-type yarn";
  return nullptr;
}

// Router settings that only Megatron has: a model using them has no Hugging Face equivalent.
void require_plain_router(const TransformerConfig& c, Family f) {
  const char* flag = c.moe_router_score_function != MoEScoreFunction::Softmax
                         ? "--moe-router-score-function sigmoid"
                     : c.moe_router_topk_scaling_factor != 0 ? "--moe-router-topk-scaling-factor"
                     : c.moe_router_num_groups != 0          ? "--moe-router-num-groups"
                     : c.moe_router_enable_expert_bias       ? "--moe-router-enable-expert-bias"
                     : f == Family::Mixtral && c.moe_router_pre_softmax ? "--moe-router-pre-softmax"
                                                                        : nullptr;
  OMNI_REQUIRE(!flag, "this mixture-of-experts model uses ", flag, ", which ",
               family_info(f).architecture, " does not have");
}

}  // namespace

const FamilyInfo& family_info(Family f) {
  for (const FamilyInfo& i : kFamilies)
    if (i.family == f) return i;
  throw InternalError("[hf] unknown family");
}

std::string model_types() {
  std::string s;
  for (const FamilyInfo& i : kFamilies) s += (s.empty() ? "" : ", ") + std::string(i.model_type);
  return s;
}

std::string format_number(double v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ptr);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OMNI_REQUIRE(in, "cannot open '", path, "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Config read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json::Value root = json::parse(read_text(path), path);
  OMNI_REQUIRE(root.is_object(), path, ": not a JSON object");
  const ConfigReader c(root, path);
  const std::string model_type = c.text_or("model_type", "");
  const FamilyInfo* info = nullptr;
  for (const FamilyInfo& i : kFamilies)
    if (model_type == i.model_type) info = &i;
  OMNI_REQUIRE(info, path, ": model_type '", model_type, "' is not one omnitron converts (",
               model_types(), ")");
  if (const json::Value* archs = c.get("architectures")) {
    OMNI_REQUIRE(archs->is_array(), path, ": field architectures should be a list");
    for (const json::Value& a : archs->arr()) {
      const bool ok = a.is_string() && (a.str() == info->architecture ||
                                        (info->family == Family::GPT2 && a.str() == "GPT2Model"));
      OMNI_REQUIRE(ok, path, ": architectures names '", a.is_string() ? a.str() : "?",
                   "'; omnitron converts ", info->architecture, " for model_type ", model_type);
    }
  }
  Config out{info->family, {}};
  if (info->family == Family::GPT2)
    gpt2_args(c, out.args);
  else if (info->family == Family::DeepseekV3)
    deepseek_args(c, out);
  else
    llama_args(info->family, c, out.args);
  if (c.get("initializer_range"))
    add(out.args, "--init-method-std", format_number(c.number("initializer_range")));
  return out;
}

TransformerConfig config_from_args(const std::vector<std::string>& args) {
  Options o;
  parse_options(args, o);
  return o.model;
}

Family family_of(const TransformerConfig& c) {
  if (c.multi_latent_attention) {
    const char* why = not_deepseek(c);
    OMNI_REQUIRE(!why, "this model has ", why,
                 ", which has no Hugging Face equivalent (DeepseekV3ForCausalLM)");
    return Family::DeepseekV3;
  }
  // Features config.json could carry but this exporter does not write yet: refused rather
  // than dropped.
  OMNI_REQUIRE(
      !c.layernorm_zero_centered_gamma && !c.use_rope_scaling &&
          (c.position_embedding_type != PositionEmbedding::Rope || c.rotary_dim() == c.head_dim()),
      "this model uses ",
      c.layernorm_zero_centered_gamma ? "--apply-layernorm-1p"
      : c.use_rope_scaling            ? "--use-rope-scaling"
                                      : "--rotary-percent below 1",
      ", which the Hugging Face export does not write yet");
  const bool moe = c.num_moe_experts > 0, shared = c.moe_shared_expert_intermediate_size > 0;
  const bool gpt2 = c.position_embedding_type == PositionEmbedding::LearnedAbsolute &&
                    c.normalization == Normalization::LayerNorm && !c.swiglu && c.add_bias_linear &&
                    !c.qk_layernorm && c.query_groups() == c.num_attention_heads &&
                    c.head_dim() * c.num_attention_heads == c.hidden_size && !moe;
  if (gpt2) return Family::GPT2;
  const bool llama = c.position_embedding_type == PositionEmbedding::Rope &&
                     c.normalization == Normalization::RMSNorm && c.swiglu && !c.add_bias_linear &&
                     !(c.qk_layernorm && c.add_qkv_bias);
  if (llama && !moe)
    return c.add_qkv_bias ? Family::Qwen2 : c.qk_layernorm ? Family::Qwen3 : Family::Llama;
  if (llama) {
    // Qwen2-MoE always has q/k/v biases and a gated shared expert; Qwen3-MoE has q/k norms
    // and no shared expert; Mixtral neither, and every layer routed.
    const std::vector<int> pattern = c.moe_layer_pattern();
    const bool every_layer = std::all_of(pattern.begin(), pattern.end(), [](int p) { return p; });
    std::optional<Family> f;
    if (shared && c.moe_shared_expert_gate && c.add_qkv_bias)
      f = Family::Qwen2Moe;
    else if (!shared && c.qk_layernorm)
      f = Family::Qwen3Moe;
    else if (!shared && !c.add_qkv_bias && every_layer)
      f = Family::Mixtral;
    if (f) {
      require_plain_router(c, *f);
      return *f;
    }
  }
  throw UsageError(detail::concat(
      "this model (", to_string(c.position_embedding_type), " positions, ",
      to_string(c.normalization), ", ", c.swiglu ? "SwiGLU" : "GELU",
      c.add_bias_linear ? ", linear biases" : ", no linear biases",
      c.add_qkv_bias ? ", --add-qkv-bias" : "", c.qk_layernorm ? ", --qk-layernorm" : "",
      moe ? ", --num-experts " + std::to_string(c.num_moe_experts) : "",
      shared ? ", a shared expert" : "",
      shared && !c.moe_shared_expert_gate ? " without a gate" : "",
      ") has no Hugging Face equivalent: GPT2LMHeadModel is learned_absolute + LayerNorm + GELU "
      "+ biases (multi-head attention); Llama, Qwen2 (--add-qkv-bias) and Qwen3 "
      "(--qk-layernorm) are rope + RMSNorm + SwiGLU + --disable-bias-linear; their "
      "mixtures of experts are Mixtral (every layer routed), Qwen2-MoE (--add-qkv-bias and a "
      "gated shared expert) and Qwen3-MoE (--qk-layernorm)"));
}

std::string config_json(Family family, const TransformerConfig& c, DType dtype) {
  const FamilyInfo& info = family_info(family);
  std::ostringstream out;
  const char* sep = "{\n";
  auto field = [&out, &sep](const char* k, const std::string& json_value) {
    out << sep << "  \"" << k << "\": " << json_value;
    sep = ",\n";
  };
  auto num = [&field](const char* k, double v) { field(k, format_number(v)); };
  auto boolean = [&field](const char* k, bool v) { field(k, v ? "true" : "false"); };
  auto text = [&field](const char* k, const char* v) { field(k, std::string("\"") + v + "\""); };
  field("architectures", std::string("[\"") + info.architecture + "\"]");
  text("model_type", info.model_type);
  num("vocab_size", c.vocab_size);
  const bool tied = !c.untie_embeddings_and_output_weights;
  if (family == Family::GPT2) {
    num("n_positions", c.max_positions());
    num("n_ctx", c.max_positions());
    num("n_embd", c.hidden_size);
    num("n_layer", c.num_layers);
    num("n_head", c.num_attention_heads);
    num("n_inner", c.ffn_size());
    text("activation_function", c.openai_gelu ? "gelu_new" : "gelu");
    num("layer_norm_epsilon", c.norm_epsilon);
    for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) num(k, 0.0);
    boolean("scale_attn_weights", true);
    boolean("scale_attn_by_inverse_layer_idx", false);
    boolean("reorder_and_upcast_attn", false);
  } else if (family == Family::DeepseekV3) {
    deepseek_fields(c, field);
  } else {
    num("hidden_size", c.hidden_size);
    num("intermediate_size", family == Family::Mixtral ? c.moe_ffn_size() : c.ffn_size());
    num("num_hidden_layers", c.num_layers);
    num("num_attention_heads", c.num_attention_heads);
    num("num_key_value_heads", c.query_groups());
    num("head_dim", c.head_dim());
    text("hidden_act", "silu");
    num("max_position_embeddings", c.max_positions());
    num("rms_norm_eps", c.norm_epsilon);
    num("rope_theta", c.rotary_base);
    field("rope_scaling", "null");
    num("attention_dropout", 0.0);
    if (family == Family::Llama || family == Family::Mistral || family == Family::Mixtral) {
      boolean("attention_bias", false);
      if (family == Family::Llama) {
        boolean("mlp_bias", false);
        num("pretraining_tp", 1);
      } else {
        field("sliding_window", "null");
      }
    } else {
      boolean("use_sliding_window", false);
      if (has_qk_norm(family)) boolean("attention_bias", false);
    }
    if (family == Family::Mixtral) {
      num("num_local_experts", c.num_moe_experts);
      num("router_jitter_noise", 0.0);
    } else if (is_moe(family)) {
      num("num_experts", c.num_moe_experts);
      num("moe_intermediate_size", c.moe_ffn_size());
      num("decoder_sparse_step", 1);
      const std::vector<int> pattern = c.moe_layer_pattern();
      std::string dense;
      for (int i = 0; i < c.num_layers; ++i)
        if (!pattern[size_t(i)]) dense += (dense.empty() ? "" : ", ") + std::to_string(i);
      field("mlp_only_layers", "[" + dense + "]");
      boolean("norm_topk_prob", !c.moe_router_pre_softmax);
      if (family == Family::Qwen2Moe)
        num("shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size);
    }
    if (is_moe(family)) {
      num("num_experts_per_tok", c.moe_router_topk);
      num("router_aux_loss_coef", c.moe_aux_loss_coeff);
      boolean("output_router_logits", false);
    }
  }
  boolean("tie_word_embeddings", tied);
  num("initializer_range", c.init_method_std);
  text("torch_dtype", dtype == DType::BF16  ? "bfloat16"
                      : dtype == DType::F16 ? "float16"
                                            : "float32");
  boolean("use_cache", true);
  out << "\n}\n";
  return out.str();
}

}  // namespace omni::hf
