// See gpu_model.h. The layer code follows GPTModel's layer_forward/layer_backward op for op
// (one rank, no sequence parallelism), so the two read side by side.
#include "model/gpu_model.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "base/error.h"

OMNI_GPU_NAMESPACE_BEGIN

namespace {
std::string layer_prefix(int i) {
  return "decoder.layers." + std::to_string(i) + ".";
}
}  // namespace

// A layer's weights (the T copy) or fp32 gradients, looked up by name once; null where the
// model has no such tensor (biases off, RMSNorm).
template <typename P>
struct LayerTensors {
  P *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w,
      *fc2_b;
};

template <typename T>
struct GPUGPTModel<T>::Layer {
  LayerTensors<const T> w;
  LayerTensors<float> g;
  DeviceArray<T> ln1, q, k, v, attn, mid, ln2, fc1, act;
  DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
};

template <typename T>
struct GPUGPTModel<T>::Buffers {
  std::unordered_map<std::string, const ParamInfo*> by_name;
  std::vector<DeviceArray<T>> residual;  // num_layers + 1 streams [N, C]
  std::vector<Layer> layers;
  DeviceArray<T> final_norm, d_final, qkv, d_resid, partial, d_ffn, d_fc1, d_attn, dq, dk, dv, dh;
  DeviceArray<float> final_mean, final_rstd, mask, rope_cos, rope_sin;
  DeviceArray<int32_t> tokens, labels, positions, key_start;
};

template <typename T>
GPUGPTModel<T>::GPUGPTModel(const TransformerConfig& config, int max_batch, uint64_t seed)
    : cfg_(config), max_batch_(max_batch), b_(std::make_unique<Buffers>()) {
  OMNI_REQUIRE(!cfg_.qk_layernorm, "--qk-layernorm is not built for the GPU model yet");
  OMNI_REQUIRE(!cfg_.layernorm_zero_centered_gamma,
               "--apply-layernorm-1p is not built for the GPU model yet; use --device cpu");
  OMNI_REQUIRE(cfg_.position_embedding_type != PositionEmbedding::Rope ||
                   cfg_.rotary_dim() == cfg_.head_dim(),
               "--rotary-percent ", cfg_.rotary_percent,
               " (rope on part of each head) is not built for the GPU model yet; use --device "
               "cpu");
  OMNI_CHECK(max_batch > 0, "[gpu model] max_batch ", max_batch);
  // The host model lays out and initialises the parameters exactly as the CPU runs do.
  {
    GPTModel<float> host(cfg_, 1, seed);
    infos_ = host.params().infos();
    size_ = host.params().size();
    master_ = DeviceArray<float>(size_);
    copy_to_device(master_.data(), host.params().values(), size_ * sizeof(float));
  }
  for (const ParamInfo& p : infos_) b_->by_name[p.name] = &p;
  grads_ = DeviceArray<float>(size_);
  exp_avg_ = DeviceArray<float>(size_);
  exp_avg_sq_ = DeviceArray<float>(size_);
  fill_zero(grads_.data(), size_ * sizeof(float));
  fill_zero(exp_avg_.data(), size_ * sizeof(float));
  fill_zero(exp_avg_sq_.data(), size_ * sizeof(float));
  if constexpr (!std::is_same_v<T, float>) model_ = DeviceArray<T>(size_);
  refresh_model_copy();

  const int64_t S = cfg_.seq_length, N = int64_t(max_batch) * S, C = cfg_.hidden_size;
  const int64_t hd = cfg_.head_dim(), H = cfg_.num_attention_heads, G = cfg_.query_groups();
  const int64_t F = cfg_.ffn_size(), fc1_out = cfg_.swiglu ? 2 * F : F;
  Buffers& b = *b_;
  for (int i = 0; i <= cfg_.num_layers; ++i) b.residual.emplace_back(N * C);
  b.layers.resize(cfg_.num_layers);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    const std::string p = layer_prefix(i);
    auto w = [&](const char* name) { return weight_or_null(p + name); };
    auto g = [&](const char* name) { return grad_or_null(p + name); };
    Layer& l = b.layers[i];
    l.w = {w("input_layernorm.weight"),
           w("input_layernorm.bias"),
           w("self_attention.linear_qkv.weight"),
           w("self_attention.linear_qkv.bias"),
           w("self_attention.linear_proj.weight"),
           w("self_attention.linear_proj.bias"),
           w("pre_mlp_layernorm.weight"),
           w("pre_mlp_layernorm.bias"),
           w("mlp.linear_fc1.weight"),
           w("mlp.linear_fc1.bias"),
           w("mlp.linear_fc2.weight"),
           w("mlp.linear_fc2.bias")};
    l.g = {g("input_layernorm.weight"),
           g("input_layernorm.bias"),
           g("self_attention.linear_qkv.weight"),
           g("self_attention.linear_qkv.bias"),
           g("self_attention.linear_proj.weight"),
           g("self_attention.linear_proj.bias"),
           g("pre_mlp_layernorm.weight"),
           g("pre_mlp_layernorm.bias"),
           g("mlp.linear_fc1.weight"),
           g("mlp.linear_fc1.bias"),
           g("mlp.linear_fc2.weight"),
           g("mlp.linear_fc2.bias")};
    OMNI_CHECK(l.w.ln1_w && l.w.qkv_w && l.w.proj_w && l.w.ln2_w && l.w.fc1_w && l.w.fc2_w,
               "[gpu model] layer ", i, " lacks a weight");
    l.ln1 = DeviceArray<T>(N * C), l.ln2 = DeviceArray<T>(N * C), l.mid = DeviceArray<T>(N * C);
    l.ln1_mean = DeviceArray<float>(N), l.ln1_rstd = DeviceArray<float>(N);
    l.ln2_mean = DeviceArray<float>(N), l.ln2_rstd = DeviceArray<float>(N);
    l.q = DeviceArray<T>(N * H * hd), l.attn = DeviceArray<T>(N * H * hd);
    l.k = DeviceArray<T>(N * G * hd), l.v = DeviceArray<T>(N * G * hd);
    l.lse = DeviceArray<float>(N * H);
    l.fc1 = DeviceArray<T>(N * fc1_out), l.act = DeviceArray<T>(N * F);
  }
  b.final_norm = DeviceArray<T>(N * C), b.d_final = DeviceArray<T>(N * C);
  b.final_mean = DeviceArray<float>(N), b.final_rstd = DeviceArray<float>(N);
  b.qkv = DeviceArray<T>(N * (H + 2 * G) * hd);
  b.d_resid = DeviceArray<T>(N * C), b.partial = DeviceArray<T>(N * C),
  b.dh = DeviceArray<T>(N * C);
  b.d_ffn = DeviceArray<T>(N * F), b.d_fc1 = DeviceArray<T>(N * fc1_out);
  b.d_attn = DeviceArray<T>(N * H * hd), b.dq = DeviceArray<T>(N * H * hd);
  b.dk = DeviceArray<T>(N * G * hd), b.dv = DeviceArray<T>(N * G * hd);
  b.mask = DeviceArray<float>(N);
  b.tokens = DeviceArray<int32_t>(N), b.labels = DeviceArray<int32_t>(N);
  b.positions = DeviceArray<int32_t>(N), b.key_start = DeviceArray<int32_t>(N);
  if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
    // Llama 3.1 scaling lives in the frequencies: the kernels need nothing else.
    std::vector<double> cos(S * hd / 2), sin(S * hd / 2);
    ops::rope_tables(cos.data(), sin.data(), int(S), cfg_.rotary_inv_freq());
    const std::vector<float> cosf(cos.begin(), cos.end()), sinf(sin.begin(), sin.end());
    b.rope_cos = DeviceArray<float>(cosf.size()), b.rope_sin = DeviceArray<float>(sinf.size());
    copy_to_device(b.rope_cos.data(), cosf.data(), cosf.size() * sizeof(float));
    copy_to_device(b.rope_sin.data(), sinf.data(), sinf.size() * sizeof(float));
  }
}

template <typename T>
GPUGPTModel<T>::~GPUGPTModel() = default;

template <typename T>
void GPUGPTModel<T>::refresh_model_copy() {
  if constexpr (!std::is_same_v<T, float>) convert_from_float(model_.data(), master_.data(), size_);
}

template <typename T>
const T* GPUGPTModel<T>::weight_or_null(const std::string& name) const {
  auto it = b_->by_name.find(name);
  if (it == b_->by_name.end()) return nullptr;
  if constexpr (std::is_same_v<T, float>)
    return master_.data() + it->second->offset;
  else
    return model_.data() + it->second->offset;
}

template <typename T>
float* GPUGPTModel<T>::grad_or_null(const std::string& name) const {
  auto it = b_->by_name.find(name);
  return it == b_->by_name.end() ? nullptr : grads_.data() + it->second->offset;
}

template <typename T>
const T* GPUGPTModel<T>::weight(const std::string& name) const {
  const T* p = weight_or_null(name);
  OMNI_CHECK(p, "[gpu model] no parameter ", name);
  return p;
}

template <typename T>
float* GPUGPTModel<T>::grad(const std::string& name) const {
  float* p = grad_or_null(name);
  OMNI_CHECK(p, "[gpu model] no parameter ", name);
  return p;
}

template <typename T>
void GPUGPTModel<T>::upload_batch(const MicroBatch& mb) {
  OMNI_CHECK(mb.batch > 0 && mb.batch <= max_batch_, "[gpu model] batch ", mb.batch, " outside 1..",
             max_batch_);
  OMNI_CHECK(mb.seq > 0 && mb.seq <= cfg_.seq_length, "[gpu model] sequence ", mb.seq,
             " outside 1..", cfg_.seq_length);
  OMNI_REQUIRE(mb.seq_index == nullptr, "context parallelism is not built for the GPU model yet");
  batch_ = mb.batch, seq_ = mb.seq, tokens_ = mb.batch * mb.seq;
  const size_t n = size_t(tokens_);
  std::vector<int32_t> labels(n, 0), positions(n);
  mask_sum_ = 0;
  for (size_t i = 0; i < n; ++i) {
    OMNI_REQUIRE(mb.tokens[i] >= 0 && mb.tokens[i] < cfg_.vocab_size, "token id ", mb.tokens[i],
                 " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
    const float m = mb.loss_mask ? mb.loss_mask[i] : 1.0f;
    mask_sum_ += m;
    // Masked-out rows may carry any label; the kernel gets 0 there.
    if (mb.labels && m != 0.0f) {
      OMNI_REQUIRE(mb.labels[i] >= 0 && mb.labels[i] < cfg_.vocab_size, "label id ", mb.labels[i],
                   " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
      labels[i] = mb.labels[i];
    }
    positions[i] = mb.position_ids ? mb.position_ids[i] : int32_t(i % size_t(seq_));
  }
  Buffers& b = *b_;
  copy_to_device(b.tokens.data(), mb.tokens, n * sizeof(int32_t));
  copy_to_device(b.labels.data(), labels.data(), n * sizeof(int32_t));
  copy_to_device(b.positions.data(), positions.data(), n * sizeof(int32_t));
  if (mb.loss_mask) copy_to_device(b.mask.data(), mb.loss_mask, n * sizeof(float));
  has_key_start_ = mb.key_start != nullptr;
  if (has_key_start_) copy_to_device(b.key_start.data(), mb.key_start, n * sizeof(int32_t));
}

template <typename T>
void GPUGPTModel<T>::norm_forward(T* out, float* mean, float* rstd, const T* x, const T* w,
                                  const T* bias, int rows) {
  const auto eps = float(cfg_.norm_epsilon);
  if (cfg_.normalization == Normalization::LayerNorm)
    layernorm_forward(out, mean, rstd, x, w, bias, rows, cfg_.hidden_size, eps);
  else
    rmsnorm_forward(out, rstd, x, w, rows, cfg_.hidden_size, eps);
}

template <typename T>
void GPUGPTModel<T>::norm_backward(T* dx, float* dw, float* db, const T* dout, const T* x,
                                   const T* w, const float* mean, const float* rstd, int rows) {
  if (cfg_.normalization == Normalization::LayerNorm)
    layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, cfg_.hidden_size);
  else
    rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, cfg_.hidden_size);
}

template <typename T>
void GPUGPTModel<T>::layer_forward(int i, const T* x, T* out) {
  Buffers& b = *b_;
  Layer& a = b.layers[i];
  const int N = tokens_, C = cfg_.hidden_size, hd = cfg_.head_dim();
  const int H = cfg_.num_attention_heads, G = cfg_.query_groups(), F = cfg_.ffn_size();
  ops::AttentionDims ad{batch_, seq_, H, G, hd};
  if (has_key_start_) ad.key_start = b.key_start.data();

  norm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, a.w.ln1_w, a.w.ln1_b, N);
  linear_forward(b.qkv.data(), a.ln1.data(), a.w.qkv_w, a.w.qkv_b, N, C, ad.qkv_width());
  gpu::qkv_split(a.q.data(), a.k.data(), a.v.data(), b.qkv.data(), ad);
  if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
    rope_forward(a.q.data(), b.rope_cos.data(), b.rope_sin.data(), N, seq_, H, hd,
                 b.positions.data());
    rope_forward(a.k.data(), b.rope_cos.data(), b.rope_sin.data(), N, seq_, G, hd,
                 b.positions.data());
  }
  flash_attention_forward(a.attn.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), ad);
  linear_forward(a.mid.data(), a.attn.data(), a.w.proj_w, a.w.proj_b, N, H * hd, C);
  add(a.mid.data(), a.mid.data(), x, size_t(N) * C);

  norm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.mid.data(), a.w.ln2_w,
               a.w.ln2_b, N);
  const T* fc1_w = a.w.fc1_w;
  const T* fc1_b = a.w.fc1_b;
  if (cfg_.swiglu) {
    linear_forward(a.fc1.data(), a.ln2.data(), fc1_w, fc1_b, N, C, 2 * F);
    swiglu_forward(a.act.data(), a.fc1.data(), N, F);
  } else {  // the bias-GELU epilogue keeps the pre-activation for the backward
    linear_forward(a.fc1.data(), a.ln2.data(), fc1_w, fc1_b, N, C, F, nullptr, a.act.data(),
                   gelu_form(cfg_));
  }
  linear_forward(out, a.act.data(), a.w.fc2_w, a.w.fc2_b, N, F, C);
  add(out, out, a.mid.data(), size_t(N) * C);
}

template <typename T>
void GPUGPTModel<T>::layer_backward(int i, const T* x, T* dres) {
  Buffers& b = *b_;
  Layer& a = b.layers[i];
  const int N = tokens_, C = cfg_.hidden_size, hd = cfg_.head_dim();
  const int H = cfg_.num_attention_heads, G = cfg_.query_groups(), F = cfg_.ffn_size();
  const int fc1_out = cfg_.swiglu ? 2 * F : F;
  ops::AttentionDims ad{batch_, seq_, H, G, hd};
  if (has_key_start_) ad.key_start = b.key_start.data();

  // MLP: out = mid + fc2(act(fc1(norm(mid)))); dres holds d(out).
  linear_backward(b.d_ffn.data(), a.g.fc2_w, a.g.fc2_b, dres, a.act.data(), a.w.fc2_w, N, F, C);
  if (cfg_.swiglu)
    swiglu_backward(b.d_fc1.data(), b.d_ffn.data(), a.fc1.data(), N, F);
  else
    gelu_backward(b.d_fc1.data(), b.d_ffn.data(), a.fc1.data(), size_t(N) * F, gelu_form(cfg_));
  linear_backward(b.partial.data(), a.g.fc1_w, a.g.fc1_b, b.d_fc1.data(), a.ln2.data(), a.w.fc1_w,
                  N, C, fc1_out);
  norm_backward(dres, a.g.ln2_w, a.g.ln2_b, b.partial.data(), a.mid.data(), a.w.ln2_w,
                a.ln2_mean.data(), a.ln2_rstd.data(), N);
  // Attention: mid = x + proj(attention(qkv(norm(x)))); dres holds d(mid).
  linear_backward(b.d_attn.data(), a.g.proj_w, a.g.proj_b, dres, a.attn.data(), a.w.proj_w, N,
                  H * hd, C);
  flash_attention_backward(b.dq.data(), b.dk.data(), b.dv.data(), b.d_attn.data(), a.attn.data(),
                           a.lse.data(), a.q.data(), a.k.data(), a.v.data(), ad);
  if (cfg_.position_embedding_type == PositionEmbedding::Rope) {
    rope_backward(b.dq.data(), b.rope_cos.data(), b.rope_sin.data(), N, seq_, H, hd,
                  b.positions.data());
    rope_backward(b.dk.data(), b.rope_cos.data(), b.rope_sin.data(), N, seq_, G, hd,
                  b.positions.data());
  }
  gpu::qkv_merge(b.qkv.data(), b.dq.data(), b.dk.data(), b.dv.data(), ad);
  linear_backward(b.partial.data(), a.g.qkv_w, a.g.qkv_b, b.qkv.data(), a.ln1.data(), a.w.qkv_w, N,
                  C, ad.qkv_width());
  norm_backward(dres, a.g.ln1_w, a.g.ln1_b, b.partial.data(), x, a.w.ln1_w, a.ln1_mean.data(),
                a.ln1_rstd.data(), N);
}

template <typename T>
double GPUGPTModel<T>::head(bool train, double grad_scale) {
  Buffers& b = *b_;
  const int N = tokens_, C = cfg_.hidden_size;
  const T* x = b.residual.back().data();
  norm_forward(b.final_norm.data(), b.final_mean.data(), b.final_rstd.data(), x,
               weight("decoder.final_layernorm.weight"),
               weight_or_null("decoder.final_layernorm.bias"), N);
  fill_zero(b.d_final.data(), size_t(N) * C * sizeof(T));
  if (mask_sum_ == 0) return 0.0;  // every token masked: no loss, no gradient
  const std::string classifier = cfg_.untie_embeddings_and_output_weights
                                     ? "output_layer.weight"
                                     : "embedding.word_embeddings.weight";
  ops::ClassifierLossArgs ca;
  ca.rows = N, ca.hidden = C, ca.vocab = cfg_.vocab_size;
  ca.grad_scale = grad_scale / mask_sum_;
  const float* mask = mask_sum_ == double(N) ? nullptr : b.mask.data();
  const double loss = gpu::classifier_cross_entropy<T>(
      nullptr, train ? b.dh.data() : nullptr, train ? grad(classifier) : nullptr,
      b.final_norm.data(), weight(classifier), b.labels.data(), mask, ca);
  if (train)
    norm_backward(b.d_final.data(), grad("decoder.final_layernorm.weight"),
                  grad_or_null("decoder.final_layernorm.bias"), b.dh.data(), x,
                  weight("decoder.final_layernorm.weight"), b.final_mean.data(),
                  b.final_rstd.data(), N);
  return loss / mask_sum_;
}

template <typename T>
double GPUGPTModel<T>::forward_backward(const MicroBatch& mb, double grad_scale) {
  OMNI_CHECK(mb.labels, "[gpu model] the loss needs labels");
  upload_batch(mb);
  Buffers& b = *b_;
  const int N = tokens_, C = cfg_.hidden_size;
  embedding_forward(
      b.residual[0].data(), b.tokens.data(), weight("embedding.word_embeddings.weight"),
      weight_or_null("embedding.position_embeddings.weight"), N, seq_, C, b.positions.data());
  for (int i = 0; i < cfg_.num_layers; ++i)
    layer_forward(i, b.residual[i].data(), b.residual[i + 1].data());
  const double loss = head(true, grad_scale);
  copy_on_device(b.d_resid.data(), b.d_final.data(), size_t(N) * C * sizeof(T));
  for (int i = cfg_.num_layers - 1; i >= 0; --i)
    layer_backward(i, b.residual[i].data(), b.d_resid.data());
  embedding_backward(grad("embedding.word_embeddings.weight"),
                     grad_or_null("embedding.position_embeddings.weight"), b.tokens.data(),
                     b.d_resid.data(), N, seq_, C, b.positions.data());
  return loss;
}

template <typename T>
double GPUGPTModel<T>::forward_loss(const MicroBatch& mb) {
  OMNI_CHECK(mb.labels, "[gpu model] the loss needs labels");
  OMNI_CHECK(!mb.token_losses, "[gpu model] per-token losses are computed by the host model");
  upload_batch(mb);
  Buffers& b = *b_;
  embedding_forward(b.residual[0].data(), b.tokens.data(),
                    weight("embedding.word_embeddings.weight"),
                    weight_or_null("embedding.position_embeddings.weight"), tokens_, seq_,
                    cfg_.hidden_size, b.positions.data());
  for (int i = 0; i < cfg_.num_layers; ++i)
    layer_forward(i, b.residual[i].data(), b.residual[i + 1].data());
  return head(false, 0.0);
}

template <typename T>
void GPUGPTModel<T>::zero_grads() {
  fill_zero(grads_.data(), size_ * sizeof(float));
}

template <typename T>
std::vector<float> GPUGPTModel<T>::get_params() const {
  std::vector<float> v(size_);
  copy_to_host(v.data(), master_.data(), v.size() * sizeof(float));
  return v;
}

template <typename T>
std::vector<float> GPUGPTModel<T>::get_grads() const {
  std::vector<float> v(size_);
  copy_to_host(v.data(), grads_.data(), v.size() * sizeof(float));
  return v;
}

template <typename T>
void GPUGPTModel<T>::set_params(const std::vector<float>& values) {
  OMNI_CHECK(int64_t(values.size()) == size_, "[gpu model] ", values.size(), " values for ", size_,
             " parameters");
  copy_to_device(master_.data(), values.data(), values.size() * sizeof(float));
  refresh_model_copy();
}

template <typename T>
double GPUGPTModel<T>::grad_sum_squares() const {
  const float* arrays[] = {grads_.data()};
  const size_t sizes[] = {size_t(size_)};
  return sum_squares(arrays, sizes, 1);
}

template <typename T>
bool GPUGPTModel<T>::grads_nonfinite() const {
  return has_nonfinite(grads_.data(), size_t(size_));
}

template <typename T>
void GPUGPTModel<T>::adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                                int step, float grad_scale) {
  AdamWStep s{lr,
              beta1,
              beta2,
              eps,
              0.0f,
              float(1.0 - std::pow(double(beta1), step)),
              float(1.0 - std::pow(double(beta2), step)),
              grad_scale};
  T* model = std::is_same_v<T, float> ? nullptr : model_.data();
  // Consecutive tensors with the same decay are one range (the alignment gaps between them
  // hold zeros, which the update keeps at zero).
  size_t i = 0;
  while (i < infos_.size()) {
    size_t j = i + 1;
    while (j < infos_.size() && infos_[j].weight_decay == infos_[i].weight_decay) ++j;
    const int64_t begin = infos_[i].offset, end = infos_[j - 1].offset + infos_[j - 1].numel;
    s.weight_decay = infos_[i].weight_decay ? weight_decay : 0.0f;
    adamw_update(master_.data() + begin, model ? model + begin : nullptr, grads_.data() + begin,
                 exp_avg_.data() + begin, exp_avg_sq_.data() + begin, size_t(end - begin), s);
    i = j;
  }
}

template <typename T>
const DeviceArray<float>& GPUGPTModel<T>::state(const std::string& name) const {
  if (name == "exp_avg") return exp_avg_;
  if (name == "exp_avg_sq") return exp_avg_sq_;
  throw UsageError("the GPU model's AdamW has no state '" + name +
                   "' (expected exp_avg or exp_avg_sq)");
}

template <typename T>
std::vector<float> GPUGPTModel<T>::get_state(const std::string& name) const {
  std::vector<float> v(size_);
  copy_to_host(v.data(), state(name).data(), v.size() * sizeof(float));
  return v;
}

template <typename T>
void GPUGPTModel<T>::set_state(const std::string& name, const std::vector<float>& values) {
  OMNI_CHECK(int64_t(values.size()) == size_, "[gpu model] ", values.size(), " values of ", name,
             " for ", size_, " parameters");
  copy_to_device(state(name).data(), values.data(), values.size() * sizeof(float));
}

std::unique_ptr<GPUTrainingModel> make_gpu_model(const TransformerConfig& config, int max_batch,
                                                 uint64_t seed, DType storage) {
  switch (storage) {
    case DType::F32:
      return std::make_unique<GPUGPTModel<float>>(config, max_batch, seed);
    case DType::BF16:
      return std::make_unique<GPUGPTModel<bf16>>(config, max_batch, seed);
    case DType::F16:
      return std::make_unique<GPUGPTModel<f16>>(config, max_batch, seed);
    default:
      throw UsageError(std::string("the GPU model stores f32, bf16 or f16, not ") +
                       dtype_name(storage));
  }
}

template class GPUGPTModel<float>;
template class GPUGPTModel<bf16>;
template class GPUGPTModel<f16>;

OMNI_GPU_NAMESPACE_END
