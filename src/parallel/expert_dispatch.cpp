#include "parallel/expert_dispatch.h"

#include <algorithm>
#include <memory>

#include "backend/moe_ops.h"
#include "base/error.h"

namespace omni {

ExpertAllToAll::ExpertAllToAll(Communicator& ep, const ops::MoEDispatchPlan& plan, int experts)
    : ep_(&ep) {
  const int n = ep.size(), local = experts / n;
  OMNI_CHECK(local * n == experts && plan.experts == experts, "[expert dispatch] ", experts,
             " experts over ", n, " ranks (plan of ", plan.experts, ")");
  // Counts travel as f64 (the communicator's types are floating point; exact below 2^53).
  std::vector<double> send(experts), recv(experts);
  for (int e = 0; e < experts; ++e) send[e] = double(plan.expert_rows(e));
  ep.all_to_all(recv.data(), send.data(), size_t(local), DType::F64);
  send_rows_.assign(n, 0), recv_rows_.assign(n, 0);
  std::vector<int64_t> block_start(size_t(n) * local + 1, 0);  // received, source-major
  for (int s = 0; s < n; ++s)
    for (int l = 0; l < local; ++l) {
      send_rows_[s] += size_t(send[s * local + l]);
      recv_rows_[s] += size_t(recv[s * local + l]);
      block_start[s * local + l + 1] = block_start[s * local + l] + int64_t(recv[s * local + l]);
    }
  expert_offsets_.assign(local + 1, 0);
  for (int l = 0; l < local; ++l)
    for (int s = 0; s < n; ++s) {
      for (int64_t r = block_start[s * local + l]; r < block_start[s * local + l + 1]; ++r)
        order_.push_back(int32_t(r));
      expert_offsets_[l + 1] = int32_t(order_.size());
    }
}

namespace {
// expert-major row i <-> received row order[i], copied in runs of consecutive rows (one
// block per source rank and local expert) where `e` says.
template <typename T>
void reorder_rows(const ops::Exec& e, T* dst, const T* src, const std::vector<int32_t>& order,
                  int width, bool to_expert_major) {
  const size_t w = size_t(width);
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    while (j < order.size() && order[j] == order[j - 1] + 1) ++j;
    const size_t n = (j - i) * w, received = size_t(order[i]) * w;
    if (to_expert_major)
      ops::copy(e, dst + i * w, src + received, n);
    else
      ops::copy(e, dst + received, src + i * w, n);
    i = j;
  }
}
// Communicator::all_to_all_v's exchange (counts in elements), with this rank's own block
// copied where `e` says: all_to_all_v copies it with memcpy, which a GPU's memory does not
// take. Its message order (receives, then sends, in ring order from this rank) and tag.
template <typename T>
void exchange_rows(Communicator& ep, const ops::Exec& e, T* out, const std::vector<size_t>& recv,
                   const T* in, const std::vector<size_t>& send) {
  if (!e.on_gpu()) return ep.all_to_all_v(out, recv.data(), in, send.data(), dtype_of<T>());
  constexpr int kTag = 0x6570;
  const int n = ep.size(), me = ep.rank();
  std::vector<size_t> send_at(n + 1, 0), recv_at(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    send_at[r + 1] = send_at[r] + send[r];
    recv_at[r + 1] = recv_at[r] + recv[r];
  }
  std::vector<std::unique_ptr<CommRequest>> pending;
  for (int k = 1; k < n; ++k) {
    const int from = (me - k + n) % n;
    if (recv[from] > 0)
      pending.push_back(ep.irecv(out + recv_at[from], recv[from] * sizeof(T), from, kTag));
  }
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    if (send[to] > 0) pending.push_back(ep.isend(in + send_at[to], send[to] * sizeof(T), to, kTag));
  }
  ops::copy(e, out + recv_at[me], in + send_at[me], send[me]);
  for (auto& r : pending) r->wait();
}
}  // namespace

template <typename T>
void ExpertAllToAll::dispatch(T* expert_rows, const T* rows, int width, const ops::Exec& e,
                              T* staging) const {
  std::vector<size_t> send(send_rows_), recv(recv_rows_);
  for (size_t& c : send) c *= size_t(width);
  for (size_t& c : recv) c *= size_t(width);
  exchange_rows(*ep_, e, staging, recv, rows, send);
  reorder_rows(e, expert_rows, staging, order_, width, true);
}

template <typename T>
void ExpertAllToAll::combine(T* rows, const T* expert_rows, int width, const ops::Exec& e,
                             T* staging) const {
  std::vector<size_t> send(recv_rows_), recv(send_rows_);
  for (size_t& c : send) c *= size_t(width);
  for (size_t& c : recv) c *= size_t(width);
  reorder_rows(e, staging, expert_rows, order_, width, false);
  exchange_rows(*ep_, e, rows, recv, staging, send);
}

ExpertTensorExchange::ExpertTensorExchange(Communicator& etp, const int32_t* offsets,
                                           int local_experts)
    : etp_(&etp), local_(local_experts), own_(offsets, offsets + local_experts + 1) {
  const int n = etp.size(), me = etp.rank(), L = local_experts;
  // Counts travel as f64 (the communicator's types are floating point; exact below 2^53).
  std::vector<double> mine(L), all(size_t(n) * L);
  for (int l = 0; l < L; ++l) mine[l] = double(offsets[l + 1] - offsets[l]);
  etp.all_gather(all.data(), mine.data(), size_t(L));
  counts_.resize(all.size()), at_.resize(all.size());
  expert_offsets_.assign(L + 1, 0);
  int32_t row = 0;
  for (int l = 0; l < L; ++l) {
    for (int r = 0; r < n; ++r) {
      const size_t i = size_t(r) * L + l;
      counts_[i] = int32_t(all[i]), at_[i] = row;
      row += counts_[i];
    }
    expert_offsets_[l + 1] = row;
  }
  peer_at_.assign(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    int32_t rows = 0;
    for (int l = 0; l < L; ++l) rows += counts_[size_t(r) * L + l];
    peer_at_[r + 1] = peer_at_[r] + (r == me ? 0 : rows);
  }
}

int ExpertTensorExchange::staging_rows() const {
  return peer_at_.back() + std::max(etp_->size() - 2, 0) * own_rows();
}

namespace {
constexpr int kExpertTensorTag = 0x6574;
}  // namespace

template <typename T>
void ExpertTensorExchange::gather(T* all, const T* mine, int width, const ops::Exec& e,
                                  T* staging) const {
  const int n = etp_->size(), me = etp_->rank(), L = local_;
  const size_t w = size_t(width), own = size_t(own_rows());
  // One message each way per other rank: this rank's rows (contiguous) to it, its rows into
  // staging (receives first, then sends in ring order), then its blocks to their experts.
  std::vector<std::unique_ptr<CommRequest>> pending;
  for (int k = 1; k < n; ++k) {
    const int from = (me - k + n) % n;
    if (const size_t c = size_t(peer_at_[from + 1] - peer_at_[from]); c > 0)
      pending.push_back(etp_->irecv(staging + size_t(peer_at_[from]) * w, c * w * sizeof(T), from,
                                    kExpertTensorTag));
  }
  for (int k = 1; k < n && own > 0; ++k)
    pending.push_back(etp_->isend(mine, own * w * sizeof(T), (me + k) % n, kExpertTensorTag));
  for (int l = 0; l < L; ++l)
    ops::copy(e, all + size_t(at_[size_t(me) * L + l]) * w, mine + size_t(own_[l]) * w,
              size_t(own_[l + 1] - own_[l]) * w);
  for (auto& r : pending) r->wait();
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    size_t from = size_t(peer_at_[r]);
    for (int l = 0; l < L; ++l) {
      const size_t i = size_t(r) * L + l, c = size_t(counts_[i]);
      if (c > 0) ops::copy(e, all + size_t(at_[i]) * w, staging + from * w, c * w);
      from += c;
    }
  }
}

template <typename T>
void ExpertTensorExchange::reduce_scatter(T* mine, const T* all, int width, const ops::Exec& e,
                                          T* staging) const {
  const int n = etp_->size(), me = etp_->rank(), L = local_;
  const size_t w = size_t(width), own = size_t(own_rows()) * w;
  // This rank's own part of its rows, block l of expert l, stays in `all`.
  auto own_block = [&](int l) { return all + size_t(at_[size_t(me) * L + l]) * w; };
  if (n == 1) {
    for (int l = 0; l < L; ++l)
      ops::copy(e, mine + size_t(own_[l]) * w, own_block(l), size_t(own_[l + 1] - own_[l]) * w);
    return;
  }
  // The sum runs in rank order from rank 0's part plus rank 1's: the one of them that is
  // another rank's (`direct`) lands in `mine`, every other rank's in staging after the
  // packed sends (this rank's part of each other rank's rows, in gather's staging layout).
  const int direct = me == 0 ? 1 : 0;
  T* const received = staging + size_t(peer_at_.back()) * w;
  auto part = [&](int r) {  // rank r's part of this rank's rows (r neither me nor direct)
    return received + size_t(r - (r > me) - (r > direct)) * own;
  };
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    size_t to = size_t(peer_at_[r]);
    for (int l = 0; l < L; ++l) {
      const size_t i = size_t(r) * L + l, c = size_t(counts_[i]);
      if (c > 0) ops::copy(e, staging + to * w, all + size_t(at_[i]) * w, c * w);
      to += c;
    }
  }
  std::vector<std::unique_ptr<CommRequest>> pending;
  for (int k = 1; k < n && own > 0; ++k) {
    const int from = (me - k + n) % n;
    pending.push_back(
        etp_->irecv(from == direct ? mine : part(from), own * sizeof(T), from, kExpertTensorTag));
  }
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    if (const size_t c = size_t(peer_at_[to + 1] - peer_at_[to]); c > 0)
      pending.push_back(
          etp_->isend(staging + size_t(peer_at_[to]) * w, c * w * sizeof(T), to, kExpertTensorTag));
  }
  for (auto& r : pending) r->wait();
  // mine = a + b, a and b each either `mine` itself, a received part, or (null) this rank's
  // own part, added expert by expert from `all`.
  auto add = [&](const T* a, const T* b) {
    if (a && b) return ops::add(e, mine, a, b, own);
    for (int l = 0; l < L; ++l) {
      const size_t at = size_t(own_[l]) * w, c = size_t(own_[l + 1] - own_[l]) * w;
      if (c > 0) ops::add(e, mine + at, a ? a + at : own_block(l), b ? b + at : own_block(l), c);
    }
  };
  // Rank 0's part plus rank 1's (one of them `mine`, the direct one), then the others'.
  if (me == 0)
    add(nullptr, mine);
  else
    add(mine, me == 1 ? nullptr : part(1));
  for (int r = 2; r < n; ++r) add(mine, r == me ? nullptr : part(r));
}

template <typename P>
GatheredRouting<P> gather_routing(Communicator& ep, const P* probs, const int32_t* indices,
                                  int tokens, int topk) {
  const int n = ep.size();
  const size_t nk = size_t(tokens) * topk, block = 1 + 2 * nk;
  std::vector<P> mine(block), all(size_t(n) * block);
  mine[0] = P(tokens);
  std::copy(probs, probs + nk, mine.begin() + 1);
  for (size_t i = 0; i < nk; ++i) {
    OMNI_CHECK(indices[i] >= 0 && indices[i] < (1 << 24), "[expert dispatch] expert index ",
               indices[i]);
    mine[1 + nk + i] = P(indices[i]);
  }
  ep.all_gather(all.data(), mine.data(), block);
  GatheredRouting<P> r;
  r.probs.resize(size_t(n) * nk);
  r.indices.resize(size_t(n) * nk);
  for (int s = 0; s < n; ++s) {
    const P* from = all.data() + size_t(s) * block;
    OMNI_REQUIRE(from[0] == P(tokens), "--moe-token-dispatcher-type allgather: rank ", s,
                 " of the dispatch group (expert tp x ep) routes ", double(from[0]),
                 " tokens, this rank ", tokens,
                 " (the ranks' micro-batches must be the same size)");
    std::copy(from + 1, from + 1 + nk, r.probs.begin() + ptrdiff_t(s * nk));
    for (size_t i = 0; i < nk; ++i) r.indices[s * nk + i] = int32_t(from[1 + nk + i]);
  }
  return r;
}

template <typename T>
ops::MoEDispatchPlan expert_allgather_plan(const int32_t* indices, const T* probs, int tokens,
                                           int ranks, int experts, int topk,
                                           const ops::MoECapacityArgs& capacity, int first_expert,
                                           int local_experts) {
  std::vector<ops::MoEDispatchPlan> sources;
  for (int s = 0; s < ranks; ++s)
    sources.push_back(ops::moe_dispatch_plan(indices + size_t(s) * tokens * topk,
                                             probs + size_t(s) * tokens * topk, tokens, experts,
                                             topk, capacity));
  ops::MoEDispatchPlan p;
  p.tokens = tokens * ranks, p.experts = local_experts, p.topk = topk;
  p.capacity = sources.empty() ? 0 : sources[0].capacity;
  p.expert_offsets.assign(local_experts + 1, 0);
  for (int l = 0; l < local_experts; ++l) {
    for (int s = 0; s < ranks; ++s) {
      const ops::MoEDispatchPlan& q = sources[s];
      for (int32_t r = q.expert_offsets[first_expert + l];
           r < q.expert_offsets[first_expert + l + 1]; ++r) {
        p.row_token.push_back(s * tokens + q.row_token[r]);
        p.row_slot.push_back(q.row_slot[r] < 0 ? -1 : s * tokens * topk + q.row_slot[r]);
      }
    }
    p.expert_offsets[l + 1] = p.rows();
  }
  for (const ops::MoEDispatchPlan& q : sources) p.dropped += q.dropped;
  // Each gathered token's rows, ascending.
  p.token_offsets.assign(size_t(p.tokens) + 1, 0);
  for (int32_t t : p.row_token) ++p.token_offsets[size_t(t) + 1];
  for (int t = 0; t < p.tokens; ++t) p.token_offsets[t + 1] += p.token_offsets[t];
  p.token_rows.resize(p.row_token.size());
  std::vector<int32_t> fill(p.token_offsets.begin(), p.token_offsets.end() - 1);
  for (int r = 0; r < p.rows(); ++r) p.token_rows[fill[p.row_token[r]]++] = r;
  return p;
}

#define OMNI_EXPERT_ROWS(T)                                                                      \
  template void ExpertAllToAll::dispatch<T>(T*, const T*, int, const ops::Exec&, T*) const;      \
  template void ExpertAllToAll::combine<T>(T*, const T*, int, const ops::Exec&, T*) const;       \
  template void ExpertTensorExchange::gather<T>(T*, const T*, int, const ops::Exec&, T*) const;  \
  template void ExpertTensorExchange::reduce_scatter<T>(T*, const T*, int, const ops::Exec&, T*) \
      const;
OMNI_EXPERT_ROWS(float)
OMNI_EXPERT_ROWS(double)
OMNI_EXPERT_ROWS(bf16)  // a 16-bit MoE layer's rows (its routing plans are float's)
OMNI_EXPERT_ROWS(f16)
#undef OMNI_EXPERT_ROWS
#define OMNI_EXPERT_PLAN(T)                                                                 \
  template ops::MoEDispatchPlan expert_allgather_plan<T>(                                   \
      const int32_t*, const T*, int, int, int, int, const ops::MoECapacityArgs&, int, int); \
  template GatheredRouting<T> gather_routing<T>(Communicator&, const T*, const int32_t*, int, int);
OMNI_EXPERT_PLAN(float)
OMNI_EXPERT_PLAN(double)
#undef OMNI_EXPERT_PLAN

}  // namespace omni
