// Exercises every Communicator call over MPI against values computed here, and the ways a
// job can fail. tests/mpi/test_mpi.cpp runs it under mpirun at 2, 3, 4 and 8 ranks.
//
//   omnitron_mpi_check collectives     every call on the world, again with max_count 3 (so
//                                      each call is split into chunks), on split groups, the
//                                      process grid and data-parallel buckets
//   omnitron_mpi_check throw R         rank R throws while the others wait in an all-reduce
//   omnitron_mpi_check hang PIDFILE    all ranks all-reduce for up to 120 s; rank 1 writes
//                                      its pid to PIDFILE first (a test kills it)
//   omnitron_mpi_check stall MINUTES   --distributed-timeout-minutes MINUTES: rank 1 never
//                                      joins the others' all-reduce (the watchdog must end it)
//   omnitron_mpi_check watchdog SCENARIO REPORT_S TIMEOUT_MIN   a hang of comm/hang_scenarios.h
//                                      (4 ranks) with --hang-report-seconds REPORT_S
//   omnitron_mpi_check idle            starts MPI and sleeps 120 s: a rank that never joins
//                                      (beside `omnitron train` in one mpirun job)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/process_grid.h"
#include "../comm/hang_scenarios.h"
#include "comm/watchdog.h"
#include "parallel/data_parallel.h"

namespace {

using omni::Communicator;
using omni::DType;

void expect(bool ok, Communicator& c, const std::string& what) {
  if (!ok) throw omni::InternalError("on " + c.name() + " (rank " + std::to_string(c.rank()) +
                                     " of " + std::to_string(c.size()) + "): " + what);
}

template <typename T>
void expect_eq(const std::vector<T>& got, const std::vector<T>& want, Communicator& c,
               const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    expect(got.at(i) == want[i], c,
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
  c.all_reduce(x.data(), x.size());
  expect_eq(x, want, c, "all_reduce f32 sum");

  std::vector<double> m(7);
  for (int i = 0; i < 7; ++i) m[i] = (7 * r + i) % p;
  c.all_reduce(m.data(), m.size(), omni::ReduceOp::Max);
  expect_eq(m, std::vector<double>(7, p - 1), c, "all_reduce f64 max");

  const int n = 5;
  std::vector<float> in(p * n), out(n), rs_want(n);
  std::vector<double> ind(p * n), outd(n);
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) in[k * n + j] = ind[k * n + j] = 100 * r + 10 * k + j;
  for (int j = 0; j < n; ++j) rs_want[j] = 100 * p * (p - 1) / 2 + p * (10 * r + j);
  c.reduce_scatter(out.data(), in.data(), n);
  expect_eq(out, rs_want, c, "reduce_scatter f32");
  auto rs = c.ireduce_scatter(outd.data(), ind.data(), n, DType::F64);
  std::vector<double> a(6, r), b(4, 2.0 * r);
  auto ra = c.iall_reduce(a.data(), a.size(), DType::F64);
  auto rb = c.iall_reduce(b.data(), b.size(), DType::F64);
  rb->test();
  rb->wait();
  ra->wait();
  rs->wait();
  expect(rs->test(), c, "a completed request tests true");
  expect_eq(outd, std::vector<double>(rs_want.begin(), rs_want.end()), c, "ireduce_scatter f64");
  expect_eq(a, std::vector<double>(6, p * (p - 1) / 2.0), c, "iall_reduce (first)");
  expect_eq(b, std::vector<double>(4, double(p * (p - 1))), c, "iall_reduce (second)");
}

void check_movement(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const int n = 4;
  std::vector<float> mine(n), all(p * n), want(p * n);
  for (int j = 0; j < n; ++j) mine[j] = 10 * r + j;
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) want[k * n + j] = 10 * k + j;
  c.all_gather(all.data(), mine.data(), n);
  expect_eq(all, want, c, "all_gather");
  std::vector<float> in_place(p * n, -1);
  std::copy(mine.begin(), mine.end(), in_place.begin() + r * n);
  c.all_gather(in_place.data(), in_place.data() + r * n, n);
  expect_eq(in_place, want, c, "all_gather in place");

  std::vector<uint16_t> half(3), halves(3 * p), halves_want(3 * p);
  for (int j = 0; j < 3; ++j) half[j] = uint16_t(1000 * r + j);
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < 3; ++j) halves_want[3 * k + j] = uint16_t(1000 * k + j);
  c.all_gather(halves.data(), half.data(), 3, DType::BF16);
  expect_eq(halves, halves_want, c, "all_gather bf16");

  std::vector<double> send(p * n), recv(p * n), a2a_want(p * n);
  for (int k = 0; k < p; ++k)
    for (int j = 0; j < n; ++j) {
      send[k * n + j] = 1000 * r + 10 * k + j;
      a2a_want[k * n + j] = 1000 * k + 10 * r + j;
    }
  c.all_to_all(recv.data(), send.data(), n, DType::F64);
  expect_eq(recv, a2a_want, c, "all_to_all");

  char text[12] = "-----------";
  if (r == p - 1) std::strcpy(text, "from last!!");
  c.broadcast(text, sizeof text, p - 1);
  expect(std::string(text) == "from last!!", c, "broadcast from the last rank");
  c.barrier();
}

void check_point_to_point(Communicator& c) {
  const int p = c.size(), r = c.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  // A token around the ring, 7 doubles (56 bytes: several chunks with max_count 3).
  std::vector<double> token(7, 0.0);
  if (r != 0) c.recv(token.data(), token.size() * sizeof(double), prev, 11);
  for (double& t : token) t += r;
  c.send(token.data(), token.size() * sizeof(double), next, 11);
  if (r == 0) {
    c.recv(token.data(), token.size() * sizeof(double), prev, 11);
    expect_eq(token, std::vector<double>(7, p * (p - 1) / 2.0), c, "ring send/recv");
  }
  // Both neighbours at once, non-blocking, with a message of no bytes between them.
  int to_next = 100 + r, to_prev = 200 + r, from_prev = -1, from_next = -1;
  auto r1 = c.irecv(&from_prev, sizeof(int), prev, 1);
  auto r2 = c.irecv(&from_next, sizeof(int), next, 2);
  auto r0 = c.irecv(nullptr, 0, prev, 3);
  auto s1 = c.isend(&to_next, sizeof(int), next, 1);
  auto s2 = c.isend(&to_prev, sizeof(int), prev, 2);
  auto s0 = c.isend(nullptr, 0, next, 3);
  for (auto* req : {&s2, &s1, &s0, &r0, &r2, &r1}) (*req)->wait();
  expect(from_prev == 100 + prev, c, "isend/irecv from the previous rank");
  expect(from_next == 200 + next, c, "isend/irecv from the next rank");
}

void check_everything(Communicator& c) {
  check_reductions(c);
  check_movement(c);
  check_point_to_point(c);
}

void check_groups(Communicator& world) {
  const int p = world.size(), r = world.rank();
  auto half = world.split(r % 2, -r, "half");
  std::vector<double> members(half->size());
  const double me = r;
  half->all_gather(members.data(), &me, 1);
  for (int i = 0; i < half->size(); ++i) {
    // Same parity as r, in decreasing order of rank.
    const int last = (p - 1) % 2 == r % 2 ? p - 1 : p - 2;
    expect(members[i] == last - 2 * i, *half, "split ordered by key");
  }
  check_everything(*half);
  if (p % 2 != 0) return;
  const omni::ParallelLayout layout{.tp = 2};
  omni::ProcessGrid grid(world, layout);
  for (const auto& [comm, kind] : {std::pair<Communicator*, const char*>{&grid.tp(), "tp"},
                                   {&grid.dp(), "dp"}}) {
    std::vector<double> got(comm->size());
    comm->all_gather(got.data(), &me, 1);
    for (const auto& g : omni::rank_groups(p, layout, kind))
      if (std::find(g.begin(), g.end(), r) != g.end())
        expect_eq(got, std::vector<double>(g.begin(), g.end()), *comm, "process grid groups");
  }
}

// Buckets, overlapped or not, against an all-reduce of the whole pre-scaled buffer.
void check_data_parallel(Communicator& world) {
  const int p = world.size(), r = world.rank();
  std::vector<omni::ParamInfo> infos = {{"a", {37}}, {"b", {5, 9}}, {"c", {64}}};
  for (const auto mode : {omni::GradReduce::AllReduce, omni::GradReduce::ReduceScatter}) {
    omni::ParameterSet<float> params(infos);
    omni::DataParallelBuckets<float> ddp(world, params, 50, mode);
    std::vector<float> want(params.size());
    for (int64_t i = 0; i < params.size(); ++i)
      want[i] = params.grads()[i] = float((i * 31 + r * 17) % 97) * float(1.0 / p);
    world.all_reduce(want.data(), want.size());
    for (int64_t i = 0; i < params.size(); ++i) params.grads()[i] *= float(p);
    for (size_t k = params.infos().size(); k-- > 0;)
      ddp.mark_ready(params.infos()[k].offset, params.infos()[k].offset + params.infos()[k].numel);
    ddp.finish();
    for (const omni::ShardRange& s : mode == omni::GradReduce::AllReduce
                                         ? std::vector<omni::ShardRange>{{0, params.size()}}
                                         : ddp.shard())
      for (int64_t i = s.begin; i < s.end; ++i)
        expect(params.grads()[i] == want[i], world, "data-parallel buckets, element " +
                                                        std::to_string(i));
  }
}

int run(const std::vector<std::string>& args) {
  Communicator& world = omni::world_communicator();
  const std::string mode = args.empty() ? "" : args[0];
  if (mode == "collectives") {
    check_everything(world);
    auto chunked = omni::make_mpi_world(3);
    check_everything(*chunked);
    check_groups(world);
    check_data_parallel(world);
    world.barrier();
    if (world.rank() == 0) std::printf("all checks passed on %d ranks\n", world.size());
    return 0;
  }
  if (mode == "throw" && args.size() == 2) {
    world.barrier();
    if (world.rank() == std::stoi(args[1]))
      throw omni::UsageError("rank " + args[1] + " was told to fail");
    float x = 1;
    world.all_reduce(&x, 1);  // never completes: the failing rank does not come
    return 0;
  }
  if (mode == "hang" && args.size() == 2) {
    if (world.rank() == 1) {
      const std::string tmp = args[1] + ".tmp";
      std::ofstream(tmp) << getpid() << "\n";
      std::rename(tmp.c_str(), args[1].c_str());
    }
    std::vector<float> x(1000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(120))
      world.all_reduce(x.data(), x.size());
    std::fprintf(stderr, "rank %d: not killed within 120 s\n", world.rank());
    return 3;
  }
  if (mode == "stall" && args.size() == 2) {
    omni::set_collective_timeout(std::stod(args[1]) * 60,
                                 "--distributed-timeout-minutes " + args[1]);
    world.barrier();
    if (world.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(120));
    } else {
      float x = 1;
      world.all_reduce(&x, 1);
    }
    std::fprintf(stderr, "rank %d: the watchdog did not end the job within 120 s\n", world.rank());
    return 3;
  }
  if (mode == "watchdog" && args.size() == 4) {  // watchdog SCENARIO REPORT_S TIMEOUT_MIN
    omni::set_hang_report_seconds(std::stod(args[2]));
    omni::set_collective_timeout(std::stod(args[3]) * 60,
                                 "--distributed-timeout-minutes " + args[3]);
    omni::testing::run_hang_scenario(world, args[1]);
    std::fprintf(stderr, "rank %d: the watchdog did not end the job\n", world.rank());
    return 3;
  }
  if (mode == "idle") {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    std::fprintf(stderr, "rank %d: idle for 120 s and not ended\n", world.rank());
    return 3;
  }
  throw omni::UsageError(
      "usage: omnitron_mpi_check collectives | throw RANK | hang PIDFILE | stall MINUTES | watchdog SCENARIO REPORT_S TIMEOUT_MIN | idle");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::string where;
    try {
      const Communicator& world = omni::world_communicator();
      where = " [rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
              "]";
    } catch (const std::exception&) {
      // The world itself did not start; the message says why.
    }
    std::fprintf(stderr, "omnitron_mpi_check%s: error: %s\n", where.c_str(), e.what());
    omni::abort_world(2);
    return 2;
  }
}
