// The op seam's mixture-of-experts ops on the GPU (backend/gpu_moe_backend.h): each through
// moe_kernels.h's functions on the default stream. Built as CUDA, as HIP and on the emulator.
#include "backend/gpu/moe_kernels.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

template <typename T>
class MoeOps final : public GpuMoeOps<T> {
 public:
  void topk_routing_forward(T* probs, int32_t* indices, const T* logits, const T* expert_bias,
                            const ops::MoERoutingArgs& a) const override {
    gpu::moe_topk_routing_forward(probs, indices, logits, expert_bias, a);
  }
  void topk_routing_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices,
                             const ops::MoERoutingArgs& a) const override {
    gpu::moe_topk_routing_backward(dlogits, dprobs, logits, indices, a);
  }
  double aux_loss(T* dlogits, const T* logits, const ops::MoEAuxLossArgs& a,
                  double grad_scale) const override {
    return gpu::moe_aux_loss(dlogits, logits, a, grad_scale);
  }
  void aux_loss_counts(double* counts, const T* logits,
                       const ops::MoEAuxLossArgs& a) const override {
    gpu::moe_aux_loss_counts(counts, logits, a);
  }
  double z_loss(T* dlogits, const T* logits, int tokens, int experts, double coeff,
                double grad_scale) const override {
    return gpu::moe_z_loss(dlogits, logits, tokens, experts, coeff, grad_scale);
  }
  void expert_bias_update(T* expert_bias, const double* tokens_per_expert, int experts,
                          double rate) const override {
    gpu::moe_expert_bias_update(expert_bias, tokens_per_expert, experts, rate);
  }
  void permute(T* out, const T* x, const MoEDevicePlan& plan, int C) const override {
    gpu::moe_permute(out, x, plan, C);
  }
  void permute_backward(T* dx, const T* dout, const MoEDevicePlan& plan, int C,
                        bool accumulate) const override {
    gpu::moe_permute_backward(dx, dout, plan, C, accumulate);
  }
  void row_weights(T* row_weight, const T* probs, const MoEDevicePlan& plan) const override {
    gpu::moe_row_weights(row_weight, probs, plan);
  }
  void row_weights_backward(T* dprobs, const T* drow_weight,
                            const MoEDevicePlan& plan) const override {
    gpu::moe_row_weights_backward(dprobs, drow_weight, plan);
  }
  void unpermute(T* y, const T* expert_out, const T* row_weight, const MoEDevicePlan& plan,
                 int C) const override {
    gpu::moe_unpermute(y, expert_out, row_weight, plan, C);
  }
  void unpermute_backward(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                          const T* row_weight, const MoEDevicePlan& plan, int C) const override {
    gpu::moe_unpermute_backward(dexpert_out, drow_weight, dy, expert_out, row_weight, plan, C);
  }
  void grouped_linear_forward(T* y, const T* x, const T* w, const T* bias,
                              const int32_t* host_offsets, int experts, int K,
                              int N) const override {
    gpu::moe_grouped_linear_forward(y, x, w, bias, host_offsets, experts, K, N);
  }
  void grouped_linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x, const T* w,
                               const int32_t* host_offsets, int experts, int K,
                               int N) const override {
    gpu::moe_grouped_linear_backward(dx, dw, dbias, dy, x, w, host_offsets, experts, K, N);
  }
  void shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens,
                           int C) const override {
    gpu::moe_shared_gate_forward(y, gate, h, x, w, tokens, C);
  }
  void shared_gate_backward(T* dh, T* dx, float* dw, const T* dy, const T* h, const T* gate,
                            const T* x, const T* w, int tokens, int C) const override {
    gpu::moe_shared_gate_backward(dh, dx, dw, dy, h, gate, x, w, tokens, C);
  }
};

}  // namespace

template <typename T>
const ::omni::GpuMoeOps<T>& moe_backend_ops() {
  static const MoeOps<T> instance;
  return instance;
}
template const ::omni::GpuMoeOps<float>& moe_backend_ops<float>();
template const ::omni::GpuMoeOps<bf16>& moe_backend_ops<bf16>();
template const ::omni::GpuMoeOps<f16>& moe_backend_ops<f16>();

OMNI_GPU_NAMESPACE_END
