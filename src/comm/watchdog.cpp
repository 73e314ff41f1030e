#include "comm/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace omni {

namespace {

using Clock = std::chrono::steady_clock;

// The call in progress (MPI is used from one thread, so one slot suffices; a call made
// while another is watched is not watched itself).
struct Watchdog {
  std::mutex mutex;
  std::condition_variable wake;
  std::atomic<bool> enabled{false};
  double timeout_seconds = 0;
  std::string flag_value;
  int world_rank = 0, world_size = 1;
  void (*abort_job)(int) = nullptr;
  bool busy = false;
  Clock::time_point since;
  const char* op = "";
  std::string group;
  int group_rank = 0, group_size = 1;
  bool thread_started = false;

  [[noreturn]] void fire(double waited) {
    std::fprintf(stderr,
                 "omnitron [rank %d of %d]: error: %s on the %s group (its rank %d of %d) has "
                 "waited %.1f s, longer than %s (%.1f s): a rank of that group did not join the "
                 "call (it hung, failed or took another path); ending the job\n",
                 world_rank, world_size, op, group.c_str(), group_rank, group_size, waited,
                 flag_value.c_str(), timeout_seconds);
    std::fflush(stderr);
    std::fflush(stdout);
    if (abort_job) abort_job(3);
    std::_Exit(3);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      // Checks a few times per timeout, at least every second.
      const double period = std::min(1.0, std::max(0.01, timeout_seconds / 20));
      wake.wait_for(lock, std::chrono::duration<double>(period));
      if (!busy || timeout_seconds <= 0) continue;
      const double waited = std::chrono::duration<double>(Clock::now() - since).count();
      if (waited > timeout_seconds) fire(waited);
    }
  }
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: its thread runs until exit
  return *w;
}

}  // namespace

void set_collective_timeout(double seconds, const std::string& flag_value) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.timeout_seconds = seconds;
  w.flag_value = flag_value.empty() ? "the collective timeout" : flag_value;
  w.enabled.store(seconds > 0, std::memory_order_release);
  if (seconds > 0 && !w.thread_started) {
    std::thread([&w] { w.run(); }).detach();
    w.thread_started = true;
  }
  w.wake.notify_all();
}

double collective_timeout() {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  return w.timeout_seconds;
}

void set_collective_world(int rank, int size, void (*abort_job)(int)) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.world_rank = rank, w.world_size = size, w.abort_job = abort_job;
}

CollectiveWatch::CollectiveWatch(const char* op, const std::string& group, int group_rank,
                                 int group_size) {
  Watchdog& w = watchdog();
  if (!w.enabled.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.busy) return;
  w.busy = active_ = true;
  w.since = Clock::now();
  w.op = op;
  w.group = group;
  w.group_rank = group_rank, w.group_size = group_size;
}

CollectiveWatch::~CollectiveWatch() {
  if (!active_) return;
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.busy = false;
}

}  // namespace omni
