// The CPU's fp32 GEMM kernels side by side at the shapes bench_train_step's 6-layer model runs
// (hidden 384, 1024 tokens, vocabulary 50304): oneDNN's dnnl_sgemm (ops::gemm<float>'s choice in
// a build with oneDNN) and OpenBLAS's sgemm, each at the process's threads and at one thread
// (the experts' GEMMs run one per thread), and the bf16 GEMM of --bf16.
//
//   build/bench_cpu_gemm [--reps N]
//
// GFLOP/s, best of N (5) calls after a warm-up, kernels alternating call by call so that a
// moment of load from other work lands on each. Prints figures; never fails.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/device.h"

namespace {

struct Shape {
  const char* name;
  bool ta, tb;
  int M, N, K;
};

// Forward (x w^T), input gradient (dy w) and weight gradient (dy^T x) of the model's products.
const Shape kShapes[] = {
    {"LM head forward", false, true, 1024, 50304, 384},
    {"LM head dX", false, false, 1024, 384, 50304},
    {"LM head dW", true, false, 50304, 384, 1024},
    {"qkv forward", false, true, 1024, 1152, 384},
    {"fc1 forward", false, true, 1024, 1536, 384},
    {"fc2 forward", false, true, 1024, 384, 1536},
    {"fc1 dW", true, false, 1536, 384, 1024},
    {"expert fc1 (256 rows)", false, true, 256, 768, 384},
    {"expert fc2 dX", false, false, 256, 768, 384},
    {"expert fc1 dW", true, false, 768, 384, 256},
    {"attention QK^T (a head)", false, true, 256, 256, 64},
    {"square 2048", false, false, 2048, 2048, 2048},
};

using Run = std::function<void(const Shape&, const float*, const float*, float*)>;

}  // namespace

int main(int argc, char** argv) {
  omni::ensure_runtime_environment(argv);
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_cpu_gemm [--reps N]   (got '%s')\n", argv[i]);
      return 2;
    }
  }
  using omni::ops::Fp32GemmKernel;
  auto fp32 = [](Fp32GemmKernel k) -> Run {
    return [k](const Shape& s, const float* a, const float* b, float* c) {
      omni::ops::gemm_fp32(k, s.ta, s.tb, s.M, s.N, s.K, 1.f, a, s.ta ? s.M : s.K, b,
                           s.tb ? s.K : s.N, 0.f, c, s.N);
    };
  };
  const Run bf16 = [](const Shape& s, const float* a, const float* b, float* c) {
    omni::ops::gemm_bf16(omni::ops::cpu_bf16_gemm_kernel(), s.ta, s.tb, s.M, s.N, s.K, 1.f, a,
                         s.ta ? s.M : s.K, b, s.tb ? s.K : s.N, 0.f, c, s.N);
  };
  const std::vector<std::pair<std::string, Run>> kernels = {
      {"oneDNN", fp32(Fp32GemmKernel::OneDnn)},
      {"OpenBLAS", fp32(Fp32GemmKernel::OpenBlas)},
      {"bf16", bf16}};
  std::printf("cpu: %s; %s\nfp32 GEMM: %s\nbf16 GEMM: %s\n", omni::cpu_model_name().c_str(),
              omni::blas_config().c_str(), omni::ops::describe_cpu_fp32_gemm().c_str(),
              omni::ops::describe_cpu_bf16_gemm().c_str());
  const int all = omp_get_max_threads();
  for (int threads : {all, 1}) {
    if (threads == 1 && all == 1) break;
    omp_set_num_threads(threads);
    std::printf("\n%d thread%s, GFLOP/s       %10s %10s %10s   oneDNN/OpenBLAS\n", threads,
                threads == 1 ? " " : "s", "oneDNN", "OpenBLAS", "bf16");
    for (const Shape& s : kShapes) {
      std::vector<float> a(size_t(s.M) * s.K, 0.01f), b(size_t(s.K) * s.N, 0.02f),
          c(size_t(s.M) * s.N);
      std::vector<double> best(kernels.size(), 1e30);
      for (int r = 0; r <= reps; ++r)
        for (size_t k = 0; k < kernels.size(); ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          kernels[k].second(s, a.data(), b.data(), c.data());
          const double t =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r > 0) best[k] = std::min(best[k], t);  // the first call warms up
        }
      const double flops = 2.0 * s.M * s.N * double(s.K);
      std::printf("%-27s %10.1f %10.1f %10.1f   %.2f\n", s.name, flops / best[0] * 1e-9,
                  flops / best[1] * 1e-9, flops / best[2] * 1e-9, best[1] / best[0]);
    }
  }
  return 0;
}
