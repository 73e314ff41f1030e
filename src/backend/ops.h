// The op surface, declared once. Every op has a CPU implementation in backend/cpu/
// (the reference, OpenMP + BLAS); each is a function template instantiated for float
// (training) and double (the float64 finite-difference checks run the same code).
//
// Conventions: row-major; activations are [N, C] with N = batch * sequence tokens;
// weights are [out, in] as in PyTorch and Megatron; gradients of parameters are
// accumulated (+=) so micro-batches add up; gradients of activations are overwritten
// unless the name says `accumulate`.
#pragma once

#include <cstddef>
#include <cstdint>

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

// out[n] = wte[tokens[n]] + wpe[position(n)] (wpe may be null), where position(n) is
// positions[n], or n % seq when positions is null.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int seq,
                       int C, const int32_t* positions = nullptr);
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const int32_t* tokens, const T* dout, int N, int seq,
                        int C, const int32_t* positions = nullptr);

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

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void gelu_forward(T* out, const T* x, size_t n);
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n);
// SwiGLU on x[N, 2F] = [gate | up] (Megatron's chunk order): out[N,F] = silu(gate) * up.
template <typename T>
void swiglu_forward(T* out, const T* x, int N, int F);
template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F);

// out = a + b.
template <typename T>
void add(T* out, const T* a, const T* b, size_t n);

// Shapes of one attention call. Grouped-query attention: `heads` query heads share
// `groups` key/value heads, heads / groups query heads per group.
struct AttentionDims {
  int batch, seq, heads, groups, head_dim;
  // Optional [batch * seq]: row n attends keys key_start[n] .. n of its sequence (documents
  // packed in one sample, Megatron's --reset-attention-mask); null: keys 0 .. n.
  const int32_t* key_start = nullptr;
  int heads_per_group() const { return heads / groups; }
  int qkv_width() const { return (heads + 2 * groups) * head_dim; }
};

// Megatron's fused QKV projection output is interleaved per query group:
// [q_0 .. q_{hpg-1}, k, v] for each group. Split it into contiguous q [N, heads*hd],
// k and v [N, groups*hd]; merge is the backward (and inverse).
template <typename T>
void qkv_split(T* q, T* k, T* v, const T* qkv, const AttentionDims& d);
template <typename T>
void qkv_merge(T* qkv, const T* q, const T* k, const T* v, const AttentionDims& d);

// Rotary position embedding (non-interleaved halves, as Megatron and Hugging Face Llama)
// applied in place to x [N, nheads, head_dim] at positions[n] (null: n % seq); cos/sin
// are [seq, head_dim/2] tables from rope_tables. backward = rotation by the negative angle.
void rope_tables(double* cos, double* sin, int seq, int head_dim, double base);
template <typename T>
void rope_forward(T* x, const double* cos, const double* sin, int N, int seq, int nheads,
                  int head_dim, const int32_t* positions = nullptr);
template <typename T>
void rope_backward(T* dx, const double* cos, const double* sin, int N, int seq, int nheads,
                   int head_dim, const int32_t* positions = nullptr);

// Causal softmax attention. q [N, heads*hd], k/v [N, groups*hd], out [N, heads*hd];
// probs [batch, heads, seq, seq] is saved for backward (entries outside each row's keys are
// 0, which is also all the backward needs to know about the mask).
template <typename T>
void attention_forward(T* out, T* probs, const T* q, const T* k, const T* v,
                       const AttentionDims& d);
// dq, dk, dv are overwritten.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* probs,
                        const T* q, const T* k, const T* v, const AttentionDims& d);

// The output layer fused with cross-entropy: logits = h w[:vocab]^T are computed a chunk of
// rows at a time and never stored whole. w has at least `vocab` rows (the padded rows are
// excluded from the softmax). mask (may be null = all ones) weights each row's loss.
// Returns sum_n mask[n] * loss[n]; losses (may be null) receives the per-row loss.
// With dh non-null: dh = d(grad_scale * sum mask*loss)/dh (overwritten), dw += the same for w.
struct ClassifierLossArgs {
  int rows, hidden, vocab;
  double grad_scale = 1.0;
};
template <typename T>
double classifier_cross_entropy(T* losses, T* dh, T* dw, const T* h, const T* w,
                                const int32_t* targets, const float* mask,
                                const ClassifierLossArgs& a);

// Sum of squares of x, accumulated in double in a fixed order (independent of threads).
template <typename T>
double sum_squares(const T* x, size_t n);

}  // namespace omni::ops
