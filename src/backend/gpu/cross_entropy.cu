// The output layer fused with softmax cross-entropy on the GPU (gpu_ops.h; the CPU op in
// backend/cpu/cross_entropy.cpp is the reference and defines the vocabulary-parallel
// protocol). A chunk of rows at a time:
//   1. logits z = h w[:vocab]^T into a float buffer (GEMM, fp32 output);
//   2. per row, the maximum;                      [reduce: max across the vocabulary ranks]
//   3. per row, sum exp(z - max) and z[target];   [reduce: sum across the vocabulary ranks]
//   4. per row, the loss, and z overwritten in place by
//      dz = grad_scale mask (softmax(z) - onehot(target)), stored as T;
//   5. dh = dz w and dw += dz^T h (GEMMs, dw in fp32).
// The full [rows, vocab] logits never exist, and nothing is summed with atomics: every sum has
// a fixed order, so a run is bit-reproducible.
#include "backend/gpu/cross_entropy.h"

#include <algorithm>
#include <atomic>
#include <cfloat>

#include "backend/gpu/blas.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 256;
constexpr int kTileElements = 4;  // per thread, held in registers between a tile's read and write
std::atomic<size_t> chunk_elements{size_t{1} << 25};

// Rows of the logits buffer start 256 bytes apart (64 floats), the alignment cuBLASLt's
// fastest kernels want, whatever the vocabulary size.
constexpr int kRowAlignElements = 64;

OMNI_DEVICE bool live_row(const float* mask, int n) {
  return !mask || mask[n] != 0.0f;
}

// One block per row of the chunk: its largest logit (-FLT_MAX, the CPU's lowest(), for an
// empty vocabulary slice, so it never wins the max across ranks).
__global__ void row_max_kernel(double* row_max, const float* z, int ldz, int V) {
  __shared__ float reduce_scratch[kWarpSize];
  const float* row = z + size_t(blockIdx.x) * ldz;
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m, reduce_scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

// One block per row: (sum_j exp(z_j - max), z[target] or 0 when another rank holds the target)
// into row_sums[2i], [2i + 1]; zeros for a masked row.
__global__ void row_sums_kernel(double* row_sums, const double* row_max, const float* z, int ldz,
                                int V, const int32_t* targets, const float* mask, int vocab_start) {
  __shared__ float reduce_scratch[kWarpSize];
  const int i = blockIdx.x;
  if (!live_row(mask, i)) {
    if (threadIdx.x == 0) row_sums[2 * i] = row_sums[2 * i + 1] = 0.0;
    return;
  }
  const float* row = z + size_t(i) * ldz;
  const float mx = static_cast<float>(row_max[i]);
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(row[j] - mx);
  s = block_sum(s, reduce_scratch);
  if (threadIdx.x == 0) {
    const int t = targets[i] - vocab_start;
    row_sums[2 * i] = s;
    row_sums[2 * i + 1] = t >= 0 && t < V ? row[t] : 0.0;
  }
}

// One block per row: loss = log(sum) + max - z[target] (in double, like the CPU), and with
// write_grad the row's float logits overwritten by its gradient as T, in place: T element j
// lands in bytes [j sizeof(T), (j+1) sizeof(T)) of the row, inside floats 0..j, so the row is
// walked in tiles of kTileElements * blockDim.x elements and each tile is read whole (barrier)
// before it is written; the GEMMs then read the gradient with a leading dimension of ldz * 4 /
// sizeof(T).
template <typename T>
__global__ void row_finish_kernel(float* z, int ldz, int V, const double* row_max,
                                  const double* row_sums, const int32_t* targets, const float* mask,
                                  int vocab_start, double grad_scale, bool write_grad,
                                  double* row_loss, float* losses) {
  const int i = blockIdx.x;
  float* row = z + size_t(i) * ldz;
  T* grad = reinterpret_cast<T*>(row);
  if (!live_row(mask, i)) {
    if (threadIdx.x == 0) {
      row_loss[i] = 0.0;
      if (losses) losses[i] = 0.0f;
    }
    if (write_grad)
      for (int j = threadIdx.x; j < V; j += blockDim.x) grad[j] = from_float<T>(0.0f);
    return;
  }
  const double sum = row_sums[2 * i], mx = row_max[i];
  const float m = mask ? mask[i] : 1.0f;
  if (threadIdx.x == 0) {
    const double loss = log(sum) + mx - row_sums[2 * i + 1];  // logsumexp(z) - z[target]
    row_loss[i] = m * loss;
    if (losses) losses[i] = static_cast<float>(loss);
  }
  if (!write_grad) return;
  const float g = static_cast<float>(grad_scale * m), scale = static_cast<float>(1.0 / sum) * g;
  const float mxf = static_cast<float>(mx);
  const int t = targets[i] - vocab_start;
  const int tile = kTileElements * blockDim.x;
  for (int base = 0; base < V; base += tile) {
    float d[kTileElements];
    for (int k = 0; k < kTileElements; ++k) {
      const int j = base + k * blockDim.x + threadIdx.x;
      d[k] = j < V ? __expf(row[j] - mxf) * scale - (j == t ? g : 0.0f) : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kTileElements; ++k) {
      const int j = base + k * blockDim.x + threadIdx.x;
      if (j < V) grad[j] = from_float<T>(d[k]);
    }
  }
}

// sum of values[0..n) in a fixed order (one block: strided partial sums, then a tree).
__global__ void total_kernel(double* total, const double* values, int n) {
  __shared__ double warp_sums[kThreads / kWarpSize];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  for (int m = kWarpSize / 2; m > 0; m /= 2) s += warp_shfl_xor(s, m);
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kThreads / kWarpSize; ++w) t += warp_sums[w];
    *total = t;
  }
}

}  // namespace

size_t classifier_chunk_elements() {
  return chunk_elements.load();
}
void set_classifier_chunk_elements(size_t elements) {
  chunk_elements.store(std::max<size_t>(elements, 1));
}

template <typename T>
double classifier_cross_entropy(float* losses, T* dh, float* dw, const T* h, const T* w,
                                const int32_t* targets, const float* mask,
                                const ops::ClassifierLossArgs& a, Stream stream) {
  const int N = a.rows, C = a.hidden, V = a.vocab, v0 = a.vocab_start;
  if (N <= 0) return 0.0;
  const auto s = static_cast<gpuStream_t>(stream);
  const DType type = dtype_of<T>();
  const int ldz = (std::max(V, 1) + kRowAlignElements - 1) / kRowAlignElements * kRowAlignElements;
  const int ld_grad = ldz * static_cast<int>(sizeof(float) / sizeof(T));  // in T elements
  const int chunk = static_cast<int>(std::clamp<size_t>(classifier_chunk_elements() / ldz, 1, N));
  auto* z = static_cast<float*>(scratch(size_t(chunk) * ldz * sizeof(float), blas::kLogitsSlot));
  // [N] mask * loss per row, [chunk] maxima, [2 chunk] (sum, target logit), [1] the total.
  auto* row_loss = static_cast<double*>(
      scratch((size_t(N) + 3 * size_t(chunk) + 1) * sizeof(double), blas::kRowStatisticsSlot));
  double* const row_max = row_loss + N;
  double* const row_sums = row_max + chunk;
  double* const total = row_sums + 2 * size_t(chunk);
  const bool write_grad = dh != nullptr;

  // The reduce callback reads and writes the values directly (a blocking all-reduce): they
  // must be complete before it is called.
  auto reduce = [&](double* values, int n, bool max) {
    if (!a.reduce) return;
    OMNI_GPU_CHECK(gpuStreamSynchronize(s));
    a.reduce(values, n, max);
  };

  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = std::min(chunk, N - r0);
    const T* hb = h + size_t(r0) * C;
    const int32_t* tb = targets + r0;
    const float* mb = mask ? mask + r0 : nullptr;
    if (V > 0 && C > 0) {  // z[rows, V] = h w^T, float output
      blas::GemmProblem p;
      p.M = rows, p.N = V, p.K = C;
      p.trans_b = true;
      p.ab_type = type, p.d_type = DType::F32;
      p.A = hb, p.lda = C;
      p.B = w, p.ldb = C;
      p.D = z, p.ldd = ldz;
      blas::gemm(p, stream);
    } else if (V > 0) {
      fill_zero(z, size_t(rows) * ldz * sizeof(float), stream);
    }
    launch(row_max_kernel, rows, kThreads, 0, s, row_max, z, ldz, V);
    reduce(row_max, rows, true);
    launch(row_sums_kernel, rows, kThreads, 0, s, row_sums, row_max, z, ldz, V, tb, mb, v0);
    reduce(row_sums, 2 * rows, false);
    launch(row_finish_kernel<T>, rows, kThreads, 0, s, z, ldz, V, row_max, row_sums, tb, mb, v0,
           a.grad_scale, write_grad, row_loss + r0, losses ? losses + r0 : nullptr);
    if (!write_grad) continue;
    T* dhb = dh + size_t(r0) * C;
    if (V == 0 || C == 0) {  // no logits on this rank: no gradient either
      fill_zero(dhb, size_t(rows) * C * sizeof(T), stream);
      continue;
    }
    const T* grad = reinterpret_cast<const T*>(z);
    {  // dh[rows, C] = dz[rows, V] w[V, C]
      blas::GemmProblem p;
      p.M = rows, p.N = C, p.K = V;
      p.ab_type = p.d_type = type;
      p.A = grad, p.lda = ld_grad;
      p.B = w, p.ldb = C;
      p.D = dhb, p.ldd = C;
      blas::gemm(p, stream);
    }
    if (dw) blas::accumulate_weight_grad(dw, grad, ld_grad, hb, C, rows, V, C, type, stream);
  }
  launch(total_kernel, 1, kThreads, 0, s, total, row_loss, N);
  double result = 0.0;
  OMNI_GPU_CHECK(gpuMemcpyAsync(&result, total, sizeof(double), gpuMemcpyDeviceToHost, s));
  OMNI_GPU_CHECK(gpuStreamSynchronize(s));
  return result;
}

#define OMNI_INSTANTIATE(T)                                                           \
  template double classifier_cross_entropy<T>(float*, T*, float*, const T*, const T*, \
                                              const int32_t*, const float*,           \
                                              const ops::ClassifierLossArgs&, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
