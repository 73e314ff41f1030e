// Token dispatch on the device (moe_kernels.h; backend/moe_ops.h for the meaning): the
// permutation of tokens into the experts' rows and back with the combine weights, read from a
// plan the host built (MoEDevicePlan), the experts' GEMMs on their rows of one buffer (one
// grouped library call where blas::grouped_gemm has one, else one linear op per expert), and
// the shared expert's gate. Gathers only (each output element is written by one thread, summing
// its token's rows in row order): no atomics, the same bits on every run.
#include <cmath>
#include <vector>

#include "backend/gpu/blas.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/moe_kernels.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 128;
constexpr int kScratchSlot = 21;  // the shared gate's per-token gradients
constexpr int kOffsetsSlot = 22;  // the experts' row offsets, for their biases

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

// y[r, :] = bias[expert of r] for every routed row, before the grouped GEMM adds x w^T with
// beta = 1: y is rounded once, as by the per-expert path's fused bias epilogue.
template <typename T>
__global__ void expert_bias_rows_kernel(T* y, const T* bias, const int32_t* offsets, int experts,
                                        int N) {
  const size_t r0 = offsets[0], n = size_t(offsets[experts] - offsets[0]) * N;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int r = int(r0 + i / N);
    int lo = 0, hi = experts;  // the last expert whose rows start at or before r
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (offsets[mid] <= r ? lo : hi) = mid;
    }
    y[r0 * N + i] = bias[size_t(lo) * N + i % N];
  }
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

namespace {

template <typename T>
void per_expert_forward(T* y, const T* x, const T* w, const T* bias, const int32_t* host_offsets,
                        int experts, int K, int N, Stream stream) {
  for (int e = 0; e < experts; ++e) {
    const int r0 = host_offsets[e], rows = host_offsets[e + 1] - r0;
    if (rows == 0) continue;
    linear_forward(y + size_t(r0) * N, x + size_t(r0) * K, w + size_t(e) * N * K,
                   bias ? bias + size_t(e) * N : nullptr, rows, K, N, stream);
  }
}

template <typename T>
void per_expert_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x, const T* w,
                         const int32_t* host_offsets, int experts, int K, int N, Stream stream) {
  for (int e = 0; e < experts; ++e) {
    const int r0 = host_offsets[e], rows = host_offsets[e + 1] - r0;
    if (rows == 0) continue;
    linear_backward(dx ? dx + size_t(r0) * K : nullptr, dw + size_t(e) * N * K,
                    dbias ? dbias + size_t(e) * N : nullptr, dy + size_t(r0) * N,
                    x + size_t(r0) * K, w + size_t(e) * N * K, rows, K, N, false, stream);
  }
}

// The problems linear_forward / linear_backward pose for expert e's `rows` rows (blas.cu's
// accumulate_weight_grad for dw): y = x w^T, dx = dy w, dw += dy^T x.
template <typename T>
blas::GemmProblem expert_problem(int M, int N, int K, bool trans_a, bool trans_b, const T* a,
                                 int lda, const T* b, int ldb, void* d, int ldd, bool float_d,
                                 float beta) {
  blas::GemmProblem p;
  p.M = M, p.N = N, p.K = K;
  p.trans_a = trans_a, p.trans_b = trans_b;
  p.ab_type = dtype_of<T>();
  p.d_type = float_d ? DType::F32 : p.ab_type;
  p.A = a, p.lda = lda, p.B = b, p.ldb = ldb, p.D = d, p.ldd = ldd;
  p.beta = beta;
  return p;
}

}  // namespace

// A bias is written into y first and the grouped GEMM adds onto it; where the problems cannot
// run grouped (blas::can_group), the per-expert path as before (bias in the GEMM's epilogue).
template <typename T>
void moe_grouped_linear_forward(T* y, const T* x, const T* w, const T* bias,
                                const int32_t* host_offsets, int experts, int K, int N,
                                Stream stream) {
  std::vector<blas::GemmProblem> problems;
  for (int e = 0; e < experts; ++e) {
    const int r0 = host_offsets[e], rows = host_offsets[e + 1] - r0;
    if (rows > 0)
      problems.push_back(expert_problem(rows, N, K, false, true, x + size_t(r0) * K, K,
                                        w + size_t(e) * N * K, K, y + size_t(r0) * N, N, false,
                                        bias ? 1.0f : 0.0f));
  }
  const int count = static_cast<int>(problems.size());
  if (!blas::can_group(problems.data(), count).empty())
    return per_expert_forward(y, x, w, bias, host_offsets, experts, K, N, stream);
  const auto s = static_cast<gpuStream_t>(stream);
  if (bias) {
    const size_t bytes = size_t(experts + 1) * sizeof(int32_t);
    auto* offsets = static_cast<int32_t*>(scratch(bytes, kOffsetsSlot));
    OMNI_GPU_CHECK(gpuMemcpyAsync(offsets, host_offsets, bytes, gpuMemcpyHostToDevice, s));
    const size_t n = size_t(host_offsets[experts] - host_offsets[0]) * N;
    launch(expert_bias_rows_kernel<T>, grid_of(n), kThreads, 0, s, y, bias, offsets, experts, N);
  }
  blas::grouped_gemm(problems.data(), count, stream);
}

// dx and dw each as one grouped call where blas::grouped_gemm can (dw of bf16 / f16 activations
// accumulates into float: mixed types, so one GEMM per expert, as accumulate_weight_grad). With
// a bias gradient, or an empty K or N, the per-expert path (linear_backward) as before.
template <typename T>
void moe_grouped_linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x,
                                 const T* w, const int32_t* host_offsets, int experts, int K, int N,
                                 Stream stream) {
  if (dbias || K == 0 || N == 0)
    return per_expert_backward(dx, dw, dbias, dy, x, w, host_offsets, experts, K, N, stream);
  std::vector<blas::GemmProblem> dx_problems, dw_problems;
  for (int e = 0; e < experts; ++e) {
    const int r0 = host_offsets[e], rows = host_offsets[e + 1] - r0;
    if (rows == 0) continue;
    const T* dy_e = dy + size_t(r0) * N;
    const T* w_e = w + size_t(e) * N * K;
    if (dx)
      dx_problems.push_back(expert_problem(rows, K, N, false, false, dy_e, N, w_e, K,
                                           dx + size_t(r0) * K, K, false, 0.0f));
    dw_problems.push_back(expert_problem(N, K, rows, true, false, dy_e, N, x + size_t(r0) * K, K,
                                         dw + size_t(e) * N * K, K, true, 1.0f));
  }
  blas::grouped_gemm(dx_problems.data(), static_cast<int>(dx_problems.size()), stream);
  blas::grouped_gemm(dw_problems.data(), static_cast<int>(dw_problems.size()), stream);
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
