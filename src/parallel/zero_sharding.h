// ZeRO stages 2 and 3 on the data-parallel group (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020; DeepSpeed's
// zero_optimization.stage, Megatron-DeepSpeed's --zero-stage). Stage 1, optimizer states
// sharded, is DistributedOptimizer; this class adds the gradients (stage 2) and the
// parameters (stage 3), over the same shards: DataParallelBuckets' ranges in ReduceScatter
// mode, with buckets closed at every layer's boundary (zero_bucket_boundaries).
//
//   ZeroSharding zero(2, ddp, params);
//   zero.begin_step();                  // gradient buffer empty, accumulator zero
//   ... every micro-batch's backward: zero.grads_ready(begin, end) as a layer finishes;
//   ... stage 3: zero.use_params(range, true) before a layer runs, (range, false) after;
//   zero.finish();  // this rank's ranges of params.grads() hold the averaged gradients
//   dist_optimizer.step(params, lr) (without its all-gather under stage 3)
//
// Stage 2: a bucket is reduce-scattered as soon as one micro-batch's backward has finished
// it; this rank's piece is added to a shard-sized accumulator and the bucket's part of the
// full-size gradient buffer is released. So the gradients of one micro-batch live only for
// the layer in flight, and the rank keeps 1/dp of the accumulated ones. Stage 3: between
// uses the parameter buffer holds only this rank's ranges; a layer's parameters are
// all-gathered before its forward, again before its backward, and released after each.
//
// The flat buffers keep their addresses, so every view the model, the optimizer and the
// checkpoint writer hold stays valid: "released" memory is handed back to the operating
// system (madvise, MADV_DONTNEED) and reads as zeros until written again, so only the pages
// in use are backed. That needs host memory: the CPU, or the emulated GPU whose device memory
// is host memory.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "parallel/data_parallel.h"
#include "tensor/parameters.h"

namespace omni {

// The contents of [p, p + bytes) are no longer needed: the whole pages inside go back to the
// operating system, the partial pages at the ends are zeroed; the range then reads as zeros.
void discard_memory(void* p, size_t bytes);
// Bytes of the pages overlapping [p, p + bytes) that are backed by memory (mincore).
int64_t resident_bytes(const void* p, size_t bytes);

// Where stage 2 and 3 buckets must close: the start of each layer's (and the embedding's and
// output layer's) range of the flat buffer, so a layer is a run of whole buckets.
std::vector<int64_t> zero_bucket_boundaries(const std::vector<ParamInfo>& infos);

class ZeroSharding {
 public:
  // `buckets` (ReduceScatter mode) and `params` must outlive this object. stage: 2 or 3.
  ZeroSharding(int stage, DataParallelBuckets<float>& buckets, ParameterSet<float>& params,
               const ops::Exec& exec = {});

  int stage() const { return stage_; }
  // Before a step's first backward: the gradient buffer reads as zeros and holds no memory.
  void begin_step();
  // [begin, end) (whole parameters) are final for this micro-batch: each bucket they complete
  // is reduce-scattered into the accumulator and released. Collective in bucket order.
  void grads_ready(int64_t begin, int64_t end);
  // After the step's last backward: buckets not yet reduced are; then this rank's ranges of
  // the gradient buffer hold the step's averaged gradients (as DistributedOptimizer reads them).
  void finish();
  // Stage 3: the parameters of [begin, end) are about to be read (all-gathered, collective) or
  // no longer needed (released but for this rank's ranges). Stage 2: nothing.
  void use_params(int64_t begin, int64_t end, bool use);
  // Stage 3: every parameter outside this rank's ranges released (after initialisation, a load).
  void release_params();

  // Resident bytes of the parameter buffer, and of the gradient buffer with the accumulator,
  // measured now; peak(): the largest seen at the calls above since reset_peak().
  struct Bytes {
    int64_t params = 0, grads = 0;
  };
  Bytes resident() const;
  Bytes peak() const { return peak_; }
  void reset_peak() { peak_ = resident(); }

 private:
  void reduce(size_t bucket);
  void sample();
  // The buckets inside [begin, end).
  std::pair<size_t, size_t> buckets_in(int64_t begin, int64_t end) const;

  int stage_;
  DataParallelBuckets<float>& ddp_;
  ParameterSet<float>& params_;
  ops::Exec x_;
  std::vector<size_t> bucket_of_param_;
  std::vector<int> params_in_bucket_, pending_;
  std::vector<bool> param_ready_, reduced_once_;
  // This rank's accumulated piece of each bucket (shard order) and a reduce-scatter's output.
  Tensor accum_, piece_;
  std::vector<int64_t> accum_offset_;
  Bytes peak_;
};

}  // namespace omni
