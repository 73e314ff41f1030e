// The GEMM wrapper of blas.h over cuBLASLt (CUDA), hipBLASLt (HIP) or the CPU (emulated).
#include "backend/gpu/blas.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/gpu/gelu.h"
#include "backend/gpu/gpu_runtime.h"
#include "base/error.h"

// ---- BLAS library names -------------------------------------------------------------------
// hipBLASLt mirrors cuBLASLt call for call; the names below are written once for both, like
// gpu_runtime.h's runtime names. Debian ships no hipBLASLt: a HIP build without its header
// compiles, and a matmul there throws saying so.
#if defined(OMNITRON_GPU_EMULATE)
#include "backend/ops.h"
#elif defined(__HIPCC__) || defined(OMNITRON_HIP)
#if __has_include(<hipblaslt/hipblaslt.h>)
#include <hipblaslt/hipblaslt.h>
#define OMNI_BLAS_LT 1
#define OMNI_BLAS_NAME "hipBLASLt"
#define blasStatus_t hipblasStatus_t
#define BLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define blasOperation_t hipblasOperation_t
#define BLAS_OP_N HIPBLAS_OP_N
#define BLAS_OP_T HIPBLAS_OP_T
#define blasComputeType_t hipblasComputeType_t
#define BLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define BLAS_COMPUTE_32F_FAST_TF32 HIPBLAS_COMPUTE_32F  // no TF32 path on AMD: plain fp32
#define blasDataType_t hipDataType
#define BLAS_R_32F HIP_R_32F
#define BLAS_R_16BF HIP_R_16BF
#define BLAS_R_16F HIP_R_16F
#define blasLtHandle_t hipblasLtHandle_t
#define blasLtCreate hipblasLtCreate
#define blasLtMatmulDesc_t hipblasLtMatmulDesc_t
#define blasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define blasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define blasLtMatrixLayout_t hipblasLtMatrixLayout_t
#define blasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define blasLtMatmulPreference_t hipblasLtMatmulPreference_t
#define blasLtMatmulPreferenceCreate hipblasLtMatmulPreferenceCreate
#define blasLtMatmulPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define blasLtMatmulPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define blasLtMatmulAlgo_t hipblasLtMatmulAlgo_t
#define blasLtMatmulHeuristicResult_t hipblasLtMatmulHeuristicResult_t
#define blasLtMatmulAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define blasLtMatmul hipblasLtMatmul
#define blasLtEpilogue_t hipblasLtEpilogue_t
#define BLASLT_EPILOGUE_DEFAULT HIPBLASLT_EPILOGUE_DEFAULT
#define BLASLT_EPILOGUE_BIAS HIPBLASLT_EPILOGUE_BIAS
#define BLASLT_EPILOGUE_GELU_AUX HIPBLASLT_EPILOGUE_GELU_AUX
#define BLASLT_EPILOGUE_GELU_AUX_BIAS HIPBLASLT_EPILOGUE_GELU_AUX_BIAS
#define BLASLT_MATMUL_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define BLASLT_MATMUL_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define BLASLT_MATMUL_DESC_EPILOGUE HIPBLASLT_MATMUL_DESC_EPILOGUE
#define BLASLT_MATMUL_DESC_BIAS_POINTER HIPBLASLT_MATMUL_DESC_BIAS_POINTER
#define BLASLT_MATMUL_DESC_BIAS_DATA_TYPE HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
#define BLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER
#define BLASLT_MATMUL_DESC_EPILOGUE_AUX_LD HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
#define BLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#else
#define OMNI_BLAS_MISSING 1
#endif
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#define OMNI_BLAS_LT 1
#if CUBLAS_VERSION >= 120500  // cublasGemmGroupedBatchedEx came with cuBLAS 12.5
#define OMNI_BLAS_GROUPED 1
#endif
#define OMNI_BLAS_NAME "cuBLASLt"
#define OMNI_BLAS_HAS_ALIGNMENT_PREFERENCES 1
#define blasStatus_t cublasStatus_t
#define BLAS_STATUS_SUCCESS CUBLAS_STATUS_SUCCESS
#define blasOperation_t cublasOperation_t
#define BLAS_OP_N CUBLAS_OP_N
#define BLAS_OP_T CUBLAS_OP_T
#define blasComputeType_t cublasComputeType_t
#define BLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define BLAS_COMPUTE_32F_FAST_TF32 CUBLAS_COMPUTE_32F_FAST_TF32
#define blasDataType_t cudaDataType_t
#define BLAS_R_32F CUDA_R_32F
#define BLAS_R_16BF CUDA_R_16BF
#define BLAS_R_16F CUDA_R_16F
#define blasLtHandle_t cublasLtHandle_t
#define blasLtCreate cublasLtCreate
#define blasLtMatmulDesc_t cublasLtMatmulDesc_t
#define blasLtMatmulDescCreate cublasLtMatmulDescCreate
#define blasLtMatmulDescSetAttribute cublasLtMatmulDescSetAttribute
#define blasLtMatrixLayout_t cublasLtMatrixLayout_t
#define blasLtMatrixLayoutCreate cublasLtMatrixLayoutCreate
#define blasLtMatmulPreference_t cublasLtMatmulPreference_t
#define blasLtMatmulPreferenceCreate cublasLtMatmulPreferenceCreate
#define blasLtMatmulPreferenceDestroy cublasLtMatmulPreferenceDestroy
#define blasLtMatmulPreferenceSetAttribute cublasLtMatmulPreferenceSetAttribute
#define blasLtMatmulAlgo_t cublasLtMatmulAlgo_t
#define blasLtMatmulHeuristicResult_t cublasLtMatmulHeuristicResult_t
#define blasLtMatmulAlgoGetHeuristic cublasLtMatmulAlgoGetHeuristic
#define blasLtMatmul cublasLtMatmul
#define blasLtEpilogue_t cublasLtEpilogue_t
#define BLASLT_EPILOGUE_DEFAULT CUBLASLT_EPILOGUE_DEFAULT
#define BLASLT_EPILOGUE_BIAS CUBLASLT_EPILOGUE_BIAS
#define BLASLT_EPILOGUE_GELU_AUX CUBLASLT_EPILOGUE_GELU_AUX
#define BLASLT_EPILOGUE_GELU_AUX_BIAS CUBLASLT_EPILOGUE_GELU_AUX_BIAS
#define BLASLT_MATMUL_DESC_TRANSA CUBLASLT_MATMUL_DESC_TRANSA
#define BLASLT_MATMUL_DESC_TRANSB CUBLASLT_MATMUL_DESC_TRANSB
#define BLASLT_MATMUL_DESC_EPILOGUE CUBLASLT_MATMUL_DESC_EPILOGUE
#define BLASLT_MATMUL_DESC_BIAS_POINTER CUBLASLT_MATMUL_DESC_BIAS_POINTER
#define BLASLT_MATMUL_DESC_BIAS_DATA_TYPE CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
#define BLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER
#define BLASLT_MATMUL_DESC_EPILOGUE_AUX_LD CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
#define BLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#endif

OMNI_GPU_NAMESPACE_BEGIN
namespace blas {
namespace {

bool is_gemm_type(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

bool has_bias(Epilogue e) {
  return e == Epilogue::Bias || e == Epilogue::GeluAuxBias;
}
bool has_gelu(Epilogue e) {
  return e == Epilogue::GeluAux || e == Epilogue::GeluAuxBias;
}

// Argument errors, the same in every build. Empty when the problem is well formed.
std::string check_arguments(const GemmProblem& p) {
  if (p.M < 0 || p.N < 0 || p.K < 0) return "negative size";
  if (p.M == 0 || p.N == 0) return {};
  if (p.K == 0) return "K = 0 (the caller handles the empty sum)";
  if (!is_gemm_type(p.ab_type) || !is_gemm_type(p.d_type))
    return "matrices must be f32, bf16 or f16";
  if (p.d_type != p.ab_type && p.d_type != DType::F32)
    return "D must have the inputs' type or be f32";
  if (!p.A || !p.B || !p.D) return "null matrix pointer";
  if (p.lda < (p.trans_a ? p.M : p.K)) return "lda shorter than a row of A";
  if (p.ldb < (p.trans_b ? p.K : p.N)) return "ldb shorter than a row of B";
  if (p.ldd < p.N) return "ldd shorter than a row of D";
  if (has_bias(p.epilogue) && !p.bias) return "bias epilogue without a bias";
  if (has_gelu(p.epilogue)) {
    if (!p.aux) return "GELU epilogue without its aux (pre-activation) output";
    // cuBLASLt's documented constraint on the GELU input matrix; the emulated build keeps it
    // so that callers' fallbacks run in tests too.
    if (p.ld_aux < p.N || p.ld_aux % 8 != 0) return "ld_aux must be >= N and a multiple of 8";
  }
  return {};
}

}  // namespace

std::string describe(const GemmProblem& p) {
  static const char* const kEpilogue[] = {"", ", bias", ", gelu(aux)", ", gelu(aux = + bias)"};
  return "[gemm] " + std::to_string(p.M) + "x" + std::to_string(p.N) + "x" + std::to_string(p.K) +
         " " + dtype_name(p.ab_type) + " x " + dtype_name(p.ab_type) + " -> " +
         dtype_name(p.d_type) + " (" + (p.trans_a ? "T" : "N") + "," + (p.trans_b ? "T" : "N") +
         ")" + kEpilogue[static_cast<int>(p.epilogue)] + (p.beta != 0.0f ? ", beta != 0" : "");
}

#if defined(OMNITRON_GPU_EMULATE)
// ---- Emulated: the CPU multiplies float copies ----------------------------------------------
namespace {

float load(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return to_float(static_cast<const bf16*>(p)[i]);
    default:
      return to_float(static_cast<const f16*>(p)[i]);
  }
}
void store(DType t, void* p, size_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::BF16:
      static_cast<bf16*>(p)[i] = from_float<bf16>(v);
      break;
    default:
      static_cast<f16*>(p)[i] = from_float<f16>(v);
      break;
  }
}

}  // namespace

std::string Gemm::can_implement(const GemmProblem& p) {
  return check_arguments(p);
}

size_t Gemm::get_workspace_size(const GemmProblem&) {
  return 0;
}

void Gemm::run(const GemmProblem& p, void*, size_t, Stream) {
  if (const std::string why = check_arguments(p); !why.empty())
    throw InternalError(describe(p) + ": " + why);
  if (p.M == 0 || p.N == 0) return;
  const int M = p.M, N = p.N, K = p.K;
  std::vector<float> a(size_t(M) * K), b(size_t(K) * N), c(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      a[size_t(m) * K + k] =
          load(p.ab_type, p.A, p.trans_a ? size_t(k) * p.lda + m : size_t(m) * p.lda + k);
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n)
      b[size_t(k) * N + n] =
          load(p.ab_type, p.B, p.trans_b ? size_t(n) * p.ldb + k : size_t(k) * p.ldb + n);
  ops::gemm<float>(false, false, M, N, K, p.alpha, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      const size_t d = size_t(m) * p.ldd + n;
      float v = c[size_t(m) * N + n];
      if (p.beta != 0.0f) v += p.beta * load(p.d_type, p.D, d);
      if (has_bias(p.epilogue)) v += load(p.d_type, p.bias, n);
      if (has_gelu(p.epilogue)) {
        store(p.d_type, p.aux, size_t(m) * p.ld_aux + n, v);
        v = gelu_tanh(v);
      }
      store(p.d_type, p.D, d, v);
    }
  }
}

#elif defined(OMNI_BLAS_LT)
// ---- cuBLASLt / hipBLASLt ----------------------------------------------------------------------
namespace {

// cuBLAS's recommended workspace on Hopper; enough for every split-K choice of the heuristic.
constexpr size_t kMaxWorkspaceBytes = size_t{32} << 20;

#define OMNI_BLAS_CHECK(call)                                                               \
  do {                                                                                      \
    const blasStatus_t status_ = (call);                                                    \
    if (status_ != BLAS_STATUS_SUCCESS)                                                     \
      throw InternalError(std::string(#call) + " failed: " OMNI_BLAS_NAME " status " +      \
                          std::to_string(static_cast<int>(status_)) + " at " __FILE__ ":" + \
                          std::to_string(__LINE__));                                        \
  } while (0)

blasDataType_t library_type(DType t) {
  return t == DType::F32 ? BLAS_R_32F : t == DType::BF16 ? BLAS_R_16BF : BLAS_R_16F;
}

// The largest power of two up to 256 dividing the address: the algorithm choice depends on it.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

blasLtHandle_t handle() {
  static std::mutex mutex;
  static std::vector<blasLtHandle_t> handles;  // per device, for the life of the process
  int device = 0;
  OMNI_GPU_CHECK(gpuGetDevice(&device));
  const std::lock_guard lock(mutex);
  if (handles.size() <= static_cast<size_t>(device)) handles.resize(device + 1, nullptr);
  if (!handles[device]) OMNI_BLAS_CHECK(blasLtCreate(&handles[device]));
  return handles[device];
}

// A problem's descriptors and chosen algorithm. Pointers are set per call (under the plan's
// mutex: the descriptor is shared); their alignments are part of the cache key.
struct Plan {
  blasLtMatmulDesc_t desc = nullptr;
  blasLtMatrixLayout_t first = nullptr, second = nullptr, d = nullptr;
  blasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  std::string failure;  // non-empty: no algorithm for this problem
  std::mutex mutex;
};

using Key = std::array<int64_t, 20>;

Key key_of(const GemmProblem& p) {
  int device = 0;
  OMNI_GPU_CHECK(gpuGetDevice(&device));
  return {device,
          p.M,
          p.N,
          p.K,
          p.trans_a,
          p.trans_b,
          static_cast<int64_t>(p.ab_type),
          static_cast<int64_t>(p.d_type),
          p.lda,
          p.ldb,
          p.ldd,
          static_cast<int64_t>(p.epilogue),
          has_gelu(p.epilogue) ? p.ld_aux : 0,
          p.allow_tf32 && p.ab_type == DType::F32,
          alignment(p.A),
          alignment(p.B),
          alignment(p.D),
          has_bias(p.epilogue) ? alignment(p.bias) : 0,
          has_gelu(p.epilogue) ? alignment(p.aux) : 0,
          p.beta != 0.0f};
}

void set_pointers(const Plan& plan, const GemmProblem& p) {
  if (has_bias(p.epilogue))
    OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan.desc, BLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &p.bias, sizeof(p.bias)));
  if (has_gelu(p.epilogue))
    OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan.desc, BLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                 &p.aux, sizeof(p.aux)));
}

// Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T: the library sees B's
// buffer as its first operand, A's as its second, and D as an N x M column-major matrix.
std::unique_ptr<Plan> make_plan(const GemmProblem& p) {
  auto plan = std::make_unique<Plan>();
  const bool tf32 = p.allow_tf32 && p.ab_type == DType::F32;
  const blasComputeType_t compute = tf32 ? BLAS_COMPUTE_32F_FAST_TF32 : BLAS_COMPUTE_32F;
  OMNI_BLAS_CHECK(blasLtMatmulDescCreate(&plan->desc, compute, BLAS_R_32F));
  const blasOperation_t op_first = p.trans_b ? BLAS_OP_T : BLAS_OP_N;
  const blasOperation_t op_second = p.trans_a ? BLAS_OP_T : BLAS_OP_N;
  OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan->desc, BLASLT_MATMUL_DESC_TRANSA, &op_first,
                                               sizeof(op_first)));
  OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan->desc, BLASLT_MATMUL_DESC_TRANSB, &op_second,
                                               sizeof(op_second)));
  blasLtEpilogue_t epilogue = BLASLT_EPILOGUE_DEFAULT;
  switch (p.epilogue) {
    case Epilogue::None:
      break;
    case Epilogue::Bias:
      epilogue = BLASLT_EPILOGUE_BIAS;
      break;
    case Epilogue::GeluAux:
      epilogue = BLASLT_EPILOGUE_GELU_AUX;
      break;
    case Epilogue::GeluAuxBias:
      epilogue = BLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
  }
  OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan->desc, BLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                               sizeof(epilogue)));
  if (has_bias(p.epilogue)) {
    const int32_t bias_type = library_type(p.d_type);
    OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan->desc, BLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &bias_type, sizeof(bias_type)));
  }
  if (has_gelu(p.epilogue)) {
    const int64_t ld_aux = p.ld_aux;
    OMNI_BLAS_CHECK(blasLtMatmulDescSetAttribute(plan->desc, BLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                 &ld_aux, sizeof(ld_aux)));
  }
  set_pointers(*plan, p);
  const blasDataType_t ab = library_type(p.ab_type), d = library_type(p.d_type);
  OMNI_BLAS_CHECK(blasLtMatrixLayoutCreate(&plan->first, ab, p.trans_b ? p.K : p.N,
                                           p.trans_b ? p.N : p.K, p.ldb));
  OMNI_BLAS_CHECK(blasLtMatrixLayoutCreate(&plan->second, ab, p.trans_a ? p.M : p.K,
                                           p.trans_a ? p.K : p.M, p.lda));
  OMNI_BLAS_CHECK(blasLtMatrixLayoutCreate(&plan->d, d, p.N, p.M, p.ldd));

  blasLtMatmulPreference_t preference = nullptr;
  OMNI_BLAS_CHECK(blasLtMatmulPreferenceCreate(&preference));
  const uint64_t max_workspace = kMaxWorkspaceBytes;
  OMNI_BLAS_CHECK(blasLtMatmulPreferenceSetAttribute(
      preference, BLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
#if defined(OMNI_BLAS_HAS_ALIGNMENT_PREFERENCES)
  // cuBLASLt assumes 256-byte aligned buffers unless told otherwise.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(p.B)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(p.A)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(p.D)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(p.D)}};
  for (const auto& [attribute, bytes] : alignments)
    OMNI_BLAS_CHECK(
        blasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes)));
#endif
  blasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const blasStatus_t status =
      blasLtMatmulAlgoGetHeuristic(handle(), plan->desc, plan->first, plan->second, plan->d,
                                   plan->d, preference, 1, &result, &count);
  OMNI_BLAS_CHECK(blasLtMatmulPreferenceDestroy(preference));
  if (status != BLAS_STATUS_SUCCESS || count == 0 || result.state != BLAS_STATUS_SUCCESS) {
    plan->failure = OMNI_BLAS_NAME " has no algorithm for it (heuristic status " +
                    std::to_string(static_cast<int>(status)) + ")";
  } else {
    plan->algo = result.algo;
    plan->workspace = result.workspaceSize;
  }
  return plan;
}

// The plan of a problem, made on first use and kept for the life of the process (descriptors
// included), so a shape always runs the same algorithm.
Plan& plan_for(const GemmProblem& p) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Plan> > plans;
  const Key key = key_of(p);
  const std::lock_guard lock(mutex);
  auto& plan = plans[key];
  if (!plan) plan = make_plan(p);
  return *plan;
}

}  // namespace

std::string Gemm::can_implement(const GemmProblem& p) {
  std::string why = check_arguments(p);
  if (why.empty() && p.M > 0 && p.N > 0) why = plan_for(p).failure;
  return why;
}

size_t Gemm::get_workspace_size(const GemmProblem& p) {
  if (!check_arguments(p).empty() || p.M == 0 || p.N == 0) return 0;
  return plan_for(p).workspace;
}

void Gemm::run(const GemmProblem& p, void* workspace, size_t workspace_bytes, Stream stream) {
  if (const std::string why = check_arguments(p); !why.empty())
    throw InternalError(describe(p) + ": " + why);
  if (p.M == 0 || p.N == 0) return;
  Plan& plan = plan_for(p);
  if (!plan.failure.empty()) throw InternalError(describe(p) + ": " + plan.failure);
  if (workspace_bytes < plan.workspace)
    throw InternalError(describe(p) + ": needs " + std::to_string(plan.workspace) +
                        " bytes of workspace, given " + std::to_string(workspace_bytes));
  const std::lock_guard lock(plan.mutex);
  set_pointers(plan, p);
  // The algorithm's own workspace size, not the buffer's: the same work split on every call.
  OMNI_BLAS_CHECK(blasLtMatmul(handle(), plan.desc, &p.alpha, p.B, plan.first, p.A, plan.second,
                               &p.beta, p.D, plan.d, p.D, plan.d, &plan.algo, workspace,
                               plan.workspace, static_cast<gpuStream_t>(stream)));
}

#else
// ---- HIP without hipBLASLt ---------------------------------------------------------------------
namespace {
[[noreturn]] void missing(const GemmProblem& p) {
  throw UsageError(describe(p) +
                   ": this omnitron was built without hipBLASLt (install ROCm's hipblaslt "
                   "development package and rebuild), so it has no GPU matmul");
}
}  // namespace

std::string Gemm::can_implement(const GemmProblem& p) {
  std::string why = check_arguments(p);
  return why.empty() ? "built without hipBLASLt" : why;
}
size_t Gemm::get_workspace_size(const GemmProblem&) {
  return 0;
}
void Gemm::run(const GemmProblem& p, void*, size_t, Stream) {
  missing(p);
}
#endif

// ---- Grouped GEMM ---------------------------------------------------------------------------
namespace {

std::atomic<bool> grouped_enabled{true};
std::atomic<long> grouped_calls{0};

// The grouped call's own rules, the same in every build (the emulator keeps them, so the
// fallbacks run in tests as they would on a GPU).
std::string check_groupable(const GemmProblem* problems, int count) {
  if (!grouped_enabled) return "turned off (set_grouped_gemm)";
  int nonempty = 0;
  for (int i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    if (const std::string why = check_arguments(p); !why.empty()) return describe(p) + ": " + why;
    if (p.M == 0 || p.N == 0) continue;
    ++nonempty;
    if (p.epilogue != Epilogue::None) return describe(p) + ": the grouped call has no epilogue";
    if (p.ab_type != problems[0].ab_type || p.d_type != p.ab_type)
      return describe(p) + ": the grouped call takes one type for A, B and C";
    if (p.allow_tf32 && p.ab_type == DType::F32) return describe(p) + ": TF32 asked for";
    // cuBLAS's rule for 16-bit inputs (and every pointer here): 16-byte aligned matrices.
    for (const void* ptr : {p.A, p.B, static_cast<const void*>(p.D)})
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return describe(p) + ": a matrix not 16-byte aligned";
  }
  return nonempty == 0 ? "no non-empty problem" : "";
}

#if defined(OMNITRON_GPU_EMULATE) || defined(OMNI_BLAS_GROUPED)
// The A, B and C pointer arrays, in that order, in device memory by one copy on the stream (no
// wait: the runtime stages pageable host memory before it returns; the stream orders the copy
// after the previous call that read this scratch).
const void* const* upload_pointers(const GroupedGemmArgs& g, Stream stream) {
  std::vector<const void*> host(g.a);
  host.insert(host.end(), g.b.begin(), g.b.end());
  host.insert(host.end(), g.c.begin(), g.c.end());
  const size_t bytes = host.size() * sizeof(void*);
  void* device = scratch(bytes, kGroupedPointersSlot);
  OMNI_GPU_CHECK(gpuMemcpyAsync(device, host.data(), bytes, gpuMemcpyHostToDevice,
                                static_cast<gpuStream_t>(stream)));
  return static_cast<const void* const*>(device);
}
#endif

#if defined(OMNITRON_GPU_EMULATE)
std::string device_support() {
  return {};
}

// The grouped call on the CPU: reads the arrays as cuBLAS does (the pointers from device
// memory) and multiplies each group with the emulated Gemm. A column-major C[m, n] = op(A) op(B)
// is the row-major C^T[n, m] = op(B)^T op(A)^T.
std::string run_grouped(const GroupedGemmArgs& g, Stream stream) {
  const void* const* pointers = upload_pointers(g, stream);
  const int groups = g.groups();
  for (int i = 0; i < groups; ++i) {
    GemmProblem p;
    p.M = g.n[i], p.N = g.m[i], p.K = g.k[i];
    p.ab_type = p.d_type = g.type;
    p.A = pointers[groups + i], p.lda = g.ldb[i], p.trans_a = g.trans_b[i] == 'T';
    p.B = pointers[i], p.ldb = g.lda[i], p.trans_b = g.trans_a[i] == 'T';
    p.D = const_cast<void*>(pointers[2 * groups + i]), p.ldd = g.ldc[i];
    p.alpha = g.alpha[i], p.beta = g.beta[i];
    Gemm::run(p, nullptr, 0, stream);
  }
  return {};
}

#elif defined(OMNI_BLAS_GROUPED)
// The grouped path is for the GPUs the MoE shapes train on, Ampere (8.0) and later (bf16 needs
// 8.0): older GPUs keep the per-problem path.
std::string device_support() {
  int device = 0, major = 0;
  OMNI_GPU_CHECK(gpuGetDevice(&device));
  OMNI_GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8 ? "" : "compute capability below 8.0";
}

cublasHandle_t grouped_handle() {
  static std::vector<cublasHandle_t> handles;  // per device, for the life of the process
  int device = 0;
  OMNI_GPU_CHECK(gpuGetDevice(&device));
  if (handles.size() <= static_cast<size_t>(device)) handles.resize(device + 1, nullptr);
  if (!handles[device]) OMNI_BLAS_CHECK(cublasCreate(&handles[device]));
  return handles[device];
}

std::string run_grouped(const GroupedGemmArgs& g, Stream stream) {
  const int groups = g.groups();
  std::vector<cublasOperation_t> trans_a(groups), trans_b(groups);
  for (int i = 0; i < groups; ++i) {
    trans_a[i] = g.trans_a[i] == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
    trans_b[i] = g.trans_b[i] == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
  }
  const std::vector<int> group_size(groups, 1);
  const void* const* pointers = upload_pointers(g, stream);
  const cudaDataType_t type = library_type(g.type);
  // The handle's stream and workspace are set per call; a fixed workspace of our own keeps the
  // kernels' choice the same on every call (cuBLAS's pool differs per stream otherwise).
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  const cublasHandle_t handle = grouped_handle();
  OMNI_BLAS_CHECK(cublasSetStream(handle, static_cast<gpuStream_t>(stream)));
  OMNI_BLAS_CHECK(
      cublasSetWorkspace(handle, scratch(kMaxWorkspaceBytes, kWorkspaceSlot), kMaxWorkspaceBytes));
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      handle, trans_a.data(), trans_b.data(), g.m.data(), g.n.data(), g.k.data(), g.alpha.data(),
      pointers, type, g.lda.data(), pointers + groups, type, g.ldb.data(), g.beta.data(),
      const_cast<void* const*>(pointers + 2 * groups), type, g.ldc.data(), groups,
      group_size.data(), CUBLAS_COMPUTE_32F);
  // Refusals are found before anything is enqueued: the caller runs the problems one by one.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH ||
      status == CUBLAS_STATUS_INVALID_VALUE)
    return "cublasGemmGroupedBatchedEx refused them (status " +
           std::to_string(static_cast<int>(status)) + ")";
  OMNI_BLAS_CHECK(status);
  return {};
}

#else
std::string device_support() {
#if defined(OMNI_BLAS_LT) && !defined(__HIPCC__) && !defined(OMNITRON_HIP)
  return "cuBLAS older than 12.5 has no grouped GEMM";
#else
  return "HIP builds run one GEMM per problem";
#endif
}
std::string run_grouped(const GroupedGemmArgs&, Stream) {
  return device_support();
}
#endif

}  // namespace

GroupedGemmArgs marshal_grouped(const GemmProblem* problems, int count) {
  GroupedGemmArgs g;
  if (count > 0) g.type = problems[0].ab_type;
  for (int i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    if (p.M == 0 || p.N == 0) continue;
    g.trans_a.push_back(p.trans_b ? 'T' : 'N');
    g.trans_b.push_back(p.trans_a ? 'T' : 'N');
    g.m.push_back(p.N), g.n.push_back(p.M), g.k.push_back(p.K);
    g.a.push_back(p.B), g.lda.push_back(p.ldb);
    g.b.push_back(p.A), g.ldb.push_back(p.lda);
    g.c.push_back(p.D), g.ldc.push_back(p.ldd);
    g.alpha.push_back(p.alpha), g.beta.push_back(p.beta);
  }
  return g;
}

std::string can_group(const GemmProblem* problems, int count) {
  std::string why = check_groupable(problems, count);
  return why.empty() ? device_support() : why;
}

std::string grouped_gemm(const GemmProblem* problems, int count, Stream stream) {
  std::string why = can_group(problems, count);
  if (why.empty()) why = run_grouped(marshal_grouped(problems, count), stream);
  if (why.empty()) {
    ++grouped_calls;
    return why;
  }
  for (int i = 0; i < count; ++i) gemm(problems[i], stream);
  return why;
}

void set_grouped_gemm(bool enabled) {
  grouped_enabled = enabled;
}

long grouped_gemm_calls() {
  return grouped_calls;
}

void gemm(const GemmProblem& p, Stream stream) {
  if (p.M == 0 || p.N == 0) return;
  const size_t bytes = Gemm::get_workspace_size(p);
  void* workspace = bytes ? scratch(bytes, kWorkspaceSlot) : nullptr;
  Gemm::run(p, workspace, bytes, stream);
}

void accumulate_weight_grad(float* dw, const void* dy, int ld_dy, const void* x, int ld_x, int M,
                            int N, int K, DType type, Stream stream) {
  if (M == 0) return;
  GemmProblem p;
  p.M = N, p.N = K, p.K = M;
  p.trans_a = true;
  p.ab_type = type, p.d_type = DType::F32;
  p.A = dy, p.lda = ld_dy;
  p.B = x, p.ldb = ld_x;
  p.D = dw, p.ldd = K;
  p.beta = 1.0f;
  gemm(p, stream);
}

}  // namespace blas
OMNI_GPU_NAMESPACE_END
