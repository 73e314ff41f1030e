// The collective watchdog (--distributed-timeout-minutes, --hang-report-seconds). Every
// communicator (MPI, NCCL, in-process) counts its collectives per group (WatchGroup: a
// counter, the last operation); a rank that waits in one blocking call longer than the
// report time or the timeout starts a hang report:
//
//   * each rank prints one line: its rank and host, the group of the stuck call (its name
//     and world ranks), the operation, its sequence number on that group and its size,
//     and where in the step the rank is (the innermost TraceSpan: micro-batch, forward,
//     backward, optimizer, checkpoint, data loading);
//   * rank 0 then prints which ranks of that group are behind and on what.
//
// On the timeout the job then ends (MPI_Abort of the world, or _Exit in-process), exit 3.
//
// How stuck ranks still report: a rank blocked in MPI cannot run MPI, and MPI here is
// MPI_THREAD_FUNNELED, so the exchange does not use MPI at all. Each process has one
// watchdog thread, which never calls MPI and never waits on the blocked thread; the
// threads talk through files in one directory that rank 0 chooses at start-up and
// broadcasts (OMNITRON_HANG_DIR, else TMPDIR, else /tmp: on several nodes point it at a
// shared filesystem, or rank 0 sees only its own node's ranks and says which are missing).
// A stuck rank's thread writes request-R; every thread, polling that directory once a
// second, writes state-R-<rank> (its line and its counter on the named group); the thread
// of rank 0 reads them and prints the summary. In-process (run_ranks) the same thread
// handles every rank of the process, through the same files.
//
//   auto group = std::make_shared<WatchGroup>("dp", 0, std::vector<int>{0, 2});
//   { CollectiveWatch watch(*group, "MPI_Allreduce", bytes); MPI_Allreduce(...); }
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace omni {

// Seconds a blocking call may wait; <= 0 turns the watchdog off. `flag_value` is the text
// the message quotes ("--distributed-timeout-minutes 0.05").
void set_collective_timeout(double seconds, const std::string& flag_value = "");
double collective_timeout();
// --hang-report-seconds: a first report (the job goes on) after this many seconds in one
// call; <= 0: none before the timeout.
void set_hang_report_seconds(double seconds);

// The world rank and size of this process (MPI), what ends the job, and the directory of
// the exchange (the same on every rank).
void set_collective_world(int rank, int size, void (*abort_job)(int code));
void set_hang_dir(const std::string& dir);
// The host of each world rank (make_mpi_world gathers them): the hang report then names the
// host of a rank that gives no answer, and a rank that the launcher ends with SIGTERM while it
// waits in a call with ranks on other hosts prints one line naming them and their hosts (a
// host that died or dropped off the network: Open MPI names only the host). Call once, on
// the main thread, before the ranks' calls start.
void set_collective_hosts(std::vector<std::string> hosts);
// "4 ranks on 2 hosts: node0 (ranks 0-1), node1 (ranks 2-3)", in the order the hosts first
// appear; empty when every rank is on one host. Rank 0 prints it at start-up, so that a log
// whose launcher names only a lost host (Open MPI: "Remote daemon ... on node node1") also
// tells which ranks were there.
std::string hosts_summary(const std::vector<std::string>& hosts);
// A fresh directory for the exchange: under OMNITRON_HANG_DIR, TMPDIR or /tmp.
std::string make_hang_dir();

// The calling thread is world rank `rank` of `size` (run_ranks calls it for each thread;
// make_mpi_world for the main thread). Only such threads are watched.
void watch_this_thread(int rank, int size);
void unwatch_this_thread();

// One communicator's group as the watchdog names it, and its counter. Made by the thread
// that uses the communicator (it is registered with that thread's rank).
class WatchGroup {
 public:
  WatchGroup(std::string name, int rank, std::vector<int> world_ranks);
  ~WatchGroup();
  WatchGroup(const WatchGroup&) = delete;
  WatchGroup& operator=(const WatchGroup&) = delete;
  // Counts one operation; returns its sequence number (from 1).
  uint64_t count(const char* op, size_t bytes) {
    last_op.store(op, std::memory_order_relaxed);
    last_bytes.store(bytes, std::memory_order_relaxed);
    return seq.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  // "dp (ranks 0,2)", and a key equal on every member.
  std::string describe() const;

  const std::string name;
  const int rank;  // in the group
  const std::vector<int> world_ranks;
  std::atomic<uint64_t> seq{0};
  std::atomic<const char*> last_op{""};
  std::atomic<size_t> last_bytes{0};
};

// Marks one blocking call of the calling thread, from construction to destruction: the
// counter (unless `seq` is given: a request's wait counted at its start) and a timestamp.
// `op` must outlive the watch (a literal). `peer` is the group rank of a send's or
// receive's partner (-1 for a collective).
class CollectiveWatch {
 public:
  CollectiveWatch(WatchGroup& group, const char* op, size_t bytes, int peer = -1, uint64_t seq = 0);
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

 private:
  void* slot_ = nullptr;
};

namespace testing {
// The calling thread's next watched call sleeps this long inside the call, before it
// reaches the transport (a rank stalled inside a collective).
void stall_inside_next_call(double seconds);
}  // namespace testing

}  // namespace omni
