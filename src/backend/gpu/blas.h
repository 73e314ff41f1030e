// The GEMM behind the matmul ops (linear.cu, cross_entropy.cu), in CUTLASS's shape: describe
// the problem, ask whether it can run and how much workspace it needs, then run it.
//   - CUDA: cuBLASLt; HIP: hipBLASLt (the same API under other names, blas.cu's rename
//     section); the emulated build multiplies on the CPU (ops::gemm on float copies), so
//     everything around the GEMM is tested without a GPU.
//   - Row-major, like the rest of omnitron: D[M,N] = epilogue(alpha op(A) op(B) + beta D),
//     with op(X) = X or X^T. A and B are one storage type; D is that type or float (the fp32
//     accumulation of parameter gradients, beta = 1). Arithmetic is float (compute type
//     32F; TF32 only when asked for).
//   - Deterministic: the algorithm is picked by heuristic once per problem shape and then
//     cached, the workspace limit is fixed, and every cuBLASLt reduction scheme (split-K
//     included) adds its parts in a fixed order, so a shape gives the same bits every run.
// Plain C++ (no GPU headers): only backend/gpu/ includes it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "base/dtype.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace blas {

// gpu::scratch() slots the matmul ops use; each is live at the same time as the others within
// one op call, so they must differ.
constexpr int kWorkspaceSlot = 8;         // cuBLASLt / hipBLASLt workspace
constexpr int kColumnSumSlot = 9;         // linear_backward: per-block column sums of dy
constexpr int kLogitsSlot = 10;           // classifier_cross_entropy: a chunk of float logits
constexpr int kRowStatisticsSlot = 11;    // classifier_cross_entropy: per-row float64 values
constexpr int kGroupedPointersSlot = 13;  // grouped_gemm: the A, B and C pointer arrays

enum class Epilogue {
  None,
  Bias,         // D[m, n] += bias[n]
  GeluAux,      // aux = the result, D = gelu(aux)
  GeluAuxBias,  // aux = the result + bias[n], D = gelu(aux): the pre-activation is kept
};

// GELU is the tanh form (ops::gelu_forward's, and cuBLASLt's).
struct GemmProblem {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  DType ab_type = DType::F32;  // A and B: F32, BF16 or F16 (dtype_of<T>())
  DType d_type = DType::F32;   // D (and bias, aux): ab_type or F32
  const void* A = nullptr;     // op(A) is [M, K]; A is [M, K] (or [K, M] transposed)
  int lda = 0;                 // elements between rows of A as stored
  const void* B = nullptr;     // op(B) is [K, N]
  int ldb = 0;
  void* D = nullptr;  // [M, N], read too when beta != 0
  int ldd = 0;
  float alpha = 1.0f, beta = 0.0f;
  Epilogue epilogue = Epilogue::None;
  const void* bias = nullptr;  // [N] of d_type (Bias, GeluAuxBias)
  void* aux = nullptr;         // [M, N] of d_type (GeluAux*)
  int ld_aux = 0;
  bool allow_tf32 = false;  // float inputs only: TF32 tensor cores (10-bit mantissa products)
};

class Gemm {
 public:
  // Empty when the problem can run as described; otherwise why not (the library lacks a
  // kernel for it, an epilogue constraint such as ld_aux % 8, a bad argument). Callers that
  // have another way (a separate epilogue kernel) take it when this says no.
  static std::string can_implement(const GemmProblem& p);
  // Bytes of device workspace run() needs (the chosen algorithm's).
  static size_t get_workspace_size(const GemmProblem& p);
  // Enqueues the GEMM on `stream`; throws (naming the problem) when it cannot run.
  static void run(const GemmProblem& p, void* workspace, size_t workspace_bytes, Stream stream);
};

// The three steps with the workspace from gpu::scratch(kWorkspaceSlot). M or N == 0: nothing
// to do. K must be positive (callers handle the empty sum themselves).
void gemm(const GemmProblem& p, Stream stream);

// dw[N, K] += dy[M, N]^T x[M, K] in float: the weight gradient of y = x w^T (linear layers and
// the classifier). dy and x are of `type` with leading dimensions ld_dy and ld_x; M == 0 adds
// nothing.
void accumulate_weight_grad(float* dw, const void* dy, int ld_dy, const void* x, int ld_x, int M,
                            int N, int K, DType type, Stream stream);

// ---- Grouped GEMM: independent problems in one library call -----------------------------------
// Megatron's --moe-grouped-gemm: the local experts' matmuls as one launch, which keeps a GPU
// busy where each of 16-32 small experts alone would not. On CUDA (cuBLAS >= 12.5, compute
// capability >= 8.0) it is one cublasGemmGroupedBatchedEx; the emulated build interprets the
// same argument arrays on the CPU; HIP builds and older cuBLAS run one gemm() per problem.
//
// The grouped call has no epilogue and one type for A, B and C (f32, bf16 or f16; arithmetic
// f32, no TF32): problems beyond that (a bias, bf16 inputs into a float dW) run one gemm()
// each, the same bits as before.

// The arguments of cublasGemmGroupedBatchedEx, column-major as cuBLAS reads them (the row-major
// D = op(A) op(B) is the column-major D^T = op(B)^T op(A)^T), one group of one problem per
// non-empty GemmProblem. Pointers index a, b and c (device memory on the call: copied there).
struct GroupedGemmArgs {
  DType type = DType::F32;             // A, B and C
  std::vector<char> trans_a, trans_b;  // 'N' or 'T', of the library's A (our B) and B (our A)
  std::vector<int> m, n, k, lda, ldb, ldc;
  std::vector<float> alpha, beta;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  int groups() const { return static_cast<int>(m.size()); }
};

// Pure host: the problems as the grouped call's arrays (problems with M or N == 0 dropped).
GroupedGemmArgs marshal_grouped(const GemmProblem* problems, int count);

// Empty when grouped_gemm() will try these problems as one grouped call; otherwise why not
// (this build or GPU has no grouped call, an epilogue, mixed types, K == 0, a pointer not
// 16-byte aligned, turned off by set_grouped_gemm()).
std::string can_group(const GemmProblem* problems, int count);

// Enqueues the problems: one grouped call when can_group() says so, else (or when the library
// refuses them) one gemm() each. Returns why they did not run grouped (empty: they did).
std::string grouped_gemm(const GemmProblem* problems, int count, Stream stream);

// Process-wide switch (on by default): off, grouped_gemm() always runs one gemm() per problem
// (the reference the tests and bench_gpu_ops compare with).
void set_grouped_gemm(bool enabled);
// Grouped calls run so far in this process (tests and bench_gpu_ops read it).
long grouped_gemm_calls();

// "[gemm] 64x50304x768 bf16 x bf16 -> f32 (T,N), bias" for error messages.
std::string describe(const GemmProblem& p);

}  // namespace blas
OMNI_GPU_NAMESPACE_END
