// GPTModel's transformer layer (model/gpt_model.h): its norms, self-attention and MLP,
// forward and backward. The layer is written with the parallel primitives: QKV and fc1 are
// column-parallel and the attention's projection and fc2 row-parallel linears of
// parallel/tensor_parallel.h (which gather and scatter the rows of sequence-parallel regions),
// and under context parallelism attention is the ring of parallel/context_parallel.h or the
// all-to-all of parallel/ulysses.h. The model, its embedding, head and chunks are in
// gpt_model.cpp.
#include <string>

#include "model/gpt_model.h"

namespace omni {

template <typename T>
template <typename P, typename Get>
typename GPTModel<T>::template LayerTensors<P> GPTModel<T>::layer_tensors(int i, Get get) const {
  const std::string l = layer_prefix(i);
  return LayerTensors<P>{get(l + "input_layernorm.weight"),
                         get(l + "input_layernorm.bias"),
                         get(l + "self_attention.linear_qkv.weight"),
                         get(l + "self_attention.linear_qkv.bias"),
                         get(l + "self_attention.q_layernorm.weight"),
                         get(l + "self_attention.q_layernorm.bias"),
                         get(l + "self_attention.k_layernorm.weight"),
                         get(l + "self_attention.k_layernorm.bias"),
                         get(l + "self_attention.linear_proj.weight"),
                         get(l + "self_attention.linear_proj.bias"),
                         get(l + "pre_mlp_layernorm.weight"),
                         get(l + "pre_mlp_layernorm.bias"),
                         get(l + "mlp.linear_fc1.weight"),
                         get(l + "mlp.linear_fc1.bias"),
                         get(l + "mlp.linear_fc2.weight"),
                         get(l + "mlp.linear_fc2.bias")};
}

template <typename T>
typename GPTModel<T>::template LayerTensors<T> GPTModel<T>::layer_params(int i) const {
  return layer_tensors<T>(i, [&](const std::string& n) { return params_.value_or_null(n); });
}

template <typename T>
typename GPTModel<T>::template LayerTensors<typename GPTModel<T>::Grad> GPTModel<T>::layer_grads(
    int i) const {
  return layer_tensors<Grad>(i, [&](const std::string& n) { return params_.grad_or_null(n); });
}

// The whole-sequence tensors Ulysses attention keeps in a layer's activations.
template <typename T>
typename UlyssesAttention<T>::Whole ulysses_whole(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const Tensor& out) {
  return {q.template data<T>(), k.template data<T>(), v.template data<T>(), out.template data<T>()};
}

template <typename T>
const T* GPTModel<T>::norm_gamma(const T* w, int width) const {
  if (!cfg_.layernorm_zero_centered_gamma) return w;
  T* gamma = gamma_.template data<T>();
  ops::add(x_, gamma, w, ones_.template data<T>(), size_t(width));
  return gamma;
}

template <typename T>
void GPTModel<T>::norm_forward(T* out, Grad* mean, Grad* rstd, const T* x, const T* w, const T* b,
                               int rows, int width) const {
  w = norm_gamma(w, width);
  if (cfg_.normalization == Normalization::LayerNorm)
    ops::layernorm_forward(x_, out, mean, rstd, x, w, b, rows, width, cfg_.norm_epsilon);
  else
    ops::rmsnorm_forward(x_, out, rstd, x, w, rows, width, cfg_.norm_epsilon);
}

template <typename T>
void GPTModel<T>::norm_backward(T* dx, Grad* dw, Grad* db, const T* dout, const T* x, const T* w,
                                const Grad* mean, const Grad* rstd, int rows, int width) const {
  w = norm_gamma(w, width);  // d(w + 1)/dw = 1: the gradient is the applied gamma's
  if (cfg_.normalization == Normalization::LayerNorm)
    ops::layernorm_backward(x_, dx, dw, db, dout, x, w, mean, rstd, rows, width);
  else
    ops::rmsnorm_backward(x_, dx, dw, dout, x, w, rstd, rows, width);
}

template <typename T>
void GPTModel<T>::layer_forward(int layer, LayerActivations& a, const T* x, T* out,
                                const MicroBatch& mb, const Geometry& g, const Inputs& in) {
  const int N = g.tokens, R = g.rows, C = cfg_.hidden_size, hd = cfg_.head_dim();
  const int H = heads_, G = groups_, F = ffn_, fc1_out = cfg_.swiglu ? 2 * F : F;
  ops::AttentionDims ad = attention_dims(mb, in);
  ad.dropout = dropout_key(mb, in, g, layer, ops::DropoutSite::Attention);
  const auto p = layer_params(layer);
  T* ln1 = a.ln1.template data<T>();
  norm_forward(ln1, a.ln1_mean.template data<Grad>(), a.ln1_rstd.template data<Grad>(), x, p.ln1_w,
               p.ln1_b, R, C);
  T *q = a.q.template data<T>(), *k = a.k.template data<T>(), *v = a.v.template data<T>();
  if (cfg_.multi_latent_attention) {  // gpt_mla.cpp: q, k, v from the latents
    mla_forward(layer, a, tp_.gather_rows(a.ln1_full.template data<T>(), ln1, N), g, in);
  } else {
    T* qkv = qkv_.template data<T>();
    tp_.column_forward(qkv, a.ln1_full.template data<T>(), ln1, p.qkv_w, p.qkv_b, ad.qkv_width(),
                       N);
    if (cfg_.qk_layernorm) {
      T *q_raw = a.q_raw.template data<T>(), *k_raw = a.k_raw.template data<T>();
      ops::qkv_split(x_, q_raw, k_raw, v, qkv, ad);
      norm_forward(q, a.qn_mean.template data<Grad>(), a.qn_rstd.template data<Grad>(), q_raw,
                   p.qln_w, p.qln_b, N * H, hd);
      norm_forward(k, a.kn_mean.template data<Grad>(), a.kn_rstd.template data<Grad>(), k_raw,
                   p.kln_w, p.kln_b, N * G, hd);
    } else {
      ops::qkv_split(x_, q, k, v, qkv, ad);
    }
    if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
      const int rd = cfg_.rotary_dim();
      ops::rope_forward(x_, q, rope_, N, g.seq, H, hd, in.positions, rd);
      ops::rope_forward(x_, k, rope_, N, g.seq, G, hd, in.positions, rd);
    }
  }
  T* attn = a.attn.template data<T>();
  if (cp_->size() > 1 && parallel_.ulysses)
    ulysses_.forward(attn, a.lse.template data<Grad>(), q, k, v,
                     ulysses_whole<T>(a.q_all, a.k_all, a.v_all, a.out_all), ad);
  else if (cp_->size() > 1)
    ring_.forward(attn, a.lse.template data<Grad>(), q, k, v, a.k_all.template data<T>(),
                  a.v_all.template data<T>(), mb, ad.dropout);
  else
    ops::attention_forward(x_, attn, a.lse.template data<Grad>(), q, k, v, ad);
  T* mid = a.mid.template data<T>();
  tp_.row_forward(mid, full_.template data<T>(), attn, p.proj_w, p.proj_b, H * ad.v_dim(), N);
  hidden_dropout(mid, mb, in, g, layer, ops::DropoutSite::AttentionOutput);
  ops::add(x_, mid, mid, x, size_t(R) * C);

  T* ln2 = a.ln2.template data<T>();
  norm_forward(ln2, a.ln2_mean.template data<Grad>(), a.ln2_rstd.template data<Grad>(), mid,
               p.ln2_w, p.ln2_b, R, C);
  if (cfg_.is_moe_layer(layer)) {  // routed experts in place of the MLP (gpt_moe.cpp)
    // Each rank's part of the output of the rows it takes (moe_tp_'s: every row over tp, or
    // its experts' block's over that block), summed as the dense fc2's.
    const int n = moe_tokens(N);
    T* part = moe_tp_.partial_rows(out, full_.template data<T>());
    moe_forward(layer, a, moe_tp_.gather_rows(a.ln2_full.template data<T>(), ln2, n), part, mb, g);
    moe_tp_.reduce_rows(out, part, n);
    hidden_dropout(out, mb, in, g, layer, ops::DropoutSite::MlpOutput);
    ops::add(x_, out, out, mid, size_t(R) * C);
    return;
  }
  T *fc1 = a.fc1.template data<T>(), *act = a.act.template data<T>();
  tp_.column_forward(fc1, a.ln2_full.template data<T>(), ln2, p.fc1_w, p.fc1_b, fc1_out, N);
  if (cfg_.swiglu)
    ops::swiglu_forward(x_, act, fc1, N, F);
  else
    ops::gelu_forward(x_, act, fc1, size_t(N) * F, gelu_form(cfg_));
  tp_.row_forward(out, full_.template data<T>(), act, p.fc2_w, p.fc2_b, F, N);
  hidden_dropout(out, mb, in, g, layer, ops::DropoutSite::MlpOutput);
  ops::add(x_, out, out, mid, size_t(R) * C);
}

template <typename T>
void GPTModel<T>::layer_backward(int layer, LayerActivations& a, const T* x, T* dres,
                                 const MicroBatch& mb, const Geometry& g, const Inputs& in) {
  const int N = g.tokens, R = g.rows, C = cfg_.hidden_size, hd = cfg_.head_dim();
  const int H = heads_, G = groups_, F = ffn_, fc1_out = cfg_.swiglu ? 2 * F : F;
  ops::AttentionDims ad = attention_dims(mb, in);
  ad.dropout = dropout_key(mb, in, g, layer, ops::DropoutSite::Attention);
  const auto p = layer_params(layer);
  const auto gp = layer_grads(layer);
  T* partial = full_.template data<T>();
  T* d_rows = d_rows_.template data<T>();
  // d(block output before its dropout): the mask (its own transpose) on a copy of dres, which
  // the residual path keeps unmasked.
  auto through_dropout = [&](ops::DropoutSite site) -> const T* {
    if (!dropout_key(mb, in, g, layer, site).active()) return dres;
    ops::copy(x_, d_rows, dres, size_t(R) * C);
    hidden_dropout(d_rows, mb, in, g, layer, site);
    return d_rows;
  };
  // MLP: out = mid + fc2(act(fc1(norm(mid)))); dres holds d(out).
  T *dffn = d_ffn_.template data<T>(), *dfc1 = d_fc1_.template data<T>();
  const T* dln2 = nullptr;
  if (cfg_.is_moe_layer(layer)) {  // gpt_moe.cpp; dx: this rank's part, summed over moe_tp_
    // (dx in `partial`, not d_rows: dy may be d_rows, the dropout's copy; ETP 1 sums in place)
    const int n = moe_tokens(N);
    moe_backward(layer, a,
                 moe_tp_.gather_rows(d_full_.template data<T>(),
                                     through_dropout(ops::DropoutSite::MlpOutput), n),
                 partial);
    dln2 = moe_tp_.reduce_rows(d_rows, partial, n);
  } else {
    tp_.row_backward(dffn, gp.fc2_w, gp.fc2_b, d_full_.template data<T>(),
                     through_dropout(ops::DropoutSite::MlpOutput), a.act.template data<T>(),
                     p.fc2_w, F, N);
    if (cfg_.swiglu)
      ops::swiglu_backward(x_, dfc1, dffn, a.fc1.template data<T>(), N, F);
    else
      ops::gelu_backward(x_, dfc1, dffn, a.fc1.template data<T>(), size_t(N) * F, gelu_form(cfg_));
    dln2 = tp_.column_backward(d_rows, partial, gp.fc1_w, gp.fc1_b, dfc1,
                               a.ln2_full.template data<T>(), p.fc1_w, fc1_out, N);
  }
  norm_backward(dres, gp.ln2_w, gp.ln2_b, dln2, a.mid.template data<T>(), p.ln2_w,
                a.ln2_mean.template data<Grad>(), a.ln2_rstd.template data<Grad>(), R, C);
  // Attention: mid = x + proj(attention(qkv(norm(x)))); dres holds d(mid).
  T* dattn = d_attn_.template data<T>();
  tp_.row_backward(dattn, gp.proj_w, gp.proj_b, d_full_.template data<T>(),
                   through_dropout(ops::DropoutSite::AttentionOutput), a.attn.template data<T>(),
                   p.proj_w, H * ad.v_dim(), N);
  T *dq = dq_.template data<T>(), *dk = dk_.template data<T>(), *dv = dv_.template data<T>();
  if (cp_->size() > 1 && parallel_.ulysses)
    ulysses_.backward(dq, dk, dv, dattn, ulysses_whole<T>(a.q_all, a.k_all, a.v_all, a.out_all),
                      a.lse.template data<Grad>(), ad);
  else if (cp_->size() > 1)
    ring_.backward(dq, dk, dv, dattn, a.attn.template data<T>(), a.lse.template data<Grad>(),
                   a.q.template data<T>(), a.k_all.template data<T>(), a.v_all.template data<T>(),
                   mb, ad.dropout);
  else
    ops::attention_backward(x_, dq, dk, dv, dattn, a.attn.template data<T>(),
                            a.lse.template data<Grad>(), a.q.template data<T>(),
                            a.k.template data<T>(), a.v.template data<T>(), ad);
  const T* dln1 = nullptr;
  if (cfg_.multi_latent_attention) {  // gpt_mla.cpp
    dln1 = mla_backward(layer, a, dq, dk, dv, partial, d_rows, g, in);
  } else {
    if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
      const int rd = cfg_.rotary_dim();
      ops::rope_backward(x_, dq, rope_, N, g.seq, H, hd, in.positions, rd);
      ops::rope_backward(x_, dk, rope_, N, g.seq, G, hd, in.positions, rd);
    }
    if (cfg_.qk_layernorm) {
      T *dq_raw = dq_raw_.template data<T>(), *dk_raw = dk_raw_.template data<T>();
      ops::zero(x_, dq_raw, size_t(N) * H * hd);
      ops::zero(x_, dk_raw, size_t(N) * G * hd);
      norm_backward(dq_raw, gp.qln_w, gp.qln_b, dq, a.q_raw.template data<T>(), p.qln_w,
                    a.qn_mean.template data<Grad>(), a.qn_rstd.template data<Grad>(), N * H, hd);
      norm_backward(dk_raw, gp.kln_w, gp.kln_b, dk, a.k_raw.template data<T>(), p.kln_w,
                    a.kn_mean.template data<Grad>(), a.kn_rstd.template data<Grad>(), N * G, hd);
      dq = dq_raw, dk = dk_raw;
    }
    T* dqkv = qkv_.template data<T>();
    ops::qkv_merge(x_, dqkv, dq, dk, dv, ad);
    dln1 = tp_.column_backward(d_rows, partial, gp.qkv_w, gp.qkv_b, dqkv,
                               a.ln1_full.template data<T>(), p.qkv_w, ad.qkv_width(), N);
  }
  norm_backward(dres, gp.ln1_w, gp.ln1_b, dln1, x, p.ln1_w, a.ln1_mean.template data<Grad>(),
                a.ln1_rstd.template data<Grad>(), R, C);
}

#define OMNI_INSTANTIATE(T)                                                                     \
  template const T* GPTModel<T>::norm_gamma(const T*, int) const;                               \
  template void GPTModel<T>::norm_forward(T*, accum_t<T>*, accum_t<T>*, const T*, const T*,     \
                                          const T*, int, int) const;                            \
  template void GPTModel<T>::norm_backward(T*, accum_t<T>*, accum_t<T>*, const T*, const T*,    \
                                           const T*, const accum_t<T>*, const accum_t<T>*, int, \
                                           int) const;                                          \
  template void GPTModel<T>::layer_forward(int, LayerActivations&, const T*, T*,                \
                                           const MicroBatch&, const Geometry&, const Inputs&);  \
  template void GPTModel<T>::layer_backward(int, LayerActivations&, const T*, T*,               \
                                            const MicroBatch&, const Geometry&, const Inputs&);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(double)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

}  // namespace omni
