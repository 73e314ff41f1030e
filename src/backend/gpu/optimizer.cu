// The optimizer's kernels: the gradient norm's sum of squares, the loss scaler's overflow
// check and the AdamW update (src/optim/optimizer.cpp's update_elements, per element the same
// formula). Memory-bound: float4 packs where aligned, grid-stride loops (vectorized.h).
#include <cmath>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kFloatPack = kPackWidth<float>;

OMNI_DEVICE double warp_sum_double(double v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += warp_shfl_xor(v, m);
  return v;
}

// Sum over the block in a fixed order (lane order within warps, then warp order), valid in
// thread 0. blockDim.x is a multiple of the warp size.
OMNI_DEVICE double block_sum_double(double v) {
  __shared__ double warp_sums[1024 / 32];  // enough for 1024 threads at any warp size
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_sum_double(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarpSize); ++w) s += warp_sums[w];
  return s;
}

// What an element adds to a sum: its square (the gradient norm) or 1 when it is zero.
enum class Term { Square, Zero };
template <Term K>
__device__ double term(float f) {
  if constexpr (K == Term::Square)
    return static_cast<double>(f) * f;
  else
    return f == 0.0f ? 1.0 : 0.0;
}

// partial[blockIdx.x] = sum of term(x) over the elements this block's threads visit. The
// visiting order depends only on n and the grid, which depends only on n: the same bits every
// run.
template <int V, Term K = Term::Square>
__global__ void sum_terms_kernel(double* partial, const float* x, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const size_t first = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  double s = 0.0;
  const size_t packs = n / V;
  for (size_t p = first; p < packs; p += stride) {
    const Pack<float, V> v = load_pack<V>(x, p);
    for (int k = 0; k < V; ++k) s += term<K>(v.v[k]);
  }
  for (size_t i = packs * V + first; i < n; i += stride) s += term<K>(x[i]);
  s = block_sum_double(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block adds the partials: thread t takes t, t + blockDim.x, ... in order, then the block
// sums the threads in order.
__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum_double(s);
  if (threadIdx.x == 0) *out = s;
}

// Sets *flag when an element is inf or NaN: the exponent bits all ones, tested on the bits so
// fast-math compilation cannot assume it away. Every writer stores the same 1: no race on the
// result.
template <int V>
__global__ void nonfinite_kernel(int* flag, const float* x, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const size_t first = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  auto bad = [](float f) { return (float_bits(f) & 0x7f800000u) == 0x7f800000u; };
  bool found = false;
  const size_t packs = n / V;
  for (size_t p = first; p < packs; p += stride) {
    const Pack<float, V> v = load_pack<V>(x, p);
    for (int k = 0; k < V; ++k) found |= bad(v.v[k]);
  }
  for (size_t i = packs * V + first; i < n; i += stride) found |= bad(x[i]);
  if (found) *flag = 1;
}

struct AdamWConstants {
  float lr_wd;         // lr * weight_decay
  float beta1, beta2;  // and 1 - beta, rounded to float as update_elements rounds them
  float one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / bias_correction1
  float inv_sqrt_bc2;  // 1 / sqrt(bias_correction2)
  float eps, grad_scale;
};

// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), in update_elements'
// order: w -= lr wd w; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// w -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
OMNI_DEVICE void adamw_element(float& w, float& m, float& v, float grad, const AdamWConstants& c) {
  const float g = grad * c.grad_scale;
  w -= c.lr_wd * w;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  w -= c.step_size * m / (sqrtf(v) * c.inv_sqrt_bc2 + c.eps);
}

template <int V, typename T>
__global__ void adamw_kernel(float* params, T* model_copy, const float* grads, float* exp_avg,
                             float* exp_avg_sq, size_t n, AdamWConstants c) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const size_t first = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const size_t packs = n / V;
  for (size_t p = first; p < packs; p += stride) {
    Pack<float, V> w = load_pack<V>(params, p), m = load_pack<V>(exp_avg, p),
                   v = load_pack<V>(exp_avg_sq, p);
    const Pack<float, V> g = load_pack<V>(grads, p);
    for (int k = 0; k < V; ++k) adamw_element(w.v[k], m.v[k], v.v[k], g.v[k], c);
    store_pack<V>(params, p, w);
    store_pack<V>(exp_avg, p, m);
    store_pack<V>(exp_avg_sq, p, v);
    if (model_copy) {
      Pack<T, V> t;
      for (int k = 0; k < V; ++k) t.v[k] = from_float<T>(w.v[k]);
      store_pack<V>(model_copy, p, t);
    }
  }
  for (size_t i = packs * V + first; i < n; i += stride) {
    float w = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(w, m, v, grads[i], c);
    params[i] = w, exp_avg[i] = m, exp_avg_sq[i] = v;
    if (model_copy) model_copy[i] = from_float<T>(w);
  }
}

}  // namespace

double sum_squares(const float* const* arrays, const size_t* sizes, int count, Stream stream) {
  const auto s = static_cast<gpuStream_t>(stream);
  std::vector<unsigned> blocks(count);
  int total = 0;
  for (int i = 0; i < count; ++i) {
    blocks[i] = grid_for(ceil_div(sizes[i], kFloatPack));
    total += static_cast<int>(blocks[i]);
  }
  // partials[0..total) then the result.
  auto* partial = static_cast<double*>(scratch((total + 1) * sizeof(double)));
  int offset = 0;
  for (int i = 0; i < count; ++i) {
    if (aligned_to(16, arrays[i]))
      launch(sum_terms_kernel<kFloatPack>, blocks[i], kThreads, 0, s, partial + offset, arrays[i],
             sizes[i]);
    else
      launch(sum_terms_kernel<1>, blocks[i], kThreads, 0, s, partial + offset, arrays[i],
             sizes[i]);
    offset += static_cast<int>(blocks[i]);
  }
  double result = 0.0;
  if (total == 0) return result;
  launch(sum_partials_kernel, 1, 1024, 0, s, partial + total, partial, total);
  synchronize(stream);
  copy_to_host(&result, partial + total, sizeof(double));
  return result;
}

double count_zeros(const float* x, size_t n, Stream stream) {
  if (n == 0) return 0.0;
  const auto s = static_cast<gpuStream_t>(stream);
  const unsigned blocks = grid_for(ceil_div(n, kFloatPack));
  auto* partial = static_cast<double*>(scratch((blocks + 1) * sizeof(double)));
  if (aligned_to(16, x))
    launch(sum_terms_kernel<kFloatPack, Term::Zero>, blocks, kThreads, 0, s, partial, x, n);
  else
    launch(sum_terms_kernel<1, Term::Zero>, blocks, kThreads, 0, s, partial, x, n);
  launch(sum_partials_kernel, 1, 1024, 0, s, partial + blocks, partial, int(blocks));
  synchronize(stream);
  double result = 0.0;
  copy_to_host(&result, partial + blocks, sizeof(double));
  return result;
}

bool has_nonfinite(const float* x, size_t n, Stream stream) {
  if (n == 0) return false;
  const auto s = static_cast<gpuStream_t>(stream);
  auto* flag = static_cast<int*>(scratch(sizeof(int)));
  fill_zero(flag, sizeof(int), stream);
  if (aligned_to(16, x))
    launch(nonfinite_kernel<kFloatPack>, grid_for(ceil_div(n, kFloatPack)), kThreads, 0, s, flag, x,
           n);
  else
    launch(nonfinite_kernel<1>, grid_for(n), kThreads, 0, s, flag, x, n);
  synchronize(stream);
  int found = 0;
  copy_to_host(&found, flag, sizeof(int));
  return found != 0;
}

template <typename T>
void adamw_update(float* params, T* model_copy, const float* grads, float* exp_avg,
                  float* exp_avg_sq, size_t n, const AdamWStep& st, Stream stream) {
  // The step's scalars as update_elements forms them: lr / bc1 and 1 / sqrt(bc2) in double,
  // then rounded once.
  const AdamWConstants c{st.lr * st.weight_decay,
                         st.beta1,
                         st.beta2,
                         1.0f - st.beta1,
                         1.0f - st.beta2,
                         static_cast<float>(double{st.lr} / st.bias_correction1),
                         static_cast<float>(1.0 / std::sqrt(double{st.bias_correction2})),
                         st.eps,
                         st.grad_scale};
  constexpr int V = kFloatPack;
  const auto s = static_cast<gpuStream_t>(stream);
  if (aligned_to(16, params, grads, exp_avg, exp_avg_sq) && aligned_to(sizeof(T) * V, model_copy))
    launch(adamw_kernel<V, T>, grid_for(ceil_div(n, V)), kThreads, 0, s, params, model_copy, grads,
           exp_avg, exp_avg_sq, n, c);
  else
    launch(adamw_kernel<1, T>, grid_for(n), kThreads, 0, s, params, model_copy, grads, exp_avg,
           exp_avg_sq, n, c);
}

// SGD with momentum and (coupled) weight decay, as optim/optimizer.cpp's update_elements:
// g' = g + wd w; m = momentum m + g'; w -= lr m.
__global__ void sgd_kernel(float* params, const float* grads, float* momentum_buf, size_t n,
                           float lr, float momentum, float weight_decay) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = grads[i] + weight_decay * params[i];
    const float m = momentum * momentum_buf[i] + g;
    momentum_buf[i] = m;
    params[i] -= lr * m;
  }
}

void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n, float lr,
                float momentum, float weight_decay, Stream stream) {
  if (n == 0) return;
  launch(sgd_kernel, grid_for(n), kThreads, 0, static_cast<gpuStream_t>(stream), params, grads,
         momentum_buf, n, lr, momentum, weight_decay);
}

#define OMNI_INSTANTIATE(T)                                                       \
  template void adamw_update<T>(float*, T*, const float*, float*, float*, size_t, \
                                const AdamWStep&, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
