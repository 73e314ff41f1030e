// GPTModel's sparse tied-embedding gradient under --overlap-grad-reduce (gpt_model.h,
// set_deferred_embedding_grads). A tied embedding's gradient is vocabulary x hidden, dense
// from the output layer, but the input embedding adds only the rows of the tokens seen. The
// last micro-batch's input rows are held back, so the embedding's bucket (the largest of a
// small model) can start its all-reduce as the backward begins rather than after it; the held
// rows (tokens x hidden per rank, far fewer than the vocabulary's rows when tokens x ranks <
// vocabulary) are all-gathered once the buckets are done and added by every rank alike.
#include <vector>

#include "base/error.h"
#include "model/gpt_model.h"

namespace omni {

template <typename T>
void GPTModel<T>::defer_embedding_grads(const T* d_rows, const Activations& a, const Geometry& g) {
  OMNI_CHECK(!x_.gpu && tp_.size() == 1 && g.rows == g.tokens,
             "[gpt] deferred embedding gradients need one CPU rank per model replica");
  OMNI_CHECK(!deferred_.pending, "[gpt] embedding gradients deferred twice in one step");
  const size_t rows = size_t(g.rows);
  deferred_.rows.assign(d_rows, d_rows + rows * cfg_.hidden_size);
  deferred_.ids.assign(a.in.tokens, a.in.tokens + rows);
  deferred_.ids.insert(deferred_.ids.end(), a.in.positions, a.in.positions + rows);
  deferred_.g = g;
  deferred_.pending = true;
}

template <typename T>
void GPTModel<T>::add_deferred_embedding_grads(Communicator& group) {
  if (!deferred_.pending) return;
  deferred_.pending = false;
  if constexpr (is_16bit<T>) {
    OMNI_CHECK(false, "[gpt] deferred embedding gradients of a 16-bit model");
  } else {
    const size_t p = size_t(group.size()), n = deferred_.rows.size(), m = deferred_.ids.size();
    std::vector<int32_t> ids(m * p);
    std::vector<T> rows(n * p);
    // 32-bit ids travel as float bits (a gather moves them unchanged).
    group.all_gather(static_cast<void*>(ids.data()), deferred_.ids.data(), m, DType::F32);
    group.all_gather(rows.data(), deferred_.rows.data(), n);
    const Geometry& g = deferred_.g;
    // In rank order on every rank, each scaled as the buckets scale theirs (1/size, then sum).
    for (size_t r = 0; r < p; ++r) {
      T* d = rows.data() + r * n;
      ops::scale(x_, d, 1.0 / double(p), n);
      embed_backward(d, ids.data() + r * m, ids.data() + r * m + g.rows, g);
    }
  }
}

#define OMNI_INSTANTIATE(T)                                                                        \
  template void GPTModel<T>::defer_embedding_grads(const T*, const Activations&, const Geometry&); \
  template void GPTModel<T>::add_deferred_embedding_grads(Communicator&);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(double)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

}  // namespace omni
