#include "parallel/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/trace.h"

namespace omni {

int64_t default_bucket_size(int64_t elements, int group_size) {
  const int64_t megatron = std::max<int64_t>(40'000'000, int64_t{1'000'000} * group_size);
  return std::min(megatron, std::max<int64_t>(1'000'000, (elements + 7) / 8));
}

template <typename T>
DataParallelBuckets<T>::DataParallelBuckets(Communicator& group, std::vector<ParamInfo> layout,
                                            Tensor grads, double bucket_size, GradReduce mode,
                                            const ops::Exec& exec,
                                            const std::vector<int64_t>& close_at)
    : comm_(group), infos_(std::move(layout)), grads_(std::move(grads)), mode_(mode), x_(exec) {
  OMNI_REQUIRE(bucket_size >= 0, "--ddp-bucket-size must not be negative (got ", bucket_size, ")");
  const std::vector<ParamInfo>& infos = infos_;
  int64_t elements = 0;  // those this group reduces
  for (const ParamInfo& p : infos) elements += p.numel;
  const int64_t target = bucket_size > 0 ? static_cast<int64_t>(bucket_size)
                                         : default_bucket_size(elements, group.size());
  bucket_of_param_.resize(infos.size());
  param_ready_.assign(infos.size(), false);
  // From the last parameter back, closing a bucket at a parameter's start once it is full.
  // `infos` may leave out parameters reduced over another group (MoE experts, over their
  // expert-data-parallel ranks): a bucket also closes where one of those lies in between
  // (ParameterSet aligns parameters to 16 elements, so only another parameter leaves a gap of
  // 16 or more), and none covers them.
  constexpr int64_t kAlign = 16;
  auto end_of = [&](size_t i) { return infos[i].offset + infos[i].numel; };
  int64_t end = grads_.numel();
  if (!infos.empty() && end_of(infos.size() - 1) + kAlign <= end) end = end_of(infos.size() - 1);
  int with_elements = 0;
  for (size_t i = infos.size(); i-- > 0;) {
    bucket_of_param_[i] = buckets_.size();
    with_elements += infos[i].numel > 0;
    const bool gap = i > 0 && infos[i].offset - end_of(i - 1) >= kAlign;
    if (i == 0 || gap || end - infos[i].offset >= target ||
        std::binary_search(close_at.begin(), close_at.end(), infos[i].offset)) {
      const int64_t begin = i == 0 && infos[0].offset < kAlign ? 0 : infos[i].offset;
      buckets_.push_back({begin, end, (end - begin) / group.size()});
      params_in_bucket_.push_back(with_elements);
      with_elements = 0;
      end = gap ? end_of(i - 1) : begin;
    }
  }
  params_pending_ = params_in_bucket_;
  requests_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) order_.push_back(b);
  const int64_t r = group.rank(), p = group.size();
  int64_t reduced = 0;
  for (const GradBucket& b : buckets_) {
    shard_.push_back({b.begin + r * b.piece, r == p - 1 ? b.end : b.begin + (r + 1) * b.piece});
    reduced_offset_.push_back(reduced);
    reduced += b.piece;
  }
  reduced_size_ = mode_ == GradReduce::ReduceScatter && p > 1 ? reduced : 0;
}

template <typename T>
void DataParallelBuckets<T>::start(size_t index) {
  TraceSpan span("grad-bucket-start", "bucket", int(index));
  const GradBucket& b = buckets_[index];
  const int p = comm_.size();
  T* g = grads() + b.begin;
  const int64_t n = b.end - b.begin;
  const double scale = gradient_scale();
  if (scale != 1.0) ops::scale(x_, g, scale, size_t(n));
  // One rank holds the whole sum already. (The one-rank communicator's copies are of host
  // memory, and the gradients may live on a GPU.)
  if (p == 1) return;
  // Allocated at first use: ZeRO 2/3 reduce into their own shard-sized accumulator.
  if (reduced_size_ > 0 && !reduced_.defined())
    reduced_ = Tensor::zeros({reduced_size_}, dtype_of<T>(), grads_.device(), x_.memory());
  std::vector<std::unique_ptr<CommRequest>>& reqs = requests_[index];
  if (mode_ == GradReduce::AllReduce) {
    reqs.push_back(comm_.iall_reduce(g, n, dtype_of<T>()));
    return;
  }
  if (b.piece > 0)
    reqs.push_back(comm_.ireduce_scatter(reduced_.template data<T>() + reduced_offset_[index], g,
                                         b.piece, dtype_of<T>()));
  if (const int64_t rest = n - p * b.piece; rest > 0)
    reqs.push_back(comm_.iall_reduce(g + p * b.piece, rest, dtype_of<T>()));
}

template <typename T>
void DataParallelBuckets<T>::start_first(int64_t begin, int64_t end) {
  OMNI_CHECK(next_start_ == 0, "[ddp] start_first during a step");
  for (const GradBucket& b : buckets_)
    OMNI_CHECK(b.end <= begin || end <= b.begin || (begin <= b.begin && b.end <= end),
               "[ddp] start_first(", begin, ", ", end, ") cuts the bucket [", b.begin, ", ", b.end,
               ")");
  std::stable_partition(order_.begin(), order_.end(), [&](size_t b) {
    return begin <= buckets_[b].begin && buckets_[b].end <= end;
  });
}

template <typename T>
void DataParallelBuckets<T>::mark_ready(int64_t begin, int64_t end) {
  OMNI_CHECK(0 <= begin && begin <= end && end <= grads_.numel(), "[ddp] mark_ready(", begin, ", ",
             end, ") outside the buffer of ", grads_.numel());
  const std::vector<ParamInfo>& infos = infos_;
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    if (p.numel == 0 || p.offset >= end || p.offset + p.numel <= begin) continue;
    OMNI_CHECK(p.offset >= begin && p.offset + p.numel <= end, "[ddp] mark_ready(", begin, ", ",
               end, ") covers part of ", p.name);
    OMNI_CHECK(!param_ready_[i], "[ddp] ", p.name, " marked ready twice in one step");
    param_ready_[i] = true;
    --params_pending_[bucket_of_param_[i]];
  }
  while (next_start_ < order_.size() && params_pending_[order_[next_start_]] == 0)
    start(order_[next_start_++]);
  progress();
}

template <typename T>
void DataParallelBuckets<T>::progress() {
  // MPI moves a non-blocking collective's data only inside MPI calls: give it a turn.
  for (size_t k = 0; k < next_start_; ++k)
    for (auto& req : requests_[order_[k]]) req->test();
}

template <typename T>
void DataParallelBuckets<T>::finish() {
  while (next_start_ < order_.size()) start(order_[next_start_++]);
  for (auto& reqs : requests_) {
    for (auto& req : reqs) req->wait();
    reqs.clear();
  }
  if (mode_ == GradReduce::ReduceScatter && comm_.size() > 1) {
    const int64_t r = comm_.rank();
    for (size_t b = 0; b < buckets_.size(); ++b)
      ops::copy(x_, grads() + buckets_[b].begin + r * buckets_[b].piece,
                reduced_.template data<T>() + reduced_offset_[b], size_t(buckets_[b].piece));
  }
  next_start_ = 0;
  params_pending_ = params_in_bucket_;
  std::fill(param_ready_.begin(), param_ready_.end(), false);
}

template <typename T>
void DataParallelBuckets<T>::all_gather(T* data, size_t first, size_t last) const {
  const int p = comm_.size(), r = comm_.rank();
  if (p == 1) return;  // every shard is this rank's
  for (size_t i = first; i < last; ++i) {
    const GradBucket& b = buckets_[i];
    if (b.piece > 0) comm_.all_gather(data + b.begin, data + b.begin + r * b.piece, b.piece);
    if (const int64_t rest = b.end - b.begin - p * b.piece; rest > 0)
      comm_.broadcast(data + b.begin + p * b.piece, rest * sizeof(T), p - 1);
  }
}

template class DataParallelBuckets<float>;
template class DataParallelBuckets<double>;

}  // namespace omni
