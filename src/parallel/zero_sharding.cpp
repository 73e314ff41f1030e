#include "parallel/zero_sharding.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/trace.h"

namespace omni {

std::vector<int64_t> zero_bucket_boundaries(const std::vector<ParamInfo>& infos) {
  // A parameter's unit: the embedding, decoder layer N, or the output layer with the final norm.
  auto unit = [](const std::string& name) -> std::string {
    if (name.rfind("embedding.", 0) == 0) return "embedding";
    if (name.rfind("decoder.layers.", 0) == 0) return name.substr(0, name.find('.', 15));
    return "head";
  };
  std::vector<int64_t> boundaries;
  for (size_t i = 1; i < infos.size(); ++i)
    if (unit(infos[i].name) != unit(infos[i - 1].name)) boundaries.push_back(infos[i].offset);
  std::sort(boundaries.begin(), boundaries.end());
  return boundaries;
}

ZeroSharding::ZeroSharding(int stage, std::vector<DataParallelBuckets<float>*> sets,
                           const Flat& params, const ops::Exec& exec)
    : stage_(stage),
      sets_(std::move(sets)),
      params_(params),
      value_size_(dtype_size(params.dtype)),
      x_(exec) {
  OMNI_CHECK(stage == 2 || stage == 3, "[zero] stage ", stage, " is not 2 or 3");
  for (size_t s = 0; s < sets_.size(); ++s) {
    const DataParallelBuckets<float>& set = *sets_[s];
    OMNI_CHECK(set.mode() == GradReduce::ReduceScatter,
               "[zero] needs data-parallel buckets in reduce-scatter mode");
    for (size_t b = 0; b < set.buckets().size(); ++b)
      buckets_.push_back({set.buckets()[b], set.shard()[b], s});
  }
  // One order on every rank: from the buffer's end, as each set lays its buckets.
  std::sort(buckets_.begin(), buckets_.end(),
            [](const Bucket& a, const Bucket& b) { return a.range.begin > b.range.begin; });
  for (size_t b = 1; b < buckets_.size(); ++b)
    OMNI_CHECK(buckets_[b].range.end <= buckets_[b - 1].range.begin, "[zero] bucket [",
               buckets_[b].range.begin, ", ", buckets_[b].range.end, ") overlaps another set's");
  if (exec.gpu) {
    std::string why;
    memory_ = releasable_memory(exec.gpu, &why);
    OMNI_REQUIRE(memory_, "ZeRO stage ", stage, " on the ", exec.gpu->name(), " GPU: not built (",
                 why, ")");
    OMNI_CHECK(params.memory == memory_,
               "[zero] the flat parameter buffers are not in the device's releasable memory");
  }
  const std::vector<ParamInfo>& infos = *params.infos;
  bucket_of_param_.resize(infos.size());
  params_in_bucket_.assign(buckets_.size(), 0);
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    size_t b = 0;
    while (b < buckets_.size() &&
           !(buckets_[b].range.begin <= p.offset && p.offset < buckets_[b].range.end))
      ++b;
    OMNI_CHECK(b < buckets_.size() || p.numel == 0, "[zero] ", p.name, " is in no bucket");
    bucket_of_param_[i] = b;
    if (p.numel > 0) ++params_in_bucket_[b];
  }
  pending_ = params_in_bucket_;
  param_ready_.assign(infos.size(), false);
  reduced_once_.assign(buckets_.size(), false);
  // The units (layers, embedding, head) the buckets close at, in buffer order.
  std::vector<int64_t> starts = zero_bucket_boundaries(infos);
  starts.insert(starts.begin(), 0);
  starts.push_back(params.size);
  for (size_t u = 0; u + 1 < starts.size(); ++u)
    if (starts[u] < starts[u + 1]) units_.push_back({starts[u], starts[u + 1]});
  bool several = false;  // ranks in some set's group
  int64_t accum = 0, largest = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    size_t u = 0;
    while (u + 1 < units_.size() && units_[u].second <= buckets_[b].range.begin) ++u;
    unit_of_bucket_.push_back(u);
    accum_offset_.push_back(accum);
    accum += buckets_[b].shard.end - buckets_[b].shard.begin;
    if (group_of(b).size() > 1) largest = std::max(largest, buckets_[b].range.piece);
    several = several || group_of(b).size() > 1;
  }
  const Device device = params.device;
  // Both are backed only while used: the accumulator during a step, the piece during a
  // reduce-scatter.
  const DeviceMemory* memory = memory_ ? memory_ : x_.memory();
  accum_ = Tensor::zeros({accum}, DType::F32, device, memory);
  piece_ = Tensor::zeros({several ? largest : 0}, DType::F32, device, memory);
  drop(accum_.data<float>(), size_t(accum) * sizeof(float), true);
  if (piece_.numel() > 0) drop(piece_.data<float>(), size_t(largest) * sizeof(float), true);
  begin_step();
  if (stage_ == 3) release_params();
  reset_peak();
}

void ZeroSharding::drop(void* p, size_t bytes, bool zero_ends) const {
  if (!memory_) {
    if (zero_ends)
      discard_memory(p, bytes);
    else
      release_pages(p, bytes);
    return;
  }
  if (bytes == 0) return;
  if (zero_ends) {  // the partial granules at the ends
    const uintptr_t g = memory_->granularity(), a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t begin = std::min((a + g - 1) / g * g, a + bytes);
    const uintptr_t end = std::max((a + bytes) / g * g, begin);
    memory_->zero(p, begin - a);
    memory_->zero(reinterpret_cast<void*>(end), a + bytes - end);
  }
  memory_->release(p, bytes);
}

void ZeroSharding::need(void* p, size_t bytes) const {
  if (memory_ && bytes > 0) memory_->commit(p, bytes);
}

int64_t ZeroSharding::backed(const void* p, size_t bytes) const {
  return memory_ ? memory_->committed_bytes(p, bytes) : resident_bytes(p, bytes);
}

void ZeroSharding::need_grads(size_t unit) {
  if (!memory_ || unit >= units_.size()) return;
  const auto [begin, end] = units_[unit];
  need(params_.grads + begin, size_t(end - begin) * sizeof(float));
}

void ZeroSharding::begin_step() {
  drop(params_.grads, size_t(params_.size) * sizeof(float), true);
  drop(accum_.data<float>(), size_t(accum_.numel()) * sizeof(float), true);
  need(accum_.data<float>(), size_t(accum_.numel()) * sizeof(float));
  // A backward pass starts with the head (and the tied embedding's gradient).
  need_grads(units_.size() - 1), need_grads(0);
  std::fill(reduced_once_.begin(), reduced_once_.end(), false);
  sample();
}

void ZeroSharding::grads_ready(int64_t begin, int64_t end) {
  const std::vector<ParamInfo>& infos = param_infos();
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    if (p.numel == 0 || p.offset >= end || p.offset + p.numel <= begin) continue;
    OMNI_CHECK(p.offset >= begin && p.offset + p.numel <= end, "[zero] grads_ready(", begin, ", ",
               end, ") covers part of ", p.name);
    OMNI_CHECK(!param_ready_[i], "[zero] ", p.name, " marked ready twice in one micro-batch");
    param_ready_[i] = true;
    if (--pending_[bucket_of_param_[i]] == 0) reduce(bucket_of_param_[i]);
  }
}

void ZeroSharding::reduce(size_t index) {
  TraceSpan span("zero-grad-reduce-scatter", "bucket", int(index));
  sample();  // the bucket's gradients are all there now
  const GradBucket& b = buckets_[index].range;
  Communicator& comm = group_of(index);
  const int p = comm.size(), r = comm.rank();
  const double scale = sets_[buckets_[index].set]->gradient_scale();
  float* g = params_.grads + b.begin;
  const int64_t n = b.end - b.begin;
  float* acc = accum_.data<float>() + accum_offset_[index];
  need(g, size_t(n) * sizeof(float));  // committed already unless the hooks skipped it
  // As DataParallelBuckets: scale (by 1/size, or the set's factor), then sum (so one
  // micro-batch's shard is the distributed optimizer's, bit for bit); this rank's piece is
  // added to what earlier micro-batches left.
  if (scale != 1.0) ops::scale(x_, g, scale, size_t(n));
  if (b.piece > 0) {
    float* piece = piece_.data<float>();
    if (p > 1) {
      need(piece, size_t(b.piece) * sizeof(float));
      comm.reduce_scatter(piece, g, size_t(b.piece));
    } else {
      piece = g;
    }
    ops::add(x_, acc, acc, piece, size_t(b.piece));
    if (p > 1) drop(piece, size_t(b.piece) * sizeof(float), false);
  }
  if (const int64_t rest = n - p * b.piece; rest > 0) {
    comm.all_reduce(g + p * b.piece, size_t(rest));
    if (r == p - 1) ops::add(x_, acc + b.piece, acc + b.piece, g + p * b.piece, size_t(rest));
  }
  drop(g, size_t(n) * sizeof(float), true);
  // After the embedding the next micro-batch starts with the head again (a layer's
  // gradients are committed as its backward starts: use_params).
  if (unit_of_bucket_[index] == 0) need_grads(units_.size() - 1), need_grads(0);
  reduced_once_[index] = true;
  pending_[index] = params_in_bucket_[index];
  const std::vector<ParamInfo>& infos = param_infos();
  for (size_t i = 0; i < infos.size(); ++i)
    if (bucket_of_param_[i] == index) param_ready_[i] = false;
}

void ZeroSharding::finish() {
  // A bucket left partly marked, or not at all (gradients accumulated in place), is reduced
  // now, in bucket order on every rank.
  end_prefetch(false);  // a guess past the last layer's backward
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (pending_[b] != params_in_bucket_[b] || !reduced_once_[b]) reduce(b);
  sample();
  float* grads = params_.grads;
  // Only this rank's ranges are read from here on: the rest released.
  drop(grads, size_t(params_.size) * sizeof(float), true);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const ShardRange& s = buckets_[b].shard;
    float* acc = accum_.data<float>() + accum_offset_[b];
    need(grads + s.begin, size_t(s.end - s.begin) * sizeof(float));
    ops::copy(x_, grads + s.begin, acc, size_t(s.end - s.begin));
    drop(acc, size_t(s.end - s.begin) * sizeof(float), false);
  }
  // Tensors whose gradient each tensor-parallel rank holds part of are all-reduced whole.
  for (const ParamInfo& p : param_infos())
    if (p.tp_partial_grad) need(grads + p.offset, size_t(p.numel) * sizeof(float));
  sample();
}

std::pair<size_t, size_t> ZeroSharding::buckets_in(int64_t begin, int64_t end) const {
  size_t first = buckets_.size(), last = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const GradBucket& b = buckets_[i].range;
    if (b.end <= begin || b.begin >= end) continue;
    OMNI_CHECK(b.begin >= begin && b.end <= end, "[zero] parameters [", begin, ", ", end,
               ") cover part of a bucket");
    first = std::min(first, i), last = i + 1;
  }
  return {first, std::max(first, last)};
}

std::pair<int64_t, int64_t> ZeroSharding::span_of(size_t first, size_t last) const {
  int64_t b = params_.size, e = 0;
  for (size_t k = first; k < last; ++k)
    b = std::min(b, buckets_[k].range.begin), e = std::max(e, buckets_[k].range.end);
  return {b, std::max(b, e)};
}

size_t ZeroSharding::unit_of(int64_t begin, int64_t end) const {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].first == begin && units_[u].second == end) return u;
  return kNone;
}

void ZeroSharding::start_prefetch(size_t unit) {
  if (unit >= units_.size()) return;
  TraceSpan span("zero-params-prefetch", "unit", int(unit));
  const auto [first, last] = buckets_in(units_[unit].first, units_[unit].second);
  // An all-gather as a sum: every rank contributes its ranges and zeros elsewhere (x + 0 is
  // x exactly, in 16 bits too), so the result is the blocking all-gather's. One sum per run
  // of adjacent buckets of one set (a dense layer's are one run; an MoE layer's experts, with
  // their own group, lie between the dense runs).
  for (size_t k = first; k < last;) {
    size_t end = k + 1;
    while (end < last && buckets_[end].set == buckets_[k].set &&
           buckets_[end].range.end == buckets_[end - 1].range.begin)
      ++end;
    Communicator& group = group_of(k);
    if (group.size() > 1) {
      const auto [b, e] = span_of(k, end);
      need(value(b), value_bytes(e - b));
      for (size_t i = k; i < end; ++i) {
        const GradBucket& g = buckets_[i].range;
        const ShardRange& r = buckets_[i].shard;
        ops::zero(x_, value(g.begin), value_bytes(r.begin - g.begin));
        ops::zero(x_, value(r.end), value_bytes(g.end - r.end));
      }
      prefetch_.push_back(group.iall_reduce(value(b), size_t(e - b), params_.dtype));
    }
    k = end;
  }
  if (!prefetch_.empty()) prefetched_ = unit;
}

void ZeroSharding::end_prefetch(bool use) {
  if (prefetched_ == kNone) return;
  for (const std::unique_ptr<CommRequest>& request : prefetch_) request->wait();
  prefetch_.clear();
  const size_t unit = prefetched_;
  prefetched_ = kNone;
  if (use) {
    ++prefetch_hits_;
  } else {  // a guess the model did not follow: given back
    const auto [first, last] = buckets_in(units_[unit].first, units_[unit].second);
    give_back(first, last);
  }
}

void ZeroSharding::give_back(size_t first, size_t last) {
  for (size_t b = first; b < last; ++b) {
    const GradBucket& k = buckets_[b].range;
    const ShardRange& s = buckets_[b].shard;
    drop(value(k.begin), value_bytes(s.begin - k.begin), false);
    drop(value(s.end), value_bytes(k.end - s.end), false);
  }
}

void ZeroSharding::use_params(int64_t begin, int64_t end, bool use) {
  if (!use) {
    in_use_ = std::max(in_use_ - 1, 0);
    if (stage_ < 3) return;
    const auto [first, last] = buckets_in(begin, end);
    give_back(first, last);
    return;
  }
  // Forward runs the units in buffer order up to the head, the backward pass back down (the
  // tied embedding inside the head's use).
  const size_t unit = unit_of(begin, end), head = units_.size() - 1;
  size_t next = kNone;
  if (unit == head) {
    backward_ = true, next = head - 1;
  } else if (unit == 0) {
    if (in_use_ == 0) backward_ = false, next = 1;  // else the head's tied weight
  } else if (unit != kNone) {
    next = backward_ ? unit - 1 : unit + 1;
    if (next == 0) next = kNone;  // the backward pass ends without the embedding's values
  }
  ++in_use_;
  // A layer's backward writes its gradients: committed here (the head's and the embedding's
  // at a micro-batch's start), not by the reduce of the layer after it.
  if (backward_ && unit != kNone && unit != head) need_grads(unit);
  if (stage_ < 3) return;
  const auto [first, last] = buckets_in(begin, end);
  // While this unit computes, the next one's all-gather is in flight.
  if (unit == kNone) end_prefetch(false);  // a range that may overlap the one in flight
  if (unit != kNone && unit == prefetched_) {
    TraceSpan span("zero-params-prefetch-wait");
    end_prefetch(true);
  } else {
    TraceSpan span("zero-params-all-gather");
    if (first < last) {
      const auto [b, e] = span_of(first, last);
      need(value(b), value_bytes(e - b));
    }
    all_gather_values(first, last);
  }
  if (prefetching_ && next != kNone && next != prefetched_ && next < units_.size()) {
    end_prefetch(false);
    start_prefetch(next);
  }
  sample();
}

void ZeroSharding::end_use() {
  if (stage_ < 3) return;
  end_prefetch(false);  // a forward-only pass leaves the backward's first guess in flight
  in_use_ = 0;
}

void ZeroSharding::release_params() {
  if (stage_ < 3) return;
  end_prefetch(false);
  in_use_ = 0;
  const auto [first, last] = buckets_in(0, params_.size);
  give_back(first, last);
}

void ZeroSharding::commit_params(bool whole) {
  if (whole || stage_ < 3) {
    need(value(0), value_bytes(params_.size));
    return;
  }
  for (const Bucket& b : buckets_)
    need(value(b.shard.begin), value_bytes(b.shard.end - b.shard.begin));
}

void ZeroSharding::params_updated() {
  if (stage_ == 2) {
    TraceSpan span("zero-params-all-gather");
    all_gather_values(0, buckets_.size());
  }
}

void ZeroSharding::all_gather_values(size_t first, size_t last) {
  // As DataParallelBuckets::all_gather, in the values' own type.
  for (size_t i = first; i < last; ++i) {
    Communicator& comm = group_of(i);
    const int p = comm.size(), r = comm.rank();
    if (p == 1) continue;
    const GradBucket& b = buckets_[i].range;
    if (b.piece > 0)
      comm.all_gather(value(b.begin), value(b.begin + r * b.piece), size_t(b.piece), params_.dtype);
    if (const int64_t rest = b.end - b.begin - p * b.piece; rest > 0)
      comm.broadcast(value(b.begin + p * b.piece), value_bytes(rest), p - 1);
  }
}

std::vector<ShardRange> ZeroSharding::shard() const {
  std::vector<ShardRange> ranges;
  for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) ranges.push_back(b->shard);
  return ranges;
}

ZeroSharding::Bytes ZeroSharding::resident() const {
  Bytes b;
  b.params = backed(value(0), value_bytes(params_.size));
  b.grads = backed(params_.grads, size_t(params_.size) * sizeof(float)) +
            backed(accum_.data<float>(), size_t(accum_.numel()) * sizeof(float)) +
            backed(piece_.data<float>(), size_t(piece_.numel()) * sizeof(float));
  return b;
}

void ZeroSharding::sample() {
  if (!track_peak_) return;  // mincore over the buffers: only when a measurement asks
  const Bytes now = resident();
  peak_.params = std::max(peak_.params, now.params);
  peak_.grads = std::max(peak_.grads, now.grads);
}

}  // namespace omni
