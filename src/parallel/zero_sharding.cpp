#include "parallel/zero_sharding.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/trace.h"

namespace omni {

namespace {

uintptr_t page_size() {
  static const uintptr_t size = uintptr_t(sysconf(_SC_PAGESIZE));
  return size;
}

// Hands the whole pages inside [p, p + bytes) back; they read as zeros afterwards.
void release_pages(void* p, size_t bytes) {
  const uintptr_t page = page_size(), a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + page - 1) / page * page, end = (a + bytes) / page * page;
  if (end > begin)
    OMNI_CHECK(madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0,
               "[zero] madvise of ", end - begin, " bytes failed");
}

}  // namespace

void discard_memory(void* p, size_t bytes) {
  const uintptr_t page = page_size(), a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = std::min((a + page - 1) / page * page, a + bytes);
  const uintptr_t end = std::max((a + bytes) / page * page, begin);
  std::memset(p, 0, begin - a);
  std::memset(reinterpret_cast<void*>(end), 0, a + bytes - end);
  release_pages(p, bytes);
}

int64_t resident_bytes(const void* p, size_t bytes) {
  if (bytes == 0) return 0;
  const uintptr_t page = page_size(), a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = a / page * page, end = (a + bytes + page - 1) / page * page;
  std::vector<unsigned char> in_core((end - begin) / page);
  OMNI_CHECK(mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()) == 0,
             "[zero] mincore failed");
  int64_t resident = 0;
  for (unsigned char c : in_core) resident += (c & 1) ? int64_t(page) : 0;
  return resident;
}

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

ZeroSharding::ZeroSharding(int stage, DataParallelBuckets<float>& buckets,
                           ParameterSet<float>& params, const ops::Exec& exec)
    : stage_(stage), ddp_(buckets), params_(params), x_(exec) {
  OMNI_CHECK(stage == 2 || stage == 3, "[zero] stage ", stage, " is not 2 or 3");
  OMNI_CHECK(buckets.mode() == GradReduce::ReduceScatter,
             "[zero] needs data-parallel buckets in reduce-scatter mode");
  OMNI_CHECK(!exec.gpu || exec.gpu->memory_is_host_memory(),
             "[zero] stages 2 and 3 release host memory; this device's is not");
  const std::vector<GradBucket>& bs = buckets.buckets();
  const std::vector<ParamInfo>& infos = params.infos();
  bucket_of_param_.resize(infos.size());
  params_in_bucket_.assign(bs.size(), 0);
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    size_t b = 0;
    while (b < bs.size() && !(bs[b].begin <= p.offset && p.offset < bs[b].end)) ++b;
    OMNI_CHECK(b < bs.size() || p.numel == 0, "[zero] ", p.name, " is in no bucket");
    bucket_of_param_[i] = b;
    if (p.numel > 0) ++params_in_bucket_[b];
  }
  pending_ = params_in_bucket_;
  param_ready_.assign(infos.size(), false);
  reduced_once_.assign(bs.size(), false);
  int64_t accum = 0, largest = 0;
  for (size_t b = 0; b < bs.size(); ++b) {
    accum_offset_.push_back(accum);
    accum += buckets.shard()[b].end - buckets.shard()[b].begin;
    largest = std::max(largest, bs[b].piece);
  }
  const Device device = params.grads_tensor().device();
  // Both are backed only while used: the accumulator during a step, the piece during a
  // reduce-scatter.
  accum_ = Tensor::zeros({accum}, DType::F32, device, x_.memory());
  piece_ = Tensor::zeros({ddp_.group().size() > 1 ? largest : 0}, DType::F32, device, x_.memory());
  discard_memory(accum_.data<float>(), size_t(accum) * sizeof(float));
  if (piece_.numel() > 0) discard_memory(piece_.data<float>(), size_t(largest) * sizeof(float));
  begin_step();
  if (stage_ == 3) release_params();
  reset_peak();
}

void ZeroSharding::begin_step() {
  discard_memory(params_.grads(), size_t(params_.size()) * sizeof(float));
  discard_memory(accum_.data<float>(), size_t(accum_.numel()) * sizeof(float));
  std::fill(reduced_once_.begin(), reduced_once_.end(), false);
  sample();
}

void ZeroSharding::grads_ready(int64_t begin, int64_t end) {
  const std::vector<ParamInfo>& infos = params_.infos();
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
  const GradBucket& b = ddp_.buckets()[index];
  Communicator& comm = ddp_.group();
  const int p = comm.size(), r = comm.rank();
  float* g = params_.grads() + b.begin;
  const int64_t n = b.end - b.begin;
  float* acc = accum_.data<float>() + accum_offset_[index];
  // As DataParallelBuckets: scale by 1/size, then sum (so one micro-batch's shard is the
  // distributed optimizer's, bit for bit); this rank's piece is added to what earlier
  // micro-batches left.
  if (p > 1) ops::scale(x_, g, 1.0 / p, size_t(n));
  if (b.piece > 0) {
    float* piece = piece_.data<float>();
    if (p > 1)
      comm.reduce_scatter(piece, g, size_t(b.piece));
    else
      piece = g;
    ops::add(x_, acc, acc, piece, size_t(b.piece));
    if (p > 1) release_pages(piece, size_t(b.piece) * sizeof(float));
  }
  if (const int64_t rest = n - p * b.piece; rest > 0) {
    comm.all_reduce(g + p * b.piece, size_t(rest));
    if (r == p - 1) ops::add(x_, acc + b.piece, acc + b.piece, g + p * b.piece, size_t(rest));
  }
  discard_memory(g, size_t(n) * sizeof(float));
  reduced_once_[index] = true;
  pending_[index] = params_in_bucket_[index];
  const std::vector<ParamInfo>& infos = params_.infos();
  for (size_t i = 0; i < infos.size(); ++i)
    if (bucket_of_param_[i] == index) param_ready_[i] = false;
}

void ZeroSharding::finish() {
  // A bucket left partly marked, or not at all (gradients accumulated in place), is reduced
  // now, in bucket order on every rank.
  for (size_t b = 0; b < ddp_.buckets().size(); ++b)
    if (pending_[b] != params_in_bucket_[b] || !reduced_once_[b]) reduce(b);
  sample();
  float* grads = params_.grads();
  for (size_t b = 0; b < ddp_.buckets().size(); ++b) {
    const ShardRange& s = ddp_.shard()[b];
    float* acc = accum_.data<float>() + accum_offset_[b];
    ops::copy(x_, grads + s.begin, acc, size_t(s.end - s.begin));
    release_pages(acc, size_t(s.end - s.begin) * sizeof(float));
  }
  sample();
}

std::pair<size_t, size_t> ZeroSharding::buckets_in(int64_t begin, int64_t end) const {
  const std::vector<GradBucket>& bs = ddp_.buckets();
  size_t first = bs.size(), last = 0;
  for (size_t i = 0; i < bs.size(); ++i) {
    if (bs[i].end <= begin || bs[i].begin >= end) continue;
    OMNI_CHECK(bs[i].begin >= begin && bs[i].end <= end, "[zero] parameters [", begin, ", ", end,
               ") cover part of a bucket");
    first = std::min(first, i), last = i + 1;
  }
  return {first, std::max(first, last)};
}

void ZeroSharding::use_params(int64_t begin, int64_t end, bool use) {
  if (stage_ < 3) return;
  const auto [first, last] = buckets_in(begin, end);
  float* values = params_.values();
  if (use) {
    TraceSpan span("zero-params-all-gather");
    ddp_.all_gather(values, first, last);
    sample();
    return;
  }
  for (size_t b = first; b < last; ++b) {
    const GradBucket& k = ddp_.buckets()[b];
    const ShardRange& s = ddp_.shard()[b];
    release_pages(values + k.begin, size_t(s.begin - k.begin) * sizeof(float));
    release_pages(values + s.end, size_t(k.end - s.end) * sizeof(float));
  }
}

void ZeroSharding::release_params() {
  if (stage_ < 3) return;
  use_params(0, params_.size(), false);
}

ZeroSharding::Bytes ZeroSharding::resident() const {
  Bytes b;
  b.params = resident_bytes(params_.values(), size_t(params_.size()) * sizeof(float));
  b.grads = resident_bytes(params_.grads(), size_t(params_.size()) * sizeof(float)) +
            resident_bytes(accum_.data<float>(), size_t(accum_.numel()) * sizeof(float)) +
            resident_bytes(piece_.data<float>(), size_t(piece_.numel()) * sizeof(float));
  return b;
}

void ZeroSharding::sample() {
  const Bytes now = resident();
  peak_.params = std::max(peak_.params, now.params);
  peak_.grads = std::max(peak_.grads, now.grads);
}

}  // namespace omni
