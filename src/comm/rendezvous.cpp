#include "comm/rendezvous.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "comm/watchdog.h"

namespace omni {

// ---- torchrun's environment ----

namespace {

// An integer environment variable within [lo, hi]; nullopt when unset or empty.
std::optional<int> env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  OMNI_REQUIRE(errno == 0 && *end == '\0' && x >= lo && x <= hi, "torchrun's environment: ", name,
               "='", v, "' should be a whole number from ", lo, " to ", hi);
  return int(x);
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace

std::optional<TorchrunEnvironment> torchrun_environment() {
  if (!env_set("RANK") || !env_set("WORLD_SIZE")) return std::nullopt;
  const bool agent = env_set("TORCHELASTIC_RUN_ID");
  if (!agent && (env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMI_SIZE") || env_set("PMIX_RANK")))
    return std::nullopt;
  TorchrunEnvironment e;
  e.world_size = *env_int("WORLD_SIZE", 1, 1 << 24);
  e.rank = *env_int("RANK", 0, e.world_size - 1);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, e.world_size).value_or(1);
  e.local_rank = env_int("LOCAL_RANK", 0, e.world_size - 1).value_or(0);
  if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", 1, 65535).value_or(0);
  if (const char* s = std::getenv("TORCHELASTIC_USE_AGENT_STORE"))
    e.agent_holds_master_port = std::string(s) == "True";
  if (e.world_size > 1)
    OMNI_REQUIRE(!e.master_addr.empty() && e.master_port > 0,
                 "torchrun's environment: RANK=", e.rank, " of WORLD_SIZE=", e.world_size,
                 " but MASTER_", e.master_addr.empty() ? "ADDR" : "PORT",
                 " is unset: rank 0's host and a free port are needed for the ranks to meet "
                 "(docs/launching.md)");
  return e;
}

double rendezvous_timeout_seconds() {
  if (const char* v = std::getenv("OMNITRON_RENDEZVOUS_TIMEOUT"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    OMNI_REQUIRE(*end == '\0' && s > 0, "OMNITRON_RENDEZVOUS_TIMEOUT='", v,
                 "' should be a number of seconds above 0");
    return s;
  }
  const double collective = collective_timeout();
  return collective > 0 ? collective : 300.0;
}

RendezvousConfig torchrun_rendezvous(const TorchrunEnvironment& env) {
  RendezvousConfig c;
  c.address = env.master_addr;
  c.rank = env.rank;
  c.size = env.world_size;
  c.watched = true;
  if (auto port = env_int("OMNITRON_RENDEZVOUS_PORT", 1, 65535)) {
    c.port = *port;
    c.described_as = "MASTER_ADDR " + c.address + ", OMNITRON_RENDEZVOUS_PORT " +
                     std::to_string(c.port) + " (" + c.address + ":" + std::to_string(c.port) + ")";
  } else if (env.agent_holds_master_port) {
    OMNI_REQUIRE(env.master_port < 65535,
                 "torchrun's agent holds MASTER_PORT 65535 and the "
                 "rendezvous needs the next port: set OMNITRON_RENDEZVOUS_PORT");
    c.port = env.master_port + 1;
    c.described_as = c.address + ":" + std::to_string(c.port) +
                     " (MASTER_ADDR, MASTER_PORT + 1: " + "torchrun's agent holds MASTER_PORT " +
                     std::to_string(env.master_port) + ")";
  } else {
    c.port = env.master_port;
    c.described_as = c.address + ":" + std::to_string(c.port) + " (MASTER_ADDR:MASTER_PORT)";
  }
  return c;
}

// ---- sockets ----

namespace {

using Clock = std::chrono::steady_clock;

// A socket, closed when dropped.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

std::string errno_text(int e = errno) {
  return std::strerror(e);
}

// Milliseconds left before `deadline` (for poll), at least 0; -1 (forever) without one.
int millis_left(const std::optional<Clock::time_point>& deadline) {
  if (!deadline) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
  return int(std::clamp<long long>(left.count(), 0, 1 << 30));
}

enum class Io { Done, Closed, TimedOut };

// Reads exactly n bytes (waiting at most until `deadline`, when given).
Io read_exact(int fd, void* data, size_t n, const std::optional<Clock::time_point>& deadline) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    if (deadline) {
      pollfd pfd{fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, millis_left(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) throw InternalError("[rendezvous] poll failed: " + errno_text());
      if (ready == 0) return Io::TimedOut;
    }
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return Io::Closed;
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return Io::Closed;
      throw InternalError("[rendezvous] recv failed: " + errno_text());
    }
    p += got;
    n -= size_t(got);
  }
  return Io::Done;
}

// Writes all n bytes; false when the peer has gone (never SIGPIPE).
bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return false;
      throw InternalError("[rendezvous] send failed: " + errno_text());
    }
    p += put;
    n -= size_t(put);
  }
  return true;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Fixed-size messages in network byte order.
template <size_t N>
struct Wire {
  std::byte bytes[N] = {};
  void put(size_t at, uint64_t v, int width) {
    for (int i = 0; i < width; ++i) bytes[at + i] = std::byte(v >> (8 * (width - 1 - i)));
  }
  uint64_t get(size_t at, int width) const {
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) v = v << 8 | uint64_t(bytes[at + i]);
    return v;
  }
};

// hello (rank -> rank 0): magic, version, rank, size. welcome (rank 0 -> rank): magic, status,
// ranks arrived.
constexpr uint32_t kMagic = 0x4f4d4e52;  // "OMNR"
constexpr uint32_t kVersion = 1;
enum WelcomeStatus : uint32_t { kAllArrived = 0, kTimedOut = 1 };
using Hello = Wire<16>;
using Welcome = Wire<12>;

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", s);
  return b;
}

// Rank 0's listening socket on the port, on every interface (IPv6 with IPv4 mapped where the
// system has IPv6, else IPv4).
Fd listen_on(const RendezvousConfig& c) {
  for (int family : {AF_INET6, AF_INET}) {
    Fd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) continue;
    int one = 1, zero = 0;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (family == AF_INET6) {
      ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(uint16_t(c.port));
      rc = ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(uint16_t(c.port));
      rc = ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0 && errno == EAFNOSUPPORT) continue;
    OMNI_REQUIRE(rc == 0, "torchrun rendezvous: rank 0 cannot listen on port ", c.port, " of ",
                 c.described_as, ": ", errno_text(),
                 errno == EADDRINUSE ? " (another program, or an earlier run, holds it: pick "
                                       "another --master-port, or set OMNITRON_RENDEZVOUS_PORT)"
                                     : "");
    OMNI_REQUIRE(::listen(s.get(), std::max(16, c.size)) == 0,
                 "torchrun rendezvous: listen on port ", c.port, " failed: ", errno_text());
    return s;
  }
  throw UsageError("torchrun rendezvous: rank 0 cannot open a TCP socket: " + errno_text());
}

// Rank 0: accepts the other size - 1 ranks; returns their sockets by rank.
std::vector<Fd> accept_ranks(const RendezvousConfig& c, Clock::time_point deadline) {
  Fd listener = listen_on(c);
  std::vector<Fd> peers(size_t(c.size));
  int arrived = 1;
  // On a timeout, the ranks that came hear how many did (they print it too), then rank 0 stops.
  auto timed_out = [&]() {
    Welcome w;
    w.put(0, kMagic, 4), w.put(4, kTimedOut, 4), w.put(8, uint32_t(arrived), 4);
    std::string missing;
    int listed = 0;
    for (int r = 1; r < c.size; ++r) {
      if (peers[r]) {
        write_all(peers[r].get(), w.bytes, sizeof w.bytes);
      } else if (listed++ < 8) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (listed > 8) missing += ", ...";
    throw UsageError("torchrun rendezvous at " + c.described_as + ": " + std::to_string(arrived) +
                     " of " + std::to_string(c.size) + " ranks arrived within " +
                     seconds_text(c.timeout_seconds) + " (missing rank" +
                     (listed > 1 ? "s " : " ") + missing +
                     "); start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE "
                     "(OMNITRON_RENDEZVOUS_TIMEOUT sets the wait)");
  };
  while (arrived < c.size) {
    pollfd pfd{listener.get(), POLLIN, 0};
    const int ready = ::poll(&pfd, 1, millis_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 || Clock::now() >= deadline) timed_out();
    if (ready < 0) throw InternalError("[rendezvous] poll failed: " + errno_text());
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) continue;  // the caller gave up meanwhile
    set_nodelay(conn.get());
    // A connection that says nothing soon is not one of ours (a port scanner, a health check).
    Hello h;
    if (read_exact(conn.get(), h.bytes, sizeof h.bytes,
                   std::min(deadline, Clock::now() + std::chrono::seconds(10))) != Io::Done)
      continue;
    if (h.get(0, 4) != kMagic || h.get(4, 4) != kVersion) continue;  // not one of ours
    const int rank = int(int32_t(h.get(8, 4))), size = int(int32_t(h.get(12, 4)));
    OMNI_REQUIRE(size == c.size, "torchrun rendezvous at ", c.described_as, ": rank ", rank,
                 " was started with WORLD_SIZE=", size, " and rank 0 with WORLD_SIZE=", c.size);
    OMNI_REQUIRE(rank > 0 && rank < c.size && !peers[size_t(rank)], "torchrun rendezvous at ",
                 c.described_as, ": two processes say they are rank ", rank, " of ", c.size,
                 " (is an earlier run still going, or RANK the same for two processes?)");
    peers[size_t(rank)] = std::move(conn);
    ++arrived;
  }
  Welcome w;
  w.put(0, kMagic, 4), w.put(4, kAllArrived, 4), w.put(8, uint32_t(arrived), 4);
  for (int r = 1; r < c.size; ++r)
    OMNI_REQUIRE(write_all(peers[r].get(), w.bytes, sizeof w.bytes), "torchrun rendezvous at ",
                 c.described_as, ": rank ", r, " left before every rank had arrived");
  return peers;
}

// One attempt to connect to rank 0 (every address the name resolves to); the error otherwise.
Fd try_connect(const RendezvousConfig& c, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(c.address.c_str(), std::to_string(c.port).c_str(), &hints, &found);
  if (rc != 0) {
    error = "cannot resolve '" + c.address + "': " + ::gai_strerror(rc);
    return Fd();
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
  for (addrinfo* a = found; a; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!s) continue;
    if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = errno_text();
        continue;
      }
      // A host that does not answer: wait at most a few seconds, then try again.
      pollfd pfd{s.get(), POLLOUT, 0};
      const int ready =
          ::poll(&pfd, 1, std::min(millis_left(std::optional<Clock::time_point>(deadline)), 3000));
      int so_error = 0;
      socklen_t len = sizeof so_error;
      ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
      if (ready <= 0 || so_error != 0) {
        error = ready <= 0 ? "no answer" : errno_text(so_error);
        continue;
      }
    }
    ::fcntl(s.get(), F_SETFL, ::fcntl(s.get(), F_GETFL) & ~O_NONBLOCK);
    set_nodelay(s.get());
    return s;
  }
  return Fd();
}

// A rank other than 0: connects to rank 0 (retrying until the deadline: rank 0 may start
// later), says who it is, and waits until rank 0 has seen every rank.
Fd join_rank0(const RendezvousConfig& c, Clock::time_point deadline) {
  const std::string who =
      "torchrun rendezvous: rank " + std::to_string(c.rank) + " of " + std::to_string(c.size) + " ";
  Fd hub;
  std::string error = "no answer";
  while (!(hub = try_connect(c, deadline, error))) {
    if (Clock::now() >= deadline)
      throw UsageError(who + "could not reach rank 0 at " + c.described_as + " within " +
                       seconds_text(c.timeout_seconds) + " (" + error +
                       "); check that rank 0 runs and that every rank has the same MASTER_ADDR "
                       "and MASTER_PORT (OMNITRON_RENDEZVOUS_TIMEOUT sets the wait)");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Hello h;
  h.put(0, kMagic, 4), h.put(4, kVersion, 4), h.put(8, uint32_t(c.rank), 4),
      h.put(12, uint32_t(c.size), 4);
  Welcome w;
  // A little longer than rank 0 waits, so that its count of arrivals reaches this rank.
  const Io io =
      write_all(hub.get(), h.bytes, sizeof h.bytes)
          ? read_exact(hub.get(), w.bytes, sizeof w.bytes, deadline + std::chrono::seconds(3))
          : Io::Closed;
  OMNI_REQUIRE(io != Io::TimedOut, who, "reached rank 0 at ", c.described_as,
               ", but not every rank arrived within ", seconds_text(c.timeout_seconds),
               " (OMNITRON_RENDEZVOUS_TIMEOUT sets the wait)");
  OMNI_REQUIRE(io == Io::Done, who, "reached ", c.described_as,
               ", which closed the connection: rank 0 stopped (its message says why), or another "
               "program holds that port");
  OMNI_REQUIRE(w.get(0, 4) == kMagic, who, "reached ", c.described_as,
               ", but what answered is not omnitron's rank 0 (another program holds that port? "
               "OMNITRON_RENDEZVOUS_PORT picks another)");
  OMNI_REQUIRE(w.get(4, 4) == kAllArrived, "torchrun rendezvous at ", c.described_as, ": ",
               w.get(8, 4), " of ", c.size, " ranks arrived within ",
               seconds_text(c.timeout_seconds),
               " (rank 0 says; its message names the missing ranks)");
  return hub;
}

// ---- the communicator ----

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

enum class Op : uint32_t { Broadcast = 1, Barrier, AllReduce, AllGather, ReduceScatter, AllToAll };

const char* op_name(Op op) {
  switch (op) {
    case Op::Broadcast:
      return "broadcast";
    case Op::Barrier:
      return "barrier";
    case Op::AllReduce:
      return "all_reduce";
    case Op::AllGather:
      return "all_gather";
    case Op::ReduceScatter:
      return "reduce_scatter";
    case Op::AllToAll:
      return "all_to_all";
  }
  return "?";
}

// What every rank announces for a collective: the operation, its argument (broadcast's root;
// the dtype and reduction of the others) and the bytes each rank contributes.
struct Call {
  Op op;
  uint32_t arg = 0;
  uint64_t bytes = 0;
};
using CallWire = Wire<16>;

CallWire encode(const Call& c) {
  CallWire w;
  w.put(0, uint32_t(c.op), 4), w.put(4, c.arg, 4), w.put(8, c.bytes, 8);
  return w;
}

std::string describe(const Call& c) {
  std::string s = op_name(c.op);
  if (c.op == Op::Broadcast) s += " from rank " + std::to_string(c.arg);
  return s + " of " + std::to_string(c.bytes) + " bytes";
}

template <typename T>
void reduce_into(T* acc, const T* in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i)
    acc[i] = op == ReduceOp::Sum ? acc[i] + in[i] : std::max(acc[i], in[i]);
}

class RendezvousCommunicator : public Communicator {
 public:
  RendezvousCommunicator(RendezvousConfig config, std::string name)
      : c_(std::move(config)),
        name_(std::move(name)),
        watch_(std::make_unique<WatchGroup>(name_, c_.rank, all_ranks(c_.size))) {
    OMNI_CHECK(c_.size >= 1 && c_.rank >= 0 && c_.rank < c_.size, "[comm ", name_, "] rank ",
               c_.rank, " of ", c_.size);
  }
  int rank() const override { return c_.rank; }
  int size() const override { return c_.size; }
  std::string name() const override { return name_; }

  void broadcast(void* data, size_t bytes, int root) override {
    OMNI_CHECK(root >= 0 && root < c_.size, "[comm ", name_, "] broadcast from rank ", root, " of ",
               c_.size);
    connect();
    CollectiveWatch watch(*watch_, "broadcast", bytes);
    const Call call{Op::Broadcast, uint32_t(root), bytes};
    if (c_.rank == 0) {
      std::vector<std::vector<std::byte>> parts = gather(call, root);
      if (root != 0) std::memcpy(data, parts[size_t(root)].data(), bytes);
      for (int r = 1; r < c_.size; ++r)
        if (r != root) reply(r, data, bytes);
    } else {
      announce(call, c_.rank == root ? data : nullptr);
      if (c_.rank != root) receive(data, bytes);
    }
  }
  void barrier() override {
    connect();
    CollectiveWatch watch(*watch_, "barrier", 0);
    std::byte ack{1};
    if (c_.rank == 0) {
      gather({Op::Barrier, 0, 0}, -1);
      for (int r = 1; r < c_.size; ++r) reply(r, &ack, 1);
    } else {
      announce({Op::Barrier, 0, 0}, nullptr);
      receive(&ack, 1);
    }
  }
  void all_reduce(void* data, size_t n, DType t, ReduceOp op) override {
    OMNI_CHECK(t == DType::F32 || t == DType::F64, "[comm ", name_, "] reductions of ",
               dtype_name(t), " are not supported (f32 and f64 are)");
    const size_t bytes = n * dtype_size(t);
    connect();
    CollectiveWatch watch(*watch_, "all_reduce", bytes);
    const Call call{Op::AllReduce, uint32_t(t) << 8 | uint32_t(op), bytes};
    if (c_.rank != 0) {
      announce(call, data);
      receive(data, bytes);
      return;
    }
    std::vector<std::vector<std::byte>> parts = gather(call, -1);
    for (int r = 1; r < c_.size; ++r) add(data, parts[size_t(r)].data(), n, t, op);
    for (int r = 1; r < c_.size; ++r) reply(r, data, bytes);
  }
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    const size_t bytes = n * dtype_size(t);
    connect();
    CollectiveWatch watch(*watch_, "all_gather", bytes * c_.size);
    const Call call{Op::AllGather, uint32_t(t), bytes};
    if (c_.rank != 0) {
      announce(call, in);
      receive(out, bytes * c_.size);
      return;
    }
    std::vector<std::vector<std::byte>> parts = gather(call, -1);
    std::memmove(out, in, bytes);  // in place: in == out
    for (int r = 1; r < c_.size; ++r)
      std::memcpy(at(out, r * bytes), parts[size_t(r)].data(), bytes);
    for (int r = 1; r < c_.size; ++r) reply(r, out, bytes * c_.size);
  }
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    OMNI_CHECK(t == DType::F32 || t == DType::F64, "[comm ", name_, "] reductions of ",
               dtype_name(t), " are not supported (f32 and f64 are)");
    const size_t block = n * dtype_size(t);
    connect();
    CollectiveWatch watch(*watch_, "reduce_scatter", block * c_.size);
    const Call call{Op::ReduceScatter, uint32_t(t), block * c_.size};
    if (c_.rank != 0) {
      announce(call, in);
      receive(out, block);
      return;
    }
    std::vector<std::vector<std::byte>> parts = gather(call, -1);
    std::vector<std::byte> sum(static_cast<const std::byte*>(in),
                               static_cast<const std::byte*>(in) + call.bytes);
    for (int r = 1; r < c_.size; ++r)
      add(sum.data(), parts[size_t(r)].data(), n * c_.size, t, ReduceOp::Sum);
    std::memcpy(out, sum.data(), block);
    for (int r = 1; r < c_.size; ++r) reply(r, sum.data() + r * block, block);
  }
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    const size_t block = n * dtype_size(t);
    connect();
    CollectiveWatch watch(*watch_, "all_to_all", block * c_.size);
    const Call call{Op::AllToAll, uint32_t(t), block * c_.size};
    if (c_.rank != 0) {
      announce(call, in);
      receive(out, block * c_.size);
      return;
    }
    std::vector<std::vector<std::byte>> parts = gather(call, -1);
    parts[0].assign(static_cast<const std::byte*>(in),
                    static_cast<const std::byte*>(in) + call.bytes);
    // Rank r receives block r of every rank, in rank order.
    std::vector<std::byte> mine(call.bytes);
    for (int r = c_.size - 1; r >= 0; --r) {
      for (int s = 0; s < c_.size; ++s)
        std::memcpy(mine.data() + s * block, parts[size_t(s)].data() + r * block, block);
      if (r > 0) reply(r, mine.data(), mine.size());
    }
    std::memcpy(out, mine.data(), mine.size());
  }
  std::unique_ptr<CommRequest> iall_reduce(void* data, size_t n, DType t) override {
    all_reduce(data, n, t, ReduceOp::Sum);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    reduce_scatter(out, in, n, t);
    return std::make_unique<DoneRequest>();
  }
  void send(const void*, size_t, int, int) override { not_here("send"); }
  void recv(void*, size_t, int, int) override { not_here("recv"); }
  std::unique_ptr<CommRequest> isend(const void*, size_t, int, int) override { not_here("isend"); }
  std::unique_ptr<CommRequest> irecv(void*, size_t, int, int) override { not_here("irecv"); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { not_here("split"); }

 private:
  static std::vector<int> all_ranks(int n) {
    std::vector<int> r(size_t(std::max(n, 0)));
    for (int i = 0; i < n; ++i) r[size_t(i)] = i;
    return r;
  }
  static std::byte* at(void* p, size_t off) { return static_cast<std::byte*>(p) + off; }
  static void add(void* acc, const void* in, size_t n, DType t, ReduceOp op) {
    if (t == DType::F32)
      reduce_into(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    else
      reduce_into(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
  }
  [[noreturn]] void not_here(const char* what) const {
    throw InternalError("[comm " + name_ + "] " + what +
                        " is not carried by the torchrun rendezvous, which carries host "
                        "collectives only (comm/rendezvous.h): GPU ranks make an NCCL/RCCL "
                        "communicator over it for the process groups and point-to-point, and "
                        "CPU ranks run under mpirun (docs/launching.md)");
  }

  // The rendezvous, on the first collective; then, for the world, the watchdog's registration
  // and its exchange directory (rank 0's, as the MPI world does).
  void connect() {
    if (connected_ || c_.size == 1) return;
    if (c_.timeout_seconds <= 0) c_.timeout_seconds = rendezvous_timeout_seconds();
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(int64_t(c_.timeout_seconds * 1000));
    if (c_.rank == 0)
      peers_ = accept_ranks(c_, deadline);
    else
      peers_.push_back(join_rank0(c_, deadline));
    connected_ = true;
    if (!c_.watched) return;
    set_collective_world(c_.rank, c_.size, nullptr);  // on a timeout the watchdog exits
    // Made again now that this thread is watched, so the watchdog sees the group.
    watch_ = std::make_unique<WatchGroup>(name_, c_.rank, all_ranks(c_.size));
    char dir[1024] = {};
    if (c_.rank == 0) std::snprintf(dir, sizeof dir, "%s", make_hang_dir().c_str());
    broadcast(dir, sizeof dir, 0);
    set_hang_dir(dir);
  }
  int link(int r) const { return peers_[c_.rank == 0 ? size_t(r) : 0].get(); }
  std::string peer_text(int r) const {
    return "rank " + std::to_string(r) + (r == 0 ? " (at " + c_.described_as + ")" : "");
  }
  [[noreturn]] void gone(int r, const Call& call) const {
    throw InternalError("[comm " + name_ + "] " + peer_text(r) + " closed its connection during " +
                        describe(call) + " (it stopped: its message says why)");
  }

  // A rank other than 0: its call and, when it contributes, its bytes.
  void announce(const Call& call, const void* data) {
    const CallWire w = encode(call);
    if (!write_all(link(0), w.bytes, sizeof w.bytes) ||
        (data && !write_all(link(0), data, call.bytes)))
      gone(0, call);
  }
  void receive(void* data, size_t bytes) {
    if (bytes && read_exact(link(0), data, bytes, std::nullopt) != Io::Done)
      throw InternalError("[comm " + name_ + "] " + peer_text(0) +
                          " closed its connection during a collective (it stopped: its message "
                          "says why)");
  }
  void reply(int r, const void* data, size_t bytes) {
    if (!write_all(link(r), data, bytes))
      throw InternalError("[comm " + name_ + "] " + peer_text(r) +
                          " closed its connection (it stopped: its message says why)");
  }
  // Rank 0: every other rank's call, checked against its own, and their bytes (all of them,
  // or only `only`'s when only >= 0), indexed by rank.
  std::vector<std::vector<std::byte>> gather(const Call& mine, int only) {
    std::vector<std::vector<std::byte>> parts(size_t(c_.size));
    for (int r = 1; r < c_.size; ++r) {
      CallWire w;
      if (read_exact(link(r), w.bytes, sizeof w.bytes, std::nullopt) != Io::Done) gone(r, mine);
      const Call theirs{Op(w.get(0, 4)), uint32_t(w.get(4, 4)), w.get(8, 8)};
      if (theirs.op != mine.op || theirs.arg != mine.arg || theirs.bytes != mine.bytes)
        throw InternalError("[comm " + name_ + "] ranks disagree on a collective: rank " +
                            std::to_string(r) + " called " + describe(theirs) +
                            " while rank 0 called " + describe(mine));
      if (only >= 0 && r != only) continue;
      parts[size_t(r)].resize(mine.bytes);
      if (read_exact(link(r), parts[size_t(r)].data(), mine.bytes, std::nullopt) != Io::Done)
        gone(r, mine);
    }
    return parts;
  }

  RendezvousConfig c_;
  std::string name_;
  std::unique_ptr<WatchGroup> watch_;
  bool connected_ = false;
  std::vector<Fd> peers_;  // rank 0: one per rank (index 0 unused); others: rank 0's
};

}  // namespace

std::unique_ptr<Communicator> make_rendezvous_communicator(const RendezvousConfig& config,
                                                           const std::string& name) {
  return std::make_unique<RendezvousCommunicator>(config, name);
}

}  // namespace omni
