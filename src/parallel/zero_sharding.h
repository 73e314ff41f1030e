// ZeRO stages 2 and 3 on the data-parallel group (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020; DeepSpeed's
// zero_optimization.stage, Megatron-DeepSpeed's --zero-stage). Stage 1, optimizer states
// sharded, is DistributedOptimizer; this class adds the gradients (stage 2) and the
// parameters (stage 3), over the same shards: DataParallelBuckets' ranges in ReduceScatter
// mode, with buckets closed at every layer's boundary (zero_bucket_boundaries). With MoE the
// experts' parameters are a second bucket set, sharded over the expert-data-parallel group
// (Megatron's expert optimizer groups; train/expert_grads.h), the dense ones over the
// data-parallel group: a layer is then a run of whole buckets of both sets.
//
//   ZeroSharding zero(2, ddp, params);  // or ({&ddp, &expert_buckets}, params)
//   zero.begin_step();                  // gradient buffer empty, accumulator zero
//   ... every micro-batch's backward: zero.grads_ready(begin, end) as a layer finishes;
//   ... stage 3: zero.use_params(range, true) before a layer runs, (range, false) after;
//   zero.finish();  // this rank's ranges of params.grads() hold the averaged gradients
//   dist_optimizer.step(params, lr) (without its all-gather: set_gather_params(false))
//   zero.params_updated();  // stage 2: all-gathered; stage 3: this rank's ranges only
// With --bf16/--fp16 `params` is the model's: the CPU's float values rounded to 16 bits, or
// a GPU's ParameterSet<bf16>/<f16> (16-bit values, float gradients), whose stage 3 gathers
// each layer's 16-bit values; the fp32 master copy keeps only this rank's ranges
// (MixedPrecision::keep_only(buckets.shard())).
//
// Stage 2: a bucket is reduce-scattered as soon as one micro-batch's backward has finished
// it; this rank's piece is added to a shard-sized accumulator and the bucket's part of the
// full-size gradient buffer is released. So the gradients of one micro-batch live only for
// the layer in flight, and the rank keeps 1/dp of the accumulated ones. Stage 3: between
// uses the parameter buffer holds only this rank's ranges; a layer's parameters are
// all-gathered before its forward, again before its backward, and released after each.
//
// A 16-bit model's prefetch sums 16-bit values (x + 0 is exact): NCCL, RCCL and the in-process
// communicator reduce them. MPI cannot, and carries only the CPU's float values (GPU ranks talk
// through NCCL or RCCL; the emulated GPU's ranks run in one process).
//
// The flat buffers keep their addresses, so every view the model, the optimizer and the
// checkpoint writer hold stays valid: "released" memory is handed back (base/
// releasable_memory.h). On the CPU it reads as zeros until written again. On a GPU the flat
// buffers come from the device's releasable memory (ModelParallel::params_memory) and a
// released granule is committed again before it is touched: a parameter range before its
// all-gather; the gradients of the head and the embedding at a micro-batch's start and each
// layer's as its backward starts (use_params), released as each is reduced, so about two
// layers' gradients are backed at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "base/releasable_memory.h"
#include "parallel/data_parallel.h"
#include "tensor/parameters.h"

namespace omni {

// Where stage 2 and 3 buckets must close: the start of each layer's (and the embedding's and
// output layer's) range of the flat buffer, so a layer is a run of whole buckets.
std::vector<int64_t> zero_bucket_boundaries(const std::vector<ParamInfo>& infos);

class ZeroSharding {
 public:
  // `sets`: bucket sets (ReduceScatter mode) over disjoint parameters that together cover
  // them all, each sharded over its own group with its own gradient scale (MoE: the dense
  // parameters over the data-parallel ranks, the experts over the expert-data-parallel ones,
  // train/expert_grads.h); they and `params` must outlive this object. stage: 2 or 3.
  // T: float, or a GPU's bf16/f16 (gradients float either way).
  template <typename T>
  ZeroSharding(int stage, std::vector<DataParallelBuckets<float>*> sets, ParameterSet<T>& params,
               const ops::Exec& exec = {})
      : ZeroSharding(stage, std::move(sets),
                     Flat{params.values(), dtype_of<T>(), params.grads(), &params.infos(),
                          params.size(), params.memory(), params.grads_tensor().device()},
                     exec) {
    static_assert(std::is_same_v<accum_t<T>, float>, "ZeRO shards float gradients");
  }
  template <typename T>
  ZeroSharding(int stage, DataParallelBuckets<float>& buckets, ParameterSet<T>& params,
               const ops::Exec& exec = {})
      : ZeroSharding(stage, std::vector<DataParallelBuckets<float>*>{&buckets}, params, exec) {}

  int stage() const { return stage_; }
  // This rank's ranges of every set's buckets (what it keeps of the values at stage 3, of the
  // gradients after finish(), and steps).
  std::vector<ShardRange> shard() const;
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
  // Before a load writes the parameter buffer: all of it backed (`whole`, or stage 2), else
  // (stage 3, a load that writes this rank's shard) only this rank's ranges.
  void commit_params(bool whole);
  // Stage 3: [begin, end) of the values about to be written outside the hooks (the expert
  // bias's update, the same on every rank): backed (a GPU's; the next use gives it back).
  void commit_values(int64_t begin, int64_t end) const {
    if (stage_ == 3) need(value(begin), value_bytes(end - begin));
  }
  // Stage 3: after a forward-only pass (evaluation), the prefetch its guess started ended, so
  // nothing writes the parameter buffer behind a checkpoint's read. Stage 2: nothing.
  void end_use();
  bool prefetch_in_flight() const { return prefetched_ != kNone; }
  // Stage 3: whether the next layer's all-gather starts while this one computes (default),
  // and how many uses found their parameters prefetched.
  void set_prefetch(bool on) { prefetching_ = on; }
  int64_t prefetch_hits() const { return prefetch_hits_; }
  // The optimizer step (or a load) wrote this rank's ranges of the values: stage 2
  // all-gathers the rest (collective), stage 3 keeps only them.
  void params_updated();

  // Resident bytes of the parameter buffer, and of the gradient buffer with the accumulator,
  // measured now; peak(): the largest seen at the calls above since reset_peak(), sampled
  // only after set_track_peak(true) (bench/bench_zero_memory.cpp).
  struct Bytes {
    int64_t params = 0, grads = 0;
  };
  Bytes resident() const;
  Bytes peak() const { return peak_; }
  void reset_peak() { peak_ = resident(); }
  void set_track_peak(bool on) {
    track_peak_ = on;
    reset_peak();
  }

 private:
  // The model's flat buffers: values of `dtype`, float gradients, laid out as `infos` say.
  struct Flat {
    void* values;
    DType dtype;
    float* grads;
    const std::vector<ParamInfo>* infos;
    int64_t size;
    const DeviceMemory* memory;
    Device device;
  };
  ZeroSharding(int stage, std::vector<DataParallelBuckets<float>*> sets, const Flat& params,
               const ops::Exec& exec);
  // Every set's buckets, from the buffer's end, each with its rank's range and its set.
  struct Bucket {
    GradBucket range;
    ShardRange shard;
    size_t set;
  };
  Communicator& group_of(size_t bucket) const { return sets_[buckets_[bucket].set]->group(); }
  const std::vector<ParamInfo>& param_infos() const { return *params_.infos; }
  // Element i of the values, and the bytes of n of them.
  char* value(int64_t i) const { return static_cast<char*>(params_.values) + i * value_size_; }
  size_t value_bytes(int64_t n) const { return size_t(n) * value_size_; }
  // Every rank's ranges of buckets [first, last) of the values to every rank (collective).
  void all_gather_values(size_t first, size_t last);
  void reduce(size_t bucket);
  void sample();
  // Memory no longer needed: released (host: read as zeros; `zero_ends`: the partial pages or
  // granules at the ends zeroed, else kept). need(): about to be touched (a GPU: committed).
  void drop(void* p, size_t bytes, bool zero_ends) const;
  void need(void* p, size_t bytes) const;
  int64_t backed(const void* p, size_t bytes) const;
  // A GPU: the gradients of units[u] (a layer, the embedding or the head) committed.
  void need_grads(size_t unit);
  // Stage 3's prefetch: units_ index of exactly [begin, end) (else kNone); start the unit's
  // all-gather; complete the one in flight, `use`d or given back.
  static constexpr size_t kNone = size_t(-1);
  size_t unit_of(int64_t begin, int64_t end) const;
  void start_prefetch(size_t unit);
  void end_prefetch(bool use);
  // Stage 3: the values of buckets [first, last) outside this rank's ranges released.
  void give_back(size_t first, size_t last);
  // The elements buckets [first, last) cover (a layer's buckets are contiguous).
  std::pair<int64_t, int64_t> span_of(size_t first, size_t last) const;
  // The buckets inside [begin, end).
  std::pair<size_t, size_t> buckets_in(int64_t begin, int64_t end) const;

  int stage_;
  std::vector<DataParallelBuckets<float>*> sets_;
  std::vector<Bucket> buckets_;
  Flat params_;
  size_t value_size_;
  ops::Exec x_;
  const ReleasableMemory* memory_ = nullptr;  // a GPU's; null: host memory
  std::vector<std::pair<int64_t, int64_t>> units_;
  std::vector<size_t> unit_of_bucket_;
  std::vector<size_t> bucket_of_param_;
  std::vector<int> params_in_bucket_, pending_;
  std::vector<bool> param_ready_, reduced_once_;
  // This rank's accumulated piece of each bucket (shard order) and a reduce-scatter's output.
  Tensor accum_, piece_;
  std::vector<int64_t> accum_offset_;
  Bytes peak_;
  bool prefetching_ = true, backward_ = false, track_peak_ = false;
  size_t prefetched_ = kNone;
  int in_use_ = 0;  // units whose use_params(.., true) has not been ended
  std::vector<std::unique_ptr<CommRequest>> prefetch_;  // one per run of a set's buckets
  int64_t prefetch_hits_ = 0;
};

}  // namespace omni
