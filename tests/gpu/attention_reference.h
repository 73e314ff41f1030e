// Shared by the GPU attention tests: random inputs rounded to T, the CPU's attention in float
// (ops::attention_forward/backward, the reference) and a GPU backend's forward and backward on
// the same inputs, with the tolerances test_gpu_attention.cpp explains.
#pragma once

#include <algorithm>
#include <limits>

#include "backend/gpu/cudnn_attention.h"
#include "backend/ops.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {

template <typename T>
constexpr double attention_tol() {
  if constexpr (std::is_same_v<T, float>) return 5e-5;
  if constexpr (std::is_same_v<T, bf16>) return 1e-2;
  return 4e-3;
}

inline ::testing::AssertionResult close_scaled(const std::vector<float>& got,
                                        const std::vector<float>& want, double tol) {
  // Floor 1e-2: gradients that cancel to ~0 (one key: dS = P (dP - D) = 0) are rounding noise.
  double peak = 1e-2;
  for (float w : want)
    if (std::isfinite(w)) peak = std::max(peak, double(std::abs(w)));
  return close(got, want, tol, tol * peak);
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

struct Case {
  ops::AttentionDims d;
  std::vector<int32_t> key_start, q_index;  // empty: not used
  uint32_t seed = 1;
};

template <typename T>
struct Inputs {
  std::vector<float> q, k, v, dout;
  explicit Inputs(const Case& c) {
    const auto& d = c.d;
    const size_t N = size_t(d.batch) * d.seq;
    q = rounded<T>(random_vector(N * d.heads * d.head_dim, c.seed));
    k = rounded<T>(random_vector(N * d.groups * d.head_dim, c.seed + 1));
    v = rounded<T>(random_vector(N * d.groups * d.head_dim, c.seed + 2));
    dout = rounded<T>(random_vector(N * d.heads * d.head_dim, c.seed + 3));
  }
};

// The CPU reference in float.
template <typename T>
Result cpu_attention(const Case& c, const Inputs<T>& in) {
  ops::AttentionDims d = c.d;
  if (!c.key_start.empty()) d.key_start = c.key_start.data();
  if (!c.q_index.empty()) d.q_index = c.q_index.data();
  const size_t N = size_t(d.batch) * d.seq;
  Result r;
  r.out.resize(in.q.size());
  r.lse.resize(size_t(d.batch) * d.heads * d.seq);
  ops::attention_forward<float>(r.out.data(), r.lse.data(), in.q.data(), in.k.data(),
                                in.v.data(), d);
  r.dq.resize(in.q.size());
  r.dk.resize(N * d.groups * d.head_dim);
  r.dv.resize(r.dk.size());
  ops::attention_backward<float>(r.dq.data(), r.dk.data(), r.dv.data(), in.dout.data(),
                                 r.out.data(), r.lse.data(), in.q.data(), in.k.data(), in.v.data(),
                                 d);
  return r;
}

enum class GpuAttention { Flash, Fused };

// The GPU forward, then the backward from the GPU's own output and lse (as training runs it),
// with our kernel or cuDNN's.
template <typename T>
Result gpu_attention(const Case& c, const Inputs<T>& in, GpuAttention which = GpuAttention::Flash) {
  ops::AttentionDims d = c.d;
  gpu::DeviceArray<int32_t> key_start, q_index;
  if (!c.key_start.empty()) key_start = to_device(c.key_start), d.key_start = key_start.data();
  if (!c.q_index.empty()) q_index = to_device(c.q_index), d.q_index = q_index.data();
  Device<T> q(in.q), k(in.k), v(in.v), dout(in.dout);
  Device<T> out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  const size_t rows = size_t(d.batch) * d.heads * d.seq;
  gpu::DeviceArray<float> lse(rows);
  if (which == GpuAttention::Flash) {
    gpu::flash_attention_forward(out.get(), lse.data(), q.get(), k.get(), v.get(), d);
    gpu::flash_attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(), lse.data(),
                                  q.get(), k.get(), v.get(), d);
  } else {
    gpu::fused_attention_forward(out.get(), lse.data(), q.get(), k.get(), v.get(), d);
    gpu::fused_attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(), lse.data(),
                                  q.get(), k.get(), v.get(), d);
  }
  Result r;
  r.out = out.host();
  r.lse.resize(rows);
  gpu::copy_to_host(r.lse.data(), lse.data(), rows * sizeof(float));
  r.dq = dq.host();
  r.dk = dk.host();
  r.dv = dv.host();
  return r;
}

}  // namespace omni::gpu_test
