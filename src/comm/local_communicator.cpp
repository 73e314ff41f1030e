#include "comm/local_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/watchdog.h"

namespace omni {

namespace {

enum class Op { AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast, Barrier, Split };

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllGather: return "all_gather";
    case Op::AllToAll: return "all_to_all";
    case Op::Broadcast: return "broadcast";
    case Op::Barrier: return "barrier";
    case Op::Split: return "split";
  }
  return "?";
}

struct Group;

// One collective as every rank of a group calls it. The last rank to arrive does the work
// for all, reading every input before writing any output (so in-place calls are safe),
// and sums in rank order, so results do not depend on thread timing.
struct Round {
  Op op = Op::Barrier;
  size_t n = 0;  // elements; bytes for broadcast
  DType t = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0;
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<int> color, key;
  std::vector<std::string> new_name;
  std::vector<std::shared_ptr<Group>> new_group;
  std::vector<int> new_rank;
  int arrived = 0, left = 0;
  bool done = false;
  bool cancelled = false;  // a rank abandoned it while failing: its buffers are gone
};

// A posted send or receive waiting for its match.
struct Transfer {
  int src = 0, dst = 0, tag = 0;  // group ranks
  const void* data = nullptr;     // send
  void* buf = nullptr;            // receive
  size_t bytes = 0;
  bool done = false;
};

struct Group {
  std::string name;
  std::vector<int> members;  // the thread of each group rank
  std::map<uint64_t, Round> rounds;
  std::deque<std::shared_ptr<Transfer>> sends, recvs;  // unmatched, in posting order
};

struct RankState {
  bool blocked = false, finished = false;
  const std::function<bool()>* ready = nullptr;
  std::string what;
};

// Everything the ranks share, under one mutex.
struct World {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RankState> ranks;
  std::exception_ptr failure;
  std::string failure_msg;

  explicit World(int n) : ranks(n) {}

  void throw_if_failed() const {
    if (failure) throw PeerFailure("[comm] " + failure_msg);
  }

  // Waits until ready() (checked under the lock) or until the job fails.
  void block(std::unique_lock<std::mutex>& lk, int thread, const std::function<bool()>& ready,
             std::string what) {
    if (ready()) return;
    throw_if_failed();
    RankState& s = ranks[thread];
    s.blocked = true;
    s.ready = &ready;
    s.what = std::move(what);
    check_deadlock();
    cv.wait(lk, [&] { return ready() || failure; });
    s.blocked = false;
    s.ready = nullptr;
    if (!ready()) throw_if_failed();
  }

  // With the lock held: if every rank has returned or waits for something that cannot
  // happen, nothing will ever change, so fail the job with what each rank waits for.
  void check_deadlock() {
    if (failure) return;
    bool any_blocked = false;
    for (const RankState& s : ranks) {
      if (!s.blocked && !s.finished) return;
      if (s.blocked && (*s.ready)()) return;
      any_blocked |= s.blocked;
    }
    if (!any_blocked) return;
    std::string msg = "deadlock: no rank can proceed;";
    for (size_t r = 0; r < ranks.size(); ++r)
      msg += " rank " + std::to_string(r) +
             (ranks[r].finished ? " has returned;" : " waits in " + ranks[r].what + ";");
    msg.pop_back();
    failure = std::make_exception_ptr(InternalError("[comm] " + msg));
    failure_msg = msg;
    cv.notify_all();
  }

  void record_failure(int thread, std::exception_ptr e, const std::string& what) {
    if (!failure) {
      failure = std::move(e);
      failure_msg = "rank " + std::to_string(thread) + " failed: " + what;
    }
    cv.notify_all();
  }
};

template <typename T>
void combine_typed(T* acc, const T* x, size_t n, ReduceOp op) {
  if (op == ReduceOp::Sum) {
    for (size_t i = 0; i < n; ++i) acc[i] += x[i];
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
  }
}

// bf16 and f16 (a 16-bit model's tensor-parallel activations, as NCCL reduces them): each
// pairwise result is computed in float and rounded to the type.
template <typename T>
void combine_16bit(T* acc, const T* x, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    const float a = to_float(acc[i]), b = to_float(x[i]);
    acc[i] = from_float<T>(op == ReduceOp::Sum ? a + b : std::max(a, b));
  }
}

void combine(void* acc, const void* x, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::F32:
      return combine_typed(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
    case DType::F64:
      return combine_typed(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
    case DType::BF16:
      return combine_16bit(static_cast<bf16*>(acc), static_cast<const bf16*>(x), n, op);
    case DType::F16:
      return combine_16bit(static_cast<f16*>(acc), static_cast<const f16*>(x), n, op);
  }
}

using Bytes = std::vector<std::byte>;

const std::byte* at(const void* p, size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}

void perform(Round& r, const Group& parent) {
  const int p = static_cast<int>(r.in.size());
  const size_t es = r.op == Op::Broadcast ? 1 : dtype_size(r.t);
  const size_t block = r.n * es;
  std::vector<Bytes> result(p);
  switch (r.op) {
    case Op::AllReduce:
    case Op::ReduceScatter:
      for (int k = 0; k < p; ++k) {
        if (r.op == Op::AllReduce && k > 0) {
          result[k] = result[0];
          continue;
        }
        const size_t offset = r.op == Op::AllReduce ? 0 : k * block;
        result[k].assign(at(r.in[0], offset), at(r.in[0], offset + block));
        for (int j = 1; j < p; ++j)
          combine(result[k].data(), at(r.in[j], offset), r.n, r.t, r.reduce);
      }
      break;
    case Op::AllGather:
      result[0].resize(p * block);
      for (int j = 0; j < p; ++j) std::memcpy(result[0].data() + j * block, r.in[j], block);
      for (int k = 1; k < p; ++k) result[k] = result[0];
      break;
    case Op::AllToAll:
      for (int k = 0; k < p; ++k) {
        result[k].resize(p * block);
        for (int j = 0; j < p; ++j)
          std::memcpy(result[k].data() + j * block, at(r.in[j], k * block), block);
      }
      break;
    case Op::Broadcast:
      for (int k = 0; k < p; ++k)
        if (k != r.root) result[k].assign(at(r.in[r.root], 0), at(r.in[r.root], block));
      break;
    case Op::Barrier:
      break;
    case Op::Split: {
      std::map<int, std::vector<int>> by_color;
      for (int k = 0; k < p; ++k) by_color[r.color[k]].push_back(k);
      for (auto& [color, ranks] : by_color) {
        std::stable_sort(ranks.begin(), ranks.end(),
                         [&](int a, int b) { return r.key[a] < r.key[b]; });
        auto g = std::make_shared<Group>();
        g->name = r.new_name[ranks[0]];
        for (size_t i = 0; i < ranks.size(); ++i) {
          g->members.push_back(parent.members[ranks[i]]);
          r.new_group[ranks[i]] = g;
          r.new_rank[ranks[i]] = static_cast<int>(i);
        }
      }
      return;
    }
  }
  for (int k = 0; k < p; ++k)
    if (!result[k].empty()) std::memcpy(r.out[k], result[k].data(), result[k].size());
}

class LocalCommunicator;

// A pending iall_reduce, ireduce_scatter, isend or irecv.
class LocalRequest : public CommRequest {
 public:
  LocalRequest(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank, uint64_t seq)
      : world_(std::move(w)), group_(std::move(g)), rank_(rank), seq_(seq) {}
  LocalRequest(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank,
               std::shared_ptr<Transfer> t, std::string what)
      : world_(std::move(w)),
        group_(std::move(g)),
        rank_(rank),
        transfer_(std::move(t)),
        what_(std::move(what)) {}
  ~LocalRequest() override;
  void wait() override;
  // What the watchdog names while wait() blocks; counts the operation.
  LocalRequest& watched(std::shared_ptr<WatchGroup> g, const char* op, size_t bytes,
                        int peer = -1) {
    watch_ = std::move(g);
    op_ = op, bytes_ = bytes, peer_ = peer;
    watch_seq_ = watch_->count(op, bytes);
    return *this;
  }
  bool test() override {
    std::lock_guard<std::mutex> lk(world_->mu);
    return waited_ || (transfer_ ? transfer_->done : group_->rounds.at(seq_).done);
  }

 private:
  void cancel();
  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int rank_;
  uint64_t seq_ = 0;
  std::shared_ptr<Transfer> transfer_;
  std::string what_;
  bool waited_ = false;
  std::shared_ptr<WatchGroup> watch_;
  const char* op_ = "";
  size_t bytes_ = 0;
  int peer_ = -1;
  uint64_t watch_seq_ = 0;
};

// Waits for this rank's part of collective `seq` and retires the round once every rank has.
void finish_round(std::unique_lock<std::mutex>& lk, World& world, Group& group, int rank,
                  uint64_t seq) {
  Round& r = group.rounds.at(seq);
  const int size = static_cast<int>(group.members.size());
  world.block(
      lk, group.members[rank], [&r] { return r.done; },
      detail::concat(op_name(r.op), " #", seq, " on ", group.name, " (", r.arrived, " of ", size,
                     " ranks have called it)"));
  if (++r.left == size) group.rounds.erase(seq);
}

void LocalRequest::wait() {
  if (waited_) return;
  std::optional<CollectiveWatch> watch;
  if (watch_) watch.emplace(*watch_, op_, bytes_, peer_, watch_seq_);
  std::unique_lock<std::mutex> lk(world_->mu);
  if (transfer_) {
    Transfer& t = *transfer_;
    world_->block(
        lk, group_->members[rank_], [&t] { return t.done; }, what_);
  } else {
    finish_round(lk, *world_, *group_, rank_, seq_);
  }
  waited_ = true;
}

void LocalRequest::cancel() {
  std::lock_guard<std::mutex> lk(world_->mu);
  if (transfer_) {
    for (auto* q : {&group_->sends, &group_->recvs})
      q->erase(std::remove(q->begin(), q->end(), transfer_), q->end());
  } else if (auto it = group_->rounds.find(seq_); it != group_->rounds.end()) {
    it->second.cancelled = true;
  }
}

LocalRequest::~LocalRequest() {
  if (waited_) return;
  if (std::uncaught_exceptions() > 0) {
    cancel();
    return;
  }
  try {
    wait();
  } catch (...) {
    cancel();  // the job has failed; the next call on this rank reports it
  }
}

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank)
      : world_(std::move(w)),
        group_(std::move(g)),
        rank_(rank),
        watch_(std::make_shared<WatchGroup>(group_->name, rank_, group_->members)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->members.size()); }
  std::string name() const override { return group_->name; }

  void all_reduce(void* data, size_t n, DType t, ReduceOp op) override {
    Round r = round(Op::AllReduce, n, t);
    r.reduce = op;
    blocking(r, data, data);
  }
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    blocking(round(Op::ReduceScatter, n, t), in, out);
  }
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    blocking(round(Op::AllGather, n, t), in, out);
  }
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    blocking(round(Op::AllToAll, n, t), in, out);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    OMNI_CHECK(root >= 0 && root < size(), "[comm ", name(), "] broadcast from rank ", root, " of ",
               size());
    Round r = round(Op::Broadcast, bytes, DType::F32);
    r.root = root;
    blocking(r, data, data);
  }
  void barrier() override { blocking(round(Op::Barrier, 0, DType::F32), nullptr, nullptr); }
  std::unique_ptr<CommRequest> iall_reduce(void* data, size_t n, DType t) override {
    std::unique_lock<std::mutex> lk(world_->mu);
    const uint64_t seq = post(round(Op::AllReduce, n, t), data, data);
    auto req = std::make_unique<LocalRequest>(world_, group_, rank_, seq);
    req->watched(watch_, "iall_reduce", n * dtype_size(t));
    return req;
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    std::unique_lock<std::mutex> lk(world_->mu);
    const uint64_t seq = post(round(Op::ReduceScatter, n, t), in, out);
    auto req = std::make_unique<LocalRequest>(world_, group_, rank_, seq);
    req->watched(watch_, "ireduce_scatter", n * size() * dtype_size(t));
    return req;
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    OMNI_CHECK(color >= 0, "[comm ", this->name(), "] split with negative color ", color);
    CollectiveWatch watch(*watch_, "split", 0);
    std::unique_lock<std::mutex> lk(world_->mu);
    const uint64_t seq = post(round(Op::Split, 0, DType::F32), nullptr, nullptr, color, key, name);
    Round& r = group_->rounds.at(seq);
    world_->block(
        lk, thread(), [&r] { return r.done; },
        detail::concat("split #", seq, " on ", group_->name));
    std::shared_ptr<Group> g = r.new_group[rank_];
    const int new_rank = r.new_rank[rank_];
    if (++r.left == size()) group_->rounds.erase(seq);
    return std::make_unique<LocalCommunicator>(world_, g, new_rank);
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    isend(data, bytes, peer, tag)->wait();
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    irecv(data, bytes, peer, tag)->wait();
  }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int peer, int tag) override {
    auto t = transfer(rank_, peer, tag, bytes);
    t->data = data;
    std::lock_guard<std::mutex> lk(world_->mu);
    world_->throw_if_failed();
    match(t, group_->recvs, group_->sends, [&](Transfer& r) { return r.src == rank_; });
    auto req = std::make_unique<LocalRequest>(world_, group_, rank_, t,
                                              describe("send to", peer, tag, bytes));
    req->watched(watch_, "send", bytes, peer);
    return req;
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int peer, int tag) override {
    auto t = transfer(peer, rank_, tag, bytes);
    t->buf = data;
    std::lock_guard<std::mutex> lk(world_->mu);
    world_->throw_if_failed();
    match(t, group_->sends, group_->recvs, [&](Transfer& s) { return s.src == peer; });
    auto req = std::make_unique<LocalRequest>(world_, group_, rank_, t,
                                              describe("recv from", peer, tag, bytes));
    req->watched(watch_, "recv", bytes, peer);
    return req;
  }

 private:
  int thread() const { return group_->members[rank_]; }
  Round round(Op op, size_t n, DType t) const {
    Round r;
    r.op = op;
    r.n = n;
    r.t = t;
    return r;
  }
  std::string describe(const char* verb, int peer, int tag, size_t bytes) const {
    return detail::concat(verb, " rank ", peer, " (tag ", tag, ", ", bytes, " bytes) on ",
                          group_->name);
  }
  std::shared_ptr<Transfer> transfer(int src, int dst, int tag, size_t bytes) const {
    const int peer = src == rank_ ? dst : src;
    OMNI_CHECK(peer >= 0 && peer < size(), "[comm ", name(), "] point-to-point with rank ", peer,
               " of ", size());
    auto t = std::make_shared<Transfer>();
    t->src = src;
    t->dst = dst;
    t->tag = tag;
    t->bytes = bytes;
    return t;
  }
  // Pairs t with the first waiting counterpart of the same (source, destination, tag), as
  // MPI's non-overtaking rule does, or queues it.
  template <typename Pred>
  void match(const std::shared_ptr<Transfer>& t, std::deque<std::shared_ptr<Transfer>>& others,
             std::deque<std::shared_ptr<Transfer>>& mine, Pred same_source) {
    for (auto it = others.begin(); it != others.end(); ++it) {
      Transfer& o = **it;
      if (o.dst != t->dst || o.tag != t->tag || !same_source(o)) continue;
      Transfer& s = t->data ? *t : o;
      Transfer& r = t->data ? o : *t;
      OMNI_CHECK(s.bytes == r.bytes, "[comm ", name(), "] rank ", s.src, " sends ", s.bytes,
                 " bytes with tag ", s.tag, " to rank ", r.dst, ", which receives ", r.bytes);
      std::memcpy(r.buf, s.data, s.bytes);
      s.done = r.done = true;
      others.erase(it);
      world_->cv.notify_all();
      return;
    }
    mine.push_back(t);
  }
  // Adds this rank's part of its next collective on this group (lock held); the rank that
  // completes the round performs it.
  uint64_t post(const Round& proto, const void* in, void* out, int color = 0, int key = 0,
                const std::string& new_name = "") {
    world_->throw_if_failed();
    const uint64_t seq = next_++;
    auto [it, fresh] = group_->rounds.try_emplace(seq, proto);
    Round& r = it->second;
    const int p = size();
    if (fresh) {
      r.in.resize(p);
      r.out.resize(p);
      r.color.resize(p);
      r.key.resize(p);
      r.new_name.resize(p);
      r.new_group.resize(p);
      r.new_rank.resize(p);
    } else {
      OMNI_CHECK(r.op == proto.op && r.n == proto.n && r.t == proto.t && r.root == proto.root &&
                     r.reduce == proto.reduce,
                 "[comm ", name(), "] collective #", seq, " differs between ranks: rank ", rank_,
                 " calls ", op_name(proto.op), " of ", proto.n, " ", dtype_name(proto.t), " (root ",
                 proto.root, ") where another rank called ", op_name(r.op), " of ", r.n, " ",
                 dtype_name(r.t), " (root ", r.root, ")");
    }
    r.in[rank_] = in;
    r.out[rank_] = out;
    r.color[rank_] = color;
    r.key[rank_] = key;
    r.new_name[rank_] = new_name;
    if (++r.arrived == p && !r.cancelled) {
      perform(r, *group_);
      r.done = true;
      world_->cv.notify_all();
    }
    return seq;
  }
  void blocking(const Round& proto, const void* in, void* out) {
    const size_t bytes = proto.op == Op::Broadcast ? proto.n : proto.n * dtype_size(proto.t);
    CollectiveWatch watch(*watch_, op_name(proto.op), bytes);
    std::unique_lock<std::mutex> lk(world_->mu);
    const uint64_t seq = post(proto, in, out);
    finish_round(lk, *world_, *group_, rank_, seq);
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int rank_;
  uint64_t next_ = 0;  // this rank's count of collectives on this group
  std::shared_ptr<WatchGroup> watch_;
};

}  // namespace

void run_ranks(int n, const std::function<void(Communicator& world)>& fn) {
  OMNI_CHECK(n >= 1, "[comm] run_ranks with ", n, " ranks");
  auto world = std::make_shared<World>(n);
  auto group = std::make_shared<Group>();
  group->name = "world";
  group->members.resize(n);
  std::iota(group->members.begin(), group->members.end(), 0);
  set_hang_dir(make_hang_dir());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      watch_this_thread(r, n);
      try {
        LocalCommunicator comm(world, group, r);
        fn(comm);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(world->mu);
        world->record_failure(r, std::current_exception(), e.what());
      } catch (...) {
        std::lock_guard<std::mutex> lk(world->mu);
        world->record_failure(r, std::current_exception(), "an exception of unknown type");
      }
      std::lock_guard<std::mutex> lk(world->mu);
      world->ranks[r].finished = true;
      world->check_deadlock();
      unwatch_this_thread();
    });
  }
  for (std::thread& t : threads) t.join();
  if (world->failure) std::rethrow_exception(world->failure);
}

}  // namespace omni
