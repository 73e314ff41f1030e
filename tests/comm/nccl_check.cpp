// Exercises every Communicator call of the NCCL communicator on device buffers, against values
// computed here. One process per GPU:
//   mpirun -np 2 build/tests/omnitron_nccl_check      (or without mpirun: one rank, one GPU)
// Prints "nccl check: all passed on N ranks" from rank 0 and exits 0; otherwise names the
// failing call and exits 2. Built only with OMNITRON_NCCL (see comm/nccl_communicator.h).
#if defined(OMNITRON_NCCL)

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/nccl_communicator.h"

namespace {

using omni::Communicator;
using omni::DType;

void expect(bool ok, Communicator& c, const std::string& what) {
  if (!ok)
    throw omni::InternalError("on " + c.name() + " (rank " + std::to_string(c.rank()) + " of " +
                              std::to_string(c.size()) + "): " + what);
}

void cuda(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess)
    throw omni::InternalError(std::string(call) + ": " + cudaGetErrorString(rc));
}

// A device copy of a host vector, read back with host().
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& v) : n_(v.size()) {
    cuda(cudaMalloc(&p_, std::max<size_t>(1, n_) * sizeof(T)), "cudaMalloc");
    cuda(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  explicit DeviceVector(size_t n) : DeviceVector(std::vector<T>(n)) {}
  ~DeviceVector() { cudaFree(p_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    cuda(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

template <typename T>
void expect_eq(const std::vector<T>& got, const std::vector<T>& want, Communicator& c,
               const std::string& what) {
  expect(got.size() == want.size(), c, what + ": size");
  for (size_t i = 0; i < want.size(); ++i)
    expect(got[i] == want[i], c,
           what + ": element " + std::to_string(i) + " is " + std::to_string(double(got[i])) +
               ", expected " + std::to_string(double(want[i])));
}

void check_reductions(Communicator& c) {
  const int p = c.size(), r = c.rank();
  std::vector<float> x(10), want(10);
  for (int i = 0; i < 10; ++i) {
    x[i] = float(r) + 0.5f * i;
    want[i] = float(p * (p - 1) / 2) + 0.5f * p * i;
  }
  DeviceVector<float> dx(x);
  c.all_reduce(dx.get(), x.size(), DType::F32);
  expect_eq(dx.host(), want, c, "all_reduce f32 sum");

  std::vector<double> m(7);
  for (int i = 0; i < 7; ++i) m[i] = (7 * r + i) % p;
  DeviceVector<double> dm(m);
  c.all_reduce(dm.get(), m.size(), DType::F64, omni::ReduceOp::Max);
  expect_eq(dm.host(), std::vector<double>(7, p - 1), c, "all_reduce f64 max");

  // bf16 sums of small integers are exact.
  std::vector<uint16_t> h(9, omni::f32_to_bf16(float(r + 1)));
  DeviceVector<uint16_t> dh(h);
  c.all_reduce(dh.get(), h.size(), DType::BF16);
  expect_eq(dh.host(), std::vector<uint16_t>(9, omni::f32_to_bf16(float(p * (p + 1) / 2))), c,
            "all_reduce bf16 sum");

  const int n = 5;
  std::vector<float> in(p * n), rs_want(n);
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) in[k * n + j] = 100 * r + 10 * k + j;
  for (int j = 0; j < n; ++j) rs_want[j] = 100 * p * (p - 1) / 2 + p * (10 * r + j);
  DeviceVector<float> din(in), dout(n), dout2(n);
  c.reduce_scatter(dout.get(), din.get(), n, DType::F32);
  expect_eq(dout.host(), rs_want, c, "reduce_scatter f32");

  auto rs = c.ireduce_scatter(dout2.get(), din.get(), n, DType::F32);
  DeviceVector<float> a(std::vector<float>(6, float(r)));
  auto ra = c.iall_reduce(a.get(), 6, DType::F32);
  while (!ra->test()) {
  }
  rs->wait();
  expect(rs->test(), c, "a completed request tests true");
  expect_eq(dout2.host(), rs_want, c, "ireduce_scatter f32");
  expect_eq(a.host(), std::vector<float>(6, float(p * (p - 1) / 2)), c, "iall_reduce");
}

void check_movement(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const int n = 4;
  std::vector<float> mine(n), want(p * n);
  for (int j = 0; j < n; ++j) mine[j] = 10 * r + j;
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) want[k * n + j] = 10 * k + j;
  DeviceVector<float> dmine(mine), dall(p * n);
  c.all_gather(dall.get(), dmine.get(), n, DType::F32);
  expect_eq(dall.host(), want, c, "all_gather");

  std::vector<float> in_place(p * n, -1.0f);
  std::copy(mine.begin(), mine.end(), in_place.begin() + r * n);
  DeviceVector<float> dip(in_place);
  c.all_gather(dip.get(), dip.get() + r * n, n, DType::F32);
  expect_eq(dip.host(), want, c, "all_gather in place");

  // all_to_all: block k of rank r holds 100 r + k; rank r receives 100 k + r from rank k.
  std::vector<float> blocks(p * n), a2a_want(p * n);
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) {
      blocks[k * n + j] = 100 * r + k + 0.25f * j;
      a2a_want[k * n + j] = 100 * k + r + 0.25f * j;
    }
  DeviceVector<float> dblocks(blocks), da2a(p * n);
  c.all_to_all(da2a.get(), dblocks.get(), n, DType::F32);
  expect_eq(da2a.host(), a2a_want, c, "all_to_all");

  const int root = p - 1;
  std::vector<uint8_t> bytes(13, uint8_t(r == root ? 7 : 0));
  DeviceVector<uint8_t> db(bytes);
  c.broadcast(db.get(), bytes.size(), root);
  expect_eq(db.host(), std::vector<uint8_t>(13, 7), c, "broadcast");
}

// all_to_all_v with uneven blocks, as MoE token dispatch sends them: rank r sends
// count(r, k) elements to rank k, some blocks empty (its own included on some ranks), and
// 24 MiB to the next rank, far past NCCL's internal buffers, so that sends launched one by one
// outside a group would deadlock. Element j of the block from r to k is
// 1000 r + k + (j mod 4096) / 4, exact in float. On device buffers, then on host buffers
// (staged through device memory).
size_t a2av_count(int from, int to, int p) {
  size_t n = size_t((from + 2 * to) % 4);
  if (p > 1 && to == (from + 1) % p) n += size_t(6) << 20;
  return n;
}
void check_all_to_all_v(Communicator& c) {
  const int p = c.size(), r = c.rank();
  std::vector<size_t> send(p), recv(p);
  std::vector<float> in, want;
  for (int k = 0; k < p; ++k) {
    send[k] = a2av_count(r, k, p), recv[k] = a2av_count(k, r, p);
    for (size_t j = 0; j < send[k]; ++j) in.push_back(1000.0f * r + k + 0.25f * float(j % 4096));
    for (size_t j = 0; j < recv[k]; ++j) want.push_back(1000.0f * k + r + 0.25f * float(j % 4096));
  }
  DeviceVector<float> din(in), dout(want.size());
  c.all_to_all_v(dout.get(), recv.data(), din.get(), send.data(), DType::F32);
  expect_eq(dout.host(), want, c, "all_to_all_v of uneven device blocks");

  std::vector<float> out(want.size(), -1.0f);
  c.all_to_all_v(out.data(), recv.data(), in.data(), send.data(), DType::F32);
  expect_eq(out, want, c, "all_to_all_v of uneven host blocks");

  // Only this rank's own block: nothing crosses, the block is copied on the device.
  std::vector<size_t> self_only(p, 0);
  self_only[r] = 3;
  const std::vector<float> own{1.0f * r, 2.0f, 3.0f};
  DeviceVector<float> down(own), dself(3);
  c.all_to_all_v(dself.get(), self_only.data(), down.get(), self_only.data(), DType::F32);
  expect_eq(dself.host(), own, c, "all_to_all_v of this rank's block alone");
}

// Every rank sends to the next and receives from the previous with isend then irecv: launched
// one by one, large messages would deadlock (each send waits for a receive queued behind it).
void check_point_to_point(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const size_t n = size_t(8) << 20;  // 32 MiB of floats: far past NCCL's internal buffers
  std::vector<float> mine(n, float(r)), expected(n, float((r + p - 1) % p));
  DeviceVector<float> send(mine), got(n);
  {
    auto s = c.isend(send.get(), n * sizeof(float), (r + 1) % p, 0);
    auto q = c.irecv(got.get(), n * sizeof(float), (r + p - 1) % p, 0);
    q->wait();
    s->wait();
  }
  expect(got.host() == expected, c, "isend/irecv around the ring");

  if (p == 1) return;
  // Blocking pairs: even ranks send first, odd ranks receive first.
  std::vector<int32_t> word{r};
  DeviceVector<int32_t> out(word), in(1);
  const int peer = r ^ 1;
  if (peer < p) {
    if (r % 2 == 0) {
      c.send(out.get(), sizeof(int32_t), peer, 1);
      c.recv(in.get(), sizeof(int32_t), peer, 1);
    } else {
      c.recv(in.get(), sizeof(int32_t), peer, 1);
      c.send(out.get(), sizeof(int32_t), peer, 1);
    }
    expect(in.host()[0] == peer, c, "send/recv with rank " + std::to_string(peer));
  }
}

void check_split(Communicator& c) {
  const int r = c.rank();
  auto part = c.split(r % 2, -r, c.name() + "/parity");  // reversed order by key
  int members = 0;
  for (int k = 0; k < c.size(); ++k) members += k % 2 == r % 2;
  expect(part->size() == members, *part, "split size");
  DeviceVector<float> one(std::vector<float>{1.0f});
  part->all_reduce(one.get(), 1, DType::F32);
  expect(one.host()[0] == float(members), *part, "all_reduce on a split part");
  // Key -r: the highest world rank of the color is rank 0 of the part.
  std::vector<float> top{float(r)};
  DeviceVector<float> dtop(top);
  part->all_reduce(dtop.get(), 1, DType::F32, omni::ReduceOp::Max);
  expect((part->rank() == 0) == (dtop.host()[0] == float(r)), *part, "split ordered by key");
}

// Host buffers (a model's losses and norms, a checkpoint's full-model sum): the blocking calls
// stage them through device memory, sums and broadcasts in pieces of 64 MiB; the non-blocking
// ones refuse them.
void check_host_buffers(Communicator& c) {
  const int p = c.size(), r = c.rank();
  double loss = r + 0.25;
  c.all_reduce(&loss, 1, DType::F64);
  expect(loss == p * (p - 1) / 2.0 + 0.25 * p, c, "all_reduce of a host double");

  const size_t big = size_t(20) << 20;  // 80 MiB of floats: two pieces
  std::vector<float> sum(big), sum_want(big);
  for (size_t i = 0; i < big; ++i) {
    sum[i] = float(r + int(i % 7));
    sum_want[i] = float(p * (p - 1) / 2 + p * int(i % 7));
  }
  c.all_reduce(sum.data(), big, DType::F32);
  expect(sum == sum_want, c, "all_reduce of 80 MiB of host floats");

  const int root = p - 1;
  std::vector<uint8_t> bytes(13, uint8_t(r == root ? 9 : 0));
  c.broadcast(bytes.data(), bytes.size(), root);
  expect_eq(bytes, std::vector<uint8_t>(13, 9), c, "broadcast of host bytes");

  const int n = 3;
  std::vector<float> mine(n), all(p * n), all_want(p * n), blocks(p * n), rs(n), rs_want(n);
  for (int j = 0; j < n; ++j) mine[j] = 10 * r + j;
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) {
      all_want[k * n + j] = 10 * k + j;
      blocks[k * n + j] = 100 * r + 10 * k + j;
    }
  for (int j = 0; j < n; ++j) rs_want[j] = 100 * p * (p - 1) / 2 + p * (10 * r + j);
  c.all_gather(all.data(), mine.data(), n, DType::F32);
  expect_eq(all, all_want, c, "all_gather of host floats");
  c.reduce_scatter(rs.data(), blocks.data(), n, DType::F32);
  expect_eq(rs, rs_want, c, "reduce_scatter of host floats");

  if (p > 1) {
    const int peer = r ^ 1;
    if (peer < p) {
      int32_t out = r, in = -1;
      if (r % 2 == 0) {
        c.send(&out, sizeof out, peer, 2);
        c.recv(&in, sizeof in, peer, 2);
      } else {
        c.recv(&in, sizeof in, peer, 2);
        c.send(&out, sizeof out, peer, 2);
      }
      expect(in == peer, c, "send/recv of a host word with rank " + std::to_string(peer));
    }
  }
  bool refused = false;
  try {
    c.iall_reduce(&loss, 1, DType::F64);
  } catch (const omni::InternalError&) {
    refused = true;
  }
  expect(refused, c, "iall_reduce refuses a host buffer");
}

int run() {
  Communicator& world = omni::world_communicator();
  auto nccl = omni::make_nccl_communicator(world, "nccl");
  expect(nccl->size() == world.size() && nccl->rank() == world.rank(), *nccl, "world layout");
  check_reductions(*nccl);
  check_movement(*nccl);
  check_all_to_all_v(*nccl);
  check_point_to_point(*nccl);
  check_split(*nccl);
  check_host_buffers(*nccl);
  nccl->barrier();
  if (world.rank() == 0)
    std::printf("nccl check: all passed on %d ranks (%s)\n", world.size(),
                omni::nccl_version().c_str());
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "omnitron_nccl_check: error: %s\n", e.what());
    omni::abort_world(2);
    return 2;
  }
}

#else
#include <cstdio>
int main() {
  std::printf("omnitron_nccl_check: built without OMNITRON_NCCL, nothing to check\n");
  return 0;
}
#endif  // OMNITRON_NCCL
