// Token dispatch on the device (moe_kernels.h; backend/moe_ops.h for the meaning): the
// permutation of tokens into the experts' rows and back with the combine weights, read from a
// plan the host built (MoEDevicePlan), the grouped GEMM as one linear op per expert on its rows
// of one buffer, and the shared expert's gate. Gathers only (each output element is written by
// one thread, summing its token's rows in row order): no atomics, the same bits on every run.
#include <cmath>

#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/moe_kernels.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 128;
constexpr int kScratchSlot = 21;  // the shared gate's per-token gradients

inline unsigned grid_of(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

template <typename T>
__global__ void permute_kernel(T* out, const T* x, const int32_t* row_token, int rows, int C) {
  const size_t n = size_t(rows) * C, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = x[size_t(row_token[i / C]) * C + i % C];
}

// dx[t, c] (+)= sum over token t's rows of dout[r, c].
template <typename T>
__global__ void gather_rows_kernel(T* dx, const T* dout, const T* row_weight, MoEDevicePlan p,
                                   int C, bool accumulate) {
  const size_t n = size_t(p.tokens) * C, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t t = i / C, c = i % C;
    float s = accumulate ? to_float(dx[i]) : 0.0f;
    for (int j = p.token_offsets[t]; j < p.token_offsets[t + 1]; ++j) {
      const int r = p.token_rows[j];
      const float v = to_float(dout[size_t(r) * C + c]);
      s += row_weight ? to_float(row_weight[r]) * v : v;
    }
    dx[i] = from_float<T>(s);
  }
}

template <typename T>
__global__ void row_weights_kernel(T* row_weight, const T* probs, MoEDevicePlan p) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < p.rows) row_weight[r] = p.row_slot[r] >= 0 ? probs[p.row_slot[r]] : from_float<T>(0.0f);
}

template <typename T>
__global__ void row_weights_backward_kernel(T* dprobs, const T* drow_weight, MoEDevicePlan p) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < p.rows && p.row_slot[r] >= 0) dprobs[p.row_slot[r]] = drow_weight[r];
}

// One block per row: dexpert_out = w dy[token]; drow_weight = <dy[token], expert_out[r]>.
template <typename T>
__global__ void unpermute_backward_kernel(T* dexpert_out, T* drow_weight, const T* dy,
                                          const T* expert_out, const T* row_weight, MoEDevicePlan p,
                                          int C) {
  __shared__ float partial[kWarpSize];
  const int r = blockIdx.x;
  const T* g = dy + size_t(p.row_token[r]) * C;
  const T* v = expert_out + size_t(r) * C;
  T* d = dexpert_out + size_t(r) * C;
  const float w = to_float(row_weight[r]);
  float dot = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float gc = to_float(g[c]);
    d[c] = from_float<T>(w * gc);
    dot += gc * to_float(v[c]);
  }
  dot = block_sum(dot, partial);
  if (threadIdx.x == 0) drow_weight[r] = from_float<T>(dot);
}

// One block per token: gate = sigmoid(x . w), y = h gate.
template <typename T>
__global__ void shared_gate_forward_kernel(T* y, T* gate, const T* h, const T* x, const T* w,
                                           int C) {
  __shared__ float partial[kWarpSize];
  const size_t t = blockIdx.x;
  float z = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) z += to_float(x[t * C + c]) * to_float(w[c]);
  z = block_sum(z, partial);
  const T g = from_float<T>(1.0f / (1.0f + expf(-z)));
  if (threadIdx.x == 0) gate[t] = g;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    y[t * C + c] = from_float<T>(to_float(h[t * C + c]) * to_float(g));
}

// One block per token: dh = dy gate, dz = gate (1 - gate) <dy, h>, dx += dz w.
template <typename T>
__global__ void shared_gate_backward_kernel(T* dh, T* dx, float* dz_out, const T* dy, const T* h,
                                            const T* gate, const T* w, int C) {
  __shared__ float partial[kWarpSize];
  const size_t t = blockIdx.x;
  const float g = to_float(gate[t]);
  float dot = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = to_float(dy[t * C + c]);
    dot += d * to_float(h[t * C + c]);
    dh[t * C + c] = from_float<T>(d * g);
  }
  dot = block_sum(dot, partial);
  const float dz = dot * g * (1.0f - g);
  if (threadIdx.x == 0) dz_out[t] = dz;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dx[t * C + c] = from_float<T>(to_float(dx[t * C + c]) + dz * to_float(w[c]));
}

// dw[c] += sum_t dz[t] x[t, c], tokens in order (one thread per column).
template <typename T>
__global__ void shared_gate_dw_kernel(float* dw, const float* dz, const T* x, int tokens, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int t = 0; t < tokens; ++t) s += dz[t] * to_float(x[size_t(t) * C + c]);
  dw[c] += s;
}

}  // namespace

template <typename T>
void moe_permute(T* out, const T* x, const MoEDevicePlan& plan, int C, Stream stream) {
  launch(permute_kernel<T>, grid_of(size_t(plan.rows) * C), kThreads, 0,
         static_cast<gpuStream_t>(stream), out, x, plan.row_token, plan.rows, C);
}

template <typename T>
void moe_permute_backward(T* dx, const T* dout, const MoEDevicePlan& plan, int C, bool accumulate,
                          Stream stream) {
  launch(gather_rows_kernel<T>, grid_of(size_t(plan.tokens) * C), kThreads, 0,
         static_cast<gpuStream_t>(stream), dx, dout, static_cast<const T*>(nullptr), plan, C,
         accumulate);
}

template <typename T>
void moe_row_weights(T* row_weight, const T* probs, const MoEDevicePlan& plan, Stream stream) {
  launch(row_weights_kernel<T>, ceil_div(size_t(plan.rows), kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), row_weight, probs, plan);
}

template <typename T>
void moe_row_weights_backward(T* dprobs, const T* drow_weight, const MoEDevicePlan& plan,
                              Stream stream) {
  fill_zero(dprobs, size_t(plan.tokens) * plan.topk * sizeof(T), stream);
  launch(row_weights_backward_kernel<T>, ceil_div(size_t(plan.rows), kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), dprobs, drow_weight, plan);
}

template <typename T>
void moe_unpermute(T* y, const T* expert_out, const T* row_weight, const MoEDevicePlan& plan, int C,
                   Stream stream) {
  launch(gather_rows_kernel<T>, grid_of(size_t(plan.tokens) * C), kThreads, 0,
         static_cast<gpuStream_t>(stream), y, expert_out, row_weight, plan, C, false);
}

template <typename T>
void moe_unpermute_backward(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                            const T* row_weight, const MoEDevicePlan& plan, int C, Stream stream) {
  launch(unpermute_backward_kernel<T>, unsigned(plan.rows), kThreads, 0,
         static_cast<gpuStream_t>(stream), dexpert_out, drow_weight, dy, expert_out, row_weight,
         plan, C);
}

template <typename T>
void moe_grouped_linear_forward(T* y, const T* x, const T* w, const T* bias,
                                const int32_t* host_offsets, int experts, int K, int N,
                                Stream stream) {
  for (int e = 0; e < experts; ++e) {
    const int r0 = host_offsets[e], rows = host_offsets[e + 1] - r0;
    if (rows == 0) continue;
    linear_forward(y + size_t(r0) * N, x + size_t(r0) * K, w + size_t(e) * N * K,
                   bias ? bias + size_t(e) * N : nullptr, rows, K, N, stream);
  }
}

template <typename T>
void moe_grouped_linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x,
                                 const T* w, const int32_t* host_offsets, int experts, int K, int N,
                                 Stream stream) {
  for (int e = 0; e < experts; ++e) {
    const int r0 = host_offsets[e], rows = host_offsets[e + 1] - r0;
    if (rows == 0) continue;
    linear_backward(dx ? dx + size_t(r0) * K : nullptr, dw + size_t(e) * N * K,
                    dbias ? dbias + size_t(e) * N : nullptr, dy + size_t(r0) * N,
                    x + size_t(r0) * K, w + size_t(e) * N * K, rows, K, N, false, stream);
  }
}

template <typename T>
void moe_shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens, int C,
                             Stream stream) {
  launch(shared_gate_forward_kernel<T>, unsigned(tokens), kThreads, 0,
         static_cast<gpuStream_t>(stream), y, gate, h, x, w, C);
}

template <typename T>
void moe_shared_gate_backward(T* dh, T* dx, float* dw, const T* dy, const T* h, const T* gate,
                              const T* x, const T* w, int tokens, int C, Stream stream) {
  auto* dz = static_cast<float*>(scratch(size_t(tokens) * sizeof(float), kScratchSlot));
  const auto s = static_cast<gpuStream_t>(stream);
  launch(shared_gate_backward_kernel<T>, unsigned(tokens), kThreads, 0, s, dh, dx, dz, dy, h, gate,
         w, C);
  launch(shared_gate_dw_kernel<T>, ceil_div(size_t(C), kThreads), kThreads, 0, s, dw, dz, x, tokens,
         C);
}

#define OMNI_INSTANTIATE(T)                                                                      \
  template void moe_permute<T>(T*, const T*, const MoEDevicePlan&, int, Stream);                 \
  template void moe_permute_backward<T>(T*, const T*, const MoEDevicePlan&, int, bool, Stream);  \
  template void moe_row_weights<T>(T*, const T*, const MoEDevicePlan&, Stream);                  \
  template void moe_row_weights_backward<T>(T*, const T*, const MoEDevicePlan&, Stream);         \
  template void moe_unpermute<T>(T*, const T*, const T*, const MoEDevicePlan&, int, Stream);     \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const T*,                  \
                                          const MoEDevicePlan&, int, Stream);                    \
  template void moe_grouped_linear_forward<T>(T*, const T*, const T*, const T*, const int32_t*,  \
                                              int, int, int, Stream);                            \
  template void moe_grouped_linear_backward<T>(T*, float*, float*, const T*, const T*, const T*, \
                                               const int32_t*, int, int, int, Stream);           \
  template void moe_shared_gate_forward<T>(T*, T*, const T*, const T*, const T*, int, int,       \
                                           Stream);                                              \
  template void moe_shared_gate_backward<T>(T*, T*, float*, const T*, const T*, const T*,        \
                                            const T*, const T*, int, int, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
