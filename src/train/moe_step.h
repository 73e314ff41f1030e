// A training step's mixture-of-experts bookkeeping, after its backward (Megatron's
// finalize_model_grads and track_moe_metrics): the expert bias's update from the global
// batch's token counts, and the figures the step reports.
#pragma once

#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "tensor/parameters.h"
#include "train/metrics.h"

namespace omni {

// With --moe-router-enable-expert-bias: sums each layer's routed-token counts over the
// data-parallel (and context-parallel) ranks, updates every bias once, and copies the new
// biases into `master` (the fp32 master weights under --bf16/--fp16; null without), so the
// optimizer's copy back to the model keeps them. Then the step's figures, reduced over the
// data-parallel ranks (averaged) and pipeline stages (each holds its own layers): the
// aux-loss tracker values per MoE layer and micro-batch, and each MoE layer's tokens per
// expert. Every rank gets the same figures. A dense model: nothing, and no communication.
template <typename T>
MoEStepMetrics finish_moe_step(GPTModel<T>& model, const ProcessGrid& grid, int micro_batches,
                               ParameterSet<float>* master);

}  // namespace omni
