#include "checkpoint/hf_interchange.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "checkpoint/safetensors.h"

namespace omni {

namespace fs = std::filesystem;

namespace {

enum class HfFamily { GPT2, Llama, Mistral, Qwen2 };

struct FamilyInfo {
  HfFamily family;
  const char* model_type;
  const char* architecture;
  const char* prefix;  // of the backbone's tensors in the *ForCausalLM model
};
constexpr FamilyInfo kFamilies[] = {
    {HfFamily::GPT2, "gpt2", "GPT2LMHeadModel", "transformer."},
    {HfFamily::Llama, "llama", "LlamaForCausalLM", "model."},
    {HfFamily::Mistral, "mistral", "MistralForCausalLM", "model."},
    {HfFamily::Qwen2, "qwen2", "Qwen2ForCausalLM", "model."},
};

const FamilyInfo& family_info(HfFamily f) {
  for (const FamilyInfo& i : kFamilies)
    if (i.family == f) return i;
  throw InternalError("[hf] unknown family");
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

// ---------------------------------------------------------------------------------------
// config.json -> flags
// ---------------------------------------------------------------------------------------

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
  // Refuses a field whose value is other than `expected` (absent counts as `fallback`).
  void require_flag(const char* field, bool fallback, bool expected, const char* why) const {
    OMNI_REQUIRE(flag_or(field, fallback) == expected, path_, ": ", field, " = ",
                 expected ? "false" : "true", " is not supported: ", why);
  }
  void refuse_present(const char* field, const char* why) const {
    OMNI_REQUIRE(!get(field), path_, ": ", field, " is not supported: ", why);
  }
  const std::string& path() const { return path_; }

 private:
  const json::Value& root_;
  std::string path_;
};

struct HfConfig {
  HfFamily family;
  std::vector<std::string> args;
};

HfConfig read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json::Value root = json::parse(read_text(path), path);
  OMNI_REQUIRE(root.is_object(), path, ": not a JSON object");
  const ConfigReader c(root, path);
  const std::string model_type = c.text_or("model_type", "");
  const FamilyInfo* info = nullptr;
  for (const FamilyInfo& i : kFamilies)
    if (model_type == i.model_type) info = &i;
  OMNI_REQUIRE(info, path, ": model_type '", model_type,
               "' is not one omnitron converts (gpt2, llama, mistral, qwen2)");
  if (const json::Value* archs = c.get("architectures")) {
    OMNI_REQUIRE(archs->is_array(), path, ": field architectures should be a list");
    for (const json::Value& a : archs->arr()) {
      const bool ok = a.is_string() && (a.str() == info->architecture ||
                                        (info->family == HfFamily::GPT2 && a.str() == "GPT2Model"));
      OMNI_REQUIRE(ok, path, ": architectures names '", a.is_string() ? a.str() : "?",
                   "'; omnitron converts ", info->architecture, " for model_type ", model_type);
    }
  }
  HfConfig out{info->family, {}};
  std::vector<std::string>& a = out.args;
  auto add = [&a](const char* flag, const std::string& value) {
    a.push_back(flag);
    a.push_back(value);
  };
  if (info->family == HfFamily::GPT2) {
    // Hugging Face's GELU names: the tanh approximation (GPT-2's own "gelu_new", the
    // default) is --openai-gelu, the exact erf GELU ("gelu") Megatron's default.
    const std::string act = c.text_or("activation_function", "gelu_new");
    const bool tanh_gelu = act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast";
    OMNI_REQUIRE(tanh_gelu || act == "gelu" || act == "gelu_python", path,
                 ": activation_function '", act,
                 "' is not supported (omnitron's GPT MLP is GELU: exact as gelu or gelu_python, "
                 "the tanh approximation as gelu_new, gelu_pytorch_tanh or gelu_fast)");
    if (tanh_gelu) a.push_back("--openai-gelu");
    c.require_flag("scale_attn_weights", true, true, "omnitron scales attention by 1/sqrt(d)");
    c.require_flag("scale_attn_by_inverse_layer_idx", false, false,
                   "omnitron does not scale attention per layer");
    c.require_flag("add_cross_attention", false, false, "omnitron is decoder-only");
    const int C = c.integer("n_embd"), P = c.integer("n_positions");
    add("--num-layers", std::to_string(c.integer("n_layer")));
    add("--hidden-size", std::to_string(C));
    add("--num-attention-heads", std::to_string(c.integer("n_head")));
    add("--ffn-hidden-size", std::to_string(c.integer_or("n_inner", 4 * C)));
    add("--max-position-embeddings", std::to_string(P));
    add("--seq-length", std::to_string(P));
    add("--vocab-size", std::to_string(c.integer("vocab_size")));
    add("--normalization", "LayerNorm");
    add("--norm-epsilon", format_number(c.number_or("layer_norm_epsilon", 1e-5)));
    add("--position-embedding-type", "learned_absolute");
    if (!c.flag_or("tie_word_embeddings", true))
      a.push_back("--untie-embeddings-and-output-weights");
  } else {
    const std::string act = c.text_or("hidden_act", "silu");
    OMNI_REQUIRE(act == "silu", path, ": hidden_act '", act,
                 "' is not supported (omnitron's SwiGLU gates with silu)");
    c.refuse_present("rope_scaling", "omnitron's rotary embedding has no frequency scaling");
    OMNI_REQUIRE(c.number_or("partial_rotary_factor", 1.0) == 1.0, path,
                 ": partial_rotary_factor is not supported: omnitron rotates whole heads");
    c.require_flag("attention_bias", false, false,
                   "omnitron has no bias on o_proj without biases on the MLP");
    c.require_flag("mlp_bias", false, false, "omnitron has no MLP biases without attention biases");
    if (info->family == HfFamily::Qwen2)
      c.require_flag("use_sliding_window", false, false,
                     "omnitron's attention is causal over the whole sequence");
    const int C = c.integer("hidden_size"), H = c.integer("num_attention_heads");
    const int G = c.integer_or("num_key_value_heads", H), P = c.integer("max_position_embeddings");
    const int hd = c.integer_or("head_dim", C / H);
    if (info->family == HfFamily::Mistral && c.get("sliding_window"))
      OMNI_REQUIRE(c.number("sliding_window") >= P, path, ": sliding_window (",
                   format_number(c.number("sliding_window")),
                   ") is not supported: omnitron's attention is causal over the whole sequence");
    add("--num-layers", std::to_string(c.integer("num_hidden_layers")));
    add("--hidden-size", std::to_string(C));
    add("--num-attention-heads", std::to_string(H));
    if (G != H) {
      a.push_back("--group-query-attention");
      add("--num-query-groups", std::to_string(G));
    }
    if (hd * H != C) add("--kv-channels", std::to_string(hd));
    add("--ffn-hidden-size", std::to_string(c.integer("intermediate_size")));
    add("--max-position-embeddings", std::to_string(P));
    add("--seq-length", std::to_string(P));
    add("--vocab-size", std::to_string(c.integer("vocab_size")));
    add("--normalization", "RMSNorm");
    add("--norm-epsilon", format_number(c.number_or("rms_norm_eps", 1e-6)));
    a.push_back("--swiglu");
    add("--position-embedding-type", "rope");
    add("--rotary-base", format_number(c.number_or("rope_theta", 10000.0)));
    a.push_back("--disable-bias-linear");
    if (info->family == HfFamily::Qwen2) a.push_back("--add-qkv-bias");
    if (!c.flag_or("tie_word_embeddings", false))
      a.push_back("--untie-embeddings-and-output-weights");
  }
  if (c.get("initializer_range"))
    add("--init-method-std", format_number(c.number("initializer_range")));
  return out;
}

TransformerConfig config_from_args(const std::vector<std::string>& args) {
  Options o;
  parse_options(args, o);
  return o.model;
}

// ---------------------------------------------------------------------------------------
// The tensor map
// ---------------------------------------------------------------------------------------

// One Hugging Face tensor: `rows` x `cols` in nn.Linear's [out, in] orientation (cols 0:
// a vector of `rows`); `transposed`: stored [cols, rows] (GPT-2's Conv1D).
struct HfPiece {
  std::string name;
  int64_t rows, cols;
  bool transposed = false;
};

// One of our parameters as the row-wise stack of its Hugging Face pieces: stacked row r is
// our row row_of[r] (identity when empty). `padded`: ours may have more rows (the padded
// vocabulary), which Hugging Face does not hold.
struct TensorMapping {
  std::string ours;
  std::vector<HfPiece> pieces;
  std::vector<int64_t> row_of;
  bool padded = false;
  int64_t stacked_rows() const {
    int64_t n = 0;
    for (const HfPiece& p : pieces) n += p.rows;
    return n;
  }
};

// Hugging Face's [q heads | k heads | v heads] rows (each head hd rows) to Megatron's
// per-group interleaving [q heads of group g, k_g, v_g] (see ops.h qkv_split).
std::vector<int64_t> qkv_rows(int64_t H, int64_t G, int64_t hd) {
  const int64_t hpg = H / G, group = (hpg + 2) * hd;
  std::vector<int64_t> rows;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < hd; ++d) rows.push_back(h / hpg * group + h % hpg * hd + d);
  for (int64_t kv = 0; kv < 2; ++kv)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < hd; ++d) rows.push_back(g * group + (hpg + kv) * hd + d);
  return rows;
}

std::vector<TensorMapping> tensor_map(HfFamily family, const TransformerConfig& cfg) {
  const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, G = cfg.query_groups();
  const int64_t hd = cfg.head_dim(), F = cfg.ffn_size(), V = cfg.vocab_size;
  const std::vector<int64_t> qkv = qkv_rows(H, G, hd);
  const std::string pre = family_info(family).prefix;
  std::vector<TensorMapping> m;
  auto one = [&m](std::string ours, std::string hf, int64_t rows, int64_t cols,
                  bool transposed = false) {
    m.push_back({std::move(ours), {{std::move(hf), rows, cols, transposed}}, {}, false});
  };
  const bool gpt2 = family == HfFamily::GPT2;
  m.push_back({"embedding.word_embeddings.weight",
               {{pre + (gpt2 ? "wte.weight" : "embed_tokens.weight"), V, C}},
               {},
               true});
  if (gpt2) one("embedding.position_embeddings.weight", pre + "wpe.weight", cfg.max_positions(), C);
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string o = "decoder.layers." + std::to_string(i) + ".";
    if (gpt2) {
      const std::string h = pre + "h." + std::to_string(i) + ".";
      for (const char* s : {"weight", "bias"}) {
        one(o + "input_layernorm." + s, h + "ln_1." + s, C, 0);
        one(o + "pre_mlp_layernorm." + s, h + "ln_2." + s, C, 0);
      }
      m.push_back({o + "self_attention.linear_qkv.weight",
                   {{h + "attn.c_attn.weight", 3 * C, C, true}},
                   qkv,
                   false});
      m.push_back(
          {o + "self_attention.linear_qkv.bias", {{h + "attn.c_attn.bias", 3 * C, 0}}, qkv, false});
      one(o + "self_attention.linear_proj.weight", h + "attn.c_proj.weight", C, C, true);
      one(o + "self_attention.linear_proj.bias", h + "attn.c_proj.bias", C, 0);
      one(o + "mlp.linear_fc1.weight", h + "mlp.c_fc.weight", F, C, true);
      one(o + "mlp.linear_fc1.bias", h + "mlp.c_fc.bias", F, 0);
      one(o + "mlp.linear_fc2.weight", h + "mlp.c_proj.weight", C, F, true);
      one(o + "mlp.linear_fc2.bias", h + "mlp.c_proj.bias", C, 0);
    } else {
      const std::string h = pre + "layers." + std::to_string(i) + ".";
      one(o + "input_layernorm.weight", h + "input_layernorm.weight", C, 0);
      one(o + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight", C, 0);
      const std::string a = h + "self_attn.";
      m.push_back({o + "self_attention.linear_qkv.weight",
                   {{a + "q_proj.weight", H * hd, C},
                    {a + "k_proj.weight", G * hd, C},
                    {a + "v_proj.weight", G * hd, C}},
                   qkv,
                   false});
      if (family == HfFamily::Qwen2)
        m.push_back({o + "self_attention.linear_qkv.bias",
                     {{a + "q_proj.bias", H * hd, 0},
                      {a + "k_proj.bias", G * hd, 0},
                      {a + "v_proj.bias", G * hd, 0}},
                     qkv,
                     false});
      one(o + "self_attention.linear_proj.weight", a + "o_proj.weight", C, H * hd);
      m.push_back({o + "mlp.linear_fc1.weight",
                   {{h + "mlp.gate_proj.weight", F, C}, {h + "mlp.up_proj.weight", F, C}},
                   {},
                   false});
      one(o + "mlp.linear_fc2.weight", h + "mlp.down_proj.weight", C, F);
    }
  }
  const std::string norm = pre + (gpt2 ? "ln_f." : "norm.");
  one("decoder.final_layernorm.weight", norm + "weight", C, 0);
  if (gpt2) one("decoder.final_layernorm.bias", norm + "bias", C, 0);
  if (cfg.untie_embeddings_and_output_weights)
    m.push_back({"output_layer.weight", {{"lm_head.weight", V, C}}, {}, true});
  return m;
}

std::string shape_text(const HfPiece& p) {
  if (p.cols == 0) return "[" + std::to_string(p.rows) + "]";
  return p.transposed ? "[" + std::to_string(p.cols) + ", " + std::to_string(p.rows) + "]"
                      : "[" + std::to_string(p.rows) + ", " + std::to_string(p.cols) + "]";
}

// Checks that our parameter has the shape the mapping expects.
const ParamInfo& our_param(const TensorMapping& m, const ParameterSet<float>& params,
                           const std::string& source) {
  OMNI_REQUIRE(params.has(m.ours), source, ": the model has no parameter ", m.ours, " for ",
               m.pieces[0].name, " (another architecture than config.json describes?)");
  const ParamInfo& p = params.info(m.ours);
  OMNI_REQUIRE(p.shard_dim < 0, source, ": parameter ", m.ours,
               " is split across tensor-parallel ranks; Hugging Face weights are converted at "
               "--tensor-model-parallel-size 1 only, for now");
  const int64_t rows = m.stacked_rows(), cols = m.pieces[0].cols;
  const bool ok = cols == 0 ? p.shape == Shape{rows}
                            : p.shape.size() == 2 && p.shape[1] == cols &&
                                  (p.shape[0] == rows || (m.padded && p.shape[0] >= rows));
  OMNI_REQUIRE(ok, source, ": parameter ", m.ours, " has shape ", shape_str(p.shape), " but ",
               m.pieces[0].name, (m.pieces.size() > 1 ? " and the rest" : ""), " need ",
               cols ? "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]"
                    : "[" + std::to_string(rows) + "]");
  return p;
}

// ---------------------------------------------------------------------------------------
// Reading a directory of safetensors files
// ---------------------------------------------------------------------------------------

// Weights from model.safetensors, or from the shards model.safetensors.index.json names.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir) {
    const std::string single = dir + "/model.safetensors";
    const std::string index = dir + "/model.safetensors.index.json";
    if (fs::exists(index)) {
      const json::Value root = json::parse(read_text(index), index);
      const json::Value* map = root.find("weight_map");
      OMNI_REQUIRE(map && map->is_object(), index, ": no \"weight_map\" object");
      std::map<std::string, size_t> file_of;
      for (const auto& [name, file] : map->obj()) {
        OMNI_REQUIRE(file.is_string() && file.str().find('/') == std::string::npos, index,
                     ": weight_map entry ", name, " should name a file in the directory");
        if (!file_of.count(file.str())) {
          file_of[file.str()] = files_.size();
          files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + file.str()));
        }
        const SafetensorsFile& f = *files_[file_of[file.str()]];
        const SafetensorsTensor* t = f.find(name);
        OMNI_REQUIRE(t, index, " places tensor ", name, " in '", f.path(),
                     "', which does not hold it");
        add(name, t, f.path());
      }
      for (const auto& f : files_)
        for (const SafetensorsTensor& t : f->tensors())
          OMNI_REQUIRE(tensors_.count(t.name), "'", f->path(), "' holds tensor ", t.name, " which ",
                       index, " does not list");
    } else {
      OMNI_REQUIRE(fs::exists(single), "'", dir,
                   "' has config.json but no model.safetensors or model.safetensors.index.json "
                   "(only safetensors weights are read; a pytorch_model.bin must be converted "
                   "first)");
      files_.push_back(std::make_unique<SafetensorsFile>(single));
      for (const SafetensorsTensor& t : files_[0]->tensors()) add(t.name, &t, single);
    }
  }

  // The tensor called `name`, also found without the backbone prefix ("transformer.",
  // "model."): a model saved from GPT2Model or LlamaModel, as the gpt2 repository is.
  const SafetensorsTensor* find(const std::string& name, const std::string& prefix) {
    auto it = tensors_.find(name);
    if (it == tensors_.end() && name.rfind(prefix, 0) == 0)
      it = tensors_.find(name.substr(prefix.size()));
    if (it == tensors_.end()) return nullptr;
    used_.insert(it->first);
    return it->second.first;
  }
  const std::string& file_of(const std::string& name) const { return tensors_.at(name).second; }
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : tensors_)
      if (!used_.count(name)) out.push_back(name);
    return out;
  }
  std::string files() const {
    std::string s;
    for (const auto& f : files_) s += (s.empty() ? "'" : ", '") + f->path() + "'";
    return s;
  }

 private:
  void add(const std::string& name, const SafetensorsTensor* t, const std::string& path) {
    tensors_[name] = {t, path};
  }
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsTensor*, std::string>> tensors_;
  std::set<std::string> used_;
};

// Buffers some Hugging Face versions stored with the weights; they hold no parameters.
bool is_buffer(const std::string& name) {
  auto ends_with = [&name](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with("rotary_emb.inv_freq");
}

// ---------------------------------------------------------------------------------------
// Our model -> config.json
// ---------------------------------------------------------------------------------------

HfFamily family_of(const TransformerConfig& c) {
  // Features config.json could carry but this exporter does not write yet: refused rather
  // than dropped.
  OMNI_REQUIRE(!c.layernorm_zero_centered_gamma && !c.use_rope_scaling &&
                   (c.position_embedding_type != PositionEmbedding::Rope ||
                    c.rotary_dim() == c.head_dim()),
               "this model uses ",
               c.layernorm_zero_centered_gamma ? "--apply-layernorm-1p"
               : c.use_rope_scaling            ? "--use-rope-scaling"
                                               : "--rotary-percent below 1",
               ", which the Hugging Face export does not write yet");
  OMNI_REQUIRE(c.num_moe_experts == 0, "--num-experts ", c.num_moe_experts,
               ": not built yet: Hugging Face interchange of mixture-of-experts models "
               "(MixtralForCausalLM, Qwen3MoeForCausalLM)");
  const bool gpt2 = c.position_embedding_type == PositionEmbedding::LearnedAbsolute &&
                    c.normalization == Normalization::LayerNorm && !c.swiglu && c.add_bias_linear &&
                    !c.qk_layernorm && c.query_groups() == c.num_attention_heads &&
                    c.head_dim() * c.num_attention_heads == c.hidden_size;
  if (gpt2) return HfFamily::GPT2;
  const bool llama = c.position_embedding_type == PositionEmbedding::Rope &&
                     c.normalization == Normalization::RMSNorm && c.swiglu && !c.add_bias_linear &&
                     !c.qk_layernorm;
  if (llama) return c.add_qkv_bias ? HfFamily::Qwen2 : HfFamily::Llama;
  throw UsageError(detail::concat(
      "this model (", to_string(c.position_embedding_type), " positions, ",
      to_string(c.normalization), ", ", c.swiglu ? "SwiGLU" : "GELU",
      c.add_bias_linear ? ", linear biases" : ", no linear biases",
      c.qk_layernorm ? ", --qk-layernorm" : "",
      ") has no Hugging Face equivalent: GPT2LMHeadModel is learned_absolute + LayerNorm + GELU "
      "+ biases (multi-head attention), LlamaForCausalLM / Qwen2ForCausalLM is rope + RMSNorm + "
      "SwiGLU + --disable-bias-linear (Qwen2: --add-qkv-bias), neither with --qk-layernorm"));
}

std::string hf_config_json(HfFamily family, const TransformerConfig& c, DType dtype) {
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
  if (family == HfFamily::GPT2) {
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
  } else {
    num("hidden_size", c.hidden_size);
    num("intermediate_size", c.ffn_size());
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
    if (family == HfFamily::Qwen2) {
      boolean("use_sliding_window", false);
    } else {
      boolean("attention_bias", false);
      boolean("mlp_bias", false);
      num("pretraining_tp", 1);
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

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  return fs::exists(dir + "/config.json") &&
         !fs::exists(dir + "/latest_checkpointed_iteration.txt");
}

std::vector<std::string> hf_model_args(const std::string& dir) {
  return read_hf_config(dir).args;
}

void load_hf_model_options(const std::string& dir, Options& opts) {
  TransformerConfig fresh;
  fresh.make_vocab_size_divisible_by = opts.model.make_vocab_size_divisible_by;
  opts.model = fresh;
  parse_options(hf_model_args(dir), opts);
}

void load_hf_weights(const std::string& dir, ParameterSet<float>& params) {
  const HfConfig hc = read_hf_config(dir);
  const TransformerConfig cfg = config_from_args(hc.args);
  const std::vector<TensorMapping> map = tensor_map(hc.family, cfg);
  HfWeights weights(dir);
  const std::string prefix = family_info(hc.family).prefix;
  const std::string source = "--load " + dir;
  std::set<std::string> mapped;
  std::vector<float> buf;
  for (const TensorMapping& m : map) {
    const ParamInfo& p = our_param(m, params, source);
    mapped.insert(m.ours);
    float* dst = params.values() + p.offset;
    std::fill(dst, dst + p.numel, 0.0f);  // the vocabulary padding
    const int64_t width = m.pieces[0].cols ? m.pieces[0].cols : 1;
    int64_t base = 0;
    for (const HfPiece& piece : m.pieces) {
      const SafetensorsTensor* t = weights.find(piece.name, prefix);
      OMNI_REQUIRE(t, source, ": no tensor ", piece.name, " (", shape_text(piece), ") in ",
                   weights.files());
      const Shape want = piece.cols == 0    ? Shape{piece.rows}
                         : piece.transposed ? Shape{piece.cols, piece.rows}
                                            : Shape{piece.rows, piece.cols};
      OMNI_REQUIRE(t->shape == want, source, ": tensor ", t->name, " in '",
                   weights.file_of(t->name), "' has shape ", shape_str(t->shape), " but ",
                   shape_text(piece), " was expected from config.json");
      buf.resize(size_t(t->numel()));
      read_as_f32(*t, buf.data());
      for (int64_t r = 0; r < piece.rows; ++r) {
        const int64_t row = m.row_of.empty() ? base + r : m.row_of[size_t(base + r)];
        float* out = dst + row * width;
        if (piece.transposed)
          for (int64_t k = 0; k < width; ++k) out[k] = buf[size_t(k * piece.rows + r)];
        else
          std::copy_n(buf.data() + r * width, width, out);
      }
      base += piece.rows;
    }
  }
  for (const ParamInfo& p : params.infos())
    OMNI_REQUIRE(mapped.count(p.name), source, ": the model's parameter ", p.name,
                 " has no Hugging Face tensor (a model flag that config.json does not set?)");
  for (const std::string& name : weights.unused()) {
    const bool tied_head = name == "lm_head.weight" && !cfg.untie_embeddings_and_output_weights;
    OMNI_REQUIRE(tied_head || is_buffer(name), source, ": tensor ", name, " in '",
                 weights.file_of(name), "' has no place in omnitron's ",
                 family_info(hc.family).architecture);
  }
}

void save_hf_model(const std::string& dir, const TransformerConfig& config,
                   const ParameterSet<float>& params, DType dtype) {
  OMNI_REQUIRE(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
               "--dtype: Hugging Face weights are written as f32, bf16 or f16 (got ",
               dtype_name(dtype), ")");
  const HfFamily family = family_of(config);
  const std::vector<TensorMapping> map = tensor_map(family, config);
  const std::string source = "--save " + dir;
  std::vector<SafetensorsOutput> out;
  for (const TensorMapping& m : map) {
    const ParamInfo& p = our_param(m, params, source);
    const float* src = params.values() + p.offset;
    const int64_t width = m.pieces[0].cols ? m.pieces[0].cols : 1;
    int64_t base = 0;
    for (const HfPiece& piece : m.pieces) {
      const Shape shape = piece.cols == 0    ? Shape{piece.rows}
                          : piece.transposed ? Shape{piece.cols, piece.rows}
                                             : Shape{piece.rows, piece.cols};
      out.push_back({piece.name, shape, [&m, piece, base, width, src](float* dst) {
                       for (int64_t r = 0; r < piece.rows; ++r) {
                         const int64_t row =
                             m.row_of.empty() ? base + r : m.row_of[size_t(base + r)];
                         const float* in = src + row * width;
                         if (piece.transposed)
                           for (int64_t k = 0; k < width; ++k) dst[k * piece.rows + r] = in[k];
                         else
                           std::copy_n(in, width, dst + r * width);
                       }
                     }});
      base += piece.rows;
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  OMNI_REQUIRE(!ec, source, ": cannot create directory '", dir, "': ", ec.message());
  OMNI_REQUIRE(!fs::exists(dir + "/latest_checkpointed_iteration.txt"), source, ": '", dir,
               "' holds an omnitron checkpoint; choose another directory");
  // A sharded model written there before would shadow the new single file.
  fs::remove(dir + "/model.safetensors.index.json", ec);
  write_safetensors(dir + "/model.safetensors", out, dtype, {{"format", "pt"}});
  const std::string text = hf_config_json(family, config, dtype);
  const std::string tmp = dir + "/config.json.tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    OMNI_REQUIRE(f.flush(), source, ": cannot write '", tmp, "'");
  }
  fs::rename(tmp, dir + "/config.json", ec);
  OMNI_REQUIRE(!ec, source, ": cannot rename '", tmp, "': ", ec.message());
}

}  // namespace omni
