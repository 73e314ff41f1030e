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
// Context parallelism: the rolls are the whole sequence's (Megatron's roll_tensor passes each
// chunk's first row to the rank holding the chunk before it); here the ranks gather the
// micro-batch's tokens, labels, mask and positions once; each depth's token count is the
// whole sequence's, and take_mtp_losses() this rank's part of its loss. Packed documents
// (--reset-attention-mask) roll as one sequence, as Megatron's roll without packed_seq_params
// does.
// Learned absolute positions (GPT-2): the depth's embedding adds the rolled tokens' positions
// (Megatron rolls position_ids with the ids), into the one position table.
#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/gpt_model.h"
#include "parallel/context_parallel.h"

namespace omni {

namespace {

// A micro-batch's tokens, labels, loss mask and positions over the whole sequence [batch,
// seq]: this rank's own arrays, or under context parallelism every rank's rows gathered to
// their indices in the full sequence (MicroBatch::seq_index).
struct WholeSequence {
  WholeSequence(const MicroBatch& mb, int local_seq, Communicator& cp) {
    const int ranks = cp.size();
    seq = int64_t(local_seq) * ranks;
    tokens = mb.tokens, labels = mb.labels, loss_mask = mb.loss_mask, positions = mb.position_ids;
    if (ranks == 1) return;
    // Five numbers a row (exact as doubles): index, token, label, mask, position.
    const size_t N = size_t(mb.batch) * local_seq;
    std::vector<double> mine(5 * N), all(5 * N * size_t(ranks));
    for (size_t n = 0; n < N; ++n) {
      const double row[5] = {double(mb.seq_index[n]), double(mb.tokens[n]), double(mb.labels[n]),
                             mb.loss_mask ? double(mb.loss_mask[n]) : 1.0,
                             double(mb.position_ids[n])};
      std::copy(row, row + 5, mine.begin() + 5 * n);
    }
    cp.all_gather(all.data(), mine.data(), mine.size());
    const size_t total = size_t(mb.batch) * size_t(seq);
    own_tokens.assign(total, 0), own_labels.assign(total, 0), own_positions.assign(total, 0);
    own_mask.assign(total, 0.0f);
    for (size_t r = 0; r < size_t(ranks); ++r)
      for (size_t n = 0; n < N; ++n) {
        const double* row = all.data() + 5 * (r * N + n);
        const size_t i = (n / size_t(local_seq)) * size_t(seq) + size_t(row[0]);
        own_tokens[i] = int32_t(row[1]), own_labels[i] = int32_t(row[2]);
        own_mask[i] = float(row[3]), own_positions[i] = int32_t(row[4]);
      }
    tokens = own_tokens.data(), labels = own_labels.data(), loss_mask = own_mask.data();
    positions = own_positions.data();
  }
  float mask(int64_t i) const { return loss_mask ? loss_mask[i] : 1.0f; }
  int32_t position(int64_t i) const { return positions ? positions[i] : int32_t(i % seq); }

  int64_t seq = 0;
  const int32_t *tokens = nullptr, *labels = nullptr, *positions = nullptr;
  const float* loss_mask = nullptr;
  std::vector<int32_t> own_tokens, own_labels, own_positions;
  std::vector<float> own_mask;
};

}  // namespace

template <typename T>
struct GPTModel<T>::MTPState {
  struct Depth {
    Tensor emb, cat, x, out, h, dh;  // [N, C] but cat [N, 2C]; dh: d(objective)/d(h)
    Tensor en_mean, en_rstd, hn_mean, hn_rstd, f_mean, f_rstd;  // [N]
    LayerActivations layer;
    std::unique_ptr<Storage> inputs;  // ids, labels, positions [N] int32; mask [N] float
    const int32_t *ids = nullptr, *labels = nullptr, *positions = nullptr;
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
int64_t GPTModel<T>::mtp_bytes() const {
  if (!mtp_) return 0;
  const MTPState& s = *mtp_;
  int64_t b = s.t.held_bytes() + s.d_cat.held_bytes() + s.d_h0.held_bytes() + s.d_full.held_bytes();
  for (const auto& d : s.depths) {
    for (const Tensor* t : {&d.emb, &d.cat, &d.x, &d.out, &d.h, &d.dh, &d.en_mean, &d.en_rstd,
                            &d.hn_mean, &d.hn_rstd, &d.f_mean, &d.f_rstd})
      b += t->held_bytes();
    b += layer_bytes(d.layer) + (d.inputs ? int64_t(d.inputs->bytes()) : 0);
  }
  return b;
}

template <typename T>
const T* GPTModel<T>::mtp_forward_backward(Activations& a, const MicroBatch& mb, const Geometry& g,
                                           double grad_scale) {
  const int D = cfg_.mtp_num_layers, L = cfg_.num_layers, C = cfg_.hidden_size;
  const int N = g.tokens, S = g.seq, R = g.rows;
  const int64_t max_n = int64_t(max_batch_) * cfg_.seq_length / cp_->size();
  if (!mtp_) {
    mtp_ = std::make_shared<MTPState>();
    mtp_->depths.resize(size_t(D));
    for (auto& d : mtp_->depths) {
      for (Tensor* t : {&d.emb, &d.x, &d.out, &d.h, &d.dh}) *t = buffer({max_n, C});
      d.cat = buffer({max_n, 2 * C});
      for (Tensor* t : {&d.en_mean, &d.en_rstd, &d.hn_mean, &d.hn_rstd, &d.f_mean, &d.f_rstd})
        *t = stat_buffer({max_n});
      allocate_layer(d.layer);
      d.inputs = std::make_unique<Storage>(4 * size_t(max_n) * 4, device_, x_.memory());
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
  // The rolls are the whole sequence's (Megatron's roll_tensor), whose 2 x cp chunks the
  // context-parallel ranks hold two each: row n's tokens k to the right may be another rank's.
  const WholeSequence whole(mb, S, *cp_);
  const int64_t Sf = whole.seq;
  auto index_of = [&](int n) -> int64_t { return mb.seq_index ? mb.seq_index[n] : n % S; };
  // The main loss's token count: Megatron rescales each depth's mean by it under
  // --calculate-per-token-loss, where the micro-batch's loss is divided by loss_divisor.
  double original = 0;
  for (int64_t i = 0; i < int64_t(mb.batch) * Sf; ++i) original += whole.mask(i);

  std::vector<int32_t> ids(static_cast<size_t>(N)), labels(static_cast<size_t>(N)),
      positions(static_cast<size_t>(N));
  std::vector<float> mask(static_cast<size_t>(N));
  for (int k = 1; k <= D; ++k) {
    auto& d = s.depths[size_t(k - 1)];
    const std::string m = "mtp.layers." + std::to_string(k - 1) + ".";
    for (int n = 0; n < N; ++n) {
      // Rolled k to the left: zeros shifted in at the sequence's end (positions too).
      const int64_t j = index_of(n) + k, i = (n / S) * Sf + j;
      const bool in = j < Sf;
      ids[n] = in ? whole.tokens[i] : 0;
      labels[n] = in ? whole.labels[i] : 0;
      mask[n] = in ? whole.mask(i) : 0.0f;
      positions[n] = in ? whole.position(i) : 0;
    }
    double denom = 0;  // the whole sequence's (every context-parallel rank's) unmasked rows
    for (int64_t i = 0; i < int64_t(mb.batch) * Sf; ++i)
      if (i % Sf >= k) denom += whole.mask(i);
    int32_t* base = static_cast<int32_t*>(d.inputs->data());
    ops::upload(x_, base, ids.data(), ids.size());
    ops::upload(x_, base + max_n, labels.data(), labels.size());
    float* mask_dev = reinterpret_cast<float*>(base + 2 * max_n);
    ops::upload(x_, mask_dev, mask.data(), mask.size());
    ops::upload(x_, base + 3 * max_n, positions.data(), positions.size());
    d.ids = base, d.labels = base + max_n, d.mask = mask_dev, d.positions = base + 3 * max_n;

    const T* h_prev =
        k == 1 ? a.final_norm.template data<T>() : s.depths[size_t(k - 2)].h.template data<T>();
    T *emb = d.emb.template data<T>(), *cat = d.cat.template data<T>();
    tp_.embedding_forward(emb, full_.template data<T>(), d.ids, word, vocab_, N, S);
    // Learned absolute positions: those of the rolled tokens (Megatron rolls position_ids).
    if (const T* wpe = params_.value_or_null("embedding.position_embeddings.weight"))
      ops::position_embedding_add(x_, emb, wpe, R, S, C, d.positions + tp_.first_row(N));
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
    // This rank's part of the whole sequence's mean: the trainer sums the parts over the
    // data- and context-parallel ranks (train/moe_step.cpp), as the balancing losses.
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
    embed_backward(d_x, d.ids, d.positions + tp_.first_row(N), g);
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
  template int64_t GPTModel<T>::mtp_bytes() const;                                      \
  template const T* GPTModel<T>::mtp_forward_backward(Activations&, const MicroBatch&,  \
                                                      const Geometry&, double);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(double)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

}  // namespace omni
