#include "comm/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "base/trace.h"

namespace omni {

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// One watched thread (a rank). Written by its thread with relaxed atomics, read by the
// watchdog's thread.
struct Slot {
  int rank = 0, size = 1;
  StepPlace* place = nullptr;
  std::atomic<bool> busy{false}, arrived{false};
  std::atomic<int64_t> since_ns{0};
  std::atomic<WatchGroup*> group{nullptr};
  std::atomic<const char*> op{""};
  std::atomic<uint64_t> seq{0};
  std::atomic<size_t> bytes{0};
  std::atomic<int> peer{-1};
  double stall = 0;                 // testing::stall_inside_next_call, its own thread only
  std::vector<WatchGroup*> groups;  // registered by its thread (under the watchdog's mutex)
};

thread_local Slot* t_slot = nullptr;
std::atomic<bool> g_enabled{false};

std::string hostname() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes atomically (a temporary, then rename), so a reader never sees half a file.
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

// Creates `path` with `text` unless it exists; true when this call created it.
bool create_once(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return false;
  close(fd);
  write_text(path + ".body", text);
  return true;
}

std::string size_text(size_t bytes) {
  char b[64];
  if (bytes >= (1u << 20))
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
  else if (bytes >= 1024)
    std::snprintf(b, sizeof b, "%.1f KiB", bytes / 1024.0);
  else
    std::snprintf(b, sizeof b, "%zu B", bytes);
  return b;
}

std::string place_text(const Slot& s) {
  const char* name = s.place ? s.place->name.load(std::memory_order_relaxed) : nullptr;
  if (!name) return "outside the training step's phases";
  std::string t = std::string("during ") + name;
  if (const char* arg = s.place->arg_name.load(std::memory_order_relaxed))
    t += std::string(" ") + arg + " " + std::to_string(s.place->arg.load());
  if (const int layer = s.place->layer.load(std::memory_order_relaxed); layer >= 0)
    t += ", layer " + std::to_string(layer);
  return t;
}

// What one round's request names: the stuck call of the rank that started it.
struct Request {
  std::string group;  // WatchGroup::describe()
  std::string op;
  uint64_t seq = 0;
  int rank = 0, peer = -1;  // world ranks; peer -1 for a collective
};

struct Watchdog {
  std::mutex mutex;
  std::condition_variable wake;
  double timeout_seconds = 0, report_seconds = 0;
  std::string flag_value;
  std::string dir;
  int world_size_mpi = 0;
  void (*abort_job)(int) = nullptr;
  std::vector<Slot*> slots;
  std::vector<std::string> hosts;  // of each world rank, when known
  bool thread_started = false;
  // Per round (1: the first report, 2: the timeout).
  bool started[3] = {}, answered[3] = {}, summarized[3] = {};
  Clock::time_point answered_at[3];
  Clock::time_point fired_at;
  bool fired = false;
  std::string fired_message;

  std::string path(const std::string& name) const { return dir + "/" + name; }

  // With the mutex held, after a time changed: watch (and start the thread) when either is set.
  void update() {
    const bool on = timeout_seconds > 0 || report_seconds > 0;
    g_enabled.store(on, std::memory_order_release);
    if (on && !thread_started) {
      std::thread([this] { run(); }).detach();
      thread_started = true;
    }
    if (dir.empty()) dir = make_hang_dir();
    wake.notify_all();
  }

  void ensure_dir() { mkdir(dir.c_str(), 0755); }

  WatchGroup* live_group(const Slot& s, WatchGroup* g) const {
    return std::find(s.groups.begin(), s.groups.end(), g) != s.groups.end() ? g : nullptr;
  }

  void start_round(int round, const Slot& s) {
    started[round] = true;
    WatchGroup* g = live_group(s, s.group.load());
    if (!g) return;
    ensure_dir();
    const int peer = s.peer.load();
    std::ostringstream body;
    body << g->describe() << "\n"
         << s.op.load() << "\n"
         << s.seq.load() << "\n"
         << s.rank << "\n"
         << (peer >= 0 && peer < int(g->world_ranks.size()) ? g->world_ranks[peer] : -1) << "\n";
    create_once(path("request-" + std::to_string(round)), body.str());
  }

  static bool parse(const std::string& text, Request& r) {
    std::istringstream in(text);
    return bool(std::getline(in, r.group) && std::getline(in, r.op) &&
                in >> r.seq >> r.rank >> r.peer);
  }

  // This rank's one line and its state on the request's group.
  std::string line(const Slot& s, const Request& r, double waited) const {
    char head[160];
    std::snprintf(head, sizeof head, "omnitron hang [rank %d of %d, host %s]: ", s.rank, s.size,
                  hostname().c_str());
    std::string text = head;
    WatchGroup* busy_group = s.busy.load() ? live_group(s, s.group.load()) : nullptr;
    if (busy_group) {
      char b[96];
      std::snprintf(b, sizeof b, "%.1f s", waited);
      const int peer = s.peer.load();
      text += (s.arrived.load() ? std::string("waiting ") + b + " in "
                                : std::string("stalled ") + b + " inside, before the transport, ") +
              s.op.load() + " #" + std::to_string(s.seq.load()) + " (" + size_text(s.bytes.load()) +
              ") on " + busy_group->describe();
      if (peer >= 0 && peer < int(busy_group->world_ranks.size()))
        text += " with rank " + std::to_string(busy_group->world_ranks[peer]);
    } else {
      // Its calls so far on each of its groups (a rank behind on one shows there).
      text += "not in a communication call (calls made:";
      for (size_t i = 0; i < s.groups.size(); ++i) {
        const WatchGroup& g = *s.groups[i];
        const uint64_t n = g.seq.load();
        text += std::string(i ? ", " : " ") + g.name + " " + std::to_string(n);
        if (n) text += std::string(" (last ") + g.last_op.load() + ")";
      }
      text += ")";
    }
    return text + ", " + place_text(s);
  }

  // What rank 0's summary reads of a rank: its line, its call in progress (when it
  // started, in wall-clock time, to compare across nodes) and its counter on each group.
  static std::string state(const Slot& s, const std::string& text) {
    std::ostringstream out;
    out << text.substr(text.find("]: ") + 3) << "\n";
    WatchGroup* g = s.busy.load() ? s.group.load() : nullptr;
    if (g && std::find(s.groups.begin(), s.groups.end(), g) == s.groups.end()) g = nullptr;
    if (g) {
      const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count() -
                           (now_ns() - s.since_ns.load());
      const int peer = s.peer.load();
      out << "busy " << s.arrived.load() << " " << wall << " " << s.seq.load() << " "
          << (peer >= 0 && peer < int(g->world_ranks.size()) ? g->world_ranks[peer] : -1) << " "
          << s.op.load() << "\t" << g->describe() << "\n";
    } else {
      out << "idle\n";
    }
    for (WatchGroup* w : s.groups) out << w->seq.load() << "\t" << w->describe() << "\n";
    return out.str();
  }

  void answer(int round, const Request& r) {
    answered[round] = true;
    answered_at[round] = Clock::now();
    ensure_dir();
    for (Slot* s : slots) {
      const double waited = (now_ns() - s->since_ns.load()) / 1e9;
      const std::string text = line(*s, r, waited);
      std::fprintf(stderr, "%s\n", text.c_str());
      write_text(path("state-" + std::to_string(round) + "-" + std::to_string(s->rank)),
                 state(*s, text));
    }
    std::fflush(stderr);
  }

  struct RankState {
    bool present = false, busy = false, arrived = false;
    int64_t since = 0;
    uint64_t seq = 0;
    int peer = -1;
    std::string text, op, group;
    std::map<std::string, uint64_t> counts;  // per group
  };

  static std::vector<int> members_of(const std::string& group) {
    std::vector<int> members;
    const size_t open = group.find("world ranks ");
    if (open == std::string::npos) return members;
    std::istringstream in(group.substr(open + 12));
    int m;
    char sep;
    while (in >> m) {
      members.push_back(m);
      if (!(in >> sep) || sep != ',') break;
    }
    return members;
  }

  // Rank 0's summary: the call that has waited longest (where the hang began), and which
  // ranks of its group are behind, and on what.
  void summarize(int round, int world_size, bool final) {
    std::vector<RankState> st(world_size);
    for (int k = 0; k < world_size; ++k) {
      const std::string file = path("state-" + std::to_string(round) + "-" + std::to_string(k));
      if (!exists(file)) {
        if (!final) return;  // wait for it
        continue;
      }
      RankState& x = st[k];
      x.present = true;
      std::istringstream in(read_text(file));
      std::getline(in, x.text);
      std::string call, kind;
      std::getline(in, call);
      std::istringstream c(call);
      c >> kind;
      if (kind == "busy") {
        x.busy = true;
        c >> x.arrived >> x.since >> x.seq >> x.peer >> x.op;
        c.ignore();
        std::getline(c, x.group);
      }
      std::string row;
      while (std::getline(in, row)) {
        const size_t tab = row.find('\t');
        if (tab != std::string::npos)
          x.counts[row.substr(tab + 1)] = std::stoull(row.substr(0, tab));
      }
    }
    summarized[round] = true;
    // The call where the hang began: the oldest wait that some rank outside any call (or
    // stalled inside one, or silent) holds up; a wait only for ranks that wait themselves
    // (a barrier behind a stuck send) is a consequence. Else the oldest wait.
    const auto blockers = [&](int k) {
      const RankState& w = st[k];
      return w.peer >= 0 ? std::vector<int>{w.peer} : members_of(w.group);
    };
    const auto in_call = [&](const RankState& x, const RankState& w) {
      return x.busy && x.arrived && x.group == w.group && x.seq == w.seq;
    };
    // Among the waits held up by such a rank, the one held up least by ranks that wait
    // elsewhere (the dp all-reduce a rank skipped, not the barrier behind it), then the oldest.
    int root = -1, oldest = -1, root_score = 0;
    for (int k = 0; k < world_size; ++k) {
      if (!st[k].busy || !st[k].arrived) continue;
      if (oldest < 0 || st[k].since < st[oldest].since) oldest = k;
      bool held_by_idle = false;
      int score = 0;  // blockers that wait in another call
      for (int m : blockers(k)) {
        if (m < 0 || m >= world_size || in_call(st[m], st[k])) continue;
        if (st[m].busy && st[m].arrived)
          ++score;
        else
          held_by_idle = true;
      }
      if (held_by_idle &&
          (root < 0 || score < root_score || (score == root_score && st[k].since < st[root].since)))
        root = k, root_score = score;
    }
    if (root < 0) root = oldest;
    std::string text;
    if (root < 0) {
      text = "omnitron hang report: no rank is waiting in a communication call any more";
    } else {
      const RankState& w = st[root];
      text = "omnitron hang report: the longest wait is rank " + std::to_string(root) + "'s " +
             w.op + " #" + std::to_string(w.seq) + " on " + w.group + "; ";
      std::string behind, missing;
      const std::vector<int> look = blockers(root);
      for (int m : look) {
        if (m < 0 || m >= world_size) continue;
        const RankState& x = st[m];
        if (!x.present) {
          missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(m);
          if (m < int(hosts.size())) missing += " on " + hosts[m];
          continue;
        }
        const auto it = x.counts.find(w.group);
        const uint64_t count = it == x.counts.end() ? 0 : it->second;
        const bool late = w.peer >= 0 || !in_call(x, w);
        if (!late) continue;
        behind += "\n  rank " + std::to_string(m) + " (" + std::to_string(count) + " calls on " +
                  w.group.substr(0, w.group.find(' ')) + "): " + x.text;
      }
      if (w.peer >= 0)
        text += "its peer is not in the matching call:";
      else if (behind.empty())
        text += "every rank of the group is inside it (a stall in the transport)";
      else
        text += "behind:";
      text += behind;
      if (!missing.empty())
        text += "\n  no answer from " + missing +
                " (on another node? set OMNITRON_HANG_DIR to a directory every node shares)";
    }
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
    write_text(path("summary-" + std::to_string(round)), text);
  }

  [[noreturn]] void end_job() {
    std::fprintf(stderr, "%s\n", fired_message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    if (abort_job) abort_job(3);
    std::_Exit(3);
  }

  // The line that ends the job, for the slot whose call ran past the timeout.
  std::string fire_message(const Slot& s, double waited) const {
    WatchGroup* g = live_group(s, s.group.load());
    char b[640];
    std::snprintf(b, sizeof b,
                  "omnitron [rank %d of %d]: error: %s on the %s group (its rank %d of %d) has "
                  "waited %.1f s, longer than %s (%.1f s): a rank of that group did not join "
                  "the call (it hung, failed or took another path; the hang report above names "
                  "it); ending the job",
                  s.rank, s.size, s.op.load(), g ? g->name.c_str() : "?", g ? g->rank : 0,
                  g ? int(g->world_ranks.size()) : 0, waited, flag_value.c_str(), timeout_seconds);
    return b;
  }

  void tick() {
    if (slots.empty() || dir.empty()) return;
    const int64_t now = now_ns();
    for (Slot* s : slots) {
      if (!s->busy.load(std::memory_order_acquire)) continue;
      const double waited = (now - s->since_ns.load()) / 1e9;
      if (timeout_seconds > 0 && waited > timeout_seconds && !started[2]) {
        start_round(2, *s);
        fired_message = fire_message(*s, waited);
        fired = true;
        fired_at = Clock::now();
      } else if (report_seconds > 0 && waited > report_seconds && !started[1]) {
        start_round(1, *s);
      }
    }
    const int world_size = world_size_mpi > 0 ? world_size_mpi : slots.front()->size;
    const bool holds_rank0 =
        std::any_of(slots.begin(), slots.end(), [](Slot* s) { return s->rank == 0; });
    for (int round : {1, 2}) {
      const std::string req = path("request-" + std::to_string(round));
      if (!answered[round] && !exists(req + ".body")) continue;
      Request r;
      if (!parse(read_text(req + ".body"), r)) continue;
      if (!answered[round]) answer(round, r);
      if (holds_rank0 && !summarized[round]) {
        const double since =
            std::chrono::duration<double>(Clock::now() - answered_at[round]).count();
        summarize(round, world_size, since > 3);
      }
    }
    // Past the timeout: end once rank 0 has summarised, or after 8 s whatever happened to
    // the exchange (an unwritable directory, a rank 0 that cannot answer).
    if (fired && (exists(path("summary-2")) ||
                  std::chrono::duration<double>(Clock::now() - fired_at).count() > 8))
      end_job();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      double shortest = 1;
      for (double t : {timeout_seconds, report_seconds})
        if (t > 0) shortest = std::min(shortest, t);
      const double period = std::min(0.5, std::max(0.01, shortest / 20));
      wake.wait_for(lock, std::chrono::duration<double>(period));
      if (timeout_seconds > 0 || report_seconds > 0) tick();
    }
  }
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: its thread runs until exit
  return *w;
}

// The SIGTERM line (set_collective_hosts). A signal handler may not allocate or lock: it
// reads the slots' atomics and the hosts (both set before it is installed) and formats into
// a fixed buffer.
struct SignalText {
  char text[1024] = {};  // stays terminated: add() writes below the last byte
  size_t n = 0;
  void add(const char* s) {
    while (*s && n + 1 < sizeof text) text[n++] = *s++;
  }
  void add(int64_t v) {
    char digits[24];
    int k = 0;
    if (v < 0) add("-"), v = -v;
    do digits[k++] = char('0' + v % 10), v /= 10;
    while (v && k < 24);
    while (k && n + 1 < sizeof text) text[n++] = digits[--k];
  }
};

struct sigaction g_previous_term;

extern "C" void report_termination(int signal) {
  const Watchdog& w = watchdog();
  bool wrote = false;
  for (const Slot* s : w.slots) {
    WatchGroup* g = s->busy.load() ? s->group.load() : nullptr;
    if (!g || size_t(s->rank) >= w.hosts.size()) continue;
    const std::string& mine = w.hosts[s->rank];
    SignalText t;
    int elsewhere = 0;
    for (int m : g->world_ranks) {
      if (m < 0 || size_t(m) >= w.hosts.size() || w.hosts[m] == mine) continue;
      if (elsewhere++ == 8) {  // a large data-parallel group: the first few
        t.add(", ...");
        break;
      }
      t.add(elsewhere > 1 ? ", " : ", whose ranks on other hosts are ");
      t.add(int64_t(m)), t.add(" on "), t.add(w.hosts[m].c_str());
    }
    if (!elsewhere) continue;  // the launcher names a lost rank of this host itself
    SignalText line;
    line.add("omnitron [rank "), line.add(int64_t(s->rank)), line.add(" of ");
    line.add(int64_t(s->size)), line.add(", host "), line.add(mine.c_str());
    line.add("]: ended by the launcher (SIGTERM) after waiting ");
    const int64_t tenths = (now_ns() - s->since_ns.load()) / 100000000;
    line.add(tenths / 10), line.add("."), line.add(tenths % 10), line.add(" s in ");
    line.add(s->op.load()), line.add(" #"), line.add(int64_t(s->seq.load()));
    line.add(" on "), line.add(g->name.c_str()), line.add(t.text), line.add("\n");
    [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, line.text, line.n);
    wrote = true;
  }
  // A moment for the launcher to read the line before it sees the process end: Open MPI's
  // mpirun, ending a job that lost a host, otherwise often drops it (it sends SIGKILL 1 s
  // after SIGTERM; Slurm after KillWait, 30 s by default).
  const timespec pause{0, 300000000};
  if (wrote) nanosleep(&pause, nullptr);
  sigaction(signal, &g_previous_term, nullptr);
  raise(signal);
}

}  // namespace

void set_collective_timeout(double seconds, const std::string& flag_value) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.timeout_seconds = seconds;
  w.flag_value = flag_value.empty() ? "the collective timeout" : flag_value;
  w.update();
}

double collective_timeout() {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  return w.timeout_seconds;
}

void set_hang_report_seconds(double seconds) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.report_seconds = seconds;
  w.update();
}

void set_collective_world(int rank, int size, void (*abort_job)(int)) {
  Watchdog& w = watchdog();
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.world_size_mpi = size, w.abort_job = abort_job;
  }
  watch_this_thread(rank, size);
}

void set_collective_hosts(std::vector<std::string> hosts) {
  Watchdog& w = watchdog();
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.hosts = std::move(hosts);
  }
  // On one host the launcher names a lost rank itself; a handler already there stays.
  const bool one_host = std::all_of(w.hosts.begin(), w.hosts.end(),
                                    [&](const std::string& h) { return h == w.hosts.front(); });
  struct sigaction current = {};
  sigaction(SIGTERM, nullptr, &current);
  if (one_host || current.sa_handler != SIG_DFL) return;
  struct sigaction sa = {};
  sa.sa_handler = report_termination;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_previous_term);
}

std::string hosts_summary(const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  std::unordered_map<std::string, size_t> index;
  for (int r = 0; r < int(hosts.size()); ++r) {
    const auto [it, added] = index.emplace(hosts[r], by_host.size());
    if (added) by_host.push_back({hosts[r], {}});
    by_host[it->second].second.push_back(r);
  }
  if (by_host.size() < 2) return "";
  std::string text =
      std::to_string(hosts.size()) + " ranks on " + std::to_string(by_host.size()) + " hosts:";
  for (size_t h = 0; h < by_host.size(); ++h) {
    const std::vector<int>& ranks = by_host[h].second;
    text.append(h ? ", " : " ").append(by_host[h].first);
    text.append(ranks.size() > 1 ? " (ranks " : " (rank ");
    for (size_t i = 0; i < ranks.size();) {  // runs of consecutive ranks as first-last
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      text.append(i ? "," : "").append(std::to_string(ranks[i]));
      if (j > i) text.append("-").append(std::to_string(ranks[j]));
      i = j + 1;
    }
    text += ")";
  }
  return text;
}

void set_hang_dir(const std::string& dir) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.dir = dir;
  for (int round : {1, 2}) w.started[round] = w.answered[round] = w.summarized[round] = false;
  w.fired = false;
}

std::string make_hang_dir() {
  const char* base = std::getenv("OMNITRON_HANG_DIR");
  if (!base || !*base) base = std::getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  static std::atomic<int> serial{0};
  return std::string(base) + "/omnitron-hang-" + hostname() + "-" + std::to_string(getpid()) + "-" +
         std::to_string(now_ns() % 1000000007) + "-" + std::to_string(serial++);
}

void watch_this_thread(int rank, int size) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (!t_slot) {
    t_slot = new Slot;  // kept until unwatch_this_thread (the watchdog may read it)
    w.slots.push_back(t_slot);
  }
  t_slot->rank = rank, t_slot->size = size;
  t_slot->place = &t_step_place;
}

void unwatch_this_thread() {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (!t_slot) return;
  w.slots.erase(std::remove(w.slots.begin(), w.slots.end(), t_slot), w.slots.end());
  delete t_slot;
  t_slot = nullptr;
}

WatchGroup::WatchGroup(std::string name_, int rank_, std::vector<int> world_ranks_)
    : name(std::move(name_)), rank(rank_), world_ranks(std::move(world_ranks_)) {
  if (!t_slot) return;
  std::lock_guard<std::mutex> lock(watchdog().mutex);
  t_slot->groups.push_back(this);
}

WatchGroup::~WatchGroup() {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mutex);
  for (Slot* s : w.slots)
    s->groups.erase(std::remove(s->groups.begin(), s->groups.end(), this), s->groups.end());
}

std::string WatchGroup::describe() const {
  if (world_ranks.empty()) return name + " (its rank " + std::to_string(rank) + ")";
  std::string t = name + " (world ranks ";
  for (size_t i = 0; i < world_ranks.size(); ++i) {
    if (i) t += ',';
    t += std::to_string(world_ranks[i]);
  }
  return t + ")";
}

CollectiveWatch::CollectiveWatch(WatchGroup& group, const char* op, size_t bytes, int peer,
                                 uint64_t seq) {
  if (!seq) seq = group.count(op, bytes);
  Slot* s = t_slot;
  if (!s || !g_enabled.load(std::memory_order_relaxed) || s->busy.load(std::memory_order_relaxed))
    return;
  s->group.store(&group, std::memory_order_relaxed);
  s->op.store(op, std::memory_order_relaxed);
  s->seq.store(seq, std::memory_order_relaxed);
  s->bytes.store(bytes, std::memory_order_relaxed);
  s->peer.store(peer, std::memory_order_relaxed);
  s->since_ns.store(now_ns(), std::memory_order_relaxed);
  s->arrived.store(false, std::memory_order_relaxed);
  s->busy.store(true, std::memory_order_release);
  slot_ = s;
  if (s->stall > 0) {
    const double stall = s->stall;
    s->stall = 0;
    std::this_thread::sleep_for(std::chrono::duration<double>(stall));
  }
  s->arrived.store(true, std::memory_order_relaxed);
}

CollectiveWatch::~CollectiveWatch() {
  if (slot_) static_cast<Slot*>(slot_)->busy.store(false, std::memory_order_release);
}

namespace testing {
void stall_inside_next_call(double seconds) {
  if (t_slot) t_slot->stall = seconds;
}
}  // namespace testing

}  // namespace omni
