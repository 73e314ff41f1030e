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
#include <functional>
#include <vector>

namespace omni {

// GELU in Megatron's two forms. Erf, its default (torch.nn.functional.gelu, Hugging Face's
// "gelu"): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). Tanh, its --openai-gelu (GPT-2's
// "gelu_new", cuBLASLt's GELU epilogue): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Outside ops, so that a call with a GeluForm argument does not also find ops' functions.
enum class GeluForm { Erf, Tanh };
const char* to_string(GeluForm form);

}  // namespace omni

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

// Shapes of one attention call. Grouped-query attention: `heads` query heads share
// `groups` key/value heads, heads / groups query heads per group.
struct AttentionDims {
  int batch, seq, heads, groups, head_dim;
  // Optional [batch * seq]: row n attends keys key_start[n] .. its own position (documents
  // packed in one sample, Megatron's --reset-attention-mask); null: from key 0.
  const int32_t* key_start = nullptr;
  // Optional [batch * seq]: each query row's last key (causal: its own position; in ring
  // attention, where the keys are another rank's block, the last one it may see, or -1 for
  // none); null: row i of a sequence is key i.
  const int32_t* q_index = nullptr;
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
// out [batch * seq, heads*hd]; probs [batch, heads, seq, seq] is saved for backward
// (entries outside each row's keys are 0, which is also all the backward needs to know
// about the mask).
// A row whose key range is empty (key_start past its last key: a block of keys it cannot
// see, in ring attention) gets zero output and probabilities. lse (may be null) receives
// [batch, heads, seq] log-sum-exp of each row's scaled scores (-inf for an empty row), so
// attention over blocks of keys can be merged.
template <typename T>
void attention_forward(T* out, T* probs, const T* q, const T* k, const T* v,
                       const AttentionDims& d, T* lse = nullptr);
// dq, dk, dv are overwritten.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* probs,
                        const T* q, const T* k, const T* v, const AttentionDims& d);

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
struct ClassifierLossArgs {
  int rows = 0, hidden = 0, vocab = 0;
  double grad_scale = 1.0;
  int vocab_start = 0;
  // In-place across ranks over n values: maximum when `max`, else sum. Null: one rank.
  std::function<void(double* values, int n, bool max)> reduce;
};
template <typename T>
double classifier_cross_entropy(T* losses, T* dh, T* dw, const T* h, const T* w,
                                const int32_t* targets, const float* mask,
                                const ClassifierLossArgs& a);

// Sum of squares of x, accumulated in double in a fixed order (independent of threads).
template <typename T>
double sum_squares(const T* x, size_t n);

}  // namespace omni::ops
