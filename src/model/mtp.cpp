// Multi-token prediction (DeepSeek-V3 report section 2.2, as Megatron-Core's
// transformer/multi_token_prediction.py trains it; --mtp-num-layers D,
// --mtp-loss-scaling-factor f). After the main model, depth k = 1..D ("mtp.layers.<k-1>.")
// reads the previous depth's output h_{k-1} (h_0: the decoder's output after its final norm,
// which Megatron's TransformerBlock applies before the MTP block) and the embedding of the
// tokens rolled k to the left (token 0 shifted in at the sequence's end):
//   x_k = eh_proj([enorm(embedding(ids_k)); hnorm(h_{k-1})])      (embedding first)
//   h_k = final_layernorm(transformer layer "mtp_model_layer" on x_k)
//   loss_k = masked mean cross-entropy of the shared output layer on h_k against the labels
//            and loss mask rolled k to the left (the last k positions masked)
// The objective adds f / D * sum_k loss_k to the main loss ("lm loss" stays the main model's;
// Megatron logs each loss_k as "mtp_<k> loss"). The word embedding and output layer are the
// main model's. The depths' transformer layers are this model's layers with global indices
// num_layers + k - 1 (layer_prefix names them), so layer_forward/layer_backward run them.
//
// The depths run whole in the loss chunk, forward and then backward in reverse, before the main
// loss's backward reaches the final norm: what they leave is d(objective)/d(h_0).
//
// Tensor parallelism: a depth's rows are the residual stream's (this rank's slice under
// sequence parallelism), its layer runs as the decoder's, and its loss takes the vocabulary-
// parallel output layer on the gathered rows. eh_proj is held whole on every rank (Megatron
// splits its output columns and gathers them: the same product, without that all-gather).
// Pipeline parallelism: the depths run on the last stage (where Megatron puts them), which
// holds a copy of the word embeddings summed with the first stage's (as tied embeddings).
// Their MoE layers (the last decoder layer's spec) report after the decoder's layers.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/gpt_model.h"

namespace omni {

template <typename T>
struct GPTModel<T>::MTPState {
  struct Depth {
    Tensor emb, cat, x, out, h, dh;  // [N, C] but cat [N, 2C]; dh: d(objective)/d(h)
    Tensor en_mean, en_rstd, hn_mean, hn_rstd, f_mean, f_rstd;  // [N]
    LayerActivations layer;
    std::unique_ptr<Storage> inputs;  // ids, labels [N] int32; mask [N] float
    const int32_t *ids = nullptr, *labels = nullptr;
    const float* mask = nullptr;
  };
  std::vector<Depth> depths;
  Tensor t, d_cat, d_h0, d_full;  // [N, C], [N, 2C], [N, C], [N, C]
  std::vector<double> losses;
};

template <typename T>
std::string GPTModel<T>::layer_prefix(int layer) const {
  if (layer < cfg_.num_layers) return "decoder.layers." + std::to_string(layer) + ".";
  return "mtp.layers." + std::to_string(layer - cfg_.num_layers) + ".mtp_model_layer.";
}

template <typename T>
void GPTModel<T>::add_mtp_parameters(const AddReplicated& replicated,
                                     const std::function<void(int)>& add_layer) const {
  const int64_t C = cfg_.hidden_size;
  const ParamInit gamma = cfg_.layernorm_zero_centered_gamma ? ParamInit::Zeros : ParamInit::Ones;
  auto norm = [&](const std::string& name) {
    replicated(name + ".weight", {C}, gamma, false, sp_);
    if (cfg_.norm_has_bias()) replicated(name + ".bias", {C}, ParamInit::Zeros, false, sp_);
  };
  // Megatron-Core's module order and names.
  for (int k = 0; k < cfg_.mtp_num_layers; ++k) {
    const std::string m = "mtp.layers." + std::to_string(k) + ".";
    norm(m + "enorm");
    norm(m + "hnorm");
    replicated(m + "eh_proj.weight", {C, 2 * C}, ParamInit::Normal, true, sp_);
    add_layer(cfg_.num_layers + k);
    norm(m + "final_layernorm");
  }
}

template <typename T>
std::vector<double> GPTModel<T>::take_mtp_losses() {
  if (!mtp_) return std::vector<double>(size_t(cfg_.mtp_num_layers), 0.0);
  std::vector<double> r = mtp_->losses;
  std::fill(mtp_->losses.begin(), mtp_->losses.end(), 0.0);
  return r;
}

template <typename T>
const T* GPTModel<T>::mtp_forward_backward(Activations& a, const MicroBatch& mb, const Geometry& g,
                                           double grad_scale) {
  const int D = cfg_.mtp_num_layers, L = cfg_.num_layers, C = cfg_.hidden_size;
  const int N = g.tokens, S = g.seq, R = g.rows;
  const int64_t max_n = int64_t(max_batch_) * cfg_.seq_length;
  if (!mtp_) {
    mtp_ = std::make_shared<MTPState>();
    mtp_->depths.resize(size_t(D));
    for (auto& d : mtp_->depths) {
      for (Tensor* t : {&d.emb, &d.x, &d.out, &d.h, &d.dh}) *t = buffer({max_n, C});
      d.cat = buffer({max_n, 2 * C});
      for (Tensor* t : {&d.en_mean, &d.en_rstd, &d.hn_mean, &d.hn_rstd, &d.f_mean, &d.f_rstd})
        *t = stat_buffer({max_n});
      allocate_layer(d.layer);
      d.inputs = std::make_unique<Storage>(3 * size_t(max_n) * 4, device_, x_.memory());
    }
    mtp_->t = buffer({max_n, C}), mtp_->d_h0 = buffer({max_n, C}),
    mtp_->d_full = buffer({max_n, C});
    mtp_->d_cat = buffer({max_n, 2 * C});
    mtp_->losses.assign(size_t(D), 0.0);
  }
  MTPState& s = *mtp_;
  const T* word = params_.value("embedding.word_embeddings.weight");
  auto w = [&](const std::string& n) { return params_.value(n); };
  auto b = [&](const std::string& n) { return params_.value_or_null(n); };
  T* t = s.t.template data<T>();
  const size_t RC = size_t(R) * C;
  // The main loss's token count: Megatron rescales each depth's mean by it under
  // --calculate-per-token-loss, where the micro-batch's loss is divided by loss_divisor.
  double original = N;
  if (mb.loss_mask) original = std::accumulate(mb.loss_mask, mb.loss_mask + N, 0.0);

  std::vector<int32_t> ids(static_cast<size_t>(N)), labels(static_cast<size_t>(N));
  std::vector<float> mask(static_cast<size_t>(N));
  for (int k = 1; k <= D; ++k) {
    auto& d = s.depths[size_t(k - 1)];
    const std::string m = "mtp.layers." + std::to_string(k - 1) + ".";
    double denom = 0;
    for (int n = 0; n < N; ++n) {
      const bool in = n % S + k < S;  // rolled k to the left: zero shifted in at the end
      ids[n] = in ? mb.tokens[n + k] : 0;
      labels[n] = in ? mb.labels[n + k] : 0;
      mask[n] = in ? (mb.loss_mask ? mb.loss_mask[n + k] : 1.0f) : 0.0f;
      denom += mask[n];
    }
    int32_t* base = static_cast<int32_t*>(d.inputs->data());
    ops::upload(x_, base, ids.data(), ids.size());
    ops::upload(x_, base + max_n, labels.data(), labels.size());
    float* mask_dev = reinterpret_cast<float*>(base + 2 * max_n);
    ops::upload(x_, mask_dev, mask.data(), mask.size());
    d.ids = base, d.labels = base + max_n, d.mask = mask_dev;

    const T* h_prev =
        k == 1 ? a.final_norm.template data<T>() : s.depths[size_t(k - 2)].h.template data<T>();
    T *emb = d.emb.template data<T>(), *cat = d.cat.template data<T>();
    tp_.embedding_forward(emb, full_.template data<T>(), d.ids, word, vocab_, N, S);
    hidden_dropout(emb, mb, a.in, g, L + k - 1, ops::DropoutSite::Embedding);
    norm_forward(t, d.en_mean.template data<Grad>(), d.en_rstd.template data<Grad>(), emb,
                 w(m + "enorm.weight"), b(m + "enorm.bias"), R, C);
    ops::copy_rows(x_, cat, 2 * C, t, C, C, R);
    norm_forward(t, d.hn_mean.template data<Grad>(), d.hn_rstd.template data<Grad>(), h_prev,
                 w(m + "hnorm.weight"), b(m + "hnorm.bias"), R, C);
    ops::copy_rows(x_, cat + C, 2 * C, t, C, C, R);
    T *x = d.x.template data<T>(), *out = d.out.template data<T>(), *h = d.h.template data<T>();
    ops::linear_forward<T>(x_, x, cat, w(m + "eh_proj.weight"), nullptr, R, 2 * C, C);
    layer_forward(L + k - 1, d.layer, x, out, mb, g, a.in);
    norm_forward(h, d.f_mean.template data<Grad>(), d.f_rstd.template data<Grad>(), out,
                 w(m + "final_layernorm.weight"), b(m + "final_layernorm.bias"), R, C);
    if (denom == 0) {  // every position of this depth masked: no loss, no gradient
      ops::zero(x_, d.dh.template data<T>(), RC);
      continue;
    }
    double scale = grad_scale * cfg_.mtp_loss_scaling_factor / D / denom;
    if (mb.loss_divisor > 0) scale *= original / mb.loss_divisor;
    // Tensor parallelism: the output layer's vocabulary slice on every row (sequence parallel:
    // gathered), its partial d(h) summed over the group into this rank's rows.
    const T* h_all = tp_.gather_rows(t, h, N);
    T* d_full = s.d_full.template data<T>();
    const double part =
        tp_.vocab_cross_entropy(nullptr, d_full, classifier_grad(), h_all, classifier_weight(),
                                d.labels, d.mask, vocab_, N, scale);
    const T* dh = tp_.reduce_rows(d.dh.template data<T>(), d_full, N);
    if (dh != d.dh.template data<T>()) ops::copy(x_, d.dh.template data<T>(), dh, RC);
    s.losses[size_t(k - 1)] += part / denom;
  }
  T* d_h0 = s.d_h0.template data<T>();
  T* d_cat = s.d_cat.template data<T>();
  ops::zero(x_, d_h0, RC);
  for (int k = D; k >= 1; --k) {
    auto& d = s.depths[size_t(k - 1)];
    const std::string m = "mtp.layers." + std::to_string(k - 1) + ".";
    auto gr = [&](const std::string& n) { return params_.grad(n); };
    auto gb = [&](const std::string& n) { return params_.grad_or_null(n); };
    T* d_x = d_resid_.template data<T>();
    ops::zero(x_, d_x, RC);
    norm_backward(d_x, gr(m + "final_layernorm.weight"), gb(m + "final_layernorm.bias"),
                  d.dh.template data<T>(), d.out.template data<T>(),
                  w(m + "final_layernorm.weight"), d.f_mean.template data<Grad>(),
                  d.f_rstd.template data<Grad>(), R, C);
    layer_backward(L + k - 1, d.layer, d.x.template data<T>(), d_x, mb, g, a.in);
    ops::linear_backward<T>(x_, d_cat, gr(m + "eh_proj.weight"), nullptr, d_x,
                            d.cat.template data<T>(), w(m + "eh_proj.weight"), R, 2 * C, C);
    // The embedding's half: through enorm and embedding dropout to the word embedding.
    ops::copy_rows(x_, t, C, d_cat, 2 * C, C, R);
    ops::zero(x_, d_x, RC);
    norm_backward(d_x, gr(m + "enorm.weight"), gb(m + "enorm.bias"), t, d.emb.template data<T>(),
                  w(m + "enorm.weight"), d.en_mean.template data<Grad>(),
                  d.en_rstd.template data<Grad>(), R, C);
    hidden_dropout(d_x, mb, a.in, g, L + k - 1, ops::DropoutSite::Embedding);
    tp_.embedding_backward(params_.grad("embedding.word_embeddings.weight"),
                           d_full_.template data<T>(), d_x, d.ids, vocab_, N, S);
    // The hidden states' half: into the previous depth's d(h) (norm_backward adds).
    ops::copy_rows(x_, t, C, d_cat + C, 2 * C, C, R);
    const T* h_prev =
        k == 1 ? a.final_norm.template data<T>() : s.depths[size_t(k - 2)].h.template data<T>();
    T* d_prev = k == 1 ? d_h0 : s.depths[size_t(k - 2)].dh.template data<T>();
    norm_backward(d_prev, gr(m + "hnorm.weight"), gb(m + "hnorm.bias"), t, h_prev,
                  w(m + "hnorm.weight"), d.hn_mean.template data<Grad>(),
                  d.hn_rstd.template data<Grad>(), R, C);
  }
  return d_h0;
}

#define OMNI_INSTANTIATE(T)                                                             \
  template std::string GPTModel<T>::layer_prefix(int) const;                            \
  template void GPTModel<T>::add_mtp_parameters(const AddReplicated&,                   \
                                                const std::function<void(int)>&) const; \
  template std::vector<double> GPTModel<T>::take_mtp_losses();                          \
  template const T* GPTModel<T>::mtp_forward_backward(Activations&, const MicroBatch&,  \
                                                      const Geometry&, double);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(double)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

}  // namespace omni
