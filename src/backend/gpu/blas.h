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

#include "backend/gpu/gpu_ops.h"
#include "base/dtype.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace blas {

// gpu::scratch() slots the matmul ops use; each is live at the same time as the others within
// one op call, so they must differ.
constexpr int kWorkspaceSlot = 8;       // cuBLASLt / hipBLASLt workspace
constexpr int kColumnSumSlot = 9;       // linear_backward: per-block column sums of dy
constexpr int kLogitsSlot = 10;         // classifier_cross_entropy: a chunk of float logits
constexpr int kRowStatisticsSlot = 11;  // classifier_cross_entropy: per-row float64 values

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

// "[gemm] 64x50304x768 bf16 x bf16 -> f32 (T,N), bias" for error messages.
std::string describe(const GemmProblem& p);

}  // namespace blas
OMNI_GPU_NAMESPACE_END
