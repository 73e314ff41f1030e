#include "parallel/tensor_parallel.h"

#include <algorithm>

namespace omni {

VocabShard vocab_shard(int vocab_size, int divisible_by, int tp, int rank) {
  const int multiple = divisible_by * tp;
  VocabShard s;
  s.rows = (vocab_size + multiple - 1) / multiple * multiple / tp;
  s.start = rank * s.rows;
  s.real = std::clamp(vocab_size - s.start, 0, s.rows);
  return s;
}

template <typename T>
TensorParallel<T>::TensorParallel(Communicator* group, bool sequence_parallel, int hidden,
                                  const ops::Exec& exec)
    : group_(group), sp_(sequence_parallel && group->size() > 1), hidden_(hidden), x_(exec) {}

template <typename T>
const T* TensorParallel<T>::gather_rows(T* full, const T* part, int tokens) const {
  if (!sp_) return part;
  group_->all_gather(full, part, size_t(rows(tokens)) * hidden_);
  return full;
}

template <typename T>
const T* TensorParallel<T>::reduce_rows(T* out, T* partial, int tokens) const {
  if (!sp_) {
    group_->all_reduce(partial, size_t(tokens) * hidden_);
    return partial;
  }
  group_->reduce_scatter(out, partial, size_t(rows(tokens)) * hidden_);
  return out;
}

template <typename T>
void TensorParallel<T>::column_forward(T* y, T* x_full, const T* x, const T* w, const T* b, int out,
                                       int tokens) const {
  const T* input = gather_rows(x_full, x, tokens);
  ops::linear_forward(x_, y, input, w, b, tokens, hidden_, out);
}

template <typename T>
const T* TensorParallel<T>::column_backward(T* dx, T* partial, Grad* dw, Grad* db, const T* dy,
                                            const T* x_full, const T* w, int out,
                                            int tokens) const {
  ops::linear_backward(x_, partial, dw, db, dy, x_full, w, tokens, hidden_, out);
  return reduce_rows(dx, partial, tokens);
}

template <typename T>
void TensorParallel<T>::row_forward(T* y, T* scratch, const T* x, const T* w, const T* b, int in,
                                    int tokens) const {
  T* partial = partial_rows(y, scratch);
  ops::linear_forward(x_, partial, x, w, static_cast<const T*>(nullptr), tokens, in, hidden_);
  reduce_rows(y, partial, tokens);
  if (b) ops::add_bias(x_, y, b, rows(tokens), hidden_);
}

template <typename T>
void TensorParallel<T>::row_backward(T* dx, Grad* dw, Grad* db, T* dy_full, const T* dy, const T* x,
                                     const T* w, int in, int tokens) const {
  const T* d_out = gather_rows(dy_full, dy, tokens);
  ops::linear_backward(x_, dx, dw, db, d_out, x, w, tokens, in, hidden_);
}

template <typename T>
void TensorParallel<T>::embedding_forward(T* out, T* scratch, const int32_t* ids, const T* w,
                                          const VocabShard& s, int tokens, int seq) const {
  T* partial = partial_rows(out, scratch);
  ops::embedding_forward(x_, partial, ids, w, static_cast<const T*>(nullptr), tokens, seq, hidden_,
                         nullptr, s.start, s.start + s.rows);
  reduce_rows(out, partial, tokens);
}

template <typename T>
void TensorParallel<T>::embedding_backward(Grad* dw, T* d_full, const T* d_rows, const int32_t* ids,
                                           const VocabShard& s, int tokens, int seq) const {
  const T* d_out = gather_rows(d_full, d_rows, tokens);
  ops::embedding_backward(x_, dw, static_cast<Grad*>(nullptr), ids, d_out, tokens, seq, hidden_,
                          nullptr, s.start, s.start + s.rows);
}

template <typename T>
double TensorParallel<T>::vocab_cross_entropy(Grad* losses, T* dh, Grad* dw, const T* h, const T* w,
                                              const int32_t* targets, const float* mask,
                                              const VocabShard& s, int tokens,
                                              double grad_scale) const {
  ops::ClassifierLossArgs a;
  a.rows = tokens, a.hidden = hidden_, a.vocab = s.real;
  a.grad_scale = grad_scale, a.vocab_start = s.start;
  if (size() > 1)
    a.reduce = [group = group_](double* values, int n, bool max) {
      group->all_reduce(values, size_t(n), max ? ReduceOp::Max : ReduceOp::Sum);
    };
  return ops::classifier_cross_entropy<T>(x_, losses, dh, dw, h, w, targets, mask, a);
}

template class TensorParallel<float>;
template class TensorParallel<double>;
template class TensorParallel<bf16>;
template class TensorParallel<f16>;

}  // namespace omni
