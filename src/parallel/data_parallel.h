// Data-parallel gradient reduction in buckets over a ParameterSet's flat gradient buffer,
// as Megatron-Core's DistributedDataParallel does it.
//
//   omni::DataParallelBuckets<float> ddp(grid.dp_cp(), model.params(), opts.ddp_bucket_size,
//                                        omni::GradReduce::AllReduce);  // ReduceScatter with
//                                                                       // the distributed
//                                                                       optimizer
//   ... micro-batches; on the LAST micro-batch of the step, as each layer's backward has
//   written its final gradients:
//   ddp.mark_ready(first_offset, end_offset);   // may start a bucket's collective at once
//   ddp.finish();  // starts what is left, waits; gradients are now averaged over the group
//
// Mark a parameter only when nothing more will be added to its gradient this step (a tied
// embedding: after the input embedding's backward, not the output layer's): its bucket may
// be scaled and sent at once.
//
// Buckets are laid from the END of the buffer (backward produces the last layers' gradients
// first) and close at parameter boundaries once they hold `bucket_size` elements (Megatron's
// rule; 0 means default_bucket_size). Buckets start in
// that fixed order whatever order mark_ready is called in, so every rank issues the same
// collectives in the same order. Before its collective a bucket is multiplied by
// 1/group size (Megatron's gradient_scaling_factor: scale, then sum), so the result is the
// average over the data-parallel (x context-parallel) ranks.
//
// ReduceScatter mode (the distributed optimizer): each bucket of L elements is split into
// group-size pieces of q = L / size elements; rank r owns [begin + r q, begin + (r+1) q) and
// the last rank also the remainder up to the bucket's end (fewer than `size` elements, summed
// by a small all-reduce), so no bucket needs padding. After finish() each rank's own ranges
// of the gradient buffer hold the averaged gradients; the rest of the buffer holds this
// rank's unreduced values. all_gather() then spreads every rank's ranges of a buffer (the
// updated parameters, or optimizer state for a checkpoint) to all ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "tensor/parameters.h"

namespace omni {

enum class GradReduce { AllReduce, ReduceScatter };

struct GradBucket {
  int64_t begin = 0, end = 0;  // elements of the flat buffer
  int64_t piece = 0;           // (end - begin) / group size: each rank's share but the remainder
};

// A contiguous range of the flat buffer that this rank owns.
struct ShardRange {
  int64_t begin = 0, end = 0;
};

// The default bucket size (elements) for `elements` gradients reduced over `group_size` ranks:
// an eighth of them, at least 1M and at most Megatron-Core's default, max(40M, 1M x group
// size). Megatron's alone never splits a model under 40M elements (GPT-2 small's is one
// bucket), so its only bucket could start after the whole backward and nothing would overlap;
// eighths let the last layers' buckets travel while the first layers compute, and the 1M
// floor keeps each collective large enough that its latency stays small beside its bytes.
// Models above 320M elements get Megatron's buckets unchanged.
int64_t default_bucket_size(int64_t elements, int group_size);

// T: the gradients' type (float, or double in the float64 checks; a bf16/f16 model's gradients
// are float).
template <typename T>
class DataParallelBuckets {
 public:
  // Buckets over `grads`, a buffer laid out as `infos` say (a ParameterSet's). `group` must
  // outlive this object. bucket_size: elements (--ddp-bucket-size). `exec`: the device the
  // gradients live on (the group's collectives move its memory).
  // close_at: offsets (sorted) where a bucket must close as well (ZeRO 2/3: each layer's start).
  DataParallelBuckets(Communicator& group, std::vector<ParamInfo> infos, Tensor grads,
                      double bucket_size, GradReduce mode, const ops::Exec& exec = {},
                      const std::vector<int64_t>& close_at = {});
  // Over the gradients of `params` (a model of any storage whose gradients are T).
  template <typename P>
  requires std::is_same_v<accum_t<P>, T> DataParallelBuckets(Communicator& group,
                                                             ParameterSet<P>& params,
                                                             double bucket_size, GradReduce mode,
                                                             const ops::Exec& exec = {})
      : DataParallelBuckets(group, params.infos(), params.grads_tensor(), bucket_size, mode, exec) {
  }

  // Moves the buckets inside [begin, end) (a range whose ends are bucket boundaries: pass its
  // end in close_at) to the front of the start order, keeping both parts' orders: gradients
  // final early in the backward (a tied embedding's, once only its output-layer part is
  // summed there) start their collective before the layers'. Before the first step; every
  // rank the same.
  void start_first(int64_t begin, int64_t end);
  // Gradients of [begin, end) (whole parameters) are final for this step.
  void mark_ready(int64_t begin, int64_t end);
  // Starts every bucket not yet started, waits for all and resets for the next step.
  void finish();

  // Buckets from the end of the buffer; their collectives start in this order (but for
  // start_first's).
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Indices into buckets() in the order their collectives start.
  const std::vector<size_t>& start_order() const { return order_; }
  // This rank's ranges (one per bucket, possibly empty), in bucket order.
  const std::vector<ShardRange>& shard() const { return shard_; }
  // Every rank's shard ranges of `data` (a buffer laid out like the parameters) to every
  // rank; collective over the group. Used for parameters after a sharded update.
  void all_gather(T* data) const { all_gather(data, 0, buckets_.size()); }
  // The same for buckets [first, last) only.
  void all_gather(T* data, size_t first, size_t last) const;
  Communicator& group() const { return comm_; }
  GradReduce mode() const { return mode_; }
  // The factor each bucket is multiplied by as its collective starts (Megatron's
  // gradient_scaling_factor), 1/group size unless set; also applied on a group of one rank.
  void set_gradient_scale(double factor) { scale_ = factor; }
  double gradient_scale() const { return scale_ > 0 ? scale_ : 1.0 / comm_.size(); }

 private:
  void start(size_t bucket);
  void progress();  // tests the started buckets' requests

  T* grads() const { return grads_.template data<T>(); }

  Communicator& comm_;
  std::vector<ParamInfo> infos_;
  Tensor grads_;
  GradReduce mode_;
  std::vector<GradBucket> buckets_;
  std::vector<ShardRange> shard_;
  std::vector<size_t> bucket_of_param_;                 // by index into params.infos()
  std::vector<int> params_in_bucket_, params_pending_;  // with elements, per bucket
  std::vector<bool> param_ready_;
  std::vector<size_t> order_;  // the buckets in the order they start
  size_t next_start_ = 0;      // into order_
  std::vector<std::vector<std::unique_ptr<CommRequest>>> requests_;  // per bucket
  ops::Exec x_;
  double scale_ = 0;  // 0: 1/group size
  Tensor reduced_;  // ReduceScatter: each bucket's piece, in bucket order (at the first start())
  int64_t reduced_size_ = 0;
  std::vector<int64_t> reduced_offset_;  // per bucket, into reduced_
};

}  // namespace omni
