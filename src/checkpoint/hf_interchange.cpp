#include "checkpoint/hf_interchange.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/hf_families.h"
#include "checkpoint/safetensors.h"
#include "model/mla.h"

namespace omni {

namespace fs = std::filesystem;

namespace {

using hf::Family;
using hf::family_info;

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

// A SwiGLU MLP: our linear_fc1 is [gate; up] (rows F each), linear_fc2 is down.
void swiglu_map(const std::string& ours, const std::string& hf, const char* gate, const char* up,
                const char* down, int64_t F, int64_t C, std::vector<TensorMapping>& m) {
  m.push_back({ours + "linear_fc1.weight",
               {{hf + gate + ".weight", F, C}, {hf + up + ".weight", F, C}},
               {},
               false});
  m.push_back({ours + "linear_fc2.weight", {{hf + down + ".weight", C, F}}, {}, false});
}

// A routed layer. Our experts are stacked: linear_fc1 [E, 2F, C] is expert 0's [gate; up],
// then expert 1's, ...; linear_fc2 [E, C, F] expert by expert.
void moe_layer_map(Family family, const TransformerConfig& cfg, const std::string& o,
                   const std::string& h, std::vector<TensorMapping>& m) {
  const int64_t C = cfg.hidden_size, E = cfg.num_moe_experts, F = cfg.moe_ffn_size();
  const bool mixtral = family == Family::Mixtral;
  const std::string block = h + (mixtral ? "block_sparse_moe." : "mlp.");
  m.push_back({o + "router.weight", {{block + "gate.weight", E, C}}, {}, false});
  if (family == Family::DeepseekV3)
    m.push_back(
        {o + "router.expert_bias", {{block + "gate.e_score_correction_bias", E, 0}}, {}, false});
  const char* gate = mixtral ? "w1" : "gate_proj";
  const char* up = mixtral ? "w3" : "up_proj";
  const char* down = mixtral ? "w2" : "down_proj";
  TensorMapping fc1{o + "experts.linear_fc1.weight", {}, {}, false};
  TensorMapping fc2{o + "experts.linear_fc2.weight", {}, {}, false};
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = block + "experts." + std::to_string(e) + ".";
    fc1.pieces.push_back({x + gate + ".weight", F, C});
    fc1.pieces.push_back({x + up + ".weight", F, C});
    fc2.pieces.push_back({x + down + ".weight", C, F});
  }
  m.push_back(std::move(fc1));
  m.push_back(std::move(fc2));
  if (family == Family::DeepseekV3 && cfg.moe_shared_expert_intermediate_size > 0) {
    swiglu_map(o + "shared_experts.", block + "shared_experts.", "gate_proj", "up_proj",
               "down_proj", cfg.moe_shared_expert_intermediate_size, C, m);
  } else if (cfg.moe_shared_expert_intermediate_size > 0) {
    swiglu_map(o + "shared_experts.", block + "shared_expert.", "gate_proj", "up_proj", "down_proj",
               cfg.moe_shared_expert_intermediate_size, C, m);
    m.push_back({o + "shared_experts.gate_weight",
                 {{block + "shared_expert_gate.weight", 1, C}},
                 {},
                 false});
  }
}

// DeepSeek-V3's multi-latent attention (model/mla.h): q_a_proj, q_a_layernorm, q_b_proj (or
// q_proj without a query latent), kv_a_proj_with_mqa ([latent; rope key]), kv_a_layernorm,
// kv_b_proj (per head [k_nope; v]), o_proj.
void mla_map(const TransformerConfig& cfg, bool interleaved, const std::string& o,
             const std::string& a, std::vector<TensorMapping>& m) {
  const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, qk = cfg.qk_head_dim;
  const int64_t pe = cfg.qk_pos_emb_head_dim, vd = cfg.v_head_dim, ql = cfg.q_lora_rank;
  const int64_t kvl = cfg.kv_lora_rank;
  // Hugging Face's rope rows in interleaved pair order (rope_interleave) are de-interleaved in
  // ours; row_of is empty (the identity) without.
  auto rope_rows = [&](int64_t rows, int64_t block, int64_t first) {
    return interleaved ? mla_deinterleaved_rope_rows(rows, block, first, pe)
                       : std::vector<int64_t>{};
  };
  const std::vector<int64_t> q_rows = rope_rows(H * (qk + pe), qk + pe, qk);
  if (ql > 0) {
    m.push_back({o + "linear_q_down_proj.weight", {{a + "q_a_proj.weight", ql, C}}, {}, false});
    m.push_back({o + "q_layernorm.weight", {{a + "q_a_layernorm.weight", ql, 0}}, {}, false});
    m.push_back({o + "linear_q_up_proj.weight",
                 {{a + "q_b_proj.weight", H * (qk + pe), ql}},
                 q_rows,
                 false});
  } else {
    m.push_back(
        {o + "linear_q_proj.weight", {{a + "q_proj.weight", H * (qk + pe), C}}, q_rows, false});
  }
  m.push_back({o + "linear_kv_down_proj.weight",
               {{a + "kv_a_proj_with_mqa.weight", kvl + pe, C}},
               rope_rows(kvl + pe, kvl + pe, kvl),
               false});
  m.push_back({o + "kv_layernorm.weight", {{a + "kv_a_layernorm.weight", kvl, 0}}, {}, false});
  m.push_back(
      {o + "linear_kv_up_proj.weight", {{a + "kv_b_proj.weight", H * (qk + vd), kvl}}, {}, false});
  m.push_back({o + "linear_proj.weight", {{a + "o_proj.weight", C, H * vd}}, {}, false});
}

std::vector<TensorMapping> tensor_map(Family family, const TransformerConfig& cfg,
                                      bool rope_interleave) {
  const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, G = cfg.query_groups();
  const int64_t hd = cfg.head_dim(), F = cfg.ffn_size(), V = cfg.vocab_size;
  const std::vector<int64_t> qkv = qkv_rows(H, G, hd);
  const std::string pre = family_info(family).prefix;
  std::vector<TensorMapping> m;
  auto one = [&m](std::string ours, std::string hf, int64_t rows, int64_t cols,
                  bool transposed = false) {
    m.push_back({std::move(ours), {{std::move(hf), rows, cols, transposed}}, {}, false});
  };
  const bool gpt2 = family == Family::GPT2;
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
      if (cfg.multi_latent_attention) {
        mla_map(cfg, rope_interleave, o + "self_attention.", a, m);
        if (cfg.is_moe_layer(i))
          moe_layer_map(family, cfg, o + "mlp.", h, m);
        else
          swiglu_map(o + "mlp.", h + "mlp.", "gate_proj", "up_proj", "down_proj", F, C, m);
        continue;
      }
      m.push_back({o + "self_attention.linear_qkv.weight",
                   {{a + "q_proj.weight", H * hd, C},
                    {a + "k_proj.weight", G * hd, C},
                    {a + "v_proj.weight", G * hd, C}},
                   qkv,
                   false});
      if (hf::has_qkv_bias(family))
        m.push_back({o + "self_attention.linear_qkv.bias",
                     {{a + "q_proj.bias", H * hd, 0},
                      {a + "k_proj.bias", G * hd, 0},
                      {a + "v_proj.bias", G * hd, 0}},
                     qkv,
                     false});
      if (hf::has_qk_norm(family)) {
        one(o + "self_attention.q_layernorm.weight", a + "q_norm.weight", hd, 0);
        one(o + "self_attention.k_layernorm.weight", a + "k_norm.weight", hd, 0);
      }
      one(o + "self_attention.linear_proj.weight", a + "o_proj.weight", C, H * hd);
      if (cfg.is_moe_layer(i))
        moe_layer_map(family, cfg, o + "mlp.", h, m);
      else
        swiglu_map(o + "mlp.", h + "mlp.", "gate_proj", "up_proj", "down_proj", F, C, m);
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

// Checks that our parameter (the whole tensor: global_shape in a parallel layout) has the
// shape the mapping expects.
const ParamInfo& our_param(const TensorMapping& m, const ParamInfo& p, const std::string& source) {
  const Shape& whole = p.global_shape.empty() ? p.shape : p.global_shape;
  const int64_t numel = checkpoint_format::numel_of(whole);
  const int64_t rows = m.stacked_rows(), cols = m.pieces[0].cols;
  // Ours may stack more than two dimensions (the experts' [E, rows, cols]): rows are all
  // but the last.
  const bool ok = cols == 0 ? whole == Shape{rows}
                            : whole.size() >= 2 && whole.back() == cols &&
                                  (numel == rows * cols || (m.padded && numel >= rows * cols));
  OMNI_REQUIRE(ok, source, ": parameter ", m.ours, " has shape ", shape_str(whole), " but ",
               m.pieces[0].name, (m.pieces.size() > 1 ? " and the rest" : ""), " need ",
               shape_str(cols ? Shape{rows, cols} : Shape{rows}));
  return p;
}
const ParamInfo& our_param(const TensorMapping& m, const ParameterSet<float>& params,
                           const std::string& source) {
  OMNI_REQUIRE(params.has(m.ours), source, ": the model has no parameter ", m.ours, " for ",
               m.pieces[0].name, " (another architecture than config.json describes?)");
  return our_param(m, params.info(m.ours), source);
}

// Where each row of our stacked tensor comes from: the piece and its row there.
struct RowSource {
  int32_t piece;
  int64_t row;
};
std::vector<RowSource> row_sources(const TensorMapping& m) {
  std::vector<RowSource> out(size_t(m.stacked_rows()));
  int64_t stacked = 0;
  for (size_t i = 0; i < m.pieces.size(); ++i)
    for (int64_t r = 0; r < m.pieces[i].rows; ++r, ++stacked)
      out[size_t(m.row_of.empty() ? stacked : m.row_of[size_t(stacked)])] = {int32_t(i), r};
  return out;
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
      const json::Value root = json::parse(hf::read_text(index), index);
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
  const SafetensorsTensor* find(const std::string& name, const std::string& prefix) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end() && name.rfind(prefix, 0) == 0)
      it = tensors_.find(name.substr(prefix.size()));
    return it == tensors_.end() ? nullptr : it->second.first;
  }
  const std::string& file_of(const std::string& name) const { return tensors_.at(name).second; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : tensors_) out.push_back(name);
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

// DeepSeek-V3's multi-token prediction layers: model.layers.N.* for N from the last layer of
// the model on (num_nextn_predict_layers of them), which omnitron does not import.
bool is_mtp_layer(const std::string& name, const std::string& prefix, int layers, int mtp) {
  const std::string head = prefix + "layers.";
  if (mtp <= 0 || name.rfind(head, 0) != 0) return false;
  int n = -1;
  const char* begin = name.data() + head.size();
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), n);
  return ec == std::errc() && *end == '.' && n >= layers && n < layers + mtp;
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  return fs::exists(dir + "/config.json") &&
         !fs::exists(dir + "/latest_checkpointed_iteration.txt");
}

std::vector<std::string> hf_model_args(const std::string& dir) {
  return hf::read_config(dir).args;
}

void load_hf_model_options(const std::string& dir, Options& opts) {
  TransformerConfig fresh;
  fresh.make_vocab_size_divisible_by = opts.model.make_vocab_size_divisible_by;
  opts.model = fresh;
  parse_options(hf_model_args(dir), opts);
}

void load_hf_weights(const std::string& dir, const std::vector<ParamInfo>& infos, float* values) {
  const hf::Config hc = hf::read_config(dir);
  const TransformerConfig cfg = hf::config_from_args(hc.args);
  const std::vector<TensorMapping> map = tensor_map(hc.family, cfg, hc.rope_interleave);
  const HfWeights weights(dir);
  const std::string prefix = family_info(hc.family).prefix;
  const std::string source = "--load " + dir;
  std::map<std::string, const ParamInfo*> ours;
  for (const ParamInfo& p : infos) ours[p.name] = &p;
  std::set<std::string> known, mapped;
  for (const TensorMapping& m : map) {
    std::vector<const SafetensorsTensor*> tensors;
    for (const HfPiece& piece : m.pieces) {
      known.insert(piece.name);
      const SafetensorsTensor* t = weights.find(piece.name, prefix);
      OMNI_REQUIRE(t, source, ": no tensor ", piece.name, " (", shape_text(piece), ") in ",
                   weights.files());
      const Shape want = piece.cols == 0    ? Shape{piece.rows}
                         : piece.transposed ? Shape{piece.cols, piece.rows}
                                            : Shape{piece.rows, piece.cols};
      OMNI_REQUIRE(t->shape == want, source, ": tensor ", t->name, " in '",
                   weights.file_of(t->name), "' has shape ", shape_str(t->shape), " but ",
                   shape_text(piece), " was expected from config.json");
      tensors.push_back(t);
    }
    const auto it = ours.find(m.ours);
    if (it == ours.end()) continue;  // another pipeline stage's
    const ParamInfo& p = our_param(m, *it->second, source);
    mapped.insert(m.ours);
    float* dst = values + p.offset;
    std::fill(dst, dst + p.numel, 0.0f);  // the vocabulary padding
    const int64_t width = m.pieces[0].cols ? m.pieces[0].cols : 1, rows = m.stacked_rows();
    const std::vector<RowSource> from = row_sources(m);
    // Only this rank's runs of the whole tensor are read, a row's part at a time.
    ParameterSet<float>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
      for (int64_t take = 0; n > 0; l += take, g += take, n -= take) {
        const int64_t r = g / width, c = g % width;
        take = std::min(n, width - c);
        if (r >= rows) continue;  // padding rows past Hugging Face's vocabulary
        const RowSource s = from[size_t(r)];
        const HfPiece& piece = m.pieces[size_t(s.piece)];
        const SafetensorsTensor& t = *tensors[size_t(s.piece)];
        if (!piece.transposed)
          read_as_f32(t, s.row * width + c, take, dst + l);
        else  // GPT-2's Conv1D: our row is a column there
          for (int64_t k = 0; k < take; ++k)
            read_as_f32(t, (c + k) * piece.rows + s.row, 1, dst + l + k);
      }
    });
  }
  for (const ParamInfo& p : infos)
    OMNI_REQUIRE(mapped.count(p.name), source, ": the model's parameter ", p.name,
                 " has no Hugging Face tensor (a model flag that config.json does not set?)");
  int mtp_skipped = 0;
  for (const std::string& name : weights.names()) {
    if (is_mtp_layer(name, prefix, cfg.num_layers, hc.mtp_layers)) {
      ++mtp_skipped;
      continue;
    }
    const bool tied_head = name == "lm_head.weight" && !cfg.untie_embeddings_and_output_weights;
    OMNI_REQUIRE(known.count(name) || known.count(prefix + name) || tied_head || is_buffer(name),
                 source, ": tensor ", name, " in '", weights.file_of(name),
                 "' has no place in omnitron's ", family_info(hc.family).architecture);
  }
  if (mtp_skipped > 0)
    std::fprintf(stderr,
                 "note: --load %s: %d tensors of the %d multi-token prediction layer(s) "
                 "(num_nextn_predict_layers) are not imported\n",
                 dir.c_str(), mtp_skipped, hc.mtp_layers);
}

void load_hf_weights(const std::string& dir, ParameterSet<float>& params) {
  load_hf_weights(dir, params.infos(), params.values());
}

void save_hf_model(const std::string& dir, const TransformerConfig& config,
                   const ParameterSet<float>& params, DType dtype) {
  OMNI_REQUIRE(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
               "--dtype: Hugging Face weights are written as f32, bf16 or f16 (got ",
               dtype_name(dtype), ")");
  const Family family = hf::family_of(config);
  const std::vector<TensorMapping> map = tensor_map(family, config, true);
  const std::string source = "--save " + dir;
  std::vector<SafetensorsOutput> out;
  for (const TensorMapping& m : map) {
    const ParamInfo& p = our_param(m, params, source);
    OMNI_CHECK(p.shard_dim < 0, "[hf] ", m.ours,
               " is a tensor-parallel slice; export takes the "
               "one-rank model");
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
  const std::string text = hf::config_json(family, config, dtype);
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
