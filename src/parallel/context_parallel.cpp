#include "parallel/context_parallel.h"

#include <algorithm>

#include "base/error.h"

namespace omni {

void ContextParallelBatch::slice(const MicroBatch& full, int cp, int rank) {
  OMNI_REQUIRE(full.seq % (2 * cp) == 0, "--seq-length (", full.seq,
               ") must be divisible by twice --context-parallel-size (", cp, ")");
  const int B = full.batch, S = full.seq, Sl = S / cp;
  const size_t n = size_t(B) * Sl;
  tokens_.resize(n);
  labels_.resize(full.labels ? n : 0);
  loss_mask_.resize(full.loss_mask ? n : 0);
  positions_.resize(n);
  key_start_.resize(full.key_start ? n : 0);
  seq_index_.resize(n);
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < Sl; ++l) {
      const int s = context_parallel_index(l, Sl, cp, rank);
      const size_t i = size_t(b) * Sl + l, f = size_t(b) * S + s;
      tokens_[i] = full.tokens[f];
      if (full.labels) labels_[i] = full.labels[f];
      if (full.loss_mask) loss_mask_[i] = full.loss_mask[f];
      positions_[i] = full.position_ids ? full.position_ids[f] : s;
      if (full.key_start) key_start_[i] = full.key_start[f];
      seq_index_[i] = s;
    }
  mb_ = MicroBatch{tokens_.data(),
                   full.labels ? labels_.data() : nullptr,
                   full.loss_mask ? loss_mask_.data() : nullptr,
                   B,
                   Sl,
                   positions_.data(),
                   full.key_start ? key_start_.data() : nullptr,
                   seq_index_.data()};
  mb_.loss_divisor = full.loss_divisor;
  mb_.first_sample = full.first_sample, mb_.iteration = full.iteration;
}

template <typename T>
RingAttention<T>::RingAttention(Communicator* group, const ops::Exec& exec, Device device,
                                int max_batch, int local_seq, int heads, int groups, int head_dim,
                                int v_head_dim, double softmax_scale)
    : group_(group),
      x_(exec),
      device_(device),
      heads_(heads),
      groups_(groups),
      head_dim_(head_dim),
      v_dim_(v_head_dim ? v_head_dim : head_dim),
      softmax_scale_(softmax_scale) {
  const int64_t N = int64_t(max_batch) * local_seq, H = heads, G = groups, hd = head_dim;
  const int64_t vd = v_dim_;
  const DType t = dtype_of<T>();
  out_ = buffer({N, H * vd}, t), dq_ = buffer({N, H * hd}, t);
  lse_ = buffer({int64_t(max_batch) * H * local_seq}, dtype_of<Grad>());
  dk_ = buffer({N, G * hd}, t), dv_ = buffer({N, G * vd}, t);
  for (auto& pair : acc_) pair[0] = buffer({N, G * hd}, t), pair[1] = buffer({N, G * vd}, t);
  first_.resize(N), last_.resize(N);
  bounds_ = std::make_unique<Storage>(2 * N * sizeof(int32_t), device_, x_.memory());
}

template <typename T>
Tensor RingAttention<T>::buffer(Shape shape, DType t) const {
  return Tensor::zeros(std::move(shape), t, device_, x_.memory());
}

template <typename T>
ops::AttentionDims RingAttention<T>::block_dims(const MicroBatch& mb, int src) {
  const int cp = group_->size(), h = mb.seq / 2, tokens = mb.batch * mb.seq;
  // Rank src's keys are two chunks of h positions, in ascending order: [a, a+h), [b, b+h).
  const int a = src * h, b = (2 * cp - 1 - src) * h;
  auto keys_before = [&](int pos) {  // keys of the block at positions < pos
    return std::clamp(pos - a, 0, h) + std::clamp(pos - b, 0, h);
  };
  for (int n = 0; n < tokens; ++n) {
    last_[n] = keys_before(mb.seq_index[n] + 1) - 1;
    first_[n] = mb.key_start ? keys_before(mb.key_start[n]) : 0;
  }
  int32_t* bounds = static_cast<int32_t*>(bounds_->data());
  ops::upload(x_, bounds, first_.data(), size_t(tokens));
  ops::upload(x_, bounds + tokens, last_.data(), size_t(tokens));
  ops::AttentionDims d{mb.batch, mb.seq, heads_, groups_, head_dim_, bounds, bounds + tokens};
  if (v_dim_ != head_dim_) d.v_head_dim = v_dim_;
  d.softmax_scale = softmax_scale_;
  return d;
}

template <typename T>
void RingAttention<T>::forward(T* out, Grad* lse, const T* q, const T* k, const T* v, T* k_all,
                               T* v_all, const MicroBatch& mb, const ops::DropoutKey& drop) {
  const int cp = group_->size(), r = group_->rank();
  const size_t rows = size_t(mb.batch) * mb.seq * groups_;
  const size_t kn = rows * head_dim_, vn = rows * v_dim_;  // one block's keys, values
  ops::copy(x_, k_all + r * kn, k, kn);
  ops::copy(x_, v_all + r * vn, v, vn);
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  for (int t = 0; t < cp; ++t) {
    const int src = (r - t + cp) % cp;
    // Pass the block on while this rank works on it.
    std::unique_ptr<CommRequest> sends[2], recvs[2];
    if (t + 1 < cp) {
      const int incoming = (src - 1 + cp) % cp;
      sends[0] = group_->isend(k_all + src * kn, kn * sizeof(T), next, 10);
      sends[1] = group_->isend(v_all + src * vn, vn * sizeof(T), next, 11);
      recvs[0] = group_->irecv(k_all + incoming * kn, kn * sizeof(T), prev, 10);
      recvs[1] = group_->irecv(v_all + incoming * vn, vn * sizeof(T), prev, 11);
    }
    ops::AttentionDims ad = block_dims(mb, src);
    ad.dropout = drop, ad.dropout.key_rank = src;
    // The first block (this rank's own keys) starts the output; each later one is merged in
    // by its log-sum-exp.
    const bool first = t == 0;
    T* block_out = first ? out : out_.template data<T>();
    Grad* block_lse = first ? lse : lse_.template data<Grad>();
    ops::attention_forward(x_, block_out, block_lse, q, k_all + src * kn, v_all + src * vn, ad);
    if (!first) ops::attention_merge(x_, out, lse, block_out, block_lse, ad);
    for (auto& req : recvs)
      if (req) req->wait();
    for (auto& req : sends)
      if (req) req->wait();
  }
}

template <typename T>
void RingAttention<T>::backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const Grad* lse,
                                const T* q, const T* k_all, const T* v_all, const MicroBatch& mb,
                                const ops::DropoutKey& drop) {
  const int cp = group_->size(), r = group_->rank();
  const size_t tokens = size_t(mb.batch) * mb.seq, qs = tokens * heads_ * head_dim_;
  const size_t kn = tokens * groups_ * head_dim_, vn = tokens * groups_ * v_dim_;
  ops::zero(x_, dq, qs);
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  std::unique_ptr<CommRequest> in_flight[2][2];  // per accumulator: its k and v sends
  for (int t = 0; t < cp; ++t) {
    const int src = (r - t + cp) % cp;
    // The accumulated key/value gradient of block src comes from the rank that worked on
    // it last step (none yet at step 0).
    T *acc_k = acc_[t % 2][0].template data<T>(), *acc_v = acc_[t % 2][1].template data<T>();
    for (auto& req : in_flight[t % 2])
      if (req) req->wait();
    if (t == 0) {
      ops::zero(x_, acc_k, kn);
      ops::zero(x_, acc_v, vn);
    } else {
      group_->recv(acc_k, kn * sizeof(T), prev, 12);
      group_->recv(acc_v, vn * sizeof(T), prev, 13);
    }
    // With the merged output and log-sum-exp, the backward gives this block's part.
    ops::AttentionDims ad = block_dims(mb, src);
    ad.dropout = drop, ad.dropout.key_rank = src;
    T *dq_b = dq_.template data<T>(), *dk_b = dk_.template data<T>(),
      *dv_b = dv_.template data<T>();
    ops::attention_backward(x_, dq_b, dk_b, dv_b, dout, out, lse, q, k_all + src * kn,
                            v_all + src * vn, ad);
    ops::add(x_, dq, dq, dq_b, qs);
    ops::add(x_, acc_k, acc_k, dk_b, kn);
    ops::add(x_, acc_v, acc_v, dv_b, vn);
    // On to the next rank; after the last step the accumulator reaches its owner.
    in_flight[t % 2][0] = group_->isend(acc_k, kn * sizeof(T), next, 12);
    in_flight[t % 2][1] = group_->isend(acc_v, vn * sizeof(T), next, 13);
  }
  group_->recv(dk, kn * sizeof(T), prev, 12);
  group_->recv(dv, vn * sizeof(T), prev, 13);
  for (auto& pair : in_flight)
    for (auto& req : pair)
      if (req) req->wait();
}

template class RingAttention<float>;
template class RingAttention<double>;
template class RingAttention<bf16>;
template class RingAttention<f16>;

}  // namespace omni
