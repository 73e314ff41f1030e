// GPTModel's transformer layer (model/gpt_model.h): its norms, self-attention (with the
// context-parallel ring) and MLP, forward and backward, and the tensor-parallel regions
// around them (all-gather or reduce-scatter of rows under sequence parallelism, else
// all-reduce). The model, its embedding, head and chunks are in gpt_model.cpp.
#include <algorithm>
#include <memory>
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
const T* GPTModel<T>::gather_rows(T* full, const T* part, const Geometry& g) const {
  if (!sp_) return part;
  tp_->all_gather(full, part, size_t(g.rows) * cfg_.hidden_size);
  return full;
}

template <typename T>
const T* GPTModel<T>::reduce_rows(T* out, T* partial, const Geometry& g) const {
  const size_t C = cfg_.hidden_size;
  if (!sp_) {
    tp_->all_reduce(partial, size_t(g.tokens) * C);
    return partial;
  }
  tp_->reduce_scatter(out, partial, size_t(g.rows) * C);
  return out;
}

template <typename T>
ops::AttentionDims GPTModel<T>::ring_block_dims(const MicroBatch& mb, const Geometry& g, int src) {
  const int cp = cp_->size(), h = g.seq / 2;
  // Rank src's keys are two chunks of h positions, in ascending order: [a, a+h), [b, b+h).
  const int a = src * h, b = (2 * cp - 1 - src) * h;
  auto keys_before = [&](int pos) {  // keys of the block at positions < pos
    return std::clamp(pos - a, 0, h) + std::clamp(pos - b, 0, h);
  };
  for (int n = 0; n < g.tokens; ++n) {
    ring_last_[n] = keys_before(mb.seq_index[n] + 1) - 1;
    ring_first_[n] = mb.key_start ? keys_before(mb.key_start[n]) : 0;
  }
  int32_t* bounds = static_cast<int32_t*>(ring_bounds_->data());
  ops::upload(x_, bounds, ring_first_.data(), size_t(g.tokens));
  ops::upload(x_, bounds + g.tokens, ring_last_.data(), size_t(g.tokens));
  return {mb.batch, mb.seq, heads_, groups_, cfg_.head_dim(), bounds, bounds + g.tokens};
}

template <typename T>
void GPTModel<T>::ring_attention_forward(LayerActivations& a, const MicroBatch& mb,
                                         const Geometry& g, const ops::DropoutKey& drop) {
  const int cp = cp_->size(), r = cp_->rank(), hd = cfg_.head_dim();
  const size_t kv = size_t(g.tokens) * groups_ * hd;
  T *k_all = a.k_all.template data<T>(), *v_all = a.v_all.template data<T>();
  ops::copy(x_, k_all + r * kv, a.k.template data<T>(), kv);
  ops::copy(x_, v_all + r * kv, a.v.template data<T>(), kv);
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  for (int t = 0; t < cp; ++t) {
    const int src = (r - t + cp) % cp;
    // Pass the block on while this rank works on it.
    std::unique_ptr<CommRequest> sends[2], recvs[2];
    if (t + 1 < cp) {
      const int incoming = (src - 1 + cp) % cp;
      sends[0] = cp_->isend(k_all + src * kv, kv * sizeof(T), next, 10);
      sends[1] = cp_->isend(v_all + src * kv, kv * sizeof(T), next, 11);
      recvs[0] = cp_->irecv(k_all + incoming * kv, kv * sizeof(T), prev, 10);
      recvs[1] = cp_->irecv(v_all + incoming * kv, kv * sizeof(T), prev, 11);
    }
    ops::AttentionDims ad = ring_block_dims(mb, g, src);
    ad.dropout = drop, ad.dropout.key_rank = src;
    // The first block (this rank's own keys) starts the output; each later one is merged in
    // by its log-sum-exp.
    const bool first = t == 0;
    T* out = first ? a.attn.template data<T>() : ring_out_.template data<T>();
    Grad* lse = first ? a.lse.template data<Grad>() : ring_lse_.template data<Grad>();
    ops::attention_forward(x_, out, lse, a.q.template data<T>(), k_all + src * kv, v_all + src * kv,
                           ad);
    if (!first)
      ops::attention_merge(x_, a.attn.template data<T>(), a.lse.template data<Grad>(), out, lse,
                           ad);
    for (auto& q : recvs)
      if (q) q->wait();
    for (auto& q : sends)
      if (q) q->wait();
  }
}

template <typename T>
void GPTModel<T>::ring_attention_backward(LayerActivations& a, T* dq, T* dk, T* dv, const T* dattn,
                                          const MicroBatch& mb, const Geometry& g,
                                          const ops::DropoutKey& drop) {
  const int cp = cp_->size(), r = cp_->rank(), H = heads_, hd = cfg_.head_dim();
  const size_t kv = size_t(g.tokens) * groups_ * hd;
  const T *k_all = a.k_all.template data<T>(), *v_all = a.v_all.template data<T>();
  ops::zero(x_, dq, size_t(g.tokens) * H * hd);
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  std::unique_ptr<CommRequest> in_flight[2][2];  // per accumulator: its k and v sends
  for (int t = 0; t < cp; ++t) {
    const int src = (r - t + cp) % cp;
    // The accumulated key/value gradient of block src comes from the rank that worked on
    // it last step (none yet at step 0).
    T *acc_k = ring_acc_[t % 2][0].template data<T>(),
      *acc_v = ring_acc_[t % 2][1].template data<T>();
    for (auto& q : in_flight[t % 2])
      if (q) q->wait();
    if (t == 0) {
      ops::zero(x_, acc_k, kv);
      ops::zero(x_, acc_v, kv);
    } else {
      cp_->recv(acc_k, kv * sizeof(T), prev, 12);
      cp_->recv(acc_v, kv * sizeof(T), prev, 13);
    }
    // With the merged output and log-sum-exp, the backward gives this block's part.
    ops::AttentionDims ad = ring_block_dims(mb, g, src);
    ad.dropout = drop, ad.dropout.key_rank = src;
    T *dq_b = ring_dq_.template data<T>(), *dk_b = ring_dk_.template data<T>(),
      *dv_b = ring_dv_.template data<T>();
    ops::attention_backward(x_, dq_b, dk_b, dv_b, dattn, a.attn.template data<T>(),
                            a.lse.template data<Grad>(), a.q.template data<T>(), k_all + src * kv,
                            v_all + src * kv, ad);
    ops::add(x_, dq, dq, dq_b, size_t(g.tokens) * H * hd);
    ops::add(x_, acc_k, acc_k, dk_b, kv);
    ops::add(x_, acc_v, acc_v, dv_b, kv);
    // On to the next rank; after the last step the accumulator reaches its owner.
    in_flight[t % 2][0] = cp_->isend(acc_k, kv * sizeof(T), next, 12);
    in_flight[t % 2][1] = cp_->isend(acc_v, kv * sizeof(T), next, 13);
  }
  cp_->recv(dk, kv * sizeof(T), prev, 12);
  cp_->recv(dv, kv * sizeof(T), prev, 13);
  for (auto& pair : in_flight)
    for (auto& q : pair)
      if (q) q->wait();
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
  const T* ln1_full = gather_rows(a.ln1_full.template data<T>(), ln1, g);
  T* qkv = qkv_.template data<T>();
  ops::linear_forward(x_, qkv, ln1_full, p.qkv_w, p.qkv_b, N, C, ad.qkv_width());
  T *q = a.q.template data<T>(), *k = a.k.template data<T>(), *v = a.v.template data<T>();
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
  T* attn = a.attn.template data<T>();
  if (cp_->size() > 1)
    ring_attention_forward(a, mb, g, ad.dropout);
  else
    ops::attention_forward(x_, attn, a.lse.template data<Grad>(), q, k, v, ad);
  // Row-parallel projection: the ranks' partial products are summed, then the bias and the
  // residual added.
  T* mid = a.mid.template data<T>();
  T* part = sp_ ? full_.template data<T>() : mid;
  ops::linear_forward(x_, part, attn, p.proj_w, static_cast<const T*>(nullptr), N, H * hd, C);
  reduce_rows(mid, part, g);
  if (p.proj_b) ops::add_bias(x_, mid, p.proj_b, R, C);
  hidden_dropout(mid, mb, in, g, layer, ops::DropoutSite::AttentionOutput);
  ops::add(x_, mid, mid, x, size_t(R) * C);

  T* ln2 = a.ln2.template data<T>();
  norm_forward(ln2, a.ln2_mean.template data<Grad>(), a.ln2_rstd.template data<Grad>(), mid,
               p.ln2_w, p.ln2_b, R, C);
  const T* ln2_full = gather_rows(a.ln2_full.template data<T>(), ln2, g);
  T *fc1 = a.fc1.template data<T>(), *act = a.act.template data<T>();
  ops::linear_forward(x_, fc1, ln2_full, p.fc1_w, p.fc1_b, N, C, fc1_out);
  if (cfg_.swiglu)
    ops::swiglu_forward(x_, act, fc1, N, F);
  else
    ops::gelu_forward(x_, act, fc1, size_t(N) * F, gelu_form(cfg_));
  part = sp_ ? full_.template data<T>() : out;
  ops::linear_forward(x_, part, act, p.fc2_w, static_cast<const T*>(nullptr), N, F, C);
  reduce_rows(out, part, g);
  if (p.fc2_b) ops::add_bias(x_, out, p.fc2_b, R, C);
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
  const T* dy =
      gather_rows(d_full_.template data<T>(), through_dropout(ops::DropoutSite::MlpOutput), g);
  T *dffn = d_ffn_.template data<T>(), *dfc1 = d_fc1_.template data<T>();
  ops::linear_backward(x_, dffn, gp.fc2_w, gp.fc2_b, dy, a.act.template data<T>(), p.fc2_w, N, F,
                       C);
  if (cfg_.swiglu)
    ops::swiglu_backward(x_, dfc1, dffn, a.fc1.template data<T>(), N, F);
  else
    ops::gelu_backward(x_, dfc1, dffn, a.fc1.template data<T>(), size_t(N) * F, gelu_form(cfg_));
  ops::linear_backward(x_, partial, gp.fc1_w, gp.fc1_b, dfc1, a.ln2_full.template data<T>(),
                       p.fc1_w, N, C, fc1_out);
  const T* dln2 = reduce_rows(d_rows, partial, g);
  norm_backward(dres, gp.ln2_w, gp.ln2_b, dln2, a.mid.template data<T>(), p.ln2_w,
                a.ln2_mean.template data<Grad>(), a.ln2_rstd.template data<Grad>(), R, C);
  // Attention: mid = x + proj(attention(qkv(norm(x)))); dres holds d(mid).
  dy = gather_rows(d_full_.template data<T>(), through_dropout(ops::DropoutSite::AttentionOutput),
                   g);
  T* dattn = d_attn_.template data<T>();
  ops::linear_backward(x_, dattn, gp.proj_w, gp.proj_b, dy, a.attn.template data<T>(), p.proj_w, N,
                       H * hd, C);
  T *dq = dq_.template data<T>(), *dk = dk_.template data<T>(), *dv = dv_.template data<T>();
  if (cp_->size() > 1)
    ring_attention_backward(a, dq, dk, dv, dattn, mb, g, ad.dropout);
  else
    ops::attention_backward(x_, dq, dk, dv, dattn, a.attn.template data<T>(),
                            a.lse.template data<Grad>(), a.q.template data<T>(),
                            a.k.template data<T>(), a.v.template data<T>(), ad);
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
  ops::linear_backward(x_, partial, gp.qkv_w, gp.qkv_b, dqkv, a.ln1_full.template data<T>(),
                       p.qkv_w, N, C, ad.qkv_width());
  const T* dln1 = reduce_rows(d_rows, partial, g);
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
  template const T* GPTModel<T>::gather_rows(T*, const T*, const Geometry&) const;              \
  template const T* GPTModel<T>::reduce_rows(T*, T*, const Geometry&) const;                    \
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
