#include "model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "base/error.h"
#include "base/trace.h"
#include "model/mla.h"
#include "parallel/context_parallel.h"

namespace omni {

namespace {
// A value in storage type T (rounded to nearest for bf16/f16).
template <typename T>
T storage_value(double v) {
  if constexpr (is_16bit<T>)
    return from_float<T>(float(v));
  else
    return T(v);
}

}  // namespace

template <typename T>
std::vector<ParamInfo> GPTModel<T>::parameter_layout(int r) const {
  const int tp = tp_.size();
  const int64_t C = cfg_.hidden_size, hd = cfg_.head_dim(), H = cfg_.num_attention_heads;
  const int64_t G = cfg_.query_groups(), F = cfg_.ffn_size(), hpg = H / G;
  const int64_t Gl = G / tp, Hl = H / tp, Fl = F / tp, Vl = vocab_.rows;
  const int64_t qkv_rows = Gl * (hpg + 2) * hd, vd = cfg_.value_head_dim();
  std::vector<ParamInfo> p;
  // A tensor every tensor-parallel rank holds whole.
  auto replicated = [&](std::string name, Shape shape, ParamInit init, bool decay, bool partial) {
    ParamInfo i(std::move(name), std::move(shape), init, decay);
    i.tp_replicated = tp > 1;
    i.tp_partial_grad = tp > 1 && partial;
    p.push_back(std::move(i));
  };
  // A tensor split along `dim` into this rank's `segments` (one rank: the whole tensor).
  auto split = [&](std::string name, Shape local, int dim, int64_t global_n,
                   std::vector<ShardSegment> segments, ParamInit init, bool decay) {
    ParamInfo i(std::move(name), local, init, decay);
    if (tp > 1) {
      i.global_shape = local;
      i.global_shape[dim] = global_n;
      i.shard_dim = dim;
      i.segments = std::move(segments);
    }
    p.push_back(std::move(i));
  };
  auto rows = [&](std::string name, Shape local, int64_t global_rows, ParamInit init, bool decay) {
    split(std::move(name), local, 0, global_rows, {{0, r * local[0], local[0]}}, init, decay);
  };
  const ParamInit gamma = cfg_.layernorm_zero_centered_gamma ? ParamInit::Zeros : ParamInit::Ones;
  auto norm = [&](const std::string& name, int64_t width, bool partial) {
    replicated(name + ".weight", {width}, gamma, false, partial);
    if (cfg_.norm_has_bias()) replicated(name + ".bias", {width}, ParamInit::Zeros, false, partial);
  };
  // SwiGLU's fused [gate; up]: this rank's gate rows, then its up rows.
  const std::vector<ShardSegment> fc1_segments =
      cfg_.swiglu ? std::vector<ShardSegment>{{0, r * Fl, Fl}, {Fl, F + r * Fl, Fl}}
                  : std::vector<ShardSegment>{{0, r * Fl, Fl}};
  const int64_t fc1_rows = cfg_.swiglu ? 2 * Fl : Fl, fc1_global = cfg_.swiglu ? 2 * F : F;
  const bool learned = cfg_.position_embedding_type == PositionEmbedding::LearnedAbsolute;
  const bool tied = !cfg_.untie_embeddings_and_output_weights;
  // The first stage embeds; the last holds the classifier (its own copy of the word
  // embeddings when they are tied and it is not also the first stage, as Megatron does).
  // Multi-token prediction embeds on the last stage too (Megatron's MTP ranks join the
  // embedding group): the same copy, summed across the stages by the trainer.
  if (parallel_.pre_process || (parallel_.post_process && (tied || cfg_.mtp_num_layers > 0)))
    rows("embedding.word_embeddings.weight", {Vl, C}, Vl * tp, ParamInit::Normal, true);
  if (parallel_.pre_process && learned)
    replicated("embedding.position_embeddings.weight", {cfg_.max_positions(), C}, ParamInit::Normal,
               true, sp_);
  // One transformer layer's parameters (the main model's, or a multi-token prediction depth's).
  auto add_layer = [&](int layer) {
    const std::string l = layer_prefix(layer);
    norm(l + "input_layernorm", C, sp_);
    if (cfg_.multi_latent_attention)  // gpt_mla.cpp
      add_mla_parameters(l + "self_attention.", replicated, rows);
    else
      rows(l + "self_attention.linear_qkv.weight", {qkv_rows, C}, qkv_rows * tp, ParamInit::Normal,
           true);
    if (cfg_.qkv_bias() && !cfg_.multi_latent_attention)
      rows(l + "self_attention.linear_qkv.bias", {qkv_rows}, qkv_rows * tp, ParamInit::Zeros,
           false);
    if (cfg_.qk_layernorm && !cfg_.multi_latent_attention) {  // shared by the heads
      norm(l + "self_attention.q_layernorm", hd, true);
      norm(l + "self_attention.k_layernorm", hd, true);
    }
    split(l + "self_attention.linear_proj.weight", {C, Hl * vd}, 1, H * vd,
          {{0, r * Hl * vd, Hl * vd}}, ParamInit::ScaledNormal, true);
    if (cfg_.add_bias_linear)
      replicated(l + "self_attention.linear_proj.bias", {C}, ParamInit::Zeros, false, false);
    norm(l + "pre_mlp_layernorm", C, sp_);
    if (cfg_.is_moe_layer(layer)) {
      add_moe_parameters(p, l + "mlp.");  // gpt_moe.cpp
      return;
    }
    split(l + "mlp.linear_fc1.weight", {fc1_rows, C}, 0, fc1_global, fc1_segments,
          ParamInit::Normal, true);
    if (cfg_.add_bias_linear)
      split(l + "mlp.linear_fc1.bias", {fc1_rows}, 0, fc1_global, fc1_segments, ParamInit::Zeros,
            false);
    split(l + "mlp.linear_fc2.weight", {C, Fl}, 1, F, {{0, r * Fl, Fl}}, ParamInit::ScaledNormal,
          true);
    if (cfg_.add_bias_linear)
      replicated(l + "mlp.linear_fc2.bias", {C}, ParamInit::Zeros, false, false);
  };
  for (const auto& [first, end] : chunks_)
    for (int layer = first; layer < end; ++layer) add_layer(layer);
  if (parallel_.post_process) {
    norm("decoder.final_layernorm", C, sp_);
    if (!tied) rows("output_layer.weight", {Vl, C}, Vl * tp, ParamInit::Normal, true);
    if (cfg_.mtp_num_layers > 0) add_mtp_parameters(replicated, add_layer);  // mtp.cpp
  }
  return p;
}

template <typename T>
GPTModel<T>::GPTModel(const TransformerConfig& config, int max_batch, uint64_t seed,
                      const ModelParallel& parallel, const ops::Exec& exec)
    : cfg_(config), max_batch_(max_batch), seed_(seed), parallel_(parallel), x_(exec) {
  if (x_.on_gpu())
    device_ = Device{x_.gpu->name() == "HIP" ? DeviceKind::HIP : DeviceKind::CUDA, 0};
  cfg_.validate();
  OMNI_REQUIRE(max_batch > 0, "--micro-batch-size must be positive (got ", max_batch, ")");
  if (!parallel_.tp) own_tp_ = make_self_communicator("tp");
  if (!parallel_.cp) own_cp_ = make_self_communicator("cp");
  Communicator* tp_group = parallel_.tp ? parallel_.tp : own_tp_.get();
  cp_ = parallel_.cp ? parallel_.cp : own_cp_.get();
  const int tp = tp_group->size(), cp = cp_->size();
  sp_ = parallel_.sequence_parallel && tp > 1;
  tp_ = TensorParallel<T>(tp_group, sp_, cfg_.hidden_size, x_);
  init_moe_rows();  // gpt_moe.cpp
  const int H = cfg_.num_attention_heads, G = cfg_.query_groups(), F = cfg_.ffn_size();
  OMNI_REQUIRE(G % tp == 0,
               cfg_.group_query_attention ? "--num-query-groups (" : "--num-attention-heads (", G,
               ") must be divisible by --tensor-model-parallel-size (", tp, ")");
  OMNI_REQUIRE(F % tp == 0, "the MLP width (--ffn-hidden-size, ", F,
               ") must be divisible by --tensor-model-parallel-size (", tp, ")");
  OMNI_REQUIRE(cfg_.seq_length % (2 * cp) == 0 || cp == 1, "--seq-length (", cfg_.seq_length,
               ") must be divisible by twice --context-parallel-size (", cp, ")");
  OMNI_REQUIRE(!parallel_.ulysses || cp == 1 || (H % (tp * cp) == 0 && G % (tp * cp) == 0),
               "Ulysses (--cp-comm-type a2a, SP, --ds-sequence-parallel-size) splits the heads: "
               "--num-attention-heads (",
               H, ") and --num-query-groups (", G,
               ") must divide by --tensor-model-parallel-size x --context-parallel-size (", tp,
               " x ", cp, ")");
  if (cfg_.num_moe_experts > 0) {  // model/gpt_moe.cpp
    expert_tokens_.assign(size_t(cfg_.num_layers + cfg_.mtp_num_layers) * cfg_.num_moe_experts,
                          0.0);  // multi-token prediction's layers after the decoder's
  }
  OMNI_REQUIRE(!cfg_.multi_latent_attention || !x_.on_gpu() || cfg_.v_head_dim <= cfg_.head_dim(),
               "--multi-latent-attention on the GPU: --v-head-dim (", cfg_.v_head_dim,
               ") above --qk-head-dim + --qk-pos-emb-head-dim (", cfg_.head_dim(),
               ") is not built yet");
  // Multi-token prediction (mtp.cpp) embeds the rolled tokens' positions on the last stage,
  // which holds no copy of the position table.
  OMNI_REQUIRE(cfg_.mtp_num_layers == 0 || parallel_.pre_process ||
                   cfg_.position_embedding_type != PositionEmbedding::LearnedAbsolute,
               "--mtp-num-layers ", cfg_.mtp_num_layers,
               " with --position-embedding-type learned_absolute and "
               "--pipeline-model-parallel-size above 1: not built yet (the last stage holds no "
               "copy of the position embeddings; rope and none are built)");
  heads_ = H / tp, groups_ = G / tp, ffn_ = F / tp;
  vocab_ = vocab_shard(cfg_.vocab_size, cfg_.make_vocab_size_divisible_by, tp, tp_.rank());
  chunks_ = parallel_.chunks;
  if (chunks_.empty()) chunks_.push_back({0, cfg_.num_layers});
  for (const auto& [first, end] : chunks_)
    OMNI_CHECK(first >= 0 && first < end && end <= cfg_.num_layers, "[gpt] bad layer range ", first,
               "..", end);

  params_ = ParameterSet<T>(parameter_layout(tp_.rank()), device_,
                            parallel_.params_memory ? parallel_.params_memory : x_.memory());
  params_.initialize(seed, cfg_.init_method_std,
                     cfg_.init_method_std / std::sqrt(2.0 * cfg_.num_layers));
  // Flat ranges of each layer, of the embedding and of the head, for the grads-ready hook.
  layer_ranges_.assign(cfg_.num_layers, {0, 0});
  const auto& infos = params_.infos();
  for (size_t i = 0; i < infos.size(); ++i) {
    const int64_t begin = infos[i].offset;
    const int64_t end = i + 1 < infos.size() ? infos[i + 1].offset : params_.size();
    auto widen = [&](std::pair<int64_t, int64_t>& r) {
      r = r.second > r.first ? std::pair{std::min(r.first, begin), std::max(r.second, end)}
                             : std::pair{begin, end};
    };
    const std::string& name = infos[i].name;
    if (name.rfind("embedding.", 0) == 0)
      widen(embedding_range_);
    else if (name.rfind("decoder.layers.", 0) == 0)
      widen(layer_ranges_[std::stoi(name.substr(15))]);
    else
      widen(head_range_);
  }

  const int64_t S = cfg_.seq_length, hd = cfg_.head_dim();
  const int64_t N = int64_t(max_batch) * S / cp, R = sp_ ? N / tp : N, C = cfg_.hidden_size;
  const int64_t fc1_out = cfg_.swiglu ? 2 * ffn_ : ffn_;
  if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
    const std::vector<double> inv_freq = cfg_.rotary_inv_freq();
    const size_t n = S * inv_freq.size();
    rope_cos_.resize(n);
    rope_sin_.resize(n);
    ops::rope_tables(rope_cos_.data(), rope_sin_.data(), S, inv_freq);
    rope_ = {rope_cos_.data(), rope_sin_.data()};
    if (x_.on_gpu()) {
      std::vector<float> tables(rope_cos_.begin(), rope_cos_.end());
      tables.insert(tables.end(), rope_sin_.begin(), rope_sin_.end());
      rope_device_ = Tensor::zeros({int64_t(2 * n)}, DType::F32, device_, x_.memory());
      float* d = rope_device_.template data<float>();
      ops::upload(x_, d, tables.data(), tables.size());
      rope_.device_cos = d, rope_.device_sin = d + n;
    }
  }
  if (cfg_.layernorm_zero_centered_gamma) {
    ones_ = buffer({C}), gamma_ = buffer({C});
    const std::vector<T> ones(size_t(C), storage_value<T>(1.0));
    ops::upload(x_, ones_.template data<T>(), ones.data(), ones.size());
  }
  acts_.resize(chunks_.size());
  auto buf = [&](Shape s) { return buffer(std::move(s)); };
  token_losses_ = stat_buffer({N});
  qkv_ = buf({N, (heads_ + 2 * groups_) * hd});
  full_ = buf({N, C}), d_full_ = buf({N, C}), d_resid_ = buf({R, C}), d_rows_ = buf({R, C});
  d_ffn_ = buf({N, ffn_}), d_fc1_ = buf({N, fc1_out});
  const int64_t vd = cfg_.value_head_dim();
  d_attn_ = buf({N, heads_ * vd}), dq_ = buf({N, heads_ * hd});
  dk_ = buf({N, groups_ * hd}), dv_ = buf({N, groups_ * vd});
  if (cfg_.qk_layernorm) dq_raw_ = buf({N, heads_ * hd}), dk_raw_ = buf({N, groups_ * hd});
  const int v_head_dim = cfg_.multi_latent_attention ? int(vd) : 0;
  if (cp > 1 && parallel_.ulysses)
    ulysses_ = UlyssesAttention<T>(cp_, x_, device_, max_batch, int(S / cp), heads_, groups_,
                                   int(hd), v_head_dim);
  else if (cp > 1)
    ring_ = RingAttention<T>(cp_, x_, device_, max_batch, int(S / cp), heads_, groups_, int(hd),
                             v_head_dim, cfg_.multi_latent_attention ? mla_softmax_scale(cfg_) : 0);
}

template <typename T>
Tensor GPTModel<T>::buffer(Shape shape) const {
  return Tensor::zeros(std::move(shape), dtype_of<T>(), device_, x_.memory());
}

template <typename T>
Tensor GPTModel<T>::stat_buffer(Shape shape) const {
  return Tensor::zeros(std::move(shape), dtype_of<Grad>(), device_, x_.memory());
}

template <typename T>
void GPTModel<T>::allocate_layer(LayerActivations& l) {
  const int cp = cp_->size(), tp = tp_.size();
  const int64_t S = cfg_.seq_length, Sl = S / cp, hd = cfg_.head_dim(), C = cfg_.hidden_size;
  const int64_t N = int64_t(max_batch_) * Sl, R = sp_ ? N / tp : N;
  const int64_t H = heads_, G = groups_, fc1_out = cfg_.swiglu ? 2 * ffn_ : ffn_;
  auto buf = [&](Shape s) { return buffer(std::move(s)); };
  auto stat = [&](Shape s) { return stat_buffer(std::move(s)); };
  l.ln1 = buf({R, C}), l.ln1_mean = stat({R}), l.ln1_rstd = stat({R});
  l.ln1_full = sp_ ? buf({N, C}) : l.ln1;
  const int64_t vd = cfg_.value_head_dim();
  l.q = buf({N, H * hd}), l.k = buf({N, G * hd}), l.v = buf({N, G * vd});
  if (cfg_.multi_latent_attention) allocate_mla(l);  // gpt_mla.cpp
  if (cfg_.qk_layernorm) {
    l.q_raw = buf({N, H * hd}), l.k_raw = buf({N, G * hd});
    l.qn_mean = stat({N * H}), l.qn_rstd = stat({N * H});
    l.kn_mean = stat({N * G}), l.kn_rstd = stat({N * G});
  }
  if (cp > 1 && parallel_.ulysses) {
    l.q_all = buf({N, H * hd}), l.out_all = buf({N, H * vd});
    l.k_all = buf({N, G * hd}), l.v_all = buf({N, G * vd});
  } else if (cp > 1) {
    l.k_all = buf({N * cp, G * hd}), l.v_all = buf({N * cp, G * vd});
  }
  l.lse = stat({int64_t(max_batch_) * H * Sl});
  l.attn = buf({N, H * vd});
  l.mid = buf({R, C});
  l.ln2 = buf({R, C}), l.ln2_mean = stat({R}), l.ln2_rstd = stat({R});
  l.ln2_full = sp_ ? buf({N, C}) : l.ln2;
  l.fc1 = buf({N, fc1_out}), l.act = buf({N, ffn_});
}

template <typename T>
bool GPTModel<T>::recomputed(int i) const {
  return recompute_.granularity == Recompute::Full &&
         (recompute_.num_layers == 0 || i < recompute_.num_layers);
}

template <typename T>
typename GPTModel<T>::LayerActivations& GPTModel<T>::layer_activations(Activations& a, int i) {
  if (!recomputed(i)) return a.layers[i];
  if (!recompute_scratch_.ln1.defined()) allocate_layer(recompute_scratch_);
  return recompute_scratch_;
}

template <typename T>
typename GPTModel<T>::Activations& GPTModel<T>::activations(int chunk, int slot) {
  auto& slots = acts_[chunk];
  if (slot >= int(slots.size())) slots.resize(slot + 1);
  if (slots[slot]) return *slots[slot];
  const int cp = cp_->size(), tp = tp_.size();
  const int64_t N = int64_t(max_batch_) * cfg_.seq_length / cp, R = sp_ ? N / tp : N;
  const int64_t C = cfg_.hidden_size;
  auto buf = [&](Shape s) { return buffer(std::move(s)); };
  auto a = std::make_unique<Activations>();
  const int layers = chunks_[chunk].second - chunks_[chunk].first;
  for (int i = 0; i <= layers; ++i) a->residual.push_back(buf({R, C}));
  a->layers.resize(layers);
  // Fully recomputed layers keep only their input (the residual stream).
  for (int i = 0; i < layers; ++i)
    if (!recomputed(i)) allocate_layer(a->layers[i]);
  if (chunk == num_chunks() - 1 && parallel_.post_process) {
    a->final_norm = buf({R, C}), a->final_mean = stat_buffer({R}), a->final_rstd = stat_buffer({R});
    a->final_full = sp_ ? buf({N, C}) : a->final_norm;
    a->d_final = buf({R, C});
  }
  a->positions.resize(N);
  // tokens, labels, positions, key_start and mask, N of each.
  a->input_storage = std::make_unique<Storage>(5 * N * sizeof(int32_t), device_, x_.memory());
  slots[slot] = std::move(a);
  return *slots[slot];
}

template <typename T>
int64_t GPTModel<T>::layer_bytes(const LayerActivations& l) const {
  int64_t b = 0;
  for (const Tensor* t :
       {&l.ln1,     &l.ln1_mean, &l.ln1_rstd, &l.q,        &l.k,   &l.v,     &l.q_raw, &l.k_raw,
        &l.qn_mean, &l.qn_rstd,  &l.kn_mean,  &l.kn_rstd,  &l.lse, &l.k_all, &l.v_all, &l.attn,
        &l.mid,     &l.ln2,      &l.ln2_mean, &l.ln2_rstd, &l.fc1, &l.act,   &l.q_all, &l.out_all})
    b += t->held_bytes();
  if (sp_ && l.ln1_full.defined()) b += int64_t(l.ln1_full.bytes() + l.ln2_full.bytes());
  return b + moe_activation_bytes(l) + mla_activation_bytes(l);
}

template <typename T>
int64_t GPTModel<T>::activation_bytes() const {
  int64_t b = layer_bytes(recompute_scratch_);
  for (const auto& slots : acts_)
    for (const auto& a : slots) {
      if (!a) continue;
      for (const Tensor& t : a->residual) b += int64_t(t.bytes());
      for (const LayerActivations& l : a->layers) b += layer_bytes(l);
    }
  return b;
}

template <typename T>
int64_t GPTModel<T>::workspace_bytes() const {
  int64_t b = 0;
  for (const Tensor* t :
       {&qkv_, &full_, &d_resid_, &d_rows_, &d_full_, &d_ffn_, &d_fc1_, &d_attn_, &dq_, &dk_, &dv_,
        &dq_raw_, &dk_raw_, &token_losses_, &ones_, &gamma_, &rope_device_})
    b += t->held_bytes();
  if (!x_.on_gpu()) b += int64_t((rope_cos_.size() + rope_sin_.size()) * sizeof(double));
  b += ring_.scratch_bytes() + ulysses_.scratch_bytes();
  for (const auto& slots : acts_)
    for (const auto& a : slots) {
      if (!a) continue;
      for (const Tensor* t : {&a->final_norm, &a->final_mean, &a->final_rstd, &a->d_final})
        b += t->held_bytes();
      if (sp_) b += a->final_full.held_bytes();  // else final_norm itself
      if (a->input_storage) b += int64_t(a->input_storage->bytes());
    }
  return b + mla_scratch_bytes() + moe_scratch_bytes() + mtp_bytes();
}

template <typename T>
void GPTModel<T>::set_recompute(const Recompute& r) {
  OMNI_CHECK(std::all_of(acts_.begin(), acts_.end(), [](const auto& s) { return s.empty(); }),
             "[gpt] set_recompute before the first forward");
  recompute_ = r;
}

template <typename T>
T* GPTModel<T>::classifier_weight() const {
  return params_.value(cfg_.untie_embeddings_and_output_weights
                           ? "output_layer.weight"
                           : "embedding.word_embeddings.weight");
}

template <typename T>
typename GPTModel<T>::Grad* GPTModel<T>::classifier_grad() const {
  return params_.grad(cfg_.untie_embeddings_and_output_weights
                          ? "output_layer.weight"
                          : "embedding.word_embeddings.weight");
}

template <typename T>
typename GPTModel<T>::Geometry GPTModel<T>::geometry(const MicroBatch& mb) const {
  const int tokens = mb.batch * mb.seq;
  return {mb.batch, mb.seq, tokens, tp_.rows(tokens)};
}

template <typename T>
ops::AttentionDims GPTModel<T>::attention_dims(const MicroBatch& mb, const Inputs& in) const {
  ops::AttentionDims d{mb.batch, mb.seq, heads_, groups_, cfg_.head_dim(), in.key_start};
  if (cfg_.multi_latent_attention)
    d.v_head_dim = cfg_.v_head_dim, d.softmax_scale = mla_softmax_scale(cfg_);
  return d;
}

template <typename T>
ops::DropoutKey GPTModel<T>::dropout_key(const MicroBatch& mb, const Inputs& in, const Geometry& g,
                                         int layer, ops::DropoutSite site) const {
  const bool attention = site == ops::DropoutSite::Attention;
  const double p = attention ? cfg_.attention_dropout : cfg_.hidden_dropout;
  if (!in.dropout || p == 0) return {};
  ops::DropoutKey k = ops::dropout_key(p, seed_, mb.iteration, layer, site);
  k.first_sample = mb.first_sample;
  k.cp = cp_->size(), k.cp_rank = k.key_rank = cp_->rank();
  k.head_offset = tp_.rank() * heads_;
  k.first_row = tp_.first_row(g.tokens);
  return k;
}

template <typename T>
void GPTModel<T>::hidden_dropout(T* rows, const MicroBatch& mb, const Inputs& in, const Geometry& g,
                                 int layer, ops::DropoutSite site) const {
  const ops::DropoutKey k = dropout_key(mb, in, g, layer, site);
  if (k.active()) ops::dropout(x_, rows, g.rows, cfg_.hidden_size, g.seq, k);
}

template <typename T>
void GPTModel<T>::stage_inputs(Activations& a, const MicroBatch& mb, const Geometry& g) {
  const size_t N = size_t(g.tokens);
  for (size_t n = 0; n < N; ++n)
    a.positions[n] = mb.position_ids ? mb.position_ids[n] : int32_t(n % size_t(g.seq));
  int32_t* base = static_cast<int32_t*>(a.input_storage->data());
  const size_t stride = size_t(max_batch_) * cfg_.seq_length / cp_->size();
  auto put = [&](int i, const int32_t* host) -> const int32_t* {
    if (!host) return nullptr;
    ops::upload(x_, base + i * stride, host, N);
    return base + i * stride;
  };
  a.in.tokens = put(0, mb.tokens);
  a.in.labels = put(1, mb.labels);
  a.in.positions = put(2, a.positions.data());
  a.in.key_start = put(3, mb.key_start);
  a.in.mask = nullptr;
  a.in.dropout = false;
  if (mb.loss_mask) {
    float* mask = reinterpret_cast<float*>(base + 4 * stride);
    ops::upload(x_, mask, mb.loss_mask, N);
    a.in.mask = mask;
  }
}

template <typename T>
void GPTModel<T>::check_batch(const MicroBatch& mb) const {
  const int cp = cp_->size(), tp = tp_.size();
  OMNI_CHECK(mb.batch > 0 && mb.batch <= max_batch_, "[gpt] batch ", mb.batch, " outside 1..",
             max_batch_);
  OMNI_CHECK(mb.seq > 0 && mb.seq * cp <= cfg_.seq_length, "[gpt] sequence ", mb.seq,
             " outside 1..", cfg_.seq_length / cp);
  OMNI_CHECK(cp == 1 || (mb.seq_index && mb.position_ids && mb.seq % 2 == 0),
             "[gpt] a context-parallel micro-batch needs seq_index and position_ids");
  const int64_t N = int64_t(mb.batch) * mb.seq;
  OMNI_REQUIRE(!sp_ || N % tp == 0, "--sequence-parallel: the micro-batch's ", N,
               " tokens must divide by --tensor-model-parallel-size (", tp, ")");
  for (int64_t n = 0; n < N; ++n) {
    OMNI_REQUIRE(mb.tokens[n] >= 0 && mb.tokens[n] < cfg_.vocab_size, "token id ", mb.tokens[n],
                 " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
    if (mb.labels && (!mb.loss_mask || mb.loss_mask[n] != 0.0f))
      OMNI_REQUIRE(mb.labels[n] >= 0 && mb.labels[n] < cfg_.vocab_size, "label id ", mb.labels[n],
                   " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
  }
}

template <typename T>
void GPTModel<T>::embed(Activations& a, const MicroBatch& mb, const Geometry& g) {
  const int C = cfg_.hidden_size;
  T* out = a.residual[0].template data<T>();
  tp_.embedding_forward(out, full_.template data<T>(), a.in.tokens,
                        params_.value("embedding.word_embeddings.weight"), vocab_, g.tokens, g.seq);
  if (const T* wpe = params_.value_or_null("embedding.position_embeddings.weight"))
    ops::position_embedding_add(x_, out, wpe, g.rows, g.seq, C,
                                a.in.positions + tp_.first_row(g.tokens));
  hidden_dropout(out, mb, a.in, g, -1, ops::DropoutSite::Embedding);
}

template <typename T>
void GPTModel<T>::embed_backward(const T* d_rows, const int32_t* tokens, const int32_t* positions,
                                 const Geometry& g) {
  const int C = cfg_.hidden_size;
  // The positions of this rank's residual rows (sequence parallel: a slice of them), which
  // under context parallelism range over the whole sequence's table, not the local share.
  if (Grad* dwpe = params_.grad_or_null("embedding.position_embeddings.weight"))
    ops::embedding_backward(x_, static_cast<Grad*>(nullptr), dwpe, tokens, d_rows, g.rows,
                            cfg_.max_positions(), C, positions, 0, 1 << 30);
  tp_.embedding_backward(params_.grad("embedding.word_embeddings.weight"),
                         d_full_.template data<T>(), d_rows, tokens, vocab_, g.tokens, g.seq);
}

template <typename T>
double GPTModel<T>::masked_tokens(const MicroBatch& mb, const Geometry& g) const {
  double s = g.tokens;
  if (mb.loss_mask) {
    s = 0;
    for (int n = 0; n < g.tokens; ++n) s += mb.loss_mask[n];
  }
  return sum_over_sequence(*cp_, s);
}

template <typename T>
void GPTModel<T>::final_norm_forward(Activations& a, const Geometry& g) {
  norm_forward(a.final_norm.template data<T>(), a.final_mean.template data<Grad>(),
               a.final_rstd.template data<Grad>(), a.residual.back().template data<T>(),
               params_.value("decoder.final_layernorm.weight"),
               params_.value_or_null("decoder.final_layernorm.bias"), g.rows, cfg_.hidden_size);
}

template <typename T>
double GPTModel<T>::head_forward(Activations& a, const MicroBatch& mb, const Geometry& g,
                                 bool train, double grad_scale) {
  OMNI_CHECK(mb.labels, "[gpt] the loss needs labels");
  const int C = cfg_.hidden_size;
  final_norm_forward(a, g);
  const T* h =
      tp_.gather_rows(a.final_full.template data<T>(), a.final_norm.template data<T>(), g.tokens);
  const double denom = mb.loss_divisor > 0 ? mb.loss_divisor : masked_tokens(mb, g);
  T* d_final = a.d_final.template data<T>();
  if (denom == 0) {  // every token masked: no loss, no gradient
    ops::zero(x_, d_final, size_t(g.rows) * C);
    if (mb.token_losses) std::fill(mb.token_losses, mb.token_losses + g.tokens, 0.0f);
    return 0.0;
  }
  // Multi-token prediction's depths first (mtp.cpp; training only: evaluation reports the
  // main loss): they use full_ and the layer scratch.
  const T* d_mtp =
      cfg_.mtp_num_layers > 0 && train ? mtp_forward_backward(a, mb, g, grad_scale) : nullptr;
  T* dh = train ? full_.template data<T>() : nullptr;
  Grad* losses = mb.token_losses ? token_losses_.template data<Grad>() : nullptr;
  const double part = tp_.vocab_cross_entropy(losses, dh, train ? classifier_grad() : nullptr, h,
                                              classifier_weight(), a.in.labels, a.in.mask, vocab_,
                                              g.tokens, grad_scale / denom);
  const double loss = sum_over_sequence(*cp_, part);
  if (losses) {
    std::vector<Grad> host(size_t(g.tokens));
    ops::download(x_, host.data(), losses, host.size());
    std::copy(host.begin(), host.end(), mb.token_losses);
  }
  if (train) {
    const T* d_norm = tp_.reduce_rows(d_rows_.template data<T>(), dh, g.tokens);
    if (d_mtp) {  // this rank's rows, as d_norm's (dh itself, or reduce-scattered out of it)
      ops::add(x_, dh, d_norm, d_mtp, size_t(g.rows) * C);
      d_norm = dh;
    }
    ops::zero(x_, d_final, size_t(g.rows) * C);
    norm_backward(
        d_final, params_.grad("decoder.final_layernorm.weight"),
        params_.grad_or_null("decoder.final_layernorm.bias"), d_norm,
        a.residual.back().template data<T>(), params_.value("decoder.final_layernorm.weight"),
        a.final_mean.template data<Grad>(), a.final_rstd.template data<Grad>(), g.rows, C);
  }
  return loss / denom;
}

template <typename T>
void GPTModel<T>::layers_forward(int chunk, Activations& a, const MicroBatch& mb,
                                 const Geometry& g) {
  const int first = chunks_[chunk].first;
  StepLayer place(-1);  // for the collective watchdog's reports
  for (size_t i = 0; i < a.layers.size(); ++i) {
    place.set(first + int(i));
    use_params(layer_ranges_[first + int(i)], true);
    layer_forward(first + int(i), layer_activations(a, int(i)), a.residual[i].template data<T>(),
                  a.residual[i + 1].template data<T>(), mb, g, a.in);
    use_params(layer_ranges_[first + int(i)], false);
  }
}

template <typename T>
int GPTModel<T>::stage_rows(const MicroBatch& mb) const {
  return geometry(mb).rows;
}

template <typename T>
const T* GPTModel<T>::chunk_forward(int chunk, int slot, const MicroBatch& mb, const T* input,
                                    bool train, double grad_scale, double* loss) {
  check_batch(mb);
  const Geometry g = geometry(mb);
  Activations& a = activations(chunk, slot);
  stage_inputs(a, mb, g);
  a.in.dropout = train;
  moe_training_ = train, moe_recomputing_ = false, moe_grad_scale_ = grad_scale;
  if (has_embedding(chunk)) {
    use_params(embedding_range_, true);
    embed(a, mb, g);
    use_params(embedding_range_, false);
  } else {
    OMNI_CHECK(input, "[gpt] chunk ", chunk, " needs the previous stage's output");
    ops::copy(x_, a.residual[0].template data<T>(), input, size_t(g.rows) * cfg_.hidden_size);
  }
  layers_forward(chunk, a, mb, g);
  if (!has_loss(chunk)) return a.residual.back().template data<T>();
  const bool tied = !cfg_.untie_embeddings_and_output_weights;  // the classifier's weight
  use_params(head_range_, true);
  if (tied) use_params(embedding_range_, true);
  *loss = head_forward(a, mb, g, train, grad_scale);
  use_params(head_range_, false);
  if (tied) use_params(embedding_range_, false);
  return nullptr;
}

template <typename T>
const T* GPTModel<T>::chunk_backward(int chunk, int slot, const MicroBatch& mb,
                                     const T* grad_output) {
  const Geometry g = geometry(mb);
  Activations& a = activations(chunk, slot);
  const size_t rows = size_t(g.rows) * cfg_.hidden_size;
  T* dres = d_resid_.template data<T>();
  const bool defer = defer_embedding_ && grads_ready_ && has_loss(chunk) && has_embedding(chunk);
  if (has_loss(chunk)) {
    ops::copy(x_, dres, a.d_final.template data<T>(), rows);
    mark_ready(head_range_);
    // The classifier's copy; or all but the rows kept below.
    if (!parallel_.pre_process || defer) mark_ready(embedding_range_);
  } else {
    OMNI_CHECK(grad_output, "[gpt] chunk ", chunk, " needs the next stage's gradient");
    ops::copy(x_, dres, grad_output, rows);
  }
  const int first = chunks_[chunk].first;
  StepLayer place(-1);  // for the collective watchdog's reports
  for (int i = int(a.layers.size()) - 1; i >= 0; --i) {
    place.set(first + i);
    LayerActivations& la = layer_activations(a, i);
    use_params(layer_ranges_[first + i], true);
    if (recomputed(i)) {  // the layer's forward again, from its saved input
      moe_training_ = moe_recomputing_ = true;
      layer_forward(first + i, la, a.residual[i].template data<T>(),
                    a.residual[i + 1].template data<T>(), mb, g, a.in);
      moe_recomputing_ = false;
    }
    layer_backward(first + i, la, a.residual[i].template data<T>(), dres, mb, g, a.in);
    use_params(layer_ranges_[first + i], false);
    mark_ready(layer_ranges_[first + i]);
  }
  if (!has_embedding(chunk)) return dres;
  hidden_dropout(dres, mb, a.in, g, -1, ops::DropoutSite::Embedding);  // its own transpose
  if (defer) {
    defer_embedding_grads(dres, a, g);
    return nullptr;
  }
  embed_backward(dres, a.in.tokens, a.in.positions + tp_.first_row(g.tokens), g);
  mark_ready(embedding_range_);
  return nullptr;
}

template <typename T>
double GPTModel<T>::forward_backward(const MicroBatch& mb, double grad_scale) {
  OMNI_CHECK(parallel_.pre_process && parallel_.post_process,
             "[gpt] forward_backward needs every stage; pipelines use chunk_forward");
  const T* x = nullptr;
  double loss = 0;
  for (int c = 0; c < num_chunks(); ++c) x = chunk_forward(c, 0, mb, x, true, grad_scale, &loss);
  const T* d = nullptr;
  for (int c = num_chunks() - 1; c >= 0; --c) d = chunk_backward(c, 0, mb, d);
  return loss;
}

template <typename T>
double GPTModel<T>::forward_loss(const MicroBatch& mb) {
  OMNI_CHECK(parallel_.pre_process && parallel_.post_process,
             "[gpt] forward_loss needs every stage; pipelines use chunk_forward");
  const T* x = nullptr;
  double loss = 0;
  for (int c = 0; c < num_chunks(); ++c) x = chunk_forward(c, 0, mb, x, false, 0.0, &loss);
  return loss;
}

template <typename T>
std::vector<T> GPTModel<T>::forward_logits(const int32_t* tokens, int batch, int seq) {
  OMNI_CHECK(tp_.size() == 1 && cp_->size() == 1 && num_chunks() == 1 && parallel_.pre_process &&
                 parallel_.post_process,
             "[gpt] logits are computed by a one-rank model");
  const MicroBatch mb{tokens, nullptr, nullptr, batch, seq};
  check_batch(mb);
  const Geometry g = geometry(mb);
  Activations& a = activations(0, 0);
  stage_inputs(a, mb, g);
  moe_training_ = moe_recomputing_ = false;
  embed(a, mb, g);
  layers_forward(0, a, mb, g);
  final_norm_forward(a, g);
  const int C = cfg_.hidden_size, V = cfg_.vocab_size;
  Tensor logits = buffer({int64_t(g.tokens), V});
  ops::linear_forward<T>(x_, logits.template data<T>(), a.final_norm.template data<T>(),
                         classifier_weight(), nullptr, g.tokens, C, V);
  std::vector<T> host(size_t(g.tokens) * V);
  ops::download(x_, host.data(), logits.template data<T>(), host.size());
  return host;
}

template <typename T>
std::vector<float> GPTModel<T>::next_token_logits(const int32_t* tokens, int seq) {
  const std::vector<T> all = forward_logits(tokens, 1, seq);
  const int V = cfg_.vocab_size;
  std::vector<float> last(static_cast<size_t>(V));
  for (int v = 0; v < V; ++v) {
    const T x = all[all.size() - V + v];
    if constexpr (is_16bit<T>)
      last[v] = to_float(x);
    else
      last[v] = float(x);
  }
  return last;
}

template class GPTModel<float>;
template class GPTModel<double>;
template class GPTModel<bf16>;
template class GPTModel<f16>;

}  // namespace omni
