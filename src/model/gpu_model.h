// GPUGPTModel: the transformer of model/gpt_model.h on one GPU, through the GPU op surface
// (backend/gpu/gpu_ops.h), in Megatron's mixed precision: weights, activations and their
// gradients stored as T (bf16, f16 or float), fp32 master weights, fp32 gradient
// accumulation (main_grad) and fp32 AdamW states, all on the device.
//
// Same parameters as the one-rank GPTModel<float> (names, flat layout, initial values: the
// host model initialises them and they are copied over once), the same layer order and the
// same loss, so its losses and gradients are checked against the CPU model's
// (tests/gpu/test_gpu_model.cpp, on the emulator everywhere and on the device where present).
//
// This first GPU path is one rank with every layer: tensor, context and pipeline
// parallelism, qk-layernorm and activation recompute are refused with a message; the CPU
// model has them, and folding both into one model over a backend interface is the next step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "model/gpt_model.h"
#include "model/parameters.h"
#include "model/transformer_config.h"

OMNI_GPU_NAMESPACE_BEGIN

template <typename T>
class GPUGPTModel {
 public:
  GPUGPTModel(const TransformerConfig& config, int max_batch, uint64_t seed);
  ~GPUGPTModel();
  GPUGPTModel(const GPUGPTModel&) = delete;
  GPUGPTModel& operator=(const GPUGPTModel&) = delete;

  const TransformerConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int64_t num_params() const { return size_; }

  // Micro-batch arrays (tokens, labels, mask, positions, key_start) are host memory, copied
  // to the device per call. Gradients of grad_scale * mean masked loss are added (fp32) to
  // grads(); returns the mean masked loss.
  double forward_backward(const MicroBatch& mb, double grad_scale);
  double forward_loss(const MicroBatch& mb);

  // Flat fp32 buffers on the device, in infos()'s layout.
  float* master() const { return master_.data(); }
  float* grads() const { return grads_.data(); }
  void zero_grads();
  // Host copies, in infos()'s layout (for tests and checkpoints); set_params also refreshes
  // the T copy the forward reads.
  std::vector<float> get_params() const;
  std::vector<float> get_grads() const;
  void set_params(const std::vector<float>& values);

  // Sum of squares of every gradient (fp32, summed in double in a fixed order).
  double grad_sum_squares() const;
  // True when a gradient holds inf or NaN (fp16's loss scaler skips the step).
  bool grads_nonfinite() const;
  // One AdamW step over every parameter (weight decay only where ParamInfo says);
  // grad_scale multiplies the gradients first (1/loss scale times the clipping factor).
  void adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale);

 private:
  struct Layer;
  struct Buffers;
  void refresh_model_copy();
  void upload_batch(const MicroBatch& mb);
  void layer_forward(int i, const T* x, T* out);
  void layer_backward(int i, const T* x, T* dres);
  double head(bool train, double grad_scale);
  void norm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int rows);
  void norm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w,
                     const float* mean, const float* rstd, int rows);
  const T* weight(const std::string& name) const;
  float* grad(const std::string& name) const;
  const T* weight_or_null(const std::string& name) const;
  float* grad_or_null(const std::string& name) const;

  TransformerConfig cfg_;
  int max_batch_;
  std::vector<ParamInfo> infos_;
  int64_t size_ = 0;
  DeviceArray<float> master_, grads_, exp_avg_, exp_avg_sq_;
  DeviceArray<T> model_;  // the T copy of master_ the forward reads (unused for float)
  std::unique_ptr<Buffers> b_;
  // The micro-batch being run.
  int batch_ = 0, seq_ = 0, tokens_ = 0;
  double mask_sum_ = 0;
  bool has_key_start_ = false;
};

OMNI_GPU_NAMESPACE_END
