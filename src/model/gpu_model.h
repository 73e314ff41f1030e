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
#include <string>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "base/dtype.h"
#include "model/gpt_model.h"
#include "tensor/parameters.h"
#include "model/transformer_config.h"

OMNI_GPU_NAMESPACE_BEGIN

// What the trainer needs of the GPU model, whatever its storage type.
class GPUTrainingModel {
 public:
  virtual ~GPUTrainingModel() = default;
  virtual int64_t num_params() const = 0;
  virtual double forward_backward(const MicroBatch& mb, double grad_scale) = 0;
  virtual double forward_loss(const MicroBatch& mb) = 0;
  virtual void zero_grads() = 0;
  virtual double grad_sum_squares() const = 0;
  virtual bool grads_nonfinite() const = 0;
  virtual void adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay,
                          int step, float grad_scale) = 0;
  virtual std::vector<float> get_params() const = 0;
  virtual void set_params(const std::vector<float>& values) = 0;
  // AdamW's moments by PyTorch's names ("exp_avg", "exp_avg_sq"), host copies in the
  // parameters' layout (checkpoints).
  virtual std::vector<float> get_state(const std::string& name) const = 0;
  virtual void set_state(const std::string& name, const std::vector<float>& values) = 0;
};

// storage: F32, BF16 or F16.
std::unique_ptr<GPUTrainingModel> make_gpu_model(const TransformerConfig& config, int max_batch,
                                                 uint64_t seed, DType storage);

template <typename T>
class GPUGPTModel final : public GPUTrainingModel {
 public:
  GPUGPTModel(const TransformerConfig& config, int max_batch, uint64_t seed);
  ~GPUGPTModel() override;
  GPUGPTModel(const GPUGPTModel&) = delete;
  GPUGPTModel& operator=(const GPUGPTModel&) = delete;

  const TransformerConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int64_t num_params() const override { return size_; }

  // Micro-batch arrays (tokens, labels, mask, positions, key_start) are host memory, copied
  // to the device per call. Gradients of grad_scale * mean masked loss are added (fp32) to
  // grads(); returns the mean masked loss.
  double forward_backward(const MicroBatch& mb, double grad_scale) override;
  double forward_loss(const MicroBatch& mb) override;

  // Flat fp32 buffers on the device, in infos()'s layout.
  float* master() const { return master_.data(); }
  float* grads() const { return grads_.data(); }
  void zero_grads() override;
  // Host copies, in infos()'s layout (for tests and checkpoints); set_params also refreshes
  // the T copy the forward reads.
  std::vector<float> get_params() const override;
  std::vector<float> get_grads() const;
  void set_params(const std::vector<float>& values) override;
  std::vector<float> get_state(const std::string& name) const override;
  void set_state(const std::string& name, const std::vector<float>& values) override;

  // Sum of squares of every gradient (fp32, summed in double in a fixed order).
  double grad_sum_squares() const override;
  // True when a gradient holds inf or NaN (fp16's loss scaler skips the step).
  bool grads_nonfinite() const override;
  // One AdamW step over every parameter (weight decay only where ParamInfo says);
  // grad_scale multiplies the gradients first (1/loss scale times the clipping factor).
  void adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale) override;

 private:
  struct Layer;
  struct Buffers;
  void refresh_model_copy();
  const DeviceArray<float>& state(const std::string& name) const;
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
