// The in-process communicator against hand-computed results: every call of the
// Communicator interface, failure propagation and deadlock reports.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "comm/local_communicator.h"

namespace {

using omni::Communicator;
using omni::run_ranks;

TEST(LocalCommunicator, RanksAndSizes) {
  std::vector<int> seen(5, -1);
  run_ranks(5, [&](Communicator& world) {
    EXPECT_EQ(world.size(), 5);
    EXPECT_EQ(world.name(), "world");
    seen[world.rank()] = world.rank();
  });
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(LocalCommunicator, AllReduceSumsInRankOrder) {
  // In f32, 1e8 + 1 == 1e8, so only the rank-order fold ((1e8 + 1) - 1e8) + 1 gives 1.
  const std::vector<float> contrib = {1e8f, 1.0f, -1e8f, 1.0f};
  const float expected = ((contrib[0] + contrib[1]) + contrib[2]) + contrib[3];
  ASSERT_EQ(expected, 1.0f);
  for (int repeat = 0; repeat < 20; ++repeat) {
    std::vector<float> got(4);
    run_ranks(4, [&](Communicator& world) {
      float x[2] = {contrib[world.rank()], float(world.rank())};
      world.all_reduce(x, 2);
      EXPECT_EQ(x[1], 6.0f);
      got[world.rank()] = x[0];
    });
    for (float g : got) EXPECT_EQ(g, expected);
  }
}

TEST(LocalCommunicator, AllReduceMaxInDouble) {
  run_ranks(3, [](Communicator& world) {
    double x[2] = {double(world.rank()), -double(world.rank())};
    world.all_reduce(x, 2, omni::ReduceOp::Max);
    EXPECT_EQ(x[0], 2.0);
    EXPECT_EQ(x[1], 0.0);
  });
}

// bf16 and f16 (a 16-bit model's tensor-parallel activations on emulated GPU ranks): each
// pairwise sum is computed in float and rounded to the type, as NCCL does; max takes the
// larger.
TEST(LocalCommunicator, ReducesBf16AndF16InFloatRoundingOnce) {
  run_ranks(2, [](Communicator& world) {
    const float mine = world.rank() == 0 ? 1.0f : 0.00390625f;  // 1 and 2^-8
    omni::bf16 b = omni::from_float<omni::bf16>(mine);
    world.all_reduce(&b, 1);
    // 1 + 2^-8 is a tie between bf16 neighbours 1 and 1 + 2^-7: to even, 1.
    EXPECT_EQ(omni::to_float(b), 1.0f);
    omni::f16 h = omni::from_float<omni::f16>(mine);
    world.all_reduce(&h, 1);
    EXPECT_EQ(omni::to_float(h), 1.00390625f);  // exact in f16 (10 fraction bits)
    omni::bf16 m = omni::from_float<omni::bf16>(world.rank() == 0 ? -3.0f : 2.5f);
    world.all_reduce(&m, 1, omni::ReduceOp::Max);
    EXPECT_EQ(omni::to_float(m), 2.5f);
  });
}

TEST(LocalCommunicator, ReduceScatterGivesEachRankTheSumOfItsBlock) {
  run_ranks(3, [](Communicator& world) {
    const int r = world.rank();
    // Rank r holds 10*r + i at index i: block k (2 elements) sums to 30*... per element.
    std::vector<double> in(6);
    for (int i = 0; i < 6; ++i) in[i] = 10 * r + i;
    std::vector<double> out(2);
    world.reduce_scatter(out.data(), in.data(), 2);
    EXPECT_EQ(out[0], 30 + 3 * (2 * r));
    EXPECT_EQ(out[1], 30 + 3 * (2 * r + 1));
  });
}

TEST(LocalCommunicator, AllGatherInRankOrderAndInPlace) {
  run_ranks(4, [](Communicator& world) {
    const int r = world.rank();
    float mine[2] = {float(r), float(10 * r)};
    std::vector<float> out(8);
    world.all_gather(out.data(), mine, 2);
    EXPECT_EQ(out, (std::vector<float>{0, 0, 1, 10, 2, 20, 3, 30}));
    std::vector<float> in_place(8, -1);
    in_place[2 * r] = float(r);
    in_place[2 * r + 1] = float(10 * r);
    world.all_gather(in_place.data(), in_place.data() + 2 * r, 2);
    EXPECT_EQ(in_place, out);
  });
}

TEST(LocalCommunicator, AllToAllTransposesBlocks) {
  run_ranks(3, [](Communicator& world) {
    const int r = world.rank();
    std::vector<double> in(3), out(3);
    for (int k = 0; k < 3; ++k) in[k] = 10 * r + k;  // block k goes to rank k
    world.all_to_all(out.data(), in.data(), 1, omni::DType::F64);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out[j], 10 * j + r);
  });
}

TEST(LocalCommunicator, BroadcastFromANonZeroRoot) {
  run_ranks(4, [](Communicator& world) {
    char text[6] = "xxxxx";
    if (world.rank() == 2) std::memcpy(text, "hello", 6);
    world.broadcast(text, 6, 2);
    EXPECT_STREQ(text, "hello");
  });
}

TEST(LocalCommunicator, SplitGroupsByColorAndOrdersByKey) {
  run_ranks(6, [](Communicator& world) {
    const int r = world.rank();
    // Even and odd ranks; the key reverses the order inside each group.
    auto half = world.split(r % 2, -r, "half");
    EXPECT_EQ(half->name(), "half");
    EXPECT_EQ(half->size(), 3);
    std::vector<double> members(3);
    double me = r;
    half->all_gather(members.data(), &me, 1);
    if (r % 2 == 0)
      EXPECT_EQ(members, (std::vector<double>{4, 2, 0}));
    else
      EXPECT_EQ(members, (std::vector<double>{5, 3, 1}));
    EXPECT_EQ(members[half->rank()], me);
    // A split of a split, and collectives on both levels interleaved.
    auto single = half->split(half->rank(), 0, "single");
    EXPECT_EQ(single->size(), 1);
    double sum = 1;
    world.all_reduce(&sum, 1);
    EXPECT_EQ(sum, 6);
    single->all_reduce(&sum, 1);
    half->barrier();
    EXPECT_EQ(sum, 6);
  });
}

TEST(LocalCommunicator, SendAndReceiveAroundARing) {
  run_ranks(5, [](Communicator& world) {
    const int r = world.rank(), n = world.size();
    int token = r == 0 ? 100 : -1;
    if (r != 0) world.recv(&token, sizeof token, r - 1, 7);
    token += r;
    world.send(&token, sizeof token, (r + 1) % n, 7);
    if (r == 0) {
      world.recv(&token, sizeof token, n - 1, 7);
      EXPECT_EQ(token, 100 + 0 + 1 + 2 + 3 + 4);
    }
  });
}

TEST(LocalCommunicator, MessagesOfOneTagArriveInOrderAndTagsSelect) {
  run_ranks(2, [](Communicator& world) {
    if (world.rank() == 0) {
      int a = 1, b = 2, c = 3;
      auto r1 = world.isend(&a, sizeof a, 1, 5);
      auto r2 = world.isend(&b, sizeof b, 1, 5);
      auto r3 = world.isend(&c, sizeof c, 1, 9);
      r3->wait();
      r1->wait();
      r2->wait();
    } else {
      int x = 0, y = 0, z = 0;
      world.recv(&z, sizeof z, 0, 9);  // the tag-9 message although it was sent last
      world.recv(&x, sizeof x, 0, 5);
      world.recv(&y, sizeof y, 0, 5);
      EXPECT_EQ(x, 1);
      EXPECT_EQ(y, 2);
      EXPECT_EQ(z, 3);
    }
  });
}

TEST(LocalCommunicator, NonBlockingExchangeBothWays) {
  run_ranks(2, [](Communicator& world) {
    const int peer = 1 - world.rank();
    double out = world.rank() + 0.5, in = -1;
    auto rr = world.irecv(&in, sizeof in, peer, 0);
    auto sr = world.isend(&out, sizeof out, peer, 0);
    sr->wait();
    rr->wait();
    EXPECT_TRUE(rr->test());
    EXPECT_EQ(in, peer + 0.5);
  });
}

TEST(LocalCommunicator, NonBlockingCollectivesWaitedInAnyOrder) {
  run_ranks(3, [](Communicator& world) {
    const int r = world.rank();
    std::vector<float> a(4, float(r)), b(4, float(2 * r));
    std::vector<float> in(6, float(r)), out(2);
    auto ra = world.iall_reduce(a.data(), a.size(), omni::DType::F32);
    auto rb = world.iall_reduce(b.data(), b.size(), omni::DType::F32);
    auto rc = world.ireduce_scatter(out.data(), in.data(), 2, omni::DType::F32);
    if (r == 1) {
      rc->wait();
      rb->wait();
      ra->wait();
    } else {
      ra->wait();
      rb->wait();
      rc->wait();
    }
    EXPECT_EQ(a, std::vector<float>(4, 3.0f));
    EXPECT_EQ(b, std::vector<float>(4, 6.0f));
    EXPECT_EQ(out, std::vector<float>(2, 3.0f));
  });
}

TEST(LocalCommunicator, AThrowingRankReleasesPeersAndItsExceptionIsRethrown) {
  std::atomic<int> peers_released{0};
  try {
    run_ranks(4, [&](Communicator& world) {
      if (world.rank() == 2) throw omni::UsageError("--seq-length: rank 2 cannot");
      try {
        float x = 1;
        world.all_reduce(&x, 1);  // rank 2 never arrives
        ADD_FAILURE() << "all_reduce completed without rank 2";
      } catch (const omni::PeerFailure& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2 failed: --seq-length: rank 2 cannot"),
                  std::string::npos)
            << e.what();
        ++peers_released;
        throw;
      }
    });
    FAIL() << "run_ranks returned";
  } catch (const omni::UsageError& e) {
    EXPECT_STREQ(e.what(), "--seq-length: rank 2 cannot");
  }
  EXPECT_EQ(peers_released, 3);
}

TEST(LocalCommunicator, AThrowingRankReleasesAPeerBlockedInReceive) {
  try {
    run_ranks(2, [&](Communicator& world) {
      if (world.rank() == 0) {
        int x;
        world.recv(&x, sizeof x, 1, 0);
      } else {
        throw std::runtime_error("data file missing");
      }
    });
    FAIL() << "run_ranks returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "data file missing");
  }
}

TEST(LocalCommunicator, ARankThatThrowsWithARequestInFlightDoesNotHang) {
  EXPECT_THROW(run_ranks(3,
                         [](Communicator& world) {
                           std::vector<float> x(8, 1);
                           auto req = world.iall_reduce(x.data(), x.size(), omni::DType::F32);
                           if (world.rank() == 0) throw omni::UsageError("bad batch");
                           req->wait();
                         }),
               omni::UsageError);
}

TEST(LocalCommunicator, ReceivesThatNobodySendsAreReportedAsDeadlock) {
  try {
    run_ranks(2, [](Communicator& world) {
      int x = 0;
      world.recv(&x, sizeof x, 1 - world.rank(), 3);
    });
    FAIL() << "run_ranks returned";
  } catch (const omni::InternalError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0 waits in recv from rank 1 (tag 3"), std::string::npos) << msg;
  }
}

TEST(LocalCommunicator, SendsAreSynchronousSoSendSendRecvRecvDeadlocks) {
  // MPI may buffer small messages and let this pass, but need not; it must not pass here.
  EXPECT_THROW(run_ranks(2,
                         [](Communicator& world) {
                           int out = 1, in = 0;
                           world.send(&out, sizeof out, 1 - world.rank(), 0);
                           world.recv(&in, sizeof in, 1 - world.rank(), 0);
                         }),
               omni::InternalError);
}

TEST(LocalCommunicator, ARankThatSkipsACollectiveIsReported) {
  try {
    run_ranks(3, [](Communicator& world) {
      if (world.rank() == 1) return;
      world.barrier();
    });
    FAIL() << "run_ranks returned";
  } catch (const omni::InternalError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1 has returned"), std::string::npos) << msg;
    EXPECT_NE(msg.find("barrier #0 on world"), std::string::npos) << msg;
  }
}

TEST(LocalCommunicator, MismatchedCollectivesAreReported) {
  try {
    run_ranks(2, [](Communicator& world) {
      std::vector<float> x(4 + world.rank());
      world.all_reduce(x.data(), x.size());
    });
    FAIL() << "run_ranks returned";
  } catch (const omni::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("differs between ranks"), std::string::npos)
        << e.what();
  }
}

TEST(LocalCommunicator, MessageSizesMustAgree) {
  EXPECT_THROW(run_ranks(2,
                         [](Communicator& world) {
                           double buf[2] = {};
                           if (world.rank() == 0)
                             world.send(buf, 16, 1, 0);
                           else
                             world.recv(buf, 8, 0, 0);
                         }),
               omni::InternalError);
}

}  // namespace
