// GPU op throughput at the shapes of GPT-2 124M and Llama 3.2 1B training, bf16: TFLOP/s for
// matmuls and flash attention (causal, FlashAttention's FLOP convention: forward 4*B*H*S^2*D
// halved for causality, backward 2.5x the forward), GB/s of memory traffic for the
// bandwidth-bound kernels; and a Qwen3-MoE-like layer's routed experts as grouped GEMMs against
// one GEMM per expert. Prints figures; never passes or fails.
//
//   build/bench_gpu_ops [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if defined(OMNITRON_GPU)
#include "backend/gpu/blas.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/moe_kernels.h"

namespace {

using omni::gpu::bf16;
using omni::gpu::DeviceArray;
namespace gpu = omni::gpu;

int reps = 20;

// Median milliseconds of fn over `reps` runs after 3 warm-up runs.
double time_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  gpu::synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    gpu::synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename T>
DeviceArray<T> random_device(size_t n, float scale = 1.0f) {
  std::mt19937 rng(n);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> host(n);
  for (auto& x : host) x = d(rng);
  DeviceArray<float> f(n);
  gpu::copy_to_device(f.data(), host.data(), n * sizeof(float));
  DeviceArray<T> out(n);
  gpu::convert_from_float(out.data(), f.data(), n);
  return out;
}

void report(const char* what, double ms, double flops, double bytes) {
  std::printf("%-52s %9.3f ms", what, ms);
  if (flops > 0) std::printf("  %7.1f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  if (bytes > 0) std::printf("  %7.1f GB/s", bytes / (ms * 1e-3) / 1e9);
  std::printf("\n");
  std::fflush(stdout);
}

void bench_linear(const char* name, int M, int K, int N) {
  auto x = random_device<bf16>(size_t(M) * K), w = random_device<bf16>(size_t(N) * K, 0.02f);
  auto y = random_device<bf16>(size_t(M) * N);
  DeviceArray<float> dw(size_t(N) * K);
  gpu::fill_zero(dw.data(), dw.size() * sizeof(float));
  auto dx = random_device<bf16>(size_t(M) * K);
  const double f = 2.0 * M * K * N;
  report((std::string(name) + " forward").c_str(), time_ms([&] {
           gpu::linear_forward<bf16>(y.data(), x.data(), w.data(), nullptr, M, K, N);
         }),
         f, 0);
  report((std::string(name) + " backward (dx, dw)").c_str(), time_ms([&] {
           gpu::linear_backward<bf16>(dx.data(), dw.data(), nullptr, y.data(), x.data(), w.data(),
                                      M, K, N);
         }),
         2 * f, 0);
}

// The routed experts of one MoE layer, forward and backward (dx, dw) of fc1 and fc2, as one
// grouped GEMM per product (blas::grouped_gemm) and as one GEMM per expert. Qwen3-MoE-like:
// 16 local experts, hidden 2048, expert FFN 768 (fc1 2 x 768 for SwiGLU), 4096 routed rows
// spread unevenly (a fixed draw, one expert empty).
void bench_moe_experts(int experts, int hidden, int ffn, int routed_rows) {
  std::mt19937 rng(7);
  std::vector<double> share(experts);
  for (auto& s : share) s = std::exponential_distribution<double>(1.0)(rng);
  share[experts / 2] = 0;
  double total = 0;
  for (double s : share) total += s;
  std::vector<int32_t> offsets = {0};
  for (int e = 0; e < experts; ++e)
    offsets.push_back(e + 1 == experts ? routed_rows
                                       : offsets.back() + int(routed_rows * share[e] / total));
  const int R = routed_rows;
  auto x = random_device<bf16>(size_t(R) * hidden), h = random_device<bf16>(size_t(R) * 2 * ffn),
       a = random_device<bf16>(size_t(R) * ffn), y = random_device<bf16>(size_t(R) * hidden);
  auto w1 = random_device<bf16>(size_t(experts) * 2 * ffn * hidden, 0.02f),
       w2 = random_device<bf16>(size_t(experts) * hidden * ffn, 0.02f);
  auto dx = random_device<bf16>(size_t(R) * hidden), da = random_device<bf16>(size_t(R) * ffn);
  DeviceArray<float> dw1(w1.size()), dw2(w2.size());
  gpu::fill_zero(dw1.data(), dw1.size() * sizeof(float));
  gpu::fill_zero(dw2.data(), dw2.size() * sizeof(float));
  const double f = 2.0 * R * hidden * 3 * ffn;  // fc1 (2 ffn) and fc2 (ffn), forward
  const int32_t* o = offsets.data();
  const auto forward = [&] {
    gpu::moe_grouped_linear_forward<bf16>(h.data(), x.data(), w1.data(), nullptr, o, experts,
                                          hidden, 2 * ffn);
    gpu::moe_grouped_linear_forward<bf16>(y.data(), a.data(), w2.data(), nullptr, o, experts, ffn,
                                          hidden);
  };
  const auto backward = [&] {
    gpu::moe_grouped_linear_backward<bf16>(da.data(), dw2.data(), nullptr, y.data(), a.data(),
                                           w2.data(), o, experts, ffn, hidden);
    gpu::moe_grouped_linear_backward<bf16>(dx.data(), dw1.data(), nullptr, h.data(), x.data(),
                                           w1.data(), o, experts, hidden, 2 * ffn);
  };
  const std::string shape = "MoE experts " + std::to_string(experts) + "x(" +
                            std::to_string(hidden) + "->2x" + std::to_string(ffn) + "->" +
                            std::to_string(hidden) + ") " + std::to_string(R) + " rows, ";
  for (bool grouped : {false, true}) {
    gpu::blas::set_grouped_gemm(grouped);
    const std::string name = shape + (grouped ? "grouped" : "per expert");
    report((name + " forward").c_str(), time_ms(forward), f, 0);
    report((name + " backward (dx, dw)").c_str(), time_ms(backward), 2 * f, 0);
  }
  // fc1 and fc2: forward, dx and dw; dw of bf16 into float dW runs per expert (mixed types).
  const long calls = gpu::blas::grouped_gemm_calls();
  forward(), backward();
  std::printf(
      "  grouped calls in one forward + backward: %ld of 6 products (4 where the device "
      "has the grouped call)\n",
      gpu::blas::grouped_gemm_calls() - calls);
  gpu::blas::set_grouped_gemm(true);
}

void bench_attention(int batch, int heads, int groups, int seq, int hd) {
  const size_t n = size_t(batch) * seq;
  auto q = random_device<bf16>(n * heads * hd), k = random_device<bf16>(n * groups * hd);
  auto v = random_device<bf16>(n * groups * hd), out = random_device<bf16>(n * heads * hd);
  auto dout = random_device<bf16>(n * heads * hd), dq = random_device<bf16>(n * heads * hd);
  auto dk = random_device<bf16>(n * groups * hd), dv = random_device<bf16>(n * groups * hd);
  DeviceArray<float> lse(n * heads);
  const omni::ops::AttentionDims d{batch, seq, heads, groups, hd};
  const double fwd = 4.0 * batch * heads * double(seq) * seq * hd / 2;  // causal
  char label[128];
  std::snprintf(label, sizeof label, "flash attention fwd  B%d H%d G%d S%d D%d causal", batch,
                heads, groups, seq, hd);
  const double fwd_ms = time_ms([&] {
    gpu::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
  });
  report(label, fwd_ms, fwd, 0);
  std::snprintf(label, sizeof label, "flash attention bwd  B%d H%d G%d S%d D%d causal", batch,
                heads, groups, seq, hd);
  const double bwd_ms = time_ms([&] {
    gpu::flash_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                  lse.data(), q.data(), k.data(), v.data(), d);
  });
  report(label, bwd_ms, 2.5 * fwd, 0);
  std::snprintf(label, sizeof label, "flash attention fwd+bwd S%d D%d causal", seq, hd);
  report(label, fwd_ms + bwd_ms, 3.5 * fwd, 0);
}

void bench_norms(int N, int C) {
  auto x = random_device<bf16>(size_t(N) * C), w = random_device<bf16>(C);
  auto b = random_device<bf16>(C), out = random_device<bf16>(size_t(N) * C);
  auto dx = random_device<bf16>(size_t(N) * C);
  DeviceArray<float> mean(N), rstd(N), dw(C), db(C);
  const double io = 2.0 * N * C * 2;  // read x, write out (bf16)
  char label[96];
  std::snprintf(label, sizeof label, "layernorm fwd N%d C%d", N, C);
  report(label, time_ms([&] {
           gpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                  b.data(), N, C, 1e-5f);
         }),
         0, io);
  std::snprintf(label, sizeof label, "layernorm bwd N%d C%d", N, C);
  report(label, time_ms([&] {
           gpu::layernorm_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(), w.data(),
                                   mean.data(), rstd.data(), N, C);
         }),
         0, 2.0 * io);  // read dout, x, dx; write dx
  std::snprintf(label, sizeof label, "rmsnorm fwd N%d C%d", N, C);
  report(label, time_ms([&] {
           gpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
         }),
         0, io);
}

void bench_elementwise(int N, int F) {
  auto x = random_device<bf16>(size_t(N) * 2 * F), out = random_device<bf16>(size_t(N) * F);
  auto dx = random_device<bf16>(size_t(N) * 2 * F);
  char label[96];
  std::snprintf(label, sizeof label, "swiglu fwd N%d F%d", N, F);
  report(label, time_ms([&] { gpu::swiglu_forward(out.data(), x.data(), N, F); }), 0,
         2.0 * N * 3 * F);
  std::snprintf(label, sizeof label, "swiglu bwd N%d F%d", N, F);
  report(label, time_ms([&] { gpu::swiglu_backward(dx.data(), out.data(), x.data(), N, F); }), 0,
         2.0 * N * 5 * F);
  std::snprintf(label, sizeof label, "gelu(erf) fwd n=%d", N * F);
  report(label, time_ms([&] {
           gpu::gelu_forward(out.data(), x.data(), size_t(N) * F, omni::GeluForm::Erf);
         }),
         0, 2.0 * 2 * N * F);
}

void bench_cross_entropy(int rows, int hidden, int vocab) {
  auto h = random_device<bf16>(size_t(rows) * hidden),
       w = random_device<bf16>(size_t(vocab) * hidden, 0.02f);
  auto dh = random_device<bf16>(size_t(rows) * hidden);
  DeviceArray<float> dw(size_t(vocab) * hidden);
  std::vector<int32_t> t(rows);
  for (int i = 0; i < rows; ++i) t[i] = (i * 7919) % vocab;
  DeviceArray<int32_t> targets(rows);
  gpu::copy_to_device(targets.data(), t.data(), rows * sizeof(int32_t));
  omni::ops::ClassifierLossArgs a;
  a.rows = rows, a.hidden = hidden, a.vocab = vocab;
  char label[96];
  std::snprintf(label, sizeof label, "classifier + cross-entropy fwd+bwd %dx%dx%d", rows, hidden,
                vocab);
  report(label, time_ms([&] {
           gpu::classifier_cross_entropy<bf16>(nullptr, dh.data(), dw.data(), h.data(), w.data(),
                                               targets.data(), nullptr, a);
         }),
         6.0 * rows * hidden * double(vocab), 0);
}

void bench_adamw(size_t n) {
  DeviceArray<float> p(n), g(n), m(n), v(n);
  for (auto* a : {&p, &g, &m, &v}) gpu::fill_zero(a->data(), n * sizeof(float));
  DeviceArray<bf16> copy(n);
  const gpu::AdamWStep s{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f};
  char label[96];
  std::snprintf(label, sizeof label, "adamw update %.0fM params (bf16 copy)", n / 1e6);
  report(label, time_ms([&] {
           gpu::adamw_update(p.data(), copy.data(), g.data(), m.data(), v.data(), n, s);
         }),
         0, n * (4.0 * 4 + 3 * 4 + 2));  // read p, g, m, v; write p, m, v, copy
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "bench_gpu_ops: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_ops: no GPU visible; nothing measured\n");
    return 0;
  }
  try {
    bench_linear("linear 8192x4096x4096", 8192, 4096, 4096);
    bench_linear("GPT-2 qkv 32768x768x2304", 32768, 768, 2304);
    bench_linear("Llama-1B fc1 8192x2048x16384", 8192, 2048, 16384);
    bench_moe_experts(16, 2048, 768, 4096);
    bench_attention(4, 16, 16, 4096, 128);
    bench_attention(32, 12, 12, 1024, 64);  // GPT-2 124M, micro-batch 32
    bench_attention(4, 32, 8, 2048, 64);    // Llama 3.2 1B, micro-batch 4
    bench_norms(32768, 768);
    bench_norms(8192, 2048);
    bench_elementwise(8192, 8192);
    bench_cross_entropy(8192, 768, 50304);
    bench_adamw(124000000);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}

#else
int main() {
  std::printf("bench_gpu_ops: built without a GPU backend (OMNITRON_CUDA/OMNITRON_HIP)\n");
  return 0;
}
#endif
