// The torchrun rendezvous (comm/rendezvous.h) between real processes: each rank is a forked
// child that meets the others over TCP on 127.0.0.1 and reports what it saw through a pipe.
// Also: what torchrun's environment variables mean to omnitron.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/rendezvous.h"
#include "comm/watchdog.h"

namespace omni {
namespace {

// A port that was free a moment ago (the kernel's choice for port 0).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

RendezvousConfig config(int port, int rank, int size, double timeout = 20) {
  RendezvousConfig c;
  c.address = "127.0.0.1";
  c.port = port;
  c.rank = rank;
  c.size = size;
  c.timeout_seconds = timeout;
  c.described_as = "127.0.0.1:" + std::to_string(port);
  return c;
}

struct RankOutcome {
  int exit_code = -1;
  std::string message;  // what the rank wrote: "" when all went well, else its error
};

// Runs body(rank) in one child process per listed rank, at once; each child exits 0 when body
// returns, 1 with the exception's text when it throws. Children still running after
// `limit_seconds` are killed (exit code -9): a hang fails the test instead of stalling it.
std::vector<RankOutcome> run_processes(const std::vector<int>& ranks,
                                       const std::function<void(int rank)>& body,
                                       double limit_seconds = 60) {
  struct Child {
    pid_t pid;
    int out;
  };
  std::vector<Child> children;
  for (int rank : ranks) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      int code = 0;
      std::string message;
      try {
        body(rank);
      } catch (const std::exception& e) {
        message = e.what(), code = 1;
      }
      if (!message.empty()) (void)!::write(fds[1], message.data(), message.size());
      ::_exit(code);
    }
    ::close(fds[1]);
    children.push_back({pid, fds[0]});
  }
  std::vector<RankOutcome> out(children.size());
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int(limit_seconds * 1000));
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    while (::waitpid(children[i].pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(children[i].pid, SIGKILL);
        ::waitpid(children[i].pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    out[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    char buf[4096];
    for (ssize_t n; (n = ::read(children[i].out, buf, sizeof buf)) > 0;)
      out[i].message.append(buf, size_t(n));
    ::close(children[i].out);
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Throws when a rank's result differs from what it should be.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

TEST(Rendezvous, ThreeProcessesExchangeBytesInEveryCollective) {
  const int port = free_port(), n = 3;
  const auto outcomes = run_processes({0, 1, 2}, [&](int rank) {
    std::unique_ptr<Communicator> world = make_rendezvous_communicator(config(port, rank, n));
    expect(world->rank() == rank && world->size() == n, "rank and size");

    char id[128] = {};  // as make_nccl_communicator broadcasts the NCCL unique id
    if (rank == 0) std::snprintf(id, sizeof id, "unique id from rank 0");
    world->broadcast(id, sizeof id, 0);
    expect(std::string(id) == "unique id from rank 0", "broadcast from 0: " + std::string(id));

    int64_t from2 = rank == 2 ? 4242 : -1;
    world->broadcast(&from2, sizeof from2, 2);
    expect(from2 == 4242, "broadcast from 2: " + std::to_string(from2));

    std::vector<float> x = {float(rank + 1), 10.0f * float(rank)};
    world->all_reduce(x.data(), x.size());
    expect(x[0] == 6.0f && x[1] == 30.0f, "all_reduce sum");
    double m = rank == 1 ? 7.5 : double(rank);
    world->all_reduce(&m, 1, ReduceOp::Max);
    expect(m == 7.5, "all_reduce max");

    std::vector<double> gathered(n * 2);
    const double mine[2] = {double(rank), double(rank) + 0.5};
    world->all_gather(gathered.data(), mine, 2);
    for (int r = 0; r < n; ++r)
      expect(gathered[r * 2] == r && gathered[r * 2 + 1] == r + 0.5,
             "all_gather block " + std::to_string(r));
    std::vector<float> in_place(n, 0.0f);
    in_place[rank] = float(100 + rank);
    world->all_gather(in_place.data(), in_place.data() + rank, 1);
    expect(in_place == std::vector<float>{100, 101, 102}, "all_gather in place");

    std::vector<float> blocks(n), block(1);  // rank r's block s holds r * 10 + s
    for (int s = 0; s < n; ++s) blocks[s] = float(rank * 10 + s);
    world->reduce_scatter(block.data(), blocks.data(), 1);
    expect(block[0] == float(30 + 3 * rank), "reduce_scatter");

    std::vector<float> received(n);
    world->all_to_all(received.data(), blocks.data(), 1, DType::F32);
    for (int s = 0; s < n; ++s)
      expect(received[s] == float(s * 10 + rank), "all_to_all from " + std::to_string(s));

    world->barrier();
    auto request = world->iall_reduce(x.data(), 1, DType::F32);
    request->wait();
    expect(x[0] == 18.0f, "iall_reduce");
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].message;
}

TEST(Rendezvous, NamesTheAddressAndHowManyArrivedWhenARankIsMissing) {
  const int port = free_port();
  const auto outcomes = run_processes({0, 1}, [&](int rank) {  // rank 2 of 3 never starts
    make_rendezvous_communicator(config(port, rank, 3, 1.0))->barrier();
  });
  const std::string where = "127.0.0.1:" + std::to_string(port);
  ASSERT_EQ(outcomes[0].exit_code, 1) << outcomes[0].message;
  for (const std::string& part : {where, std::string("2 of 3 ranks arrived within 1 s"),
                                  std::string("missing rank 2"), std::string("MASTER_PORT")})
    EXPECT_TRUE(contains(outcomes[0].message, part)) << part << " in: " << outcomes[0].message;
  ASSERT_EQ(outcomes[1].exit_code, 1) << outcomes[1].message;
  EXPECT_TRUE(contains(outcomes[1].message, where)) << outcomes[1].message;
  EXPECT_TRUE(contains(outcomes[1].message, "2 of 3 ranks arrived")) << outcomes[1].message;
}

TEST(Rendezvous, ARankWithoutRankZeroSaysItCouldNotReachIt) {
  const int port = free_port();
  const auto outcomes = run_processes(
      {1}, [&](int rank) { make_rendezvous_communicator(config(port, rank, 2, 0.5))->barrier(); });
  ASSERT_EQ(outcomes[0].exit_code, 1) << outcomes[0].message;
  EXPECT_TRUE(contains(outcomes[0].message, "rank 1 of 2 could not reach rank 0 at 127.0.0.1:" +
                                                std::to_string(port) + " within 0.5 s"))
      << outcomes[0].message;
}

TEST(Rendezvous, RanksThatCallDifferentCollectivesAreToldWhich) {
  const int port = free_port();
  const auto outcomes = run_processes({0, 1}, [&](int rank) {
    auto world = make_rendezvous_communicator(config(port, rank, 2));
    float x[4] = {};
    if (rank == 0)
      world->all_reduce(x, 4);
    else
      world->broadcast(x, sizeof x, 0);
  });
  EXPECT_EQ(outcomes[0].exit_code, 1);
  EXPECT_TRUE(contains(outcomes[0].message,
                       "rank 1 called broadcast from rank 0 of 16 bytes "
                       "while rank 0 called all_reduce of 16 bytes"))
      << outcomes[0].message;
  EXPECT_EQ(outcomes[1].exit_code, 1);  // and rank 1 is not left waiting
  EXPECT_TRUE(contains(outcomes[1].message, "rank 0 (at 127.0.0.1:")) << outcomes[1].message;
}

TEST(Rendezvous, ARankThatDiesEndsItsPeersCallsWithItsName) {
  const int port = free_port();
  const auto outcomes = run_processes({0, 1, 2}, [&](int rank) {
    auto world = make_rendezvous_communicator(config(port, rank, 3));
    world->barrier();
    if (rank == 2) ::_exit(7);  // as a crash after start-up
    world->barrier();
  });
  EXPECT_EQ(outcomes[2].exit_code, 7);
  EXPECT_EQ(outcomes[0].exit_code, 1);
  EXPECT_TRUE(contains(outcomes[0].message, "rank 2 closed its connection during barrier"))
      << outcomes[0].message;
  EXPECT_EQ(outcomes[1].exit_code, 1);
  EXPECT_TRUE(contains(outcomes[1].message, "closed its connection")) << outcomes[1].message;
}

// What `omnitron train` gets under torchrun: world_communicator() is the rendezvous world.
TEST(Rendezvous, TheWorldIsTorchrunsRanksUnderItsEnvironment) {
  const std::string port = std::to_string(free_port());
  const auto outcomes = run_processes({0, 1}, [&](int rank) {
    for (const auto& [name, value] : {std::pair{"RANK", std::to_string(rank)},
                                      {"WORLD_SIZE", "2"},
                                      {"LOCAL_RANK", "0"},
                                      {"MASTER_ADDR", "localhost"},
                                      {"MASTER_PORT", port},
                                      {"TORCHELASTIC_RUN_ID", "t"},
                                      {"OMNITRON_RENDEZVOUS_TIMEOUT", "20"}})
      ::setenv(name, value.c_str(), 1);
    Communicator& world = world_communicator();
    expect(world.rank() == rank && world.size() == 2, "rank and size");
    double x = rank + 1;
    world.all_reduce(&x, 1);
    expect(x == 3, "all_reduce over the world");
    world.barrier();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].message;
}

// The real torchrun, where one is installed and starts: this test starts this test binary as
// torchrun's 3 workers (its default static rendezvous, whose agent holds MASTER_PORT), and each
// worker, seeing OMNITRON_TEST_TORCHRUN_WORKER, meets the others in world_communicator().
TEST(Rendezvous, TheRealTorchrunsWorkersMeetInOneWorld) {
  if (std::getenv("OMNITRON_TEST_TORCHRUN_WORKER")) {
    Communicator& world = world_communicator();
    double x = world.rank() + 1;
    world.all_reduce(&x, 1);
    char id[64] = {};
    if (world.rank() == 0) std::snprintf(id, sizeof id, "id of rank 0");
    world.broadcast(id, sizeof id, 0);
    world.barrier();
    std::printf("worker %d of %d: sum %g, '%s'\n", world.rank(), world.size(), x, id);
    return;
  }
  if (std::system("torchrun --help > /dev/null 2>&1") != 0) GTEST_SKIP() << "no working torchrun";
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const std::string command =
      "OMNITRON_TEST_TORCHRUN_WORKER=1 OMNITRON_RENDEZVOUS_TIMEOUT=60 timeout 180 torchrun "
      "--nproc_per_node=3 --master_port=" +
      std::to_string(free_port()) + " --no_python --redirects 1 --tee 1 " + self +
      " --gtest_filter=Rendezvous.TheRealTorchrunsWorkersMeetInOneWorld 2>&1";
  FILE* p = ::popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(contains(out, "worker " + std::to_string(r) + " of 3: sum 6, 'id of rank 0'"))
        << out;
}

TEST(Rendezvous, PointToPointAndSplitNameTheCommunicatorThatCarriesThem) {
  auto world = make_rendezvous_communicator(config(1, 0, 2));  // never connects: no collective
  float x = 0;
  try {
    world->send(&x, sizeof x, 1, 0);
    FAIL() << "send went through";
  } catch (const InternalError& e) {
    EXPECT_TRUE(contains(e.what(), "NCCL")) << e.what();
  }
  EXPECT_THROW(world->split(0, 0, "tp"), InternalError);
}

// ---- torchrun's environment ----

// Sets (or, with nullptr, unsets) environment variables for one test.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
          "PMIX_RANK", "OMNITRON_RENDEZVOUS_PORT", "OMNITRON_RENDEZVOUS_TIMEOUT"})
      set(name, nullptr);
    for (const auto& [name, value] : vars) set(name, value);
  }
  ~Env() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had)
        ::setenv(it->name, it->value.c_str(), 1);
      else
        ::unsetenv(it->name);
    }
  }

 private:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? old : "", old != nullptr});
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  struct Saved {
    const char* name;
    std::string value;
    bool had;
  };
  std::vector<Saved> saved_;
};

TEST(TorchrunEnvironment, ReadsTorchrunsVariables) {
  Env env({{"RANK", "3"},
           {"WORLD_SIZE", "4"},
           {"LOCAL_RANK", "1"},
           {"LOCAL_WORLD_SIZE", "2"},
           {"MASTER_ADDR", "node0"},
           {"MASTER_PORT", "6000"}});
  const auto t = torchrun_environment();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 4);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->local_world_size, 2);
  const RendezvousConfig c = torchrun_rendezvous(*t);
  EXPECT_EQ(c.address, "node0");
  EXPECT_EQ(c.port, 6000);
}

TEST(TorchrunEnvironment, AbsentWithoutRankAndWorldSize) {
  Env env({{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "6000"}});  // exported by habit
  EXPECT_FALSE(torchrun_environment().has_value());
}

TEST(TorchrunEnvironment, MpirunsWorldWinsUnlessTorchrunsAgentStartedTheProcess) {
  {
    Env env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    EXPECT_FALSE(torchrun_environment().has_value());
  }
  Env env({{"RANK", "0"},
           {"WORLD_SIZE", "2"},
           {"PMIX_RANK", "0"},
           {"TORCHELASTIC_RUN_ID", "x"},
           {"MASTER_ADDR", "localhost"},
           {"MASTER_PORT", "6000"}});
  EXPECT_TRUE(torchrun_environment().has_value());
}

TEST(TorchrunEnvironment, TheAgentsStoreOnMasterPortMovesTheRendezvousToTheNextPort) {
  Env env({{"RANK", "0"},
           {"WORLD_SIZE", "2"},
           {"MASTER_ADDR", "localhost"},
           {"MASTER_PORT", "29500"},
           {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const RendezvousConfig c = torchrun_rendezvous(*torchrun_environment());
  EXPECT_EQ(c.port, 29501);
  EXPECT_TRUE(contains(c.described_as, "MASTER_PORT + 1")) << c.described_as;
  Env override_port({{"RANK", "0"},
                     {"WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "localhost"},
                     {"MASTER_PORT", "29500"},
                     {"OMNITRON_RENDEZVOUS_PORT", "7000"}});
  EXPECT_EQ(torchrun_rendezvous(*torchrun_environment()).port, 7000);
}

TEST(TorchrunEnvironment, MissingMasterAddressIsNamed) {
  Env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "6000"}});
  try {
    torchrun_environment();
    FAIL() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "MASTER_ADDR is unset")) << e.what();
  }
}

TEST(TorchrunEnvironment, ARankOutsideTheWorldIsNamed) {
  Env env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  try {
    torchrun_environment();
    FAIL() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "RANK='2' should be a whole number from 0 to 1")) << e.what();
  }
}

TEST(TorchrunEnvironment, TimeoutComesFromTheEnvironmentThenTheCollectiveTimeout) {
  const double before = collective_timeout();
  set_collective_timeout(90);  // --distributed-timeout-minutes 1.5
  {
    Env env({{"OMNITRON_RENDEZVOUS_TIMEOUT", "2.5"}});
    EXPECT_DOUBLE_EQ(rendezvous_timeout_seconds(), 2.5);
  }
  Env env({});
  EXPECT_DOUBLE_EQ(rendezvous_timeout_seconds(), 90);
  set_collective_timeout(0);
  EXPECT_DOUBLE_EQ(rendezvous_timeout_seconds(), 300);
  set_collective_timeout(before);
}

// The torchrun world reads its timeout when it connects, after the trainer has set
// --distributed-timeout-minutes (the world itself is made before the options are read).
TEST(Rendezvous, TheWorldsTimeoutIsTheOneSetBeforeItsFirstCollective) {
  const int port = free_port();
  const auto outcomes = run_processes({0}, [&](int rank) {
    RendezvousConfig c = config(port, rank, 2);
    c.timeout_seconds = 0;  // as torchrun_rendezvous leaves it
    auto world = make_rendezvous_communicator(c);
    set_collective_timeout(0.5);
    world->barrier();
  });
  EXPECT_EQ(outcomes[0].exit_code, 1);
  EXPECT_TRUE(contains(outcomes[0].message, "1 of 2 ranks arrived within 0.5 s"))
      << outcomes[0].message;
}

}  // namespace
}  // namespace omni
