#include "comm/communicator.h"

#include <cstring>

#include "base/error.h"

namespace omni {

namespace {

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SelfCommunicator : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(void*, size_t, DType, ReduceOp) override {}
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    copy(out, in, n * dtype_size(t));
  }
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    copy(out, in, n * dtype_size(t));
  }
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    copy(out, in, n * dtype_size(t));
  }
  void broadcast(void*, size_t, int root) override {
    OMNI_CHECK(root == 0, "[comm ", name_, "] broadcast from rank ", root, " of 1");
  }
  void send(const void*, size_t, int peer, int) override { no_peer(peer); }
  void recv(void*, size_t, int peer, int) override { no_peer(peer); }
  std::unique_ptr<CommRequest> isend(const void*, size_t, int peer, int) override {
    no_peer(peer);
    return nullptr;
  }
  std::unique_ptr<CommRequest> irecv(void*, size_t, int peer, int) override {
    no_peer(peer);
    return nullptr;
  }
  std::unique_ptr<CommRequest> iall_reduce(void*, size_t, DType) override {
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    reduce_scatter(out, in, n, t);
    return std::make_unique<DoneRequest>();
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<SelfCommunicator>(name);
  }

 private:
  static void copy(void* out, const void* in, size_t bytes) {
    if (out != in) std::memmove(out, in, bytes);
  }
  [[noreturn]] void no_peer(int peer) const {
    throw InternalError("[comm " + name_ + "] point-to-point with rank " + std::to_string(peer) +
                        " in a communicator of one rank");
  }
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name);
}

}  // namespace omni

namespace omni {

// Single rank until the MPI communicator lands (comm/mpi_communicator.cpp).
Communicator& world_communicator() {
  static std::unique_ptr<Communicator> world = make_self_communicator("world");
  return *world;
}

void abort_world(int) {}

}  // namespace omni
