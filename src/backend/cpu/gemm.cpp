// The CPU's GEMM kernels. fp32: oneDNN's dnnl_sgemm where built with oneDNN, else OpenBLAS.
// --bf16: C = alpha op(A) op(B) + beta C with A and B rounded to bf16
// (nearest even), products accumulated in fp32 and C in fp32, as a GPU's bf16 GEMM computes
// (Megatron's --bf16). oneDNN multiplies bf16 directly (avx512_bf16's vdpbf16ps, or AMX),
// about twice sgemm's rate; elsewhere the fp32 GEMM multiplies copies rounded to bf16 values:
// the same products (two 8-bit significands multiply exactly in fp32), another summation order.
#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/ops.h"
#include "base/dtype.h"

#if defined(OMNITRON_DNNL)
#include <oneapi/dnnl/dnnl.h>
// Exported by libdnnl (row-major, as dnnl_sgemm) but declared only in oneDNN's own tests.
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                               dnnl_dim_t K, float alpha, const uint16_t* A,
                                               dnnl_dim_t lda, const uint16_t* B, dnnl_dim_t ldb,
                                               float beta, float* C, dnnl_dim_t ldc);
#endif

namespace omni::ops {
namespace {

// Process-wide, because the model's OpenMP workers (attention's heads, the experts) run
// GEMMs for the thread that opened the scope; a thread's own exemption is thread-local.
std::atomic<int> g_bf16_scopes{0};
thread_local int t_fp32_scopes = 0;

#if defined(OMNITRON_DNNL)
std::atomic<bool> g_onednn_failed{false}, g_onednn_sgemm_failed{false};

// Inside a parallel region (one expert per thread) a oneDNN GEMM keeps to its thread, as
// OpenBLAS does there: oneDNN sizes its team by omp_get_max_threads().
class OneThreadInParallel {
 public:
  OneThreadInParallel() : threads_(omp_in_parallel() ? omp_get_max_threads() : 0) {
    if (threads_) omp_set_num_threads(1);
  }
  ~OneThreadInParallel() {
    if (threads_) omp_set_num_threads(threads_);
  }
  OneThreadInParallel(const OneThreadInParallel&) = delete;
  OneThreadInParallel& operator=(const OneThreadInParallel&) = delete;

 private:
  int threads_;
};

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

bool cpu_multiplies_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool amx = false, avx512_bf16 = false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx = d & (1u << 22);         // AMX-BF16
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512_bf16 = a & (1u << 5);  // AVX512_BF16
  return amx || avx512_bf16;
}

// One row rounded to bf16 bits (oneDNN's operands) or to bf16 values in floats (sgemm's).
void round_row(uint16_t* dst, const float* src, int n) {
  int i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  // vcvtneps2bf16: nearest even as f32_to_bf16, but subnormal inputs become zero, as
  // vdpbf16ps (oneDNN's product) treats them anyway.
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    __m256i bits;
    static_assert(sizeof(bits) == sizeof(v));
    std::memcpy(&bits, &v, sizeof(v));
    _mm256_mask_storeu_epi16(dst + i, m, bits);
  }
#endif
#pragma omp simd
  for (int j = i; j < n; ++j) dst[j] = f32_to_bf16(src[j]);
}
#endif
void round_row(float* dst, const float* src, int n) {
#pragma omp simd
  for (int j = 0; j < n; ++j) dst[j] = bf16_to_f32(f32_to_bf16(src[j]));
}
// A rows x cols matrix stored ld apart, rounded into a packed copy (ld = cols).
template <typename Out>
const Out* rounded_copy(std::vector<Out>& buf, const float* src, int rows, int cols, int ld) {
  buf.resize(size_t(rows) * cols);
  Out* dst = buf.data();
  const bool split = size_t(rows) * cols >= (size_t(1) << 15) && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (split)
  for (int r = 0; r < rows; ++r) round_row(dst + size_t(r) * cols, src + size_t(r) * ld, cols);
  return dst;
}

struct Scratch {
  std::vector<uint16_t> a16, b16;
  std::vector<float> a32, b32;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// This thread's CpuBf16Reuse scopes and the copies kept under them (a few matrices: the slots
// keep their storage when the scope closes, so the next step does not fault it in again).
struct KeptCopy {
  const float* src = nullptr;  // nullptr: free
  int rows = 0, cols = 0, ld = 0;
  std::vector<uint16_t> bits;
};
constexpr int kKeptCopies = 4;
thread_local int t_reuse_scopes = 0;
thread_local KeptCopy t_kept[kKeptCopies];

#if defined(OMNITRON_DNNL)
// The bf16 copy of a rows x cols matrix: one kept under a CpuBf16Reuse scope (made now if
// none is), else made in `buf`.
const uint16_t* bf16_copy(std::vector<uint16_t>& buf, const float* src, int rows, int cols,
                          int ld) {
  if (t_reuse_scopes == 0) return rounded_copy(buf, src, rows, cols, ld);
  KeptCopy* slot = nullptr;
  for (KeptCopy& k : t_kept) {
    if (k.src == src && k.rows == rows && k.cols == cols && k.ld == ld) return k.bits.data();
    if (!k.src && !slot) slot = &k;
  }
  if (!slot) return rounded_copy(buf, src, rows, cols, ld);  // all slots taken
  *slot = KeptCopy{src, rows, cols, ld, std::move(slot->bits)};
  return rounded_copy(slot->bits, src, rows, cols, ld);
}

bool onednn_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  Scratch& s = scratch();
  const uint16_t* a = bf16_copy(s.a16, A, ta ? K : M, ta ? M : K, lda);
  const uint16_t* b = bf16_copy(s.b16, B, tb ? N : K, tb ? K : N, ldb);
  OneThreadInParallel one;
  return dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, a, ta ? M : K, b,
                               tb ? K : N, beta, C, ldc) == dnnl_success;
}
#endif

}  // namespace

CpuBf16Gemms::CpuBf16Gemms(bool on) : on_(on) {
  if (on_) g_bf16_scopes.fetch_add(1);
}
CpuBf16Gemms::~CpuBf16Gemms() {
  if (on_) g_bf16_scopes.fetch_sub(1);
}
CpuFp32Gemms::CpuFp32Gemms() {
  ++t_fp32_scopes;
}
CpuFp32Gemms::~CpuFp32Gemms() {
  --t_fp32_scopes;
}

CpuBf16Reuse::CpuBf16Reuse() {
  ++t_reuse_scopes;
}
CpuBf16Reuse::~CpuBf16Reuse() {
  if (--t_reuse_scopes > 0) return;
  for (KeptCopy& k : t_kept) k.src = nullptr;
}

bool cpu_bf16_gemms_on() {
  return t_fp32_scopes == 0 && g_bf16_scopes.load() > 0;
}

Fp32GemmKernel cpu_fp32_gemm_kernel() {
#if defined(OMNITRON_DNNL)
  if (!g_onednn_sgemm_failed.load()) return Fp32GemmKernel::OneDnn;
#endif
  return Fp32GemmKernel::OpenBlas;
}

std::string describe_cpu_fp32_gemm() {
  const std::string openblas = "OpenBLAS sgemm";
#if defined(OMNITRON_DNNL)
  if (cpu_fp32_gemm_kernel() == Fp32GemmKernel::OneDnn) return onednn_version() + " dnnl_sgemm";
  return openblas + " (oneDNN's sgemm returned an error)";
#else
  return openblas + " (built without oneDNN)";
#endif
}

void gemm_fp32(Fp32GemmKernel kernel, bool ta, bool tb, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#if defined(OMNITRON_DNNL)
  if (kernel == Fp32GemmKernel::OneDnn && K > 0) {
    OneThreadInParallel one;
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) ==
        dnnl_success)
      return;
    g_onednn_sgemm_failed.store(true);  // checked its arguments and left C alone
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

Bf16GemmKernel cpu_bf16_gemm_kernel() {
#if defined(OMNITRON_DNNL)
  static const bool onednn = cpu_multiplies_bf16();
  if (onednn && !g_onednn_failed.load()) return Bf16GemmKernel::OneDnn;
#endif
  return Bf16GemmKernel::RoundedSgemm;
}

std::string describe_cpu_bf16_gemm() {
  const std::string fallback = "the fp32 GEMM on copies rounded to bf16";
#if defined(OMNITRON_DNNL)
  if (cpu_bf16_gemm_kernel() == Bf16GemmKernel::OneDnn) {
    return onednn_version() + " dnnl_gemm_bf16bf16f32 (fp32 accumulation)";
  }
  return fallback + (g_onednn_failed.load() ? " (oneDNN's bf16 GEMM returned an error)"
                                            : " (this CPU has neither AVX512_BF16 nor AMX-BF16)");
#else
  return fallback + " (built without oneDNN)";
#endif
}

void gemm_bf16(Bf16GemmKernel kernel, bool ta, bool tb, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#if defined(OMNITRON_DNNL)
  if (kernel == Bf16GemmKernel::OneDnn && K > 0) {
    if (onednn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    g_onednn_failed.store(true);  // checked its arguments and left C alone: sgemm from now on
  }
#endif
  Scratch& s = scratch();
  const float* a = rounded_copy(s.a32, A, ta ? K : M, ta ? M : K, lda);
  const float* b = rounded_copy(s.b32, B, tb ? N : K, tb ? K : N, ldb);
  gemm_fp32(cpu_fp32_gemm_kernel(), ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, C,
            ldc);
}

}  // namespace omni::ops
