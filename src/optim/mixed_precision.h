// Mixed precision (--bf16, --fp16) as Megatron's Float16OptimizerWithFloat16Params does it:
// the model computes with bf16 or fp16 parameters, the optimizer updates an fp32 master copy
// ("main params") with fp32 states, and the master is rounded back into the model after each
// step. On the CPU backend the model's ParameterSet<float> stays float but holds only values
// the low precision can represent (bf16/f16 storage, fp32 arithmetic), so the rounding, the
// overflow of fp16 gradients and the loss scaler behave as on a GPU.
//
//   omni::MixedPrecision mp(model.params(), omni::DType::F16, omni::DType::F16);
//   omni::Optimizer<float> optimizer(opts.optim, mp.master());   // fp32 states
//   auto scaler = omni::make_grad_scaler(loss_scale_config, omni::DType::F16);  // null: bf16
//   each iteration:
//     model.params().zero_grads();
//     forward/backward with the loss multiplied by (scaler ? scaler->scale() : 1)
//     bool found_inf = mp.unscale_and_check(scaler ? scaler->scale() : 1);
//     // with tensor/pipeline parallelism (and under the distributed optimizer, data
//     // parallelism too), OR found_inf over those ranks first, as Megatron all-reduces it
//     if (scaler) scaler->update(found_inf);
//     if (found_inf) { log "skipped iteration" and the scale; go on with the next }
//     clip with gradient_norm(mp.master()) / scale_gradients(mp.master(), coeff)
//     optimizer.step(mp.master(), lr);
//     mp.copy_master_to_model();
// On a GPU the model itself is bf16 or f16 (GPTModel<bf16>: 16-bit weights and activations,
// fp32 gradients, Megatron's main_grad), and the master lives in device memory beside it:
//   omni::MixedPrecision mp(model.params(), exec);   // ParameterSet<bf16> or <f16>
// with the same calls as above.
// Checkpoints save and load mp.master() (fp32) as the parameters; after a load, call
// copy_master_to_model(). The distributed optimizer works on mp.master() unchanged: its
// buckets reduce the model's gradients, and checking the whole gradient buffer is safe, as
// an inf in a rank's unreduced part is an inf in the reduced sum too.
// ZeRO 2 and 3 (parallel/zero_sharding.h): mp.keep_only(ddp.shard()) releases the master
// outside the rank's ranges, and both calls above then touch those ranges alone; the caller
// all-gathers the model's values (stage 2) or keeps them sharded (stage 3). found_inf then
// covers the rank's shard only: OR it over the data-parallel group. A GPU's master must then
// live in the device's releasable memory (the constructor's master_memory), and commit_all()
// backs all of it again before a load that writes it whole.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "base/dtype.h"
#include "parallel/data_parallel.h"
#include "tensor/parameters.h"

namespace omni {

// Writes each src[i] rounded to the nearest value of `dtype` (BF16 or F16: base/dtype.h's
// round-to-nearest-even, NaN stays NaN; F32: unchanged) into dst[i], which may be src[i].
// Returns whether any result is inf or NaN, counting values that overflow f16.
bool round_to_dtype(const float* src, float* dst, int64_t n, DType dtype);

class MixedPrecision {
 public:
  // `model` (which must outlive this) gets its values rounded to `dtype` (BF16 or F16); the
  // master starts as their fp32 copy, as Megatron clones its fp16 parameters. Gradients are
  // held in `grad_dtype`: F32, what Megatron always uses with bf16 and with
  // --accumulate-allreduce-grads-in-fp32, or `dtype` (fp16's default). On the CPU, fp16
  // gradient overflow shows only when grad_dtype is F16, since the arithmetic is fp32.
  MixedPrecision(ParameterSet<float>& model, DType dtype, DType grad_dtype);
  // A bf16 or f16 model on `exec`'s device (which must outlive this): float gradients, and a
  // master in the same device memory, or in `master_memory` (the device's releasable memory,
  // which keep_only needs under ZeRO 2/3).
  template <typename T>
  requires is_16bit<T> MixedPrecision(ParameterSet<T>& model, const ops::Exec& exec,
                                      const DeviceMemory* master_memory = nullptr)
      : MixedPrecision(Stored{model.values(), dtype_of<T>(), model.grads(), exec}, model.infos(),
                       model.values_tensor().device(), master_memory) {}

  DType dtype() const { return dtype_; }
  DType grad_dtype() const { return grad_dtype_; }
  // The fp32 parameters the optimizer steps, and their gradients after unscale_and_check.
  ParameterSet<float>& master() { return master_; }
  const ParameterSet<float>& master() const { return master_; }

  // After backward of loss * loss_scale: rounds the model's gradients to grad_dtype (as they
  // are stored, after accumulation over micro-batches) and writes them times 1/loss_scale
  // (an fp32 multiply, exact for powers of two) into the master's gradients. Returns whether
  // any rounded gradient is inf or NaN, in which case the step must be skipped. Given
  // `zeroed`, the model's gradients are zeroed instead of rounded in place where they are the
  // CPU's and this pass reads them all (no keep_only shards), and *zeroed says whether they were.
  bool unscale_and_check(float loss_scale, bool* zeroed = nullptr);
  // After the optimizer step: the model's values := the master's, rounded to dtype.
  void copy_master_to_model();
  // From now on only `ranges` (sorted, disjoint) of the master's values and gradients are
  // kept, the rest released (base/releasable_memory.h) and never read or written by the calls
  // above. Empty ranges: the whole master again.
  void keep_only(std::vector<ShardRange> ranges);
  // The master outside the kept ranges released again (after a load wrote all of it).
  void release_rest();
  // All of the master backed again, so a load may write all of it (a GPU's; host memory is
  // backed by the write); commit(): [begin, end) only (values and gradients).
  void commit_all() { commit(0, master_.size()); }
  void commit(int64_t begin, int64_t end);

 private:
  // A 16-bit model on a GPU: its values, their type, and its float gradients.
  struct Stored {
    void* values;
    DType dtype;
    float* grads;
    ops::Exec exec;
  };
  MixedPrecision(const Stored& model, std::vector<ParamInfo> infos, Device device,
                 const DeviceMemory* master_memory);

  ParameterSet<float>* model_ = nullptr;  // the CPU's: float values rounded to dtype_
  Stored stored_{};                       // else the GPU's
  // The kept ranges: the whole master, or keep_only's.
  const std::vector<ShardRange>& ranges() const { return ranges_; }

  ParameterSet<float> master_;
  DType dtype_, grad_dtype_;
  std::vector<ShardRange> ranges_;
};

}  // namespace omni
