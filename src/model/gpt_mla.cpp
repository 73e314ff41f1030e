// GPTModel's multi-latent attention (model/mla.h has the formulas and the layout): queries,
// keys and values of this rank's heads from the latents, forward and backward, through the ops
// seam of backend/ops.h. The down-projections and latent norms are replicated over the
// tensor-parallel group and the up-projections split by heads; each rank's backward carries
// its heads' part of every gradient upstream of the split (the latents', the replicated
// weights' and the input norm rows'), which the group sums (ParamInfo::tp_partial_grad and
// tp_.reduce_rows).
#include <string>

#include "base/error.h"
#include "model/gpt_model.h"
#include "model/mla.h"

namespace omni {

// Per layer: what the backward reads. The model's one scratch instance holds the d_* tensors.
template <typename T>
struct GPTModel<T>::MLAState {
  Tensor cq, cqn, cq_mean, cq_rstd;  // query latent [N, q_lora], normed, its statistics
  Tensor ckv;                        // [N, kv_lora + rope]: the latent and the shared rope key
  Tensor c, cn, c_mean, c_rstd;      // the latent [N, kv_lora] alone, normed, its statistics
  Tensor kv;                         // [N, heads * (qk_head_dim + v_head_dim)]
  Tensor kpe;                        // [N, rope]: the rope key after rope
  Tensor d_cqn, d_cq, d_kv, d_kpe, d_head_pe, d_cn, d_c, d_ckv;
};

namespace {

// The layer's named tensors (values or gradients) through get.
template <typename P>
struct MLATensors {
  P *q_down, *q_norm_w, *q_norm_b, *q_up, *q, *kv_down, *kv_norm_w, *kv_norm_b, *kv_up;
};
template <typename P, typename Get>
MLATensors<P> mla_tensors(const std::string& a, Get get) {
  return {get(a + "linear_q_down_proj.weight"), get(a + "q_layernorm.weight"),
          get(a + "q_layernorm.bias"),          get(a + "linear_q_up_proj.weight"),
          get(a + "linear_q_proj.weight"),      get(a + "linear_kv_down_proj.weight"),
          get(a + "kv_layernorm.weight"),       get(a + "kv_layernorm.bias"),
          get(a + "linear_kv_up_proj.weight")};
}

}  // namespace

template <typename T>
void GPTModel<T>::add_mla_parameters(const std::string& attn, const AddReplicated& replicated,
                                     const AddRows& rows) const {
  const int tp = tp_.size();
  const int64_t C = cfg_.hidden_size, Hl = cfg_.num_attention_heads / tp;
  const int64_t qk = cfg_.qk_head_dim, pe = cfg_.qk_pos_emb_head_dim, vd = cfg_.v_head_dim;
  const int64_t ql = cfg_.q_lora_rank, kvl = cfg_.kv_lora_rank;
  const ParamInit gamma = ParamInit::Ones;  // validate_mla_config refuses --apply-layernorm-1p
  auto norm = [&](const std::string& name, int64_t width) {
    replicated(name + ".weight", {width}, gamma, false, true);
    if (cfg_.norm_has_bias()) replicated(name + ".bias", {width}, ParamInit::Zeros, false, true);
  };
  if (ql > 0) {
    replicated(attn + "linear_q_down_proj.weight", {ql, C}, ParamInit::Normal, true, true);
    if (cfg_.qk_layernorm) norm(attn + "q_layernorm", ql);
    rows(attn + "linear_q_up_proj.weight", {Hl * (qk + pe), ql}, Hl * (qk + pe) * tp,
         ParamInit::Normal, true);
  } else {
    rows(attn + "linear_q_proj.weight", {Hl * (qk + pe), C}, Hl * (qk + pe) * tp, ParamInit::Normal,
         true);
  }
  replicated(attn + "linear_kv_down_proj.weight", {kvl + pe, C}, ParamInit::Normal, true, true);
  if (cfg_.qk_layernorm) norm(attn + "kv_layernorm", kvl);
  rows(attn + "linear_kv_up_proj.weight", {Hl * (qk + vd), kvl}, Hl * (qk + vd) * tp,
       ParamInit::Normal, true);
}

template <typename T>
void GPTModel<T>::allocate_mla(LayerActivations& l) const {
  const int64_t N = int64_t(max_batch_) * cfg_.seq_length / cp_->size(), H = heads_;
  const int64_t qk = cfg_.qk_head_dim, pe = cfg_.qk_pos_emb_head_dim, vd = cfg_.v_head_dim;
  const int64_t ql = cfg_.q_lora_rank, kvl = cfg_.kv_lora_rank;
  auto buf = [&](Shape s) { return buffer(std::move(s)); };
  auto stat = [&](Shape s) { return stat_buffer(std::move(s)); };
  auto m = std::make_shared<MLAState>();
  const bool normed = cfg_.qk_layernorm;
  if (ql > 0) {
    m->cq = buf({N, ql});
    if (normed) m->cqn = buf({N, ql}), m->cq_mean = stat({N}), m->cq_rstd = stat({N});
  }
  m->ckv = buf({N, kvl + pe}), m->c = buf({N, kvl});
  if (normed) m->cn = buf({N, kvl}), m->c_mean = stat({N}), m->c_rstd = stat({N});
  m->kv = buf({N, H * (qk + vd)}), m->kpe = buf({N, pe});
  l.mla = std::move(m);
}

template <typename T>
int64_t GPTModel<T>::mla_activation_bytes(const LayerActivations& l) const {
  if (!l.mla) return 0;
  int64_t b = 0;
  const MLAState& m = *l.mla;
  for (const Tensor* t : {&m.cq, &m.cqn, &m.cq_mean, &m.cq_rstd, &m.ckv, &m.c, &m.cn, &m.c_mean,
                          &m.c_rstd, &m.kv, &m.kpe})
    b += t->held_bytes();
  return b;
}

template <typename T>
int64_t GPTModel<T>::mla_scratch_bytes() const {
  if (!mla_scratch_) return 0;
  int64_t b = 0;
  const MLAState& m = *mla_scratch_;
  for (const Tensor* t :
       {&m.d_cqn, &m.d_cq, &m.d_kv, &m.d_kpe, &m.d_head_pe, &m.d_cn, &m.d_c, &m.d_ckv})
    b += t->held_bytes();
  return b;
}

template <typename T>
void GPTModel<T>::mla_forward(int layer, LayerActivations& a, const T* h, const Geometry& g,
                              const Inputs& in) {
  const int N = g.tokens, C = cfg_.hidden_size, H = heads_;
  const int qk = cfg_.qk_head_dim, pe = cfg_.qk_pos_emb_head_dim, vd = cfg_.v_head_dim;
  const int ql = cfg_.q_lora_rank, kvl = cfg_.kv_lora_rank, hd = qk + pe, kvw = qk + vd;
  const auto p = mla_tensors<T>(layer_prefix(layer) + "self_attention.",
                                [&](const std::string& n) { return params_.value_or_null(n); });
  MLAState& m = *a.mla;
  T *q = a.q.template data<T>(), *k = a.k.template data<T>(), *v = a.v.template data<T>();
  // Queries: [N, H * (qk + pe)], each head [no rope, rope].
  if (ql > 0) {
    T* cq = m.cq.template data<T>();
    ops::linear_forward(x_, cq, h, p.q_down, static_cast<const T*>(nullptr), N, C, ql);
    const T* cqn = cq;
    if (cfg_.qk_layernorm) {
      norm_forward(m.cqn.template data<T>(), m.cq_mean.template data<Grad>(),
                   m.cq_rstd.template data<Grad>(), cq, p.q_norm_w, p.q_norm_b, N, ql);
      cqn = m.cqn.template data<T>();
    }
    ops::linear_forward(x_, q, cqn, p.q_up, static_cast<const T*>(nullptr), N, ql, H * hd);
  } else {
    ops::linear_forward(x_, q, h, p.q, static_cast<const T*>(nullptr), N, C, H * hd);
  }
  ops::rope_forward(x_, q + qk, rope_, N, g.seq, H, hd, in.positions, pe);
  // The latent and the shared rope key.
  T *ckv = m.ckv.template data<T>(), *c = m.c.template data<T>(), *kpe = m.kpe.template data<T>();
  ops::linear_forward(x_, ckv, h, p.kv_down, static_cast<const T*>(nullptr), N, C, kvl + pe);
  ops::copy_rows(x_, c, kvl, ckv, kvl + pe, kvl, N);
  ops::copy_rows(x_, kpe, pe, ckv + kvl, kvl + pe, pe, N);
  ops::rope_forward(x_, kpe, rope_, N, g.seq, 1, pe, in.positions, pe);
  const T* cn = c;
  if (cfg_.qk_layernorm) {
    norm_forward(m.cn.template data<T>(), m.c_mean.template data<Grad>(),
                 m.c_rstd.template data<Grad>(), c, p.kv_norm_w, p.kv_norm_b, N, kvl);
    cn = m.cn.template data<T>();
  }
  T* kv = m.kv.template data<T>();
  ops::linear_forward(x_, kv, cn, p.kv_up, static_cast<const T*>(nullptr), N, kvl, H * kvw);
  // Keys [no rope from kv, the shared rope key] and values, per head.
  const size_t NH = size_t(N) * H;
  ops::copy_rows(x_, k, hd, kv, kvw, qk, NH);
  for (int i = 0; i < H; ++i) ops::copy_rows(x_, k + i * hd + qk, size_t(H) * hd, kpe, pe, pe, N);
  ops::copy_rows(x_, v, vd, kv + qk, kvw, vd, NH);
}

template <typename T>
const T* GPTModel<T>::mla_backward(int layer, LayerActivations& a, T* dq, T* dk, T* dv, T* partial,
                                   T* d_rows, const Geometry& g, const Inputs& in) {
  const int N = g.tokens, C = cfg_.hidden_size, H = heads_;
  const int qk = cfg_.qk_head_dim, pe = cfg_.qk_pos_emb_head_dim, vd = cfg_.v_head_dim;
  const int ql = cfg_.q_lora_rank, kvl = cfg_.kv_lora_rank, hd = qk + pe, kvw = qk + vd;
  const std::string prefix = layer_prefix(layer) + "self_attention.";
  const auto p =
      mla_tensors<T>(prefix, [&](const std::string& n) { return params_.value_or_null(n); });
  const auto gp =
      mla_tensors<Grad>(prefix, [&](const std::string& n) { return params_.grad_or_null(n); });
  if (!mla_scratch_) {
    const int64_t Nmax = int64_t(max_batch_) * cfg_.seq_length / cp_->size();  // this rank's
    auto m = std::make_shared<MLAState>();
    auto buf = [&](Shape s) { return buffer(std::move(s)); };
    if (ql > 0) m->d_cqn = buf({Nmax, ql}), m->d_cq = buf({Nmax, ql});
    m->d_kv = buf({Nmax, int64_t(H) * kvw}), m->d_kpe = buf({Nmax, pe});
    m->d_head_pe = buf({Nmax, pe}), m->d_cn = buf({Nmax, kvl}), m->d_c = buf({Nmax, kvl});
    m->d_ckv = buf({Nmax, kvl + pe});
    mla_scratch_ = std::move(m);
  }
  MLAState &m = *a.mla, &s = *mla_scratch_;
  const T* h = a.ln1_full.template data<T>();
  const size_t NH = size_t(N) * H;
  // Keys and values back to kv's layout; the heads' rope-key gradients summed.
  T *d_kv = s.d_kv.template data<T>(), *d_kpe = s.d_kpe.template data<T>();
  T* d_head_pe = s.d_head_pe.template data<T>();
  ops::copy_rows(x_, d_kv, kvw, dk, hd, qk, NH);
  ops::copy_rows(x_, d_kv + qk, kvw, dv, vd, vd, NH);
  ops::copy_rows(x_, d_kpe, pe, dk + qk, size_t(H) * hd, pe, N);
  for (int i = 1; i < H; ++i) {
    ops::copy_rows(x_, d_head_pe, pe, dk + i * hd + qk, size_t(H) * hd, pe, N);
    ops::add(x_, d_kpe, d_kpe, d_head_pe, size_t(N) * pe);
  }
  ops::rope_backward(x_, d_kpe, rope_, N, g.seq, 1, pe, in.positions, pe);
  ops::rope_backward(x_, dq + qk, rope_, N, g.seq, H, hd, in.positions, pe);
  // kv: up-projection, latent norm, then [latent, rope key] through the down-projection.
  const T* cn = cfg_.qk_layernorm ? m.cn.template data<T>() : m.c.template data<T>();
  T *d_cn = s.d_cn.template data<T>(), *d_c = d_cn;
  ops::linear_backward(x_, d_cn, gp.kv_up, static_cast<Grad*>(nullptr), d_kv, cn, p.kv_up, N, kvl,
                       H * kvw);
  if (cfg_.qk_layernorm) {
    d_c = s.d_c.template data<T>();
    ops::zero(x_, d_c, size_t(N) * kvl);
    norm_backward(d_c, gp.kv_norm_w, gp.kv_norm_b, d_cn, m.c.template data<T>(), p.kv_norm_w,
                  m.c_mean.template data<Grad>(), m.c_rstd.template data<Grad>(), N, kvl);
  }
  T* d_ckv = s.d_ckv.template data<T>();
  ops::copy_rows(x_, d_ckv, kvl + pe, d_c, kvl, kvl, N);
  ops::copy_rows(x_, d_ckv + kvl, kvl + pe, d_kpe, pe, pe, N);
  ops::linear_backward(x_, partial, gp.kv_down, static_cast<Grad*>(nullptr), d_ckv, h, p.kv_down, N,
                       C, kvl + pe);
  // Queries.
  if (ql > 0) {
    T* cq = m.cq.template data<T>();
    const T* cqn = cfg_.qk_layernorm ? m.cqn.template data<T>() : cq;
    T *d_cqn = s.d_cqn.template data<T>(), *d_cq = d_cqn;
    ops::linear_backward(x_, d_cqn, gp.q_up, static_cast<Grad*>(nullptr), dq, cqn, p.q_up, N, ql,
                         H * hd);
    if (cfg_.qk_layernorm) {
      d_cq = s.d_cq.template data<T>();
      ops::zero(x_, d_cq, size_t(N) * ql);
      norm_backward(d_cq, gp.q_norm_w, gp.q_norm_b, d_cqn, cq, p.q_norm_w,
                    m.cq_mean.template data<Grad>(), m.cq_rstd.template data<Grad>(), N, ql);
    }
    ops::linear_backward(x_, partial, gp.q_down, static_cast<Grad*>(nullptr), d_cq, h, p.q_down, N,
                         C, ql, true);
  } else {
    ops::linear_backward(x_, partial, gp.q, static_cast<Grad*>(nullptr), dq, h, p.q, N, C, H * hd,
                         true);
  }
  return tp_.reduce_rows(d_rows, partial, N);
}

#define OMNI_INSTANTIATE(T)                                                                 \
  template void GPTModel<T>::add_mla_parameters(const std::string&, const AddReplicated&,   \
                                                const AddRows&) const;                      \
  template void GPTModel<T>::allocate_mla(LayerActivations&) const;                         \
  template int64_t GPTModel<T>::mla_activation_bytes(const LayerActivations&) const;        \
  template int64_t GPTModel<T>::mla_scratch_bytes() const;                                  \
  template void GPTModel<T>::mla_forward(int, LayerActivations&, const T*, const Geometry&, \
                                         const Inputs&);                                    \
  template const T* GPTModel<T>::mla_backward(int, LayerActivations&, T*, T*, T*, T*, T*,   \
                                              const Geometry&, const Inputs&);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(double)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

}  // namespace omni
