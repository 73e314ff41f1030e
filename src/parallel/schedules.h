// Pipeline parallelism as pure logic (DESIGN.md: src/parallel): which layers each pipeline
// rank holds, and the order in which a rank runs the forward and backward passes of its
// micro-batches. No communication happens here; the executor runs these op lists with
// blocking receives and non-blocking sends. Both follow Megatron-LM's published rules, so a
// layout accepted or rejected by Megatron is accepted or rejected here, with the same
// layers on the same ranks and the same op order.
//
// Virtual pipeline stages: with interleaving each rank holds `vp` model chunks, and chunk c
// of rank r is virtual stage s = c * pp + r; a micro-batch flows through the virtual
// stages 0, 1, ..., vp * pp - 1, so it visits every rank vp times.
#pragma once

#include <optional>
#include <vector>

namespace omni {

// How the transformer layers are split across pipeline ranks: Megatron's flags.
struct PipelineSplit {
  int num_layers = 1;                    // --num-layers
  int pipeline_model_parallel_size = 1;  // --pipeline-model-parallel-size
  // --num-layers-per-virtual-pipeline-stage; 0: no interleaving.
  int num_layers_per_virtual_pipeline_stage = 0;
  // --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: uneven split,
  // the first (last) stage holds this many layers and the other stages share the rest
  // equally. Not combinable with interleaving (as in Megatron, which asks for
  // --num-virtual-stages-per-pipeline-rank there).
  std::optional<int> decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers;
};

// Layers [begin, end) of the model, numbered from 0.
struct LayerRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
  bool operator==(const LayerRange&) const = default;
};

// The model chunks pipeline rank `rank` holds, in chunk order: one range without
// interleaving, vp ranges with it (chunk c holds layers [(c*pp + rank)*L, (c*pp + rank + 1)*L)).
// Throws UsageError naming the flags and numbers for a split Megatron rejects.
std::vector<LayerRange> pipeline_rank_layers(const PipelineSplit& split, int rank);

// Model chunks per rank (vp): num_layers / (pp * L) with interleaving, else 1. Validates
// the split as pipeline_rank_layers does. Like Megatron, a vp of 1 (L = num_layers / pp) is
// the non-interleaved schedule.
int virtual_pipeline_size(const PipelineSplit& split);

enum class PipelinePass { Forward, Backward };

// One step of a rank's schedule: the forward or backward pass of `microbatch` through the
// rank's model chunk `chunk`.
struct PipelineOp {
  PipelinePass pass = PipelinePass::Forward;
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const PipelineOp&) const = default;
};

// The ops pipeline rank `rank` of `pipeline_size` runs in one training step of
// `num_microbatches` micro-batches with `virtual_size` chunks per rank, in order:
//  - pipeline_size 1: F0 B0 F1 B1 ... (no pipelining);
//  - virtual_size 1: Megatron's 1F1B: min(pp - rank - 1, M) warm-up forwards, then one
//    forward and one backward at a time, then the remaining backwards; at most
//    min(pp - rank, M) micro-batches hold activations at once;
//  - virtual_size > 1: Megatron's interleaved 1F1B, the forwards taking pp micro-batches
//    through chunk 0, the same pp through chunk 1, ..., then the next pp micro-batches;
//    the backwards take the same order with the chunks reversed; warm-up
//    (pp - rank - 1) * 2 + (vp - 1) * pp forwards (at most M * vp).
// forward_only (evaluation): the same forwards in the same order, no backwards.
// The interleaved schedule needs pipeline_size > 1 and num_microbatches a multiple of
// pipeline_size (Megatron's rule with its default micro-batch group of pp); a violation is
// a UsageError.
std::vector<PipelineOp> pipeline_schedule(int pipeline_size, int rank, int num_microbatches,
                                          int virtual_size, bool forward_only = false);

}  // namespace omni
