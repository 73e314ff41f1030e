// CountingCommunicator: a Communicator that forwards every call to another and counts, per
// group and kind of call, the bytes this rank sends (and the time it spends blocked in them),
// for the benchmarks' communication figures (bench/bench_parallel.cpp) and the tests that hold
// a layout's traffic to its analytical count (tests/parallel/test_moe_tp_bytes.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "comm/communicator.h"

namespace omni {

enum class Call { AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast, Send };

inline const char* call_name(Call c) {
  switch (c) {
    case Call::AllReduce:
      return "all-reduce";
    case Call::ReduceScatter:
      return "reduce-scatter";
    case Call::AllGather:
      return "all-gather";
    case Call::AllToAll:
      return "all-to-all";
    case Call::Broadcast:
      return "broadcast";
    case Call::Send:
      return "send";
  }
  return "?";
}

// What one rank handed to its communicators, per (group, call).
struct Tally {
  struct Entry {
    int64_t calls = 0;
    double payload = 0;      // bytes of the buffer this rank contributes
    double algorithmic = 0;  // bytes a bandwidth-optimal algorithm makes this rank send
  };
  std::map<std::pair<std::string, Call>, Entry> entries;
  double blocked_seconds = 0;  // inside communication calls and request waits
  bool on = false;

  double total_algorithmic() const {
    double s = 0;
    for (const auto& [key, e] : entries) s += e.algorithmic;
    return s;
  }
};

// Times a call into the communicator while the tally is on.
class BlockedTime {
 public:
  explicit BlockedTime(Tally& t) : tally_(t), start_(std::chrono::steady_clock::now()) {}
  ~BlockedTime() {
    if (tally_.on)
      tally_.blocked_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  Tally& tally_;
  std::chrono::steady_clock::time_point start_;
};

class CountingRequest : public CommRequest {
 public:
  CountingRequest(std::unique_ptr<CommRequest> inner, Tally& tally)
      : inner_(std::move(inner)), tally_(tally) {}
  void wait() override {
    BlockedTime b(tally_);
    inner_->wait();
  }
  bool test() override {
    BlockedTime b(tally_);
    return inner_->test();
  }

 private:
  std::unique_ptr<CommRequest> inner_;
  Tally& tally_;
};

// A Communicator that forwards every call to `inner` and counts, per group and call kind,
// what this rank sends. Its splits count into the same tally, so wrapping the world counts
// every group ProcessGrid makes of it. Groups of one rank send nothing and are not counted.
//
// "Algorithmic" bytes are those a bandwidth-optimal algorithm sends from each rank, the
// count behind nccl-tests' bus bandwidth, for a buffer of n bytes over p ranks:
// all-reduce 2(p-1)/p n (reduce-scatter then all-gather), reduce-scatter and all-gather
// (p-1)/p of the full n-byte buffer, all-to-all the (p-1)/p of it that goes to others,
// broadcast n from the root, send n. They are not the bytes OpenMPI's chosen algorithm
// puts on the wire (for small messages it picks latency-bound ones, e.g. recursive
// doubling, which send the whole buffer log2 p times).
class CountingCommunicator : public Communicator {
 public:
  CountingCommunicator(Communicator& inner, Tally& tally) : inner_(&inner), tally_(tally) {}
  CountingCommunicator(std::unique_ptr<Communicator> owned, Tally& tally)
      : owned_(std::move(owned)), inner_(owned_.get()), tally_(tally) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }

  void all_reduce(void* data, size_t n, DType t, ReduceOp op) override {
    count_all_reduce(n, t);
    BlockedTime b(tally_);
    inner_->all_reduce(data, n, t, op);
  }
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    count_scatter(Call::ReduceScatter, n, t);
    BlockedTime b(tally_);
    inner_->reduce_scatter(out, in, n, t);
  }
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    const double p = size(), full = p * double(n) * dtype_size(t);
    record(Call::AllGather, full / p, (p - 1) / p * full);
    BlockedTime b(tally_);
    inner_->all_gather(out, in, n, t);
  }
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    count_scatter(Call::AllToAll, n, t);
    BlockedTime b(tally_);
    inner_->all_to_all(out, in, n, t);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    const double sent = rank() == root ? double(bytes) : 0.0;
    record(Call::Broadcast, sent, sent);
    BlockedTime b(tally_);
    inner_->broadcast(data, bytes, root);
  }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    record(Call::Send, double(bytes), double(bytes));
    BlockedTime b(tally_);
    inner_->send(data, bytes, peer, tag);
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    BlockedTime b(tally_);
    inner_->recv(data, bytes, peer, tag);
  }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int peer, int tag) override {
    record(Call::Send, double(bytes), double(bytes));
    BlockedTime b(tally_);
    return wrap(inner_->isend(data, bytes, peer, tag));
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int peer, int tag) override {
    BlockedTime b(tally_);
    return wrap(inner_->irecv(data, bytes, peer, tag));
  }
  std::unique_ptr<CommRequest> iall_reduce(void* data, size_t n, DType t) override {
    count_all_reduce(n, t);
    BlockedTime b(tally_);
    return wrap(inner_->iall_reduce(data, n, t));
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    count_scatter(Call::ReduceScatter, n, t);
    BlockedTime b(tally_);
    return wrap(inner_->ireduce_scatter(out, in, n, t));
  }
  void barrier() override {
    BlockedTime b(tally_);
    inner_->barrier();
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return std::make_unique<CountingCommunicator>(inner_->split(color, key, name), tally_);
  }

 private:
  void record(Call c, double payload, double algorithmic) {
    if (!tally_.on || size() == 1) return;
    Tally::Entry& e = tally_.entries[{name(), c}];
    ++e.calls;
    e.payload += payload;
    e.algorithmic += algorithmic;
  }
  void count_all_reduce(size_t n, DType t) {
    const double p = size(), bytes = double(n) * dtype_size(t);
    record(Call::AllReduce, bytes, 2 * (p - 1) / p * bytes);
  }
  // n elements per rank's block: the input holds size() blocks.
  void count_scatter(Call c, size_t n, DType t) {
    const double p = size(), full = p * double(n) * dtype_size(t);
    record(c, full, (p - 1) / p * full);
  }
  std::unique_ptr<CommRequest> wrap(std::unique_ptr<CommRequest> r) {
    return std::make_unique<CountingRequest>(std::move(r), tally_);
  }

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  Tally& tally_;
};

}  // namespace omni
