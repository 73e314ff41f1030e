// Linear layers on the GPU (gpu_ops.h): the matmuls go to blas::gemm (cuBLASLt / hipBLASLt),
// with the bias and bias-GELU folded into its epilogue where the library can; the bias
// gradient is a deterministic column sum.
#include "backend/gpu/blas.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 256;

// The epilogue's pieces for when the GEMM cannot take it: y[m, :] = bias before a beta = 1
// GEMM (one rounding of y, as in the fused epilogue), and gelu_out = gelu(y) after it
// (gelu_forward, elementwise.cu).
template <typename T>
__global__ void broadcast_rows_kernel(T* y, const T* bias, size_t count, int N) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) y[i] = bias[i % N];
}

// dbias += colsum(dy) in two passes with a fixed order (no atomics): each block sums a
// kSumRows x kSumColumns tile of dy into one row of partials, then one thread per column adds
// the partials top to bottom. Threads of a block cover kSumColumns consecutive columns
// (coalesced loads) times kSumLanes interleaved rows.
constexpr int kSumColumns = 64, kSumLanes = kThreads / kSumColumns, kSumRows = 256;

template <typename T>
__global__ void column_sum_partials_kernel(float* partials, const T* dy, int M, int N) {
  __shared__ float lanes[kSumLanes][kSumColumns];
  const int column = blockIdx.x * kSumColumns + threadIdx.x % kSumColumns;
  const int lane = threadIdx.x / kSumColumns;
  const int row_end = M < int(blockIdx.y + 1) * kSumRows ? M : int(blockIdx.y + 1) * kSumRows;
  float s = 0.0f;
  if (column < N)
    for (int r = blockIdx.y * kSumRows + lane; r < row_end; r += kSumLanes)
      s += to_float(dy[size_t(r) * N + column]);
  lanes[lane][threadIdx.x % kSumColumns] = s;
  __syncthreads();
  if (lane == 0 && column < N) {
    for (int l = 1; l < kSumLanes; ++l) s += lanes[l][threadIdx.x];
    partials[size_t(blockIdx.y) * N + column] = s;
  }
}

__global__ void column_sum_finish_kernel(float* dbias, const float* partials, int blocks, int N) {
  const int column = blockIdx.x * blockDim.x + threadIdx.x;
  if (column >= N) return;
  float s = 0.0f;
  for (int b = 0; b < blocks; ++b) s += partials[size_t(b) * N + column];
  dbias[column] += s;
}

}  // namespace

template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* bias, int M, int K, int N, Stream stream,
                    T* gelu_out, GeluForm gelu_form) {
  if (M == 0 || N == 0) return;
  const auto s = static_cast<gpuStream_t>(stream);
  const size_t count = size_t(M) * N;
  const unsigned blocks = ceil_div(count, kThreads);
  blas::GemmProblem p;
  p.M = M, p.N = N, p.K = K;
  p.trans_b = true;  // w is [N, K]
  p.ab_type = p.d_type = dtype_of<T>();
  p.A = x, p.lda = K;
  p.B = w, p.ldb = K;
  p.D = y, p.ldd = N;
  // The library's GELU epilogue is the tanh form: the erf form takes the bias epilogue (D = y)
  // and gelu_forward after it.
  const bool fused_gelu = gelu_out && gelu_form == GeluForm::Tanh;
  if (fused_gelu) {  // D is the activation, aux the pre-activation the backward needs
    p.epilogue = bias ? blas::Epilogue::GeluAuxBias : blas::Epilogue::GeluAux;
    p.D = gelu_out, p.aux = y, p.ld_aux = N;
  } else if (bias) {
    p.epilogue = blas::Epilogue::Bias;
  }
  p.bias = bias;
  if (K > 0 && (p.epilogue == blas::Epilogue::None || blas::Gemm::can_implement(p).empty())) {
    blas::gemm(p, stream);
    if (gelu_out && !fused_gelu) gelu_forward(gelu_out, y, count, gelu_form, stream);
    return;
  }
  // No such epilogue here (e.g. N not a multiple of 8 for the GELU's aux), or the empty
  // product (K = 0): the epilogue's pieces around a plain GEMM.
  p.epilogue = blas::Epilogue::None;
  p.D = y, p.bias = nullptr, p.aux = nullptr, p.ld_aux = 0;
  if (bias) {
    launch(broadcast_rows_kernel<T>, blocks, kThreads, 0, s, y, bias, count, N);
    p.beta = 1.0f;
  } else if (K == 0) {
    fill_zero(y, count * sizeof(T), stream);
  }
  if (K > 0) blas::gemm(p, stream);
  if (gelu_out) gelu_forward(gelu_out, y, count, gelu_form, stream);
}

template <typename T>
void linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x, const T* w, int M,
                     int K, int N, bool accumulate_dx, Stream stream) {
  const auto s = static_cast<gpuStream_t>(stream);
  const DType type = dtype_of<T>();
  if (dx && M > 0 && K > 0) {
    if (N == 0) {
      if (!accumulate_dx) fill_zero(dx, size_t(M) * K * sizeof(T), stream);
    } else {  // dx[M,K] = dy[M,N] w[N,K] (+ dx)
      blas::GemmProblem p;
      p.M = M, p.N = K, p.K = N;
      p.ab_type = p.d_type = type;
      p.A = dy, p.lda = N;
      p.B = w, p.ldb = K;
      p.D = dx, p.ldd = K;
      p.beta = accumulate_dx ? 1.0f : 0.0f;
      blas::gemm(p, stream);
    }
  }
  if (M == 0 || N == 0) return;  // the empty sum adds nothing to dw and dbias
  blas::accumulate_weight_grad(dw, dy, N, x, K, M, N, K, type, stream);
  if (dbias) {
    const unsigned row_blocks = ceil_div(M, kSumRows);
    auto* partials =
        static_cast<float*>(scratch(size_t(row_blocks) * N * sizeof(float), blas::kColumnSumSlot));
    launch(column_sum_partials_kernel<T>, dim3(ceil_div(N, kSumColumns), row_blocks), kThreads, 0,
           s, partials, dy, M, N);
    launch(column_sum_finish_kernel, ceil_div(N, kThreads), kThreads, 0, s, dbias, partials,
           static_cast<int>(row_blocks), N);
  }
}

#define OMNI_INSTANTIATE(T)                                                                    \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int, Stream, T*, \
                                  GeluForm);                                                   \
  template void linear_backward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, \
                                   int, bool, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
