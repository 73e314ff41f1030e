#include "parallel/ulysses.h"

#include <algorithm>

#include "base/error.h"
#include "parallel/context_parallel.h"

namespace omni {

namespace {

// Rows of `width` elements between chunk order (block r of batch * local_seq rows: context-
// parallel rank r's rows, in its order) and sequence order ([batch, local_seq * cp]). Each rank
// holds two runs of local_seq/2 consecutive positions per sample, so these are whole-run copies.
template <typename E>
void reorder_rows(const ops::Exec& x, E* dst, const E* src, int batch, int local_seq, int cp,
                  int width, bool to_sequence_order) {
  const int half = local_seq / 2, seq = local_seq * cp;
  const size_t run = size_t(half) * width;
  for (int r = 0; r < cp; ++r)
    for (int b = 0; b < batch; ++b)
      for (int part = 0; part < 2; ++part) {
        const int l = part * half;
        const size_t chunk = ((size_t(r) * batch + b) * local_seq + l) * width;
        const size_t seq_row =
            (size_t(b) * seq + context_parallel_index(l, local_seq, cp, r)) * width;
        if (to_sequence_order)
          ops::copy(x, dst + seq_row, src + chunk, run);
        else
          ops::copy(x, dst + chunk, src + seq_row, run);
      }
}

}  // namespace

template <typename T>
UlyssesAttention<T>::UlyssesAttention(Communicator* group, const ops::Exec& exec, Device device,
                                      int max_batch, int local_seq, int heads, int groups,
                                      int head_dim, int v_head_dim)
    : group_(group),
      x_(exec),
      device_(device),
      local_seq_(local_seq),
      heads_(heads),
      groups_(groups),
      head_dim_(head_dim),
      v_dim_(v_head_dim ? v_head_dim : head_dim) {
  const int cp = group_->size();
  OMNI_CHECK(heads % cp == 0 && groups % cp == 0, "[ulysses] ", heads, " heads and ", groups,
             " key/value groups do not split over ", cp, " ranks");
  const int64_t rows = int64_t(max_batch) * local_seq, hd = head_dim, vd = v_dim_;
  const int64_t width = int64_t(heads) * std::max(hd, vd);
  auto zeros = [&](int64_t w) {
    return Tensor::zeros({rows, w}, dtype_of<T>(), device_, x_.memory());
  };
  send_ = zeros(width), recv_ = zeros(width);
  // d(out), d(q), d(k), d(v)
  d_whole_[0] = zeros(heads * vd), d_whole_[1] = zeros(heads * hd);
  d_whole_[2] = zeros(groups * hd), d_whole_[3] = zeros(groups * vd);
  for (auto& s : key_starts_)
    s = std::make_unique<Storage>(size_t(rows) * cp * sizeof(int32_t), device_, x_.memory());
}

template <typename T>
void UlyssesAttention<T>::to_heads(T* whole, const T* local, int batch, int width) {
  const int cp = group_->size();
  const size_t rows = size_t(batch) * local_seq_, w = size_t(width);
  T *send = send_.template data<T>(), *recv = recv_.template data<T>();
  for (int j = 0; j < cp; ++j)  // block j: rank j's columns of every row
    ops::copy_rows(x_, send + j * rows * w, w, local + j * w, cp * w, w, rows);
  group_->all_to_all(recv, send, rows * w, dtype_of<T>());
  reorder_rows(x_, whole, recv, batch, local_seq_, cp, width, true);
}

template <typename T>
void UlyssesAttention<T>::to_sequence(T* local, const T* whole, int batch, int width) {
  const int cp = group_->size();
  const size_t rows = size_t(batch) * local_seq_, w = size_t(width);
  T *send = send_.template data<T>(), *recv = recv_.template data<T>();
  reorder_rows(x_, send, whole, batch, local_seq_, cp, width, false);
  group_->all_to_all(recv, send, rows * w, dtype_of<T>());
  for (int j = 0; j < cp; ++j)  // block j: rank j's heads of this rank's rows
    ops::copy_rows(x_, local + j * w, cp * w, recv + j * rows * w, w, w, rows);
}

template <typename T>
ops::AttentionDims UlyssesAttention<T>::whole_dims(const ops::AttentionDims& local) {
  const int cp = group_->size();
  ops::AttentionDims d{local.batch, local.seq * cp, heads_ / cp, groups_ / cp, head_dim_};
  d.v_head_dim = local.v_head_dim, d.softmax_scale = local.softmax_scale;
  if (local.key_start) {
    // Every rank's first keys (positions in the full sequence already), in sequence order.
    // int32 travels as 32-bit words: the collectives only move them.
    int32_t* chunks = static_cast<int32_t*>(key_starts_[0]->data());
    int32_t* ordered = static_cast<int32_t*>(key_starts_[1]->data());
    group_->all_gather(chunks, local.key_start, size_t(local.batch) * local.seq, DType::F32);
    reorder_rows(x_, ordered, chunks, local.batch, local.seq, cp, 1, true);
    d.key_start = ordered;
  }
  d.dropout = local.dropout;
  // This rank's heads over the sequence as one rank holds it.
  d.dropout.cp = 1, d.dropout.cp_rank = d.dropout.key_rank = 0;
  d.dropout.head_offset += group_->rank() * (heads_ / cp);
  return d;
}

template <typename T>
void UlyssesAttention<T>::forward(T* out, Grad* lse, const T* q, const T* k, const T* v,
                                  const Whole& whole, const ops::AttentionDims& local) {
  OMNI_CHECK(local.seq == local_seq_, "[ulysses] micro-batch of ", local.seq,
             " rows per sequence; built for ", local_seq_);
  const int cp = group_->size(), qw = heads_ / cp * head_dim_, kw = groups_ / cp * head_dim_;
  const int vw = groups_ / cp * v_dim_, ow = heads_ / cp * v_dim_;
  to_heads(whole.q, q, local.batch, qw);
  to_heads(whole.k, k, local.batch, kw);
  to_heads(whole.v, v, local.batch, vw);
  ops::attention_forward(x_, whole.out, lse, whole.q, whole.k, whole.v, whole_dims(local));
  to_sequence(out, whole.out, local.batch, ow);
}

template <typename T>
void UlyssesAttention<T>::backward(T* dq, T* dk, T* dv, const T* dout, const Whole& whole,
                                   const Grad* lse, const ops::AttentionDims& local) {
  const int cp = group_->size(), qw = heads_ / cp * head_dim_, kw = groups_ / cp * head_dim_;
  const int vw = groups_ / cp * v_dim_, ow = heads_ / cp * v_dim_;
  T *dout_w = d_whole_[0].template data<T>(), *dq_w = d_whole_[1].template data<T>();
  T *dk_w = d_whole_[2].template data<T>(), *dv_w = d_whole_[3].template data<T>();
  to_heads(dout_w, dout, local.batch, ow);
  ops::attention_backward(x_, dq_w, dk_w, dv_w, dout_w, whole.out, lse, whole.q, whole.k, whole.v,
                          whole_dims(local));
  to_sequence(dq, dq_w, local.batch, qw);
  to_sequence(dk, dk_w, local.batch, kw);
  to_sequence(dv, dv_w, local.batch, vw);
}

template class UlyssesAttention<float>;
template class UlyssesAttention<double>;
template class UlyssesAttention<bf16>;
template class UlyssesAttention<f16>;

}  // namespace omni
