// cuDNN's fused attention (cudnn_attention.h) through cuDNN 9's backend graph API.
//
// cuDNN has no one-call attention for training in its C API: its fused flash-attention engines
// run an operation graph of the shape below, which the library recognises as attention (the
// graph NVIDIA's cudnn-frontend builds for its SDPA node; the tensors between the operations
// are virtual, so nothing but Q, K, V, O and the statistics touches memory):
//
//   forward:  S = Q K^T * scale;  S = causal ? S : -inf;  M = rowmax S;  E = exp(S - M);
//             Z = rowsum E;  Stats = M + log Z;  O = (E / Z) V
//   backward: D = rowsum(dO * O);  P = exp(causal(Q K^T * scale - Stats));
//             dV = P^T dO;  dS = P * (dO V^T - D) * scale;  dK = dS^T Q;  dQ = dS K
//
// (grouped-query heads: K and V broadcast over the heads of a group; dK and dV of the full
// heads are summed per group by a reduction). Our row-major [batch*seq, heads*hd] activations
// are cuDNN's [batch, heads, seq, hd] tensors with strides (seq*heads*hd, hd, heads*hd, 1), so
// nothing is copied. Execution plans are built once per shape (heuristics mode A, first engine
// configuration that finalises) and cached.
//
// Builds without cuDNN compile the stubs at the end of this file.
#include "backend/gpu/cudnn_attention.h"

#include "base/error.h"

#if defined(OMNITRON_CUDNN) && !defined(OMNITRON_GPU_EMULATE) && !defined(OMNITRON_HIP)

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

// ---- Errors: every failure names the cuDNN call and its status ---------------------------------
std::string status_text(cudnnStatus_t s) {
  std::string text = cudnnGetErrorString(s);
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0]) text += std::string(" (") + detail + ")";
  return text;
}

void check(cudnnStatus_t s, const std::string& call) {
  if (s != CUDNN_STATUS_SUCCESS)
    throw InternalError("[fused_attention] " + call + " failed: " + status_text(s));
}
#define OMNI_CUDNN_CHECK(call) check((call), #call)

// ---- Backend descriptors -----------------------------------------------------------------------
struct DestroyDescriptor {
  void operator()(void* d) const { cudnnBackendDestroyDescriptor(d); }
};
using Descriptor = std::unique_ptr<void, DestroyDescriptor>;

Descriptor create(cudnnBackendDescriptorType_t type, const char* type_name) {
  cudnnBackendDescriptor_t d = nullptr;
  check(cudnnBackendCreateDescriptor(type, &d),
        std::string("cudnnBackendCreateDescriptor(") + type_name + ")");
  return Descriptor(d);
}
#define OMNI_CUDNN_CREATE(type) create(type, #type)

void set_attribute(void* d, cudnnBackendAttributeName_t name, const char* attr,
                   cudnnBackendAttributeType_t type, int64_t n, const void* values) {
  check(cudnnBackendSetAttribute(d, name, type, n, values),
        std::string("cudnnBackendSetAttribute(") + attr + ")");
}
#define OMNI_CUDNN_SET(d, attr, type, n, values) set_attribute(d, attr, #attr, type, n, values)

void finalize(void* d, const char* what) {
  check(cudnnBackendFinalize(d), std::string("cudnnBackendFinalize(") + what + ")");
}

using Dims = std::array<int64_t, 4>;

template <typename T>
cudnnDataType_t data_type() {
  return std::is_same_v<T, bf16> ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// The tensors a plan reads and writes, by unique id; virtual tensors number from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kDO,
  kDQ,
  kDK,
  kDV,
  kRowDot,   // backward: rowsum(dO * O), float [b, h, s, 1], in our workspace
  kDQAccum,  // backward: dQ in float [b, h, s, d], in our workspace
  kFirstVirtual = 100,
};

// An operation graph being built: owns every descriptor until the plan is finalised.
class Graph {
 public:
  void* tensor(int64_t uid, cudnnDataType_t type, Dims dim, Dims stride, bool is_virtual = false,
               bool by_value = false) {
    Descriptor t = OMNI_CUDNN_CREATE(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    const bool virt = is_virtual, value = by_value;
    OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data());
    OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride.data());
    OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value)
      OMNI_CUDNN_SET(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &value);
    finalize(t.get(), "tensor");
    return keep(std::move(t));
  }
  void* virtual_tensor(cudnnDataType_t type, Dims dim, Dims stride) {
    return tensor(next_virtual_++, type, dim, stride, true);
  }
  // A float scalar passed by value at execution (scale, -inf, 1).
  void* scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b][, t]) computed in `precision`; axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, void* x, void* b, void* t, void* y,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor pw = OMNI_CUDNN_CREATE(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    OMNI_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    OMNI_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (axis >= 0) OMNI_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw.get(), "pointwise");
    void* pwd = keep(std::move(pw));
    Descriptor op = OMNI_CUDNN_CREATE(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &x);
    if (b)
      OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                     1, &b);
    if (t)
      OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                     1, &t);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &y);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    finalize(op.get(), "pointwise operation");
    ops_.push_back(keep(std::move(op)));
  }

  // c = a b over the last two dimensions, batched (broadcast) over the first two; float math.
  void matmul(void* a, void* b, void* c) {
    Descriptor mm = OMNI_CUDNN_CREATE(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    OMNI_CUDNN_SET(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(mm.get(), "matmul");
    void* mmd = keep(std::move(mm));
    Descriptor op = OMNI_CUDNN_CREATE(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &a);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &b);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &c);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &mmd);
    finalize(op.get(), "matmul operation");
    ops_.push_back(keep(std::move(op)));
  }

  // y = reduce(x) over the dimensions where y has extent 1 (and x does not); float math.
  void reduction(cudnnReduceTensorOp_t mode, void* x, void* y) {
    Descriptor red = OMNI_CUDNN_CREATE(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    OMNI_CUDNN_SET(red.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                   &mode);
    OMNI_CUDNN_SET(red.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(red.get(), "reduction");
    void* redd = keep(std::move(red));
    Descriptor op = OMNI_CUDNN_CREATE(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &x);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &y);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &redd);
    finalize(op.get(), "reduction operation");
    ops_.push_back(keep(std::move(op)));
  }

  // y views x with other dimensions/strides (a transpose, for the matmuls of the backward).
  void reshape(void* x, void* y) {
    Descriptor op = OMNI_CUDNN_CREATE(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &x);
    OMNI_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &y);
    finalize(op.get(), "reshape operation");
    ops_.push_back(keep(std::move(op)));
  }

  // Causal mask of the scores s (float [b, h, s, s]): keys after the query get -inf.
  void* causal_mask(void* s, void* neg_inf, Dims dim, Dims stride) {
    void* row = virtual_tensor(CUDNN_DATA_INT32, dim, stride);
    void* col = virtual_tensor(CUDNN_DATA_INT32, dim, stride);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
    void* visible = virtual_tensor(CUDNN_DATA_BOOLEAN, dim, stride);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, visible, CUDNN_DATA_BOOLEAN);
    void* masked = virtual_tensor(CUDNN_DATA_FLOAT, dim, stride);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf, visible, masked);
    return masked;
  }

  const std::vector<void*>& ops() const { return ops_; }
  void* keep(Descriptor d) {
    keep_.push_back(std::move(d));
    return keep_.back().get();
  }

 private:
  std::vector<Descriptor> keep_;
  std::vector<void*> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// ---- Plans -------------------------------------------------------------------------------------
struct Plan {
  Graph graph;  // keeps the descriptors the plan was built from alive
  Descriptor plan;
  int64_t workspace_bytes = 0;
};

cudnnHandle_t handle() {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;  // per device, for the life of the process
  int device = 0;
  OMNI_GPU_CHECK(cudaGetDevice(&device));
  const std::lock_guard lock(mutex);
  auto& h = handles[device];
  if (!h) OMNI_CUDNN_CHECK(cudnnCreate(&h));
  return h;
}

// Heuristics mode A's engine configurations for the graph, in its order; the first one that
// finalises into a plan wins.
void build_plan(Plan& p, cudnnHandle_t h) {
  Descriptor op_graph = OMNI_CUDNN_CREATE(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  OMNI_CUDNN_SET(op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  OMNI_CUDNN_SET(op_graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                 static_cast<int64_t>(p.graph.ops().size()), p.graph.ops().data());
  finalize(op_graph.get(), "operation graph");
  void* graph = p.graph.keep(std::move(op_graph));

  Descriptor heur = OMNI_CUDNN_CREATE(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  OMNI_CUDNN_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                 1, &graph);
  OMNI_CUDNN_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(heur.get(), "engine heuristics");
  int64_t count = 0;
  OMNI_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  if (count == 0)
    throw InternalError("[fused_attention] cuDNN's heuristics offer no engine for this graph");
  std::vector<Descriptor> configs;
  std::vector<void*> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(OMNI_CUDNN_CREATE(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back().get());
  }
  OMNI_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                            raw.data()));
  std::string failures;
  for (int64_t i = 0; i < count; ++i) {
    Descriptor plan = OMNI_CUDNN_CREATE(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    OMNI_CUDNN_SET(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    OMNI_CUDNN_SET(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i]);
    const cudnnStatus_t s = cudnnBackendFinalize(plan.get());
    if (s != CUDNN_STATUS_SUCCESS) {
      failures += (failures.empty() ? "" : "; ") + status_text(s);
      continue;
    }
    int64_t got = 0;
    OMNI_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &got, &p.workspace_bytes));
    p.graph.keep(std::move(configs[i]));
    p.plan = std::move(plan);
    return;
  }
  throw InternalError("[fused_attention] cudnnBackendFinalize(execution plan) failed for all " +
                      std::to_string(count) + " engine configurations: " + failures);
}

// Our row-major activations as cuDNN's [b, heads, s, hd] tensors.
struct Layout {
  int64_t b, s, h, g, d;
  explicit Layout(const ops::AttentionDims& a)
      : b(a.batch), s(a.seq), h(a.heads), g(a.groups), d(a.head_dim) {}
  Dims q_dim() const { return {b, h, s, d}; }
  Dims q_stride() const { return {s * h * d, d, h * d, 1}; }
  Dims kv_dim() const { return {b, g, s, d}; }
  Dims kv_stride() const { return {s * g * d, d, g * d, 1}; }
  Dims kv_t_dim() const { return {b, g, d, s}; }  // K^T, V^T: the same memory
  Dims kv_t_stride() const { return {s * g * d, d, 1, g * d}; }
  Dims scores_dim() const { return {b, h, s, s}; }
  Dims scores_stride() const { return {h * s * s, s * s, s, 1}; }
  Dims scores_t_stride() const { return {h * s * s, s * s, 1, s}; }
  Dims row_dim() const { return {b, h, s, 1}; }
  Dims row_stride() const { return {h * s, s, 1, 1}; }
  Dims full_head_stride() const { return {h * s * d, s * d, d, 1}; }
};

std::unique_ptr<Plan> build_forward(const Layout& L, cudnnDataType_t io) {
  auto p = std::make_unique<Plan>();
  Graph& G = p->graph;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT;
  void* q = G.tensor(kQ, io, L.q_dim(), L.q_stride());
  void* kt = G.tensor(kK, io, L.kv_t_dim(), L.kv_t_stride());
  void* v = G.tensor(kV, io, L.kv_dim(), L.kv_stride());
  void* o = G.tensor(kO, io, L.q_dim(), L.q_stride());
  void* stats = G.tensor(kStats, F, L.row_dim(), L.row_stride());
  void* scale = G.scalar(kScale);
  void* neg_inf = G.scalar(kNegInf);
  const Dims sd = L.scores_dim(), ss = L.scores_stride(), rd = L.row_dim(), rs = L.row_stride();

  void* s = G.virtual_tensor(F, sd, ss);
  G.matmul(q, kt, s);
  void* scaled = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled);
  void* masked = G.causal_mask(scaled, neg_inf, sd, ss);
  void* row_max = G.virtual_tensor(F, rd, rs);
  G.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  void* shifted = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_SUB, masked, row_max, nullptr, shifted);
  void* e = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  void* row_sum = G.virtual_tensor(F, rd, rs);
  G.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  void* log_sum = G.virtual_tensor(F, rd, rs);
  G.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, nullptr, log_sum);
  G.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, nullptr, stats);
  void* probs = G.virtual_tensor(io, sd, ss);  // the second matmul reads P in the I/O type
  G.pointwise(CUDNN_POINTWISE_DIV, e, row_sum, nullptr, probs);
  G.matmul(probs, v, o);
  build_plan(*p, handle());
  return p;
}

std::unique_ptr<Plan> build_backward(const Layout& L, cudnnDataType_t io) {
  auto p = std::make_unique<Plan>();
  Graph& G = p->graph;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT;
  void* q = G.tensor(kQ, io, L.q_dim(), L.q_stride());
  void* kt = G.tensor(kK, io, L.kv_t_dim(), L.kv_t_stride());
  void* vt = G.tensor(kV, io, L.kv_t_dim(), L.kv_t_stride());
  void* o = G.tensor(kO, io, L.q_dim(), L.q_stride());
  void* dout = G.tensor(kDO, io, L.q_dim(), L.q_stride());
  void* stats = G.tensor(kStats, F, L.row_dim(), L.row_stride());
  void* dq = G.tensor(kDQ, io, L.q_dim(), L.q_stride());
  void* dk = G.tensor(kDK, io, L.kv_dim(), L.kv_stride());
  void* dv = G.tensor(kDV, io, L.kv_dim(), L.kv_stride());
  void* scale = G.scalar(kScale);
  void* neg_inf = G.scalar(kNegInf);
  void* one = G.scalar(kOne);
  const Dims sd = L.scores_dim(), ss = L.scores_stride(), rd = L.row_dim(), rs = L.row_stride();
  const Dims st = L.scores_t_stride();

  // D = rowsum(dO * O), stored (float) for the dS of every key tile.
  void* do_o = G.virtual_tensor(F, L.q_dim(), {L.h * L.s * L.d, L.s * L.d, L.h * L.d, 1});
  G.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, do_o);
  void* row_dot = G.virtual_tensor(F, rd, rs);
  G.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, row_dot);
  void* row_dot_stored = G.tensor(kRowDot, F, rd, rs);
  G.pointwise(CUDNN_POINTWISE_MUL, row_dot, one, nullptr, row_dot_stored);

  // P = exp(causal(Q K^T * scale) - Stats)
  void* s = G.virtual_tensor(F, sd, ss);
  G.matmul(q, kt, s);
  void* scaled = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled);
  void* shifted = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, shifted);
  void* masked = G.causal_mask(shifted, neg_inf, sd, ss);
  void* probs = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, probs);

  // Per-head gradients of K and V, summed over the heads of a group when they share one.
  auto head_gradient = [&](void* lhs_t, void* rhs, void* grad) {
    if (L.h == L.g) return G.matmul(lhs_t, rhs, grad);
    void* full = G.virtual_tensor(io, L.q_dim(), L.full_head_stride());
    G.matmul(lhs_t, rhs, full);
    G.reduction(CUDNN_REDUCE_TENSOR_ADD, full, grad);
  };
  // dV = P^T dO
  void* probs_t = G.virtual_tensor(io, {L.b, L.h, L.s, L.s}, st);
  G.reshape(probs, probs_t);
  head_gradient(probs_t, dout, dv);

  // dS = P * (dO V^T - D) * scale
  void* dp = G.virtual_tensor(F, sd, ss);
  G.matmul(dout, vt, dp);
  void* dp_centered = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_SUB, dp, row_dot_stored, nullptr, dp_centered);
  void* ds_unscaled = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_MUL, dp_centered, probs, nullptr, ds_unscaled);
  void* ds = G.virtual_tensor(F, sd, ss);
  G.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, nullptr, ds);

  // dK = dS^T Q
  void* ds_t = G.virtual_tensor(io, {L.b, L.h, L.s, L.s}, st);
  G.reshape(ds, ds_t);
  head_gradient(ds_t, q, dk);

  // dQ = dS K, accumulated in float, then converted
  void* k = G.virtual_tensor(io, L.kv_dim(), L.kv_stride());
  G.reshape(kt, k);
  void* dq_accum = G.tensor(kDQAccum, F, L.q_dim(), L.full_head_stride());
  G.matmul(ds, k, dq_accum);
  G.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq);
  build_plan(*p, handle());
  return p;
}

// Plans by (device, direction, dtype, shape), built once.
const Plan& cached_plan(bool backward, const ops::AttentionDims& d, cudnnDataType_t io) {
  static std::mutex mutex;
  static std::map<std::tuple<int, bool, int, int, int, int, int, int>, std::unique_ptr<Plan>> plans;
  int device = 0;
  OMNI_GPU_CHECK(cudaGetDevice(&device));
  const auto key =
      std::make_tuple(device, backward, int(io), d.batch, d.seq, d.heads, d.groups, d.head_dim);
  const std::lock_guard lock(mutex);
  auto& p = plans[key];
  if (!p) p = backward ? build_backward(Layout(d), io) : build_forward(Layout(d), io);
  return *p;
}

size_t align_up(size_t n) {
  return (n + 255) / 256 * 256;
}

void execute(const Plan& p, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
             void* workspace, Stream stream) {
  static std::mutex mutex;  // the handle's stream is shared state
  const std::lock_guard lock(mutex);
  cudnnHandle_t h = handle();
  OMNI_CUDNN_CHECK(cudnnSetStream(h, static_cast<cudaStream_t>(stream)));
  Descriptor pack = OMNI_CUDNN_CREATE(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  OMNI_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                 static_cast<int64_t>(uids.size()), uids.data());
  OMNI_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                 static_cast<int64_t>(pointers.size()), pointers.data());
  OMNI_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  finalize(pack.get(), "variant pack");
  OMNI_CUDNN_CHECK(cudnnBackendExecute(h, p.plan.get(), pack.get()));
}

constexpr int kWorkspaceSlot = 12;  // gpu::scratch slot (blas.h uses 8..11)

// Reasons cuDNN's fused attention does not take a shape, before asking cuDNN itself.
template <typename T>
std::string static_refusal(const ops::AttentionDims& d, int major) {
  if (std::is_same_v<T, float>) return "cuDNN's fused attention takes bf16 and f16, not f32";
  if (major < 8)
    return "cuDNN's fused attention needs compute capability 8.0 or newer (this GPU has " +
           std::to_string(major) + ".x)";
  const int max_hd = major >= 9 ? 256 : 128;
  if (d.head_dim % 8 != 0 || d.head_dim > max_hd)
    return "head_dim " + std::to_string(d.head_dim) + " is not a multiple of 8 up to " +
           std::to_string(max_hd);
  if (d.groups <= 0 || d.heads % d.groups != 0)
    return "heads " + std::to_string(d.heads) + " are not a multiple of groups " +
           std::to_string(d.groups);
  if (d.key_start)
    return "packed documents (--reset-attention-mask) need per-row key ranges, which cuDNN's "
           "causal mask does not take";
  if (d.q_index)
    return "ring attention's key blocks (context parallelism) need per-row key ranges, which "
           "cuDNN's causal mask does not take";
  if (cudnnGetVersion() < 91600 && d.seq % 128 != 0)
    return "cuDNN before 9.16 needs a padding mask for sequences not a multiple of 128 (seq " +
           std::to_string(d.seq) + ")";
  return "";
}

int compute_capability_major() {
  int device = 0, major = 0;
  OMNI_GPU_CHECK(cudaGetDevice(&device));
  OMNI_GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

// The plan for a call, after the checks cuDNN cannot make (it would ignore key_start).
template <typename T>
const Plan& plan_for(bool backward, const ops::AttentionDims& d) {
  if (const std::string why = static_refusal<T>(d, compute_capability_major()); !why.empty())
    throw InternalError("[fused_attention] " + why);
  return cached_plan(backward, d, data_type<T>());
}

}  // namespace

bool has_cudnn() {
  return true;
}

std::string cudnn_version_string() {
  const size_t v = cudnnGetVersion();  // major*10000 + minor*100 + patch
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

template <typename T>
bool fused_attention_supported(const ops::AttentionDims& d, std::string* why) {
  std::string reason;
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      reason = "no CUDA device is visible";
    } else {
      reason = static_refusal<T>(d, compute_capability_major());
      if (reason.empty()) {
        // cuDNN's own answer: build (and cache) both plans.
        cached_plan(false, d, data_type<T>());
        cached_plan(true, d, data_type<T>());
      }
    }
  } catch (const std::exception& e) {
    reason = e.what();
  }
  if (why) *why = reason;
  return reason.empty();
}

template <typename T>
void fused_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const ops::AttentionDims& d, Stream stream) {
  const Plan& p = plan_for<T>(false, d);
  float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  float neg_inf = -std::numeric_limits<float>::infinity();
  void* workspace = p.workspace_bytes ? scratch(p.workspace_bytes, kWorkspaceSlot) : nullptr;
  execute(p, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
          {const_cast<T*>(q), const_cast<T*>(k), const_cast<T*>(v), out, lse, &scale, &neg_inf},
          workspace, stream);
}

template <typename T>
void fused_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const ops::AttentionDims& d,
                              Stream stream) {
  const Plan& p = plan_for<T>(true, d);
  const size_t rows = size_t(d.batch) * d.heads * d.seq;
  const size_t plan_bytes = align_up(p.workspace_bytes), row_bytes = align_up(rows * 4);
  const size_t accum_bytes = rows * d.head_dim * sizeof(float);
  auto* base =
      static_cast<unsigned char*>(scratch(plan_bytes + row_bytes + accum_bytes, kWorkspaceSlot));
  void* row_dot = base + plan_bytes;
  void* dq_accum = base + plan_bytes + row_bytes;
  OMNI_GPU_CHECK(cudaMemsetAsync(dq_accum, 0, accum_bytes, static_cast<cudaStream_t>(stream)));
  float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  float neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
  execute(p, {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kNegInf, kOne, kRowDot, kDQAccum},
          {const_cast<T*>(q), const_cast<T*>(k), const_cast<T*>(v), const_cast<T*>(out),
           const_cast<T*>(dout), const_cast<float*>(lse), dq, dk, dv, &scale, &neg_inf, &one,
           row_dot, dq_accum},
          p.workspace_bytes ? base : nullptr, stream);
}

OMNI_GPU_NAMESPACE_END

#else  // no cuDNN in this build ---------------------------------------------------------------

OMNI_GPU_NAMESPACE_BEGIN
namespace {
[[noreturn]] void no_cudnn() {
#if defined(OMNITRON_HIP)
  throw UsageError("[fused_attention] has no cuDNN in this build (HIP: cuDNN is NVIDIA's)");
#else
  throw UsageError(
      "[fused_attention] has no cuDNN in this build (rebuild with OMNITRON_CUDA=ON where "
      "libcudnn and cudnn.h are installed)");
#endif
}
}  // namespace

bool has_cudnn() {
  return false;
}
std::string cudnn_version_string() {
  return "";
}
template <typename T>
bool fused_attention_supported(const ops::AttentionDims&, std::string* why) {
  if (why) *why = "this build has no cuDNN";
  return false;
}
template <typename T>
void fused_attention_forward(T*, float*, const T*, const T*, const T*, const ops::AttentionDims&,
                             Stream) {
  no_cudnn();
}
template <typename T>
void fused_attention_backward(T*, T*, T*, const T*, const T*, const float*, const T*, const T*,
                              const T*, const ops::AttentionDims&, Stream) {
  no_cudnn();
}

OMNI_GPU_NAMESPACE_END

#endif

OMNI_GPU_NAMESPACE_BEGIN
#define OMNI_INSTANTIATE(T)                                                               \
  template bool fused_attention_supported<T>(const ops::AttentionDims&, std::string*);    \
  template void fused_attention_forward<T>(T*, float*, const T*, const T*, const T*,      \
                                           const ops::AttentionDims&, Stream);            \
  template void fused_attention_backward<T>(T*, T*, T*, const T*, const T*, const float*, \
                                            const T*, const T*, const T*,                 \
                                            const ops::AttentionDims&, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE
OMNI_GPU_NAMESPACE_END
