#include "model/gpt_model.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace omni {

namespace {
std::string layer_prefix(int i) {
  return "decoder.layers." + std::to_string(i) + ".";
}
}  // namespace

template <typename T>
std::vector<ParamInfo> GPTModel<T>::parameter_layout() const {
  const int64_t C = cfg_.hidden_size, hd = cfg_.head_dim(), H = cfg_.num_attention_heads;
  const int64_t G = cfg_.query_groups(), F = cfg_.ffn_size(), Vp = cfg_.padded_vocab_size();
  const int64_t qkv_w = (H + 2 * G) * hd, fc1_out = cfg_.swiglu ? 2 * F : F;
  std::vector<ParamInfo> p;
  auto add = [&](std::string name, Shape shape, ParamInit init, bool decay) {
    p.push_back(ParamInfo{std::move(name), std::move(shape), 0, 0, init, decay});
  };
  auto add_norm = [&](const std::string& name, int64_t width) {
    add(name + ".weight", {width}, ParamInit::Ones, false);
    if (cfg_.norm_has_bias()) add(name + ".bias", {width}, ParamInit::Zeros, false);
  };
  add("embedding.word_embeddings.weight", {Vp, C}, ParamInit::Normal, true);
  if (cfg_.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    add("embedding.position_embeddings.weight", {cfg_.max_positions(), C}, ParamInit::Normal, true);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    const std::string l = layer_prefix(i);
    add_norm(l + "input_layernorm", C);
    add(l + "self_attention.linear_qkv.weight", {qkv_w, C}, ParamInit::Normal, true);
    if (cfg_.qkv_bias())
      add(l + "self_attention.linear_qkv.bias", {qkv_w}, ParamInit::Zeros, false);
    if (cfg_.qk_layernorm) {
      add_norm(l + "self_attention.q_layernorm", hd);
      add_norm(l + "self_attention.k_layernorm", hd);
    }
    add(l + "self_attention.linear_proj.weight", {C, H * hd}, ParamInit::ScaledNormal, true);
    if (cfg_.add_bias_linear)
      add(l + "self_attention.linear_proj.bias", {C}, ParamInit::Zeros, false);
    add_norm(l + "pre_mlp_layernorm", C);
    add(l + "mlp.linear_fc1.weight", {fc1_out, C}, ParamInit::Normal, true);
    if (cfg_.add_bias_linear) add(l + "mlp.linear_fc1.bias", {fc1_out}, ParamInit::Zeros, false);
    add(l + "mlp.linear_fc2.weight", {C, F}, ParamInit::ScaledNormal, true);
    if (cfg_.add_bias_linear) add(l + "mlp.linear_fc2.bias", {C}, ParamInit::Zeros, false);
  }
  add_norm("decoder.final_layernorm", C);
  if (cfg_.untie_embeddings_and_output_weights)
    add("output_layer.weight", {Vp, C}, ParamInit::Normal, true);
  return p;
}

template <typename T>
GPTModel<T>::GPTModel(const TransformerConfig& config, int max_batch, uint64_t seed)
    : cfg_(config), max_batch_(max_batch) {
  cfg_.validate();
  OMNI_REQUIRE(max_batch > 0, "--micro-batch-size must be positive (got ", max_batch, ")");
  params_ = ParameterSet<T>(parameter_layout());
  params_.initialize(seed, cfg_.init_method_std,
                     cfg_.init_method_std / std::sqrt(2.0 * cfg_.num_layers));

  const int64_t N = int64_t(max_batch) * cfg_.seq_length, S = cfg_.seq_length;
  const int64_t C = cfg_.hidden_size, hd = cfg_.head_dim(), H = cfg_.num_attention_heads;
  const int64_t G = cfg_.query_groups(), F = cfg_.ffn_size(), fc1_out = cfg_.swiglu ? 2 * F : F;
  const DType dt = dtype_of<T>();
  auto buf = [&](Shape s) { return Tensor::zeros(std::move(s), dt); };
  if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
    rope_cos_.resize(S * hd / 2);
    rope_sin_.resize(S * hd / 2);
    ops::rope_tables(rope_cos_.data(), rope_sin_.data(), S, hd, cfg_.rotary_base);
  }
  for (int i = 0; i <= cfg_.num_layers; ++i) residual_.push_back(buf({N, C}));
  acts_.resize(cfg_.num_layers);
  for (LayerActivations& a : acts_) {
    a.ln1 = buf({N, C}), a.ln1_mean = buf({N}), a.ln1_rstd = buf({N});
    a.q = buf({N, H * hd}), a.k = buf({N, G * hd}), a.v = buf({N, G * hd});
    if (cfg_.qk_layernorm) {
      a.q_raw = buf({N, H * hd}), a.k_raw = buf({N, G * hd});
      a.qn_mean = buf({N * H}), a.qn_rstd = buf({N * H});
      a.kn_mean = buf({N * G}), a.kn_rstd = buf({N * G});
    }
    a.probs = buf({max_batch, H, S, S}), a.attn = buf({N, H * hd});
    a.mid = buf({N, C});
    a.ln2 = buf({N, C}), a.ln2_mean = buf({N}), a.ln2_rstd = buf({N});
    a.fc1 = buf({N, fc1_out}), a.act = buf({N, F});
  }
  final_norm_ = buf({N, C}), final_mean_ = buf({N}), final_rstd_ = buf({N});
  qkv_ = buf({N, (H + 2 * G) * hd});
  d_resid_ = buf({N, C}), d_hidden_ = buf({N, C}), d_ffn_ = buf({N, F}), d_fc1_ = buf({N, fc1_out});
  d_attn_ = buf({N, H * hd}), dq_ = buf({N, H * hd}), dk_ = buf({N, G * hd}),
  dv_ = buf({N, G * hd});
  if (cfg_.qk_layernorm) dq_raw_ = buf({N, H * hd}), dk_raw_ = buf({N, G * hd});
}

template <typename T>
typename GPTModel<T>::LayerParams GPTModel<T>::layer_params(int i, bool grads) const {
  const std::string l = layer_prefix(i);
  auto get = [&](const std::string& name) {
    return grads ? params_.grad_or_null(l + name) : params_.value_or_null(l + name);
  };
  return LayerParams{get("input_layernorm.weight"),
                     get("input_layernorm.bias"),
                     get("self_attention.linear_qkv.weight"),
                     get("self_attention.linear_qkv.bias"),
                     get("self_attention.q_layernorm.weight"),
                     get("self_attention.q_layernorm.bias"),
                     get("self_attention.k_layernorm.weight"),
                     get("self_attention.k_layernorm.bias"),
                     get("self_attention.linear_proj.weight"),
                     get("self_attention.linear_proj.bias"),
                     get("pre_mlp_layernorm.weight"),
                     get("pre_mlp_layernorm.bias"),
                     get("mlp.linear_fc1.weight"),
                     get("mlp.linear_fc1.bias"),
                     get("mlp.linear_fc2.weight"),
                     get("mlp.linear_fc2.bias")};
}

template <typename T>
T* GPTModel<T>::classifier_weight(bool grads) const {
  const char* name = cfg_.untie_embeddings_and_output_weights ? "output_layer.weight"
                                                              : "embedding.word_embeddings.weight";
  return grads ? params_.grad(name) : params_.value(name);
}

template <typename T>
ops::AttentionDims GPTModel<T>::attention_dims(const MicroBatch& mb) const {
  return {mb.batch, mb.seq, cfg_.num_attention_heads, cfg_.query_groups(), cfg_.head_dim(),
          mb.key_start};
}

template <typename T>
void GPTModel<T>::norm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                               int rows, int width) const {
  if (cfg_.normalization == Normalization::LayerNorm)
    ops::layernorm_forward(out, mean, rstd, x, w, b, rows, width, cfg_.norm_epsilon);
  else
    ops::rmsnorm_forward(out, rstd, x, w, rows, width, cfg_.norm_epsilon);
}

template <typename T>
void GPTModel<T>::norm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                                const T* mean, const T* rstd, int rows, int width) const {
  if (cfg_.normalization == Normalization::LayerNorm)
    ops::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, width);
  else
    ops::rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, width);
}

template <typename T>
void GPTModel<T>::check_batch(const MicroBatch& mb) const {
  OMNI_CHECK(mb.batch > 0 && mb.batch <= max_batch_, "[gpt] batch ", mb.batch, " outside 1..",
             max_batch_);
  OMNI_CHECK(mb.seq > 0 && mb.seq <= cfg_.seq_length, "[gpt] sequence ", mb.seq, " outside 1..",
             cfg_.seq_length);
  const int64_t N = int64_t(mb.batch) * mb.seq;
  for (int64_t n = 0; n < N; ++n) {
    OMNI_REQUIRE(mb.tokens[n] >= 0 && mb.tokens[n] < cfg_.vocab_size, "token id ", mb.tokens[n],
                 " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
    if (mb.labels && (!mb.loss_mask || mb.loss_mask[n] != 0.0f))
      OMNI_REQUIRE(mb.labels[n] >= 0 && mb.labels[n] < cfg_.vocab_size, "label id ", mb.labels[n],
                   " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
  }
}

template <typename T>
void GPTModel<T>::forward(const MicroBatch& mb) {
  const int B = mb.batch, S = mb.seq, N = B * S, C = cfg_.hidden_size, hd = cfg_.head_dim(), H = cfg_.num_attention_heads;
  const int G = cfg_.query_groups(), F = cfg_.ffn_size(), fc1_out = cfg_.swiglu ? 2 * F : F;
  const ops::AttentionDims ad = attention_dims(mb);
  const bool rope = cfg_.position_embedding_type == PositionEmbedding::Rope;
  const int32_t* pos = mb.position_ids;
  ops::embedding_forward(residual_[0].template data<T>(), mb.tokens,
                         params_.value("embedding.word_embeddings.weight"),
                         params_.value_or_null("embedding.position_embeddings.weight"), N, S, C,
                         pos);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    LayerActivations& a = acts_[i];
    const LayerParams p = layer_params(i, false);
    const T* x = residual_[i].template data<T>();
    T* ln1 = a.ln1.template data<T>();
    norm_forward(ln1, a.ln1_mean.template data<T>(), a.ln1_rstd.template data<T>(), x, p.ln1_w,
                 p.ln1_b, N, C);
    T* qkv = qkv_.template data<T>();
    ops::linear_forward(qkv, ln1, p.qkv_w, p.qkv_b, N, C, ad.qkv_width());
    T *q = a.q.template data<T>(), *k = a.k.template data<T>(), *v = a.v.template data<T>();
    if (cfg_.qk_layernorm) {
      T *q_raw = a.q_raw.template data<T>(), *k_raw = a.k_raw.template data<T>();
      ops::qkv_split(q_raw, k_raw, v, qkv, ad);
      norm_forward(q, a.qn_mean.template data<T>(), a.qn_rstd.template data<T>(), q_raw, p.qln_w,
                   p.qln_b, N * H, hd);
      norm_forward(k, a.kn_mean.template data<T>(), a.kn_rstd.template data<T>(), k_raw, p.kln_w,
                   p.kln_b, N * G, hd);
    } else {
      ops::qkv_split(q, k, v, qkv, ad);
    }
    if (rope) {
      ops::rope_forward(q, rope_cos_.data(), rope_sin_.data(), N, S, H, hd, pos);
      ops::rope_forward(k, rope_cos_.data(), rope_sin_.data(), N, S, G, hd, pos);
    }
    T* attn = a.attn.template data<T>();
    ops::attention_forward(attn, a.probs.template data<T>(), q, k, v, ad);
    T* mid = a.mid.template data<T>();
    ops::linear_forward(mid, attn, p.proj_w, p.proj_b, N, H * hd, C);
    ops::add(mid, mid, x, size_t(N) * C);
    T* ln2 = a.ln2.template data<T>();
    norm_forward(ln2, a.ln2_mean.template data<T>(), a.ln2_rstd.template data<T>(), mid, p.ln2_w,
                 p.ln2_b, N, C);
    T *fc1 = a.fc1.template data<T>(), *act = a.act.template data<T>();
    ops::linear_forward(fc1, ln2, p.fc1_w, p.fc1_b, N, C, fc1_out);
    if (cfg_.swiglu)
      ops::swiglu_forward(act, fc1, N, F);
    else
      ops::gelu_forward(act, fc1, size_t(N) * F);
    T* out = residual_[i + 1].template data<T>();
    ops::linear_forward(out, act, p.fc2_w, p.fc2_b, N, F, C);
    ops::add(out, out, mid, size_t(N) * C);
  }
  norm_forward(final_norm_.template data<T>(), final_mean_.template data<T>(),
               final_rstd_.template data<T>(), residual_[cfg_.num_layers].template data<T>(),
               params_.value("decoder.final_layernorm.weight"),
               params_.value_or_null("decoder.final_layernorm.bias"), N, C);
}

template <typename T>
void GPTModel<T>::backward(const MicroBatch& mb) {
  const int B = mb.batch, S = mb.seq, N = B * S;
  const int C = cfg_.hidden_size, hd = cfg_.head_dim(), H = cfg_.num_attention_heads;
  const int G = cfg_.query_groups(), F = cfg_.ffn_size(), fc1_out = cfg_.swiglu ? 2 * F : F;
  const ops::AttentionDims ad = attention_dims(mb);
  const bool rope = cfg_.position_embedding_type == PositionEmbedding::Rope;
  const int32_t* pos = mb.position_ids;
  T* dres = d_resid_.template data<T>();
  T* dh = d_hidden_.template data<T>();  // holds d(final norm output) on entry
  std::fill(dres, dres + size_t(N) * C, T(0));
  norm_backward(dres, params_.grad("decoder.final_layernorm.weight"),
                params_.grad_or_null("decoder.final_layernorm.bias"), dh,
                residual_[cfg_.num_layers].template data<T>(),
                params_.value("decoder.final_layernorm.weight"), final_mean_.template data<T>(),
                final_rstd_.template data<T>(), N, C);
  for (int i = cfg_.num_layers - 1; i >= 0; --i) {
    LayerActivations& a = acts_[i];
    const LayerParams p = layer_params(i, false), g = layer_params(i, true);
    // MLP: out = mid + fc2(act(fc1(norm(mid)))); dres holds d(out).
    T *dffn = d_ffn_.template data<T>(), *dfc1 = d_fc1_.template data<T>();
    ops::linear_backward(dffn, g.fc2_w, g.fc2_b, dres, a.act.template data<T>(), p.fc2_w, N, F, C);
    if (cfg_.swiglu)
      ops::swiglu_backward(dfc1, dffn, a.fc1.template data<T>(), N, F);
    else
      ops::gelu_backward(dfc1, dffn, a.fc1.template data<T>(), size_t(N) * F);
    ops::linear_backward(dh, g.fc1_w, g.fc1_b, dfc1, a.ln2.template data<T>(), p.fc1_w, N, C,
                         fc1_out);
    norm_backward(dres, g.ln2_w, g.ln2_b, dh, a.mid.template data<T>(), p.ln2_w,
                  a.ln2_mean.template data<T>(), a.ln2_rstd.template data<T>(), N, C);
    // Attention: mid = x + proj(attention(qkv(norm(x)))); dres holds d(mid).
    T* dattn = d_attn_.template data<T>();
    ops::linear_backward(dattn, g.proj_w, g.proj_b, dres, a.attn.template data<T>(), p.proj_w, N,
                         H * hd, C);
    T *dq = dq_.template data<T>(), *dk = dk_.template data<T>(), *dv = dv_.template data<T>();
    ops::attention_backward(dq, dk, dv, dattn, a.attn.template data<T>(),
                            a.probs.template data<T>(), a.q.template data<T>(),
                            a.k.template data<T>(), a.v.template data<T>(), ad);
    if (rope) {
      ops::rope_backward(dq, rope_cos_.data(), rope_sin_.data(), N, S, H, hd, pos);
      ops::rope_backward(dk, rope_cos_.data(), rope_sin_.data(), N, S, G, hd, pos);
    }
    if (cfg_.qk_layernorm) {
      T *dq_raw = dq_raw_.template data<T>(), *dk_raw = dk_raw_.template data<T>();
      std::fill(dq_raw, dq_raw + size_t(N) * H * hd, T(0));
      std::fill(dk_raw, dk_raw + size_t(N) * G * hd, T(0));
      norm_backward(dq_raw, g.qln_w, g.qln_b, dq, a.q_raw.template data<T>(), p.qln_w,
                    a.qn_mean.template data<T>(), a.qn_rstd.template data<T>(), N * H, hd);
      norm_backward(dk_raw, g.kln_w, g.kln_b, dk, a.k_raw.template data<T>(), p.kln_w,
                    a.kn_mean.template data<T>(), a.kn_rstd.template data<T>(), N * G, hd);
      dq = dq_raw, dk = dk_raw;
    }
    T* dqkv = qkv_.template data<T>();
    ops::qkv_merge(dqkv, dq, dk, dv, ad);
    ops::linear_backward(dh, g.qkv_w, g.qkv_b, dqkv, a.ln1.template data<T>(), p.qkv_w, N, C,
                         ad.qkv_width());
    norm_backward(dres, g.ln1_w, g.ln1_b, dh, residual_[i].template data<T>(), p.ln1_w,
                  a.ln1_mean.template data<T>(), a.ln1_rstd.template data<T>(), N, C);
  }
  ops::embedding_backward(params_.grad("embedding.word_embeddings.weight"),
                          params_.grad_or_null("embedding.position_embeddings.weight"), mb.tokens,
                          dres, N, S, C, pos);
}

template <typename T>
static double mask_sum(const MicroBatch& mb) {
  const int64_t N = int64_t(mb.batch) * mb.seq;
  if (!mb.loss_mask) return double(N);
  double s = 0;
  for (int64_t n = 0; n < N; ++n) s += mb.loss_mask[n];
  return s;
}

template <typename T>
double GPTModel<T>::forward_backward(const MicroBatch& mb, double grad_scale) {
  check_batch(mb);
  OMNI_CHECK(mb.labels, "[gpt] forward_backward needs labels");
  const double denom = mask_sum<T>(mb);
  forward(mb);
  if (denom == 0) return 0.0;  // every token masked: no loss, no gradient
  ops::ClassifierLossArgs ca{mb.batch * mb.seq, cfg_.hidden_size, cfg_.vocab_size,
                             grad_scale / denom};
  double loss = ops::classifier_cross_entropy<T>(
      nullptr, d_hidden_.template data<T>(), classifier_weight(true),
      final_norm_.template data<T>(), classifier_weight(false), mb.labels, mb.loss_mask, ca);
  backward(mb);
  return loss / denom;
}

template <typename T>
double GPTModel<T>::forward_loss(const MicroBatch& mb) {
  check_batch(mb);
  OMNI_CHECK(mb.labels, "[gpt] forward_loss needs labels");
  const double denom = mask_sum<T>(mb);
  forward(mb);
  if (denom == 0) return 0.0;
  ops::ClassifierLossArgs ca{mb.batch * mb.seq, cfg_.hidden_size, cfg_.vocab_size, 1.0};
  return ops::classifier_cross_entropy<T>(nullptr, nullptr, nullptr, final_norm_.template data<T>(),
                                          classifier_weight(false), mb.labels, mb.loss_mask, ca) /
         denom;
}

template <typename T>
std::vector<T> GPTModel<T>::forward_logits(const int32_t* tokens, int batch, int seq) {
  const MicroBatch mb{tokens, nullptr, nullptr, batch, seq};
  check_batch(mb);
  forward(mb);
  const int N = batch * seq, C = cfg_.hidden_size, V = cfg_.vocab_size;
  std::vector<T> logits(size_t(N) * V);
  ops::linear_forward<T>(logits.data(), final_norm_.template data<T>(), classifier_weight(false),
                         nullptr, N, C, V);
  return logits;
}

template <typename T>
std::vector<float> GPTModel<T>::next_token_logits(const int32_t* tokens, int seq) {
  const MicroBatch mb{tokens, nullptr, nullptr, 1, seq};
  check_batch(mb);
  forward(mb);
  const int C = cfg_.hidden_size, V = cfg_.vocab_size;
  std::vector<T> logits(V);
  ops::linear_forward<T>(logits.data(), final_norm_.template data<T>() + size_t(seq - 1) * C,
                         classifier_weight(false), nullptr, 1, C, V);
  return std::vector<float>(logits.begin(), logits.end());
}

template class GPTModel<float>;
template class GPTModel<double>;

}  // namespace omni
