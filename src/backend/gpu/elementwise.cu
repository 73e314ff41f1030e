// Element-wise ops: conversions, sums, bias, GELU and SwiGLU (ops.h for their definitions).
// Memory-bound: each thread moves 16-byte packs (vectorized.h) when the pointers and sizes
// allow, else single elements, in grid-stride loops; arithmetic in float.
#include "backend/gpu/gelu.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

OMNI_DEVICE float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));  // exp overflow gives 1/inf = 0, the right limit
}

struct Identity {
  OMNI_DEVICE float operator()(float x) const { return x; }
};
struct Sum {
  OMNI_DEVICE float operator()(float a, float b) const { return a + b; }
};
template <GeluForm kForm>
struct Gelu {
  OMNI_DEVICE float operator()(float x) const {
    return kForm == GeluForm::Erf ? gelu_erf(x) : gelu_tanh(x);
  }
};
template <GeluForm kForm>
struct GeluBackward {
  OMNI_DEVICE float operator()(float dout, float x) const {
    return dout * (kForm == GeluForm::Erf ? gelu_erf_derivative(x) : gelu_tanh_derivative(x));
  }
};

// out[i] = op(a[i]) or op(a[i], b[i]) for kInputs = 1 or 2; V = elements per pack (1: scalar).
template <int V, int kInputs, typename D, typename S, typename Op>
__global__ void map_kernel(D* out, const S* a, const S* b, size_t n, Op op) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const size_t first = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  auto apply = [&](S x, S y) {
    if constexpr (kInputs == 1) {
      return from_float<D>(op(to_float(x)));
    } else {
      return from_float<D>(op(to_float(x), to_float(y)));
    }
  };
  const size_t packs = n / V;
  for (size_t p = first; p < packs; p += stride) {
    const Pack<S, V> x = load_pack<V>(a, p);
    Pack<S, V> y{};
    if constexpr (kInputs == 2) y = load_pack<V>(b, p);
    Pack<D, V> o;
    for (int k = 0; k < V; ++k) o.v[k] = apply(x.v[k], y.v[k]);
    store_pack<V>(out, p, o);
  }
  for (size_t i = packs * V + first; i < n; i += stride)  // the last n % V elements
    out[i] = apply(a[i], kInputs == 2 ? b[i] : S{});
}

template <int kInputs, typename D, typename S, typename Op>
void map_elements(D* out, const S* a, const S* b, size_t n, Op op, Stream stream) {
  constexpr int V = kPackWidth<std::conditional_t<(sizeof(D) > sizeof(S)), D, S>>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (aligned_to(sizeof(S) * V, a, b) && aligned_to(sizeof(D) * V, out))
    launch(map_kernel<V, kInputs, D, S, Op>, grid_for(ceil_div(n, V)), kThreads, 0, s, out, a, b, n,
           op);
  else
    launch(map_kernel<1, kInputs, D, S, Op>, grid_for(n), kThreads, 0, s, out, a, b, n, op);
}

// y[m, :] += bias, V columns per thread; the thread keeps its bias pack across rows.
template <int V, typename T>
__global__ void add_bias_kernel(T* y, const T* bias, int M, int N) {
  const int cols = N / V;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    const Pack<T, V> b = load_pack<V>(bias, c);
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
      const size_t p = static_cast<size_t>(m) * cols + c;
      Pack<T, V> r = load_pack<V>(y, p);
      for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(to_float(r.v[k]) + to_float(b.v[k]));
      store_pack<V>(y, p, r);
    }
  }
}

// Row n of x is [gate | up], F columns each (Megatron's chunk order); out[n, f] = silu(gate) up.
template <int V, typename T>
__global__ void swiglu_forward_kernel(T* out, const T* x, int N, int F) {
  const int cols = F / V;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
      const size_t row = static_cast<size_t>(n) * 2 * cols;
      const Pack<T, V> g = load_pack<V>(x, row + c), u = load_pack<V>(x, row + cols + c);
      Pack<T, V> o;
      for (int k = 0; k < V; ++k) {
        const float gate = to_float(g.v[k]);
        o.v[k] = from_float<T>(gate * sigmoid(gate) * to_float(u.v[k]));
      }
      store_pack<V>(out, static_cast<size_t>(n) * cols + c, o);
    }
  }
}

// dgate = dout up sig (1 + gate (1 - sig)) (the derivative of gate sig(gate)), dup = dout silu.
template <int V, typename T>
__global__ void swiglu_backward_kernel(T* dx, const T* dout, const T* x, int N, int F) {
  const int cols = F / V;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
      const size_t row = static_cast<size_t>(n) * 2 * cols;
      const Pack<T, V> g = load_pack<V>(x, row + c), u = load_pack<V>(x, row + cols + c);
      const Pack<T, V> d = load_pack<V>(dout, static_cast<size_t>(n) * cols + c);
      Pack<T, V> dg, du;
      for (int k = 0; k < V; ++k) {
        const float gate = to_float(g.v[k]), up = to_float(u.v[k]), grad = to_float(d.v[k]);
        const float sig = sigmoid(gate);
        dg.v[k] = from_float<T>(grad * up * sig * (1.0f + gate * (1.0f - sig)));
        du.v[k] = from_float<T>(grad * gate * sig);
      }
      store_pack<V>(dx, row + c, dg);
      store_pack<V>(dx, row + cols + c, du);
    }
  }
}

}  // namespace

template <typename T>
void convert_from_float(T* dst, const float* src, size_t n, Stream stream) {
  map_elements<1>(dst, src, static_cast<const float*>(nullptr), n, Identity{}, stream);
}

template <typename T>
void convert_to_float(float* dst, const T* src, size_t n, Stream stream) {
  map_elements<1>(dst, src, static_cast<const T*>(nullptr), n, Identity{}, stream);
}

template <typename T>
void add(T* out, const T* a, const T* b, size_t n, Stream stream) {
  map_elements<2>(out, a, b, n, Sum{}, stream);
}

template <typename T>
void gelu_forward(T* out, const T* x, size_t n, GeluForm form, Stream stream) {
  const T* none = nullptr;
  if (form == GeluForm::Erf)
    map_elements<1>(out, x, none, n, Gelu<GeluForm::Erf>{}, stream);
  else
    map_elements<1>(out, x, none, n, Gelu<GeluForm::Tanh>{}, stream);
}

template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n, GeluForm form, Stream stream) {
  if (form == GeluForm::Erf)
    map_elements<2>(dx, dout, x, n, GeluBackward<GeluForm::Erf>{}, stream);
  else
    map_elements<2>(dx, dout, x, n, GeluBackward<GeluForm::Tanh>{}, stream);
}

// The row kernels take packs when V divides the row width and the base pointers are aligned
// (then every row's start is), else single elements.
template <typename T>
void add_bias(T* y, const T* bias, int M, int N, Stream stream) {
  constexpr int V = kPackWidth<T>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (N % V == 0 && aligned_to(sizeof(T) * V, y, bias)) {
    const RowsShape g = rows_shape(M, N / V);
    launch(add_bias_kernel<V, T>, g.grid, g.block, 0, s, y, bias, M, N);
  } else {
    const RowsShape g = rows_shape(M, N);
    launch(add_bias_kernel<1, T>, g.grid, g.block, 0, s, y, bias, M, N);
  }
}

template <typename T>
void swiglu_forward(T* out, const T* x, int N, int F, Stream stream) {
  constexpr int V = kPackWidth<T>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (F % V == 0 && aligned_to(sizeof(T) * V, out, x)) {
    const RowsShape g = rows_shape(N, F / V);
    launch(swiglu_forward_kernel<V, T>, g.grid, g.block, 0, s, out, x, N, F);
  } else {
    const RowsShape g = rows_shape(N, F);
    launch(swiglu_forward_kernel<1, T>, g.grid, g.block, 0, s, out, x, N, F);
  }
}

template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F, Stream stream) {
  constexpr int V = kPackWidth<T>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (F % V == 0 && aligned_to(sizeof(T) * V, dx, dout, x)) {
    const RowsShape g = rows_shape(N, F / V);
    launch(swiglu_backward_kernel<V, T>, g.grid, g.block, 0, s, dx, dout, x, N, F);
  } else {
    const RowsShape g = rows_shape(N, F);
    launch(swiglu_backward_kernel<1, T>, g.grid, g.block, 0, s, dx, dout, x, N, F);
  }
}

#define OMNI_INSTANTIATE(T)                                                         \
  template void convert_from_float<T>(T*, const float*, size_t, Stream);            \
  template void convert_to_float<T>(float*, const T*, size_t, Stream);              \
  template void add<T>(T*, const T*, const T*, size_t, Stream);                     \
  template void add_bias<T>(T*, const T*, int, int, Stream);                        \
  template void gelu_forward<T>(T*, const T*, size_t, GeluForm, Stream);            \
  template void gelu_backward<T>(T*, const T*, const T*, size_t, GeluForm, Stream); \
  template void swiglu_forward<T>(T*, const T*, int, int, Stream);                  \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
