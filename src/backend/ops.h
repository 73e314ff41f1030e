// The op seam, declared once: every op the model runs, in two forms.
//  - ops::X(args): the CPU implementation in backend/cpu/ (OpenMP + BLAS), the reference every
//    other implementation is tested against; a function template instantiated for float
//    (training) and double (the float64 finite-difference checks run the same code).
//  - ops::X(exec, args), at the end of this file: the same op where `exec` says, on the CPU or
//    on a GPU through backend/gpu_backend.h (CUDA, HIP, or the emulator in tests). The model
//    calls only this form, so one model runs on every device.
//
// One contract for both backends:
//  - Row-major; activations are [N, C] with N = batch * sequence tokens; weights are [out, in]
//    as in PyTorch and Megatron. Pointers are memory of the op's device.
//  - Gradients of parameters are accumulated (+=) so micro-batches add up; gradients of
//    activations are overwritten unless the name says `accumulate`.
//  - Gradients and per-row statistics (mean, rstd, log-sum-exp) are float32 (float64 in the
//    float64 checks), whatever the activations' storage.
//  - Attention keeps only its output and log-sum-exp for the backward, which computes the
//    probabilities again; no [seq, seq] matrix is kept between forward and backward.
//  - Deterministic: the same inputs give the same bits on every run (fixed reduction orders).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "backend/gpu_backend.h"
#include "backend/op_types.h"

namespace omni::ops {

// C[M,N] = alpha * op(A) * op(B) + beta * C, every matmul goes through BLAS gemm.
template <typename T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

// y[M,N] = x[M,K] w[N,K]^T + bias[N] (bias may be null).
template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* bias, int M, int K, int N);
// dx = dy w (overwritten, or added when accumulate_dx); dw += dy^T x; dbias += colsum(dy).
// dx, dbias may be null.
template <typename T>
void linear_backward(T* dx, T* dw, T* dbias, const T* dy, const T* x, const T* w, int M, int K,
                     int N, bool accumulate_dx = false);

// out[n] = wte[tokens[n] - vocab_start] + wpe[position(n)] (wpe may be null), where
// position(n) is positions[n], or n % seq when positions is null. wte holds the vocabulary
// rows [vocab_start, vocab_end) (a tensor-parallel rank's slice; the defaults take every
// token): a token outside them contributes zeros, and the ranks' outputs sum to the lookup.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int seq,
                       int C, const int32_t* positions = nullptr, int vocab_start = 0,
                       int vocab_end = 1 << 30);
// dwte (may be null) += the rows' gradients by token, for tokens in [vocab_start, vocab_end);
// dwpe (may be null) += by position.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const int32_t* tokens, const T* dout, int N, int seq,
                        int C, const int32_t* positions = nullptr, int vocab_start = 0,
                        int vocab_end = 1 << 30);
// out[n] += wpe[position(n)]: the position embedding added after a tensor-parallel
// reduction of the word embeddings (so it is added once).
template <typename T>
void position_embedding_add(T* out, const T* wpe, int N, int seq, int C,
                            const int32_t* positions = nullptr);

// LayerNorm over the last dimension; saves mean and rstd per row for backward. bias may be null.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int N, int C,
                       double eps);
// dx += ..., dw += ..., db += ... (db may be null).
template <typename T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                        const T* rstd, int N, int C);
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, double eps);
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int N,
                      int C);

// GELU in Megatron's two forms (GeluForm, above).
template <typename T>
void gelu_forward(T* out, const T* x, size_t n, GeluForm form);
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n, GeluForm form);
// SwiGLU on x[N, 2F] = [gate | up] (Megatron's chunk order): out[N,F] = silu(gate) * up.
template <typename T>
void swiglu_forward(T* out, const T* x, int N, int F);
template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F);

// out = a + b.
template <typename T>
void add(T* out, const T* a, const T* b, size_t n);
// y[m, :] += bias for every row of y [M, N] (a row-parallel layer's bias, added once after
// the ranks' partial outputs are summed).
template <typename T>
void add_bias(T* y, const T* bias, int M, int N);

// Megatron's fused QKV projection output is interleaved per query group:
// [q_0 .. q_{hpg-1}, k, v] for each group. Split it into contiguous q [N, heads*hd],
// k and v [N, groups*hd]; merge is the backward (and inverse).
template <typename T>
void qkv_split(T* q, T* k, T* v, const T* qkv, const AttentionDims& d);
template <typename T>
void qkv_merge(T* qkv, const T* q, const T* k, const T* v, const AttentionDims& d);

// Rotary position embedding (non-interleaved halves, as Megatron and Hugging Face Llama)
// applied in place to x [N, nheads, head_dim] at positions[n] (null: n % seq); cos/sin
// are [seq, rotary_dim/2] tables from rope_tables. backward = rotation by the negative angle.
// rotary_dim (0: head_dim) is how many leading channels of each head rotate (Megatron's
// --rotary-percent); the others pass through.
void rope_tables(double* cos, double* sin, int seq, int head_dim, double base);
// The same tables from given inverse frequencies (n of them: rotary_dim = 2n).
void rope_tables(double* cos, double* sin, int seq, const std::vector<double>& inv_freq);
template <typename T>
void rope_forward(T* x, const double* cos, const double* sin, int N, int seq, int nheads,
                  int head_dim, const int32_t* positions = nullptr, int rotary_dim = 0);
template <typename T>
void rope_backward(T* dx, const double* cos, const double* sin, int N, int seq, int nheads,
                   int head_dim, const int32_t* positions = nullptr, int rotary_dim = 0);

// Causal softmax attention. q [batch * seq, heads*hd], k/v [batch * seq, groups*hd],
// out [batch * seq, heads*hd]; lse [batch, heads, seq] receives each row's log-sum-exp of its
// scaled scores, which is all the backward keeps: it computes the probabilities again from
// q, k and lse (as FlashAttention does), so no [seq, seq] matrix outlives a call.
// A row whose key range is empty (key_start past its last key: a block of keys it cannot
// see, in ring attention) gets zero output and lse -inf.
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d);
// dq, dk, dv are overwritten. With out and lse of attention over several blocks of keys
// (merged by attention_merge), the gradients are this block's part of the whole.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const AttentionDims& d);
// Attention over the union of two blocks of keys from each block's: out and lse hold the
// first (out [batch * seq, heads*hd], lse [batch, heads, seq]; lse -inf and out 0 for none
// yet) and receive the merge: out = out e^(lse - lse') + block_out e^(block_lse - lse'), with
// lse' = log(e^lse + e^block_lse).
template <typename T>
void attention_merge(T* out, T* lse, const T* block_out, const T* block_lse,
                     const AttentionDims& d);

// The output layer fused with cross-entropy: logits = h w[:vocab]^T are computed a chunk of
// rows at a time and never stored whole. w has at least `vocab` rows (the padded rows are
// excluded from the softmax). mask (may be null = all ones) weights each row's loss.
// Returns sum_n mask[n] * loss[n]; losses (may be null) receives the per-row loss.
// With dh non-null: dh = d(grad_scale * sum mask*loss)/dh (overwritten), dw += the same for w.
//
// Vocabulary-parallel (Megatron's tensor-parallel cross-entropy): w holds the rows of
// vocabulary ids [vocab_start, vocab_start + vocab) of a larger vocabulary; `reduce` combines
// per-row values across the ranks that hold the other rows (max, then sums), so each rank's
// loss is the full softmax's and dh is this rank's part (the ranks' dh sum to the full one).
// Full logits are never gathered. Targets outside the slice are other ranks' to score.
template <typename T>
double classifier_cross_entropy(T* losses, T* dh, T* dw, const T* h, const T* w,
                                const int32_t* targets, const float* mask,
                                const ClassifierLossArgs& a);

// x *= T(s).
template <typename T>
void scale(T* x, double s, size_t n);

// Dropout's sites, each with its own masks (Megatron's: the embedding's output and, in each
// layer, the attention probabilities, the attention block's and the MLP's outputs before their
// residual adds).
enum class DropoutSite : uint32_t { Embedding = 1, Attention, AttentionOutput, MlpOutput };
// The key of one site's masks in one iteration (layer: global index; the embedding uses -1),
// with p the probability of dropping; the caller fills in where its rows are.
DropoutKey dropout_key(double p, uint64_t seed, int64_t iteration, int layer, DropoutSite site);
// Hidden dropout in place on x [rows, width], row r being token k.first_row + r of a
// micro-batch of sequences of `seq` tokens (this rank's share under context parallelism):
// each element is kept and scaled by 1/(1-p), or zeroed (backend/dropout_mask.h). The mask is
// its own transpose, so the backward is the same call on the gradient.
template <typename T>
void dropout(T* x, int rows, int width, int seq, const DropoutKey& k);

// Sum of squares of x, accumulated in double in a fixed order (independent of threads).
template <typename T>
double sum_squares(const T* x, size_t n);

// How many elements of x are exactly zero (--log-num-zeros-in-grad).
template <typename T>
double count_zeros(const T* x, size_t n);

// ---- On a device ------------------------------------------------------------------------------
// Where an op runs: the CPU, or a GPU through its backend. The GPU runs float, bf16 and f16
// storage; the CPU float and double (the float64 checks). Parameter gradients and statistics
// are accum_t<T> (base/dtype.h): float for 16-bit storage, T otherwise.
struct Exec {
  const GpuBackend* gpu = nullptr;  // null: the CPU
  bool on_gpu() const { return gpu != nullptr; }
  // Where tensors of this device are allocated (null: host memory).
  const DeviceMemory* memory() const { return gpu; }
};

namespace detail {
[[noreturn]] void gpu_has_no_double(const char* op);
[[noreturn]] void cpu_has_no_16bit(const char* op);
}  // namespace detail

// Each dispatching op: the CPU implementation (float, double), or the GPU backend's for T
// (float, bf16, f16); gpu_call is a call on the backend's GpuOps<T> (OMNI_DISPATCH) or on
// what its member template `ops_of` returns (OMNI_DISPATCH_TO).
#define OMNI_DISPATCH_TO(op, cpu_call, ops_of, gpu_call) \
  if (!e.gpu) {                                          \
    if constexpr (is_16bit<T>)                           \
      detail::cpu_has_no_16bit(#op);                     \
    else                                                 \
      return cpu_call;                                   \
  } else {                                               \
    if constexpr (std::is_same_v<T, double>)             \
      detail::gpu_has_no_double(#op);                    \
    else                                                 \
      return e.gpu->template ops_of<T>().gpu_call;       \
  }
#define OMNI_DISPATCH(op, cpu_call, gpu_call) OMNI_DISPATCH_TO(op, cpu_call, ops, gpu_call)

// Memory of the Exec's device: n elements zeroed, copied within the device, or copied from or
// to the host.
template <typename T>
void zero(const Exec& e, T* p, size_t n) {
  if (e.gpu)
    e.gpu->zero(p, n * sizeof(T));
  else
    std::memset(static_cast<void*>(p), 0, n * sizeof(T));
}
template <typename T>
void copy(const Exec& e, T* dst, const T* src, size_t n) {
  if (e.gpu)
    e.gpu->copy(dst, src, n * sizeof(T));
  else
    std::memcpy(static_cast<void*>(dst), src, n * sizeof(T));
}
// `rows` runs of `width` elements, src_stride and dst_stride elements apart (a column block).
template <typename T>
void copy_rows(const Exec& e, T* dst, size_t dst_stride, const T* src, size_t src_stride,
               size_t width, size_t rows) {
  if (e.gpu) {
    e.gpu->copy_rows(dst, dst_stride * sizeof(T), src, src_stride * sizeof(T), width * sizeof(T),
                     rows);
    return;
  }
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<void*>(dst + r * dst_stride), src + r * src_stride, width * sizeof(T));
}
template <typename T>
void upload(const Exec& e, T* dst, const T* host_src, size_t n) {
  if (e.gpu)
    e.gpu->upload(dst, host_src, n * sizeof(T));
  else
    std::memcpy(static_cast<void*>(dst), host_src, n * sizeof(T));
}
template <typename T>
void download(const Exec& e, T* host_dst, const T* src, size_t n) {
  if (e.gpu)
    e.gpu->download(host_dst, src, n * sizeof(T));
  else
    std::memcpy(static_cast<void*>(host_dst), src, n * sizeof(T));
}

template <typename T>
void linear_forward(const Exec& e, T* y, const T* x, const T* w, const T* bias, int M, int K,
                    int N) {
  OMNI_DISPATCH(linear_forward, linear_forward(y, x, w, bias, M, K, N),
                linear_forward(y, x, w, bias, M, K, N));
}
template <typename T>
void linear_backward(const Exec& e, T* dx, accum_t<T>* dw, accum_t<T>* dbias, const T* dy,
                     const T* x, const T* w, int M, int K, int N, bool accumulate_dx = false) {
  OMNI_DISPATCH(linear_backward, linear_backward(dx, dw, dbias, dy, x, w, M, K, N, accumulate_dx),
                linear_backward(dx, dw, dbias, dy, x, w, M, K, N, accumulate_dx));
}
template <typename T>
void embedding_forward(const Exec& e, T* out, const int32_t* tokens, const T* wte, const T* wpe,
                       int N, int seq, int C, const int32_t* positions, int vocab_start,
                       int vocab_end) {
  OMNI_DISPATCH(
      embedding_forward,
      embedding_forward(out, tokens, wte, wpe, N, seq, C, positions, vocab_start, vocab_end),
      embedding_forward(out, tokens, wte, wpe, N, seq, C, positions, vocab_start, vocab_end));
}
template <typename T>
void embedding_backward(const Exec& e, accum_t<T>* dwte, accum_t<T>* dwpe, const int32_t* tokens,
                        const T* dout, int N, int seq, int C, const int32_t* positions,
                        int vocab_start, int vocab_end) {
  OMNI_DISPATCH(
      embedding_backward,
      embedding_backward(dwte, dwpe, tokens, dout, N, seq, C, positions, vocab_start, vocab_end),
      embedding_backward(dwte, dwpe, tokens, dout, N, seq, C, positions, vocab_start, vocab_end));
}
template <typename T>
void position_embedding_add(const Exec& e, T* out, const T* wpe, int N, int seq, int C,
                            const int32_t* positions) {
  OMNI_DISPATCH(position_embedding_add, position_embedding_add(out, wpe, N, seq, C, positions),
                position_embedding_add(out, wpe, N, seq, C, positions));
}
template <typename T>
void layernorm_forward(const Exec& e, T* out, accum_t<T>* mean, accum_t<T>* rstd, const T* x,
                       const T* w, const T* b, int N, int C, double eps) {
  OMNI_DISPATCH(layernorm_forward, layernorm_forward(out, mean, rstd, x, w, b, N, C, eps),
                layernorm_forward(out, mean, rstd, x, w, b, N, C, eps));
}
template <typename T>
void layernorm_backward(const Exec& e, T* dx, accum_t<T>* dw, accum_t<T>* db, const T* dout,
                        const T* x, const T* w, const accum_t<T>* mean, const accum_t<T>* rstd,
                        int N, int C) {
  OMNI_DISPATCH(layernorm_backward, layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C),
                layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C));
}
template <typename T>
void rmsnorm_forward(const Exec& e, T* out, accum_t<T>* rstd, const T* x, const T* w, int N, int C,
                     double eps) {
  OMNI_DISPATCH(rmsnorm_forward, rmsnorm_forward(out, rstd, x, w, N, C, eps),
                rmsnorm_forward(out, rstd, x, w, N, C, eps));
}
template <typename T>
void rmsnorm_backward(const Exec& e, T* dx, accum_t<T>* dw, const T* dout, const T* x, const T* w,
                      const accum_t<T>* rstd, int N, int C) {
  OMNI_DISPATCH(rmsnorm_backward, rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C),
                rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C));
}
template <typename T>
void gelu_forward(const Exec& e, T* out, const T* x, size_t n, GeluForm form) {
  OMNI_DISPATCH(gelu_forward, gelu_forward(out, x, n, form), gelu_forward(out, x, n, form));
}
template <typename T>
void gelu_backward(const Exec& e, T* dx, const T* dout, const T* x, size_t n, GeluForm form) {
  OMNI_DISPATCH(gelu_backward, gelu_backward(dx, dout, x, n, form),
                gelu_backward(dx, dout, x, n, form));
}
template <typename T>
void swiglu_forward(const Exec& e, T* out, const T* x, int N, int F) {
  OMNI_DISPATCH(swiglu_forward, swiglu_forward(out, x, N, F), swiglu_forward(out, x, N, F));
}
template <typename T>
void swiglu_backward(const Exec& e, T* dx, const T* dout, const T* x, int N, int F) {
  OMNI_DISPATCH(swiglu_backward, swiglu_backward(dx, dout, x, N, F),
                swiglu_backward(dx, dout, x, N, F));
}
template <typename T>
void add(const Exec& e, T* out, const T* a, const T* b, size_t n) {
  OMNI_DISPATCH(add, add(out, a, b, n), add(out, a, b, n));
}
template <typename T>
void add_bias(const Exec& e, T* y, const T* bias, int M, int N) {
  OMNI_DISPATCH(add_bias, add_bias(y, bias, M, N), add_bias(y, bias, M, N));
}
template <typename T>
void qkv_split(const Exec& e, T* q, T* k, T* v, const T* qkv, const AttentionDims& d) {
  OMNI_DISPATCH(qkv_split, qkv_split(q, k, v, qkv, d), qkv_split(q, k, v, qkv, d));
}
template <typename T>
void qkv_merge(const Exec& e, T* qkv, const T* q, const T* k, const T* v, const AttentionDims& d) {
  OMNI_DISPATCH(qkv_merge, qkv_merge(qkv, q, k, v, d), qkv_merge(qkv, q, k, v, d));
}

// Rotary tables where each device reads them: double on the host for the CPU, float in
// device memory for a GPU ([seq, rotary_dim/2] each).
struct RopeTables {
  const double *cos = nullptr, *sin = nullptr;
  const float *device_cos = nullptr, *device_sin = nullptr;
};
template <typename T>
void rope_forward(const Exec& e, T* x, const RopeTables& t, int N, int seq, int nheads,
                  int head_dim, const int32_t* positions, int rotary_dim) {
  OMNI_DISPATCH(
      rope_forward, rope_forward(x, t.cos, t.sin, N, seq, nheads, head_dim, positions, rotary_dim),
      rope_forward(x, t.device_cos, t.device_sin, N, seq, nheads, head_dim, positions, rotary_dim));
}
template <typename T>
void rope_backward(const Exec& e, T* dx, const RopeTables& t, int N, int seq, int nheads,
                   int head_dim, const int32_t* positions, int rotary_dim) {
  OMNI_DISPATCH(rope_backward,
                rope_backward(dx, t.cos, t.sin, N, seq, nheads, head_dim, positions, rotary_dim),
                rope_backward(dx, t.device_cos, t.device_sin, N, seq, nheads, head_dim, positions,
                              rotary_dim));
}
template <typename T>
void attention_forward(const Exec& e, T* out, accum_t<T>* lse, const T* q, const T* k, const T* v,
                       const AttentionDims& d) {
  OMNI_DISPATCH(attention_forward, attention_forward(out, lse, q, k, v, d),
                attention_forward(out, lse, q, k, v, d));
}
template <typename T>
void attention_backward(const Exec& e, T* dq, T* dk, T* dv, const T* dout, const T* out,
                        const accum_t<T>* lse, const T* q, const T* k, const T* v,
                        const AttentionDims& d) {
  OMNI_DISPATCH(attention_backward, attention_backward(dq, dk, dv, dout, out, lse, q, k, v, d),
                attention_backward(dq, dk, dv, dout, out, lse, q, k, v, d));
}
template <typename T>
void attention_merge(const Exec& e, T* out, accum_t<T>* lse, const T* block_out,
                     const accum_t<T>* block_lse, const AttentionDims& d) {
  OMNI_DISPATCH(attention_merge, attention_merge(out, lse, block_out, block_lse, d),
                attention_merge(out, lse, block_out, block_lse, d));
}
template <typename T>
double classifier_cross_entropy(const Exec& e, accum_t<T>* losses, T* dh, accum_t<T>* dw,
                                const T* h, const T* w, const int32_t* targets, const float* mask,
                                const ClassifierLossArgs& a) {
  OMNI_DISPATCH(classifier_cross_entropy,
                classifier_cross_entropy(losses, dh, dw, h, w, targets, mask, a),
                classifier_cross_entropy(losses, dh, dw, h, w, targets, mask, a));
}
template <typename T>
void scale(const Exec& e, T* x, double s, size_t n) {
  OMNI_DISPATCH(scale, scale(x, s, n), scale(x, s, n));
}
template <typename T>
void dropout(const Exec& e, T* x, int rows, int width, int seq, const DropoutKey& k) {
  OMNI_DISPATCH(dropout, dropout(x, rows, width, seq, k), dropout(x, rows, width, seq, k));
}
// Sum of squares of a gradient-like buffer (float on a GPU).
template <typename T>
double sum_squares(const Exec& e, const T* x, size_t n) {
  if (!e.gpu) return sum_squares(x, n);
  if constexpr (std::is_same_v<T, float>) return e.gpu->sum_squares(x, n);
  detail::gpu_has_no_double("sum_squares");
}
template <typename T>
double count_zeros(const Exec& e, const T* x, size_t n) {
  if (!e.gpu) return count_zeros(x, n);
  if constexpr (std::is_same_v<T, float>) return e.gpu->count_zeros(x, n);
  detail::gpu_has_no_double("count_zeros");
}
// dst = src rounded to T (a 16-bit model's weights from the fp32 master), or back to float.
template <typename T>
void from_float(const Exec& e, T* dst, const float* src, size_t n) {
  OMNI_DISPATCH(
      from_float, [&] { std::copy(src, src + n, dst); }(), from_float(dst, src, n));
}
template <typename T>
void to_float(const Exec& e, float* dst, const T* src, size_t n) {
  OMNI_DISPATCH(
      to_float, [&] { std::copy(src, src + n, dst); }(), to_float(dst, src, n));
}

#undef OMNI_DISPATCH

}  // namespace omni::ops
