// Runs one step's micro-batches through this rank's pipeline stages in the order
// parallel/schedules.h gives (no pipelining, 1F1B or interleaved 1F1B), handing
// activations forward and gradients backward to the neighbouring stages: receives block,
// sends do not (their buffers are kept until the step ends). With one pipeline rank the
// same code runs F0 B0 F1 B1 ... with no communication.
//
//   PipelineExecutor<float> pipe(model, grid.pp(), virtual_size);
//   pipe.set_grads_ready_hook(hook);   // data-parallel buckets: last micro-batch only
//   double loss_sum = pipe.run(M, [&](int m) -> const MicroBatch& { ... }, true, 1.0 / M);
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "parallel/micro_batch.h"
#include "tensor/tensor.h"

namespace omni {

// What the schedule drives: this rank's model chunks (virtual pipeline stages), one
// micro-batch at a time, each keeping its activations in a slot until its backward.
// GPTModel (model/gpt_model.h) is one; the schedule never includes the model.
template <typename T>
class PipelineChunks {
 public:
  virtual ~PipelineChunks() = default;
  virtual int num_chunks() const = 0;
  virtual int hidden_size() const = 0;
  // Rows of the activations handed between stages: [stage_rows(mb), hidden_size()].
  virtual int stage_rows(const MicroBatch& mb) const = 0;
  // Forward of micro-batch `mb` through chunk `chunk` from `input` (the previous stage's
  // output; unused by the first); returns the output, or null for the chunk that ends with
  // the loss, which it writes to *loss.
  virtual const T* chunk_forward(int chunk, int slot, const MicroBatch& mb, const T* input,
                                 bool train, double grad_scale, double* loss) = 0;
  // Backward from d/d(output) (unused by the chunk with the loss); returns d/d(input), or
  // null for the first chunk.
  virtual const T* chunk_backward(int chunk, int slot, const MicroBatch& mb,
                                  const T* grad_output) = 0;
  // Called during backward with flat-gradient ranges that are final for the micro-batch.
  virtual void set_grads_ready_hook(std::function<void(int64_t, int64_t)> hook) = 0;
  // The device the activations live on, where the schedule's buffers go too.
  virtual const ops::Exec& exec() const = 0;
  virtual Device device() const = 0;
};

template <typename T>
class PipelineExecutor {
 public:
  // `model` holds this rank's chunks (model.num_chunks() == virtual_size); `pp` is the
  // pipeline group. Both must outlive the executor.
  PipelineExecutor(PipelineChunks<T>& model, Communicator& pp);

  // Forward (and with `train`, backward) of micro-batches 0 .. num_microbatches-1, where
  // batch(m) gives micro-batch m (every stage asks for it; the first stage reads its tokens,
  // the last its labels). Gradients of grad_scale * each micro-batch's mean loss are added
  // to the model's gradients. Returns the sum of the micro-batches' mean losses on the last
  // stage, 0 on the others.
  double run(int num_microbatches, const std::function<const MicroBatch&(int)>& batch, bool train,
             double grad_scale);
  // Passed to the model during the backward of the last micro-batch of each chunk only:
  // the gradients it marks ready are final for the step. every_microbatch (ZeRO 2/3): during
  // every micro-batch's backward, each marking ranges final for that micro-batch.
  void set_grads_ready_hook(std::function<void(int64_t, int64_t)> hook,
                            bool every_microbatch = false) {
    grads_ready_ = std::move(hook);
    every_microbatch_ = every_microbatch;
  }

 private:
  PipelineChunks<T>& model_;
  Communicator& pp_;
  std::function<void(int64_t, int64_t)> grads_ready_;
  bool every_microbatch_ = false;
};

}  // namespace omni
