#include "comm/progress.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace omni {

namespace {

struct Poll {
  const void* owner;
  std::thread::id thread;
  std::function<void()> fn;
};

std::mutex mu;
std::vector<Poll> polls;            // guarded by mu
std::atomic<int> registered{0};     // polls.size(), read without the lock
thread_local bool polling = false;  // a poll's own MPI calls do not recurse

}  // namespace

void set_comm_progress(const void* owner, std::function<void()> poll) {
  std::lock_guard<std::mutex> lock(mu);
  std::erase_if(polls, [&](const Poll& p) { return p.owner == owner; });
  if (poll) polls.push_back({owner, std::this_thread::get_id(), std::move(poll)});
  registered.store(int(polls.size()), std::memory_order_relaxed);
}

void poll_comm_progress() {
  if (registered.load(std::memory_order_relaxed) == 0 || polling) return;
  std::vector<std::function<void()>> mine;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Poll& p : polls)
      if (p.thread == std::this_thread::get_id()) mine.push_back(p.fn);
  }
  polling = true;
  for (auto& fn : mine) fn();
  polling = false;
}

}  // namespace omni
