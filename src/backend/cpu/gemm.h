// The CPU's GEMM kernels behind ops::gemm<float> (backend/cpu/linear.cpp): fp32, and --bf16's
// under the scope below. In their own header so that the ops every file includes stay unchanged.
#pragma once

#include <string>

namespace omni::ops {

// The CPU's --bf16: while a CpuBf16Gemms scope is open anywhere in the process, gemm<float>
// computes as a GPU's bf16 GEMM does (gemm_bf16 below). Process-wide because the model's OpenMP
// workers run GEMMs for the thread that opened it; the trainer opens one around its
// forward-backward passes, so nothing outlives a run. A CpuFp32Gemms scope keeps this thread's
// GEMMs in fp32 (an optimizer's, while another rank's thread computes in bf16).
class CpuBf16Gemms {
 public:
  explicit CpuBf16Gemms(bool on = true);
  ~CpuBf16Gemms();
  CpuBf16Gemms(const CpuBf16Gemms&) = delete;
  CpuBf16Gemms& operator=(const CpuBf16Gemms&) = delete;

 private:
  bool on_;
};
class CpuFp32Gemms {
 public:
  CpuFp32Gemms();
  ~CpuFp32Gemms();
  CpuFp32Gemms(const CpuFp32Gemms&) = delete;
  CpuFp32Gemms& operator=(const CpuFp32Gemms&) = delete;
};
bool cpu_bf16_gemms_on();
// While one is open on this thread, the bf16 copies gemm_bf16 makes of its operands are kept
// and reused by a later GEMM on this thread given the same matrix (address, rows, columns,
// leading dimension) in either role or transposition: the caller promises that the matrices it
// hands those GEMMs do not change until the scope closes. The LM head's weight and logits'
// gradient each feed two GEMMs of a chunk, a linear layer's output gradient two.
class CpuBf16Reuse {
 public:
  CpuBf16Reuse();
  ~CpuBf16Reuse();
  CpuBf16Reuse(const CpuBf16Reuse&) = delete;
  CpuBf16Reuse& operator=(const CpuBf16Reuse&) = delete;
};
// The fp32 GEMM: OneDnn, oneDNN's dnnl_sgemm where built with oneDNN (on a 2-core EPYC 5-13 %
// faster than OpenBLAS 0.3.21's sgemm at most of the model's shapes: bench/bench_cpu_gemm.cpp);
// else, or after an error from oneDNN, OpenBLAS's sgemm. Inside an OpenMP parallel region (one
// expert or head per thread) either keeps to the calling thread.
enum class Fp32GemmKernel { OneDnn, OpenBlas };
Fp32GemmKernel cpu_fp32_gemm_kernel();
std::string describe_cpu_fp32_gemm();
void gemm_fp32(Fp32GemmKernel kernel, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

// OneDnn: oneDNN's bf16 GEMM, where built with oneDNN and the CPU multiplies bf16
// (AVX512_BF16 or AMX-BF16); RoundedSgemm: the fp32 GEMM on copies rounded to bf16 values.
enum class Bf16GemmKernel { OneDnn, RoundedSgemm };
Bf16GemmKernel cpu_bf16_gemm_kernel();
std::string describe_cpu_bf16_gemm();  // the kernel gemm<float> uses under CpuBf16Gemms
// gemm's contract with A and B rounded to bf16 (nearest even), fp32 products and sums; a
// kernel this build or CPU lacks (or an error from oneDNN) runs RoundedSgemm.
void gemm_bf16(Bf16GemmKernel kernel, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace omni::ops
