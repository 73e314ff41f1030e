#include "train/profiler.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace omni {

const std::vector<const char*>& StepProfiler::timer_names() {
  static const std::vector<const char*> names = {
      "forward-backward", "forward-compute", "backward-compute",
      "forward-recv",     "backward-recv",   "batch-generator",
      "all-grads-sync",   "optimizer",       "params-all-gather"};
  return names;
}

StepProfiler::StepProfiler(const Options& opts, int world_rank, MetricsSink& sink)
    : opts_(opts), sink_(sink), rank_(world_rank) {
  const std::vector<int>& ranks = opts.profile_ranks;
  trace_rank_ = opts.profile && (ranks.empty() || std::count(ranks.begin(), ranks.end(), rank_));
  timers_ = opts.log_timers_to_tensorboard;
  timer_seconds_.assign(timer_names().size(), 0.0);
  origin_ = Clock::now();
  origin_unix_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  if (trace_rank_ || timers_) set_trace_sink(this);
  if (opts.profile && rank_ == 0) {
    std::string who = "every rank";
    if (!ranks.empty()) {
      who = ranks.size() == 1 ? "rank" : "ranks";
      for (size_t i = 0; i < ranks.size(); ++i) {
        who += i ? ", " : " ";
        who += std::to_string(ranks[i]);
      }
    }
    sink_.message("  profile: iterations " + std::to_string(opts.profile_step_start + 1) + "-" +
                  std::to_string(opts.profile_step_end) + " of " + who + " as Chrome traces in " +
                  opts.profile_dir + "/rank-R.json");
  }
}

StepProfiler::~StepProfiler() {
  if (g_trace_sink.load() == this) set_trace_sink(nullptr);
}

bool StepProfiler::in_range(int64_t iteration) const {
  // Megatron starts at the top of the loop when the counter of completed steps equals
  // --profile-step-start and stops after the step that brings it to --profile-step-end.
  return iteration > opts_.profile_step_start && iteration <= opts_.profile_step_end;
}

void StepProfiler::begin_step(int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  iteration_ = iteration;
  tracing_ = trace_rank_ && !written_ && in_range(iteration);
  step_begin_ = Clock::now();
}

void StepProfiler::end_step(int64_t iteration) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (tracing_) {
      const auto us = [&](Clock::time_point t) {
        return origin_unix_us_ + std::chrono::duration<double, std::micro>(t - origin_).count();
      };
      const double begin = us(step_begin_);
      events_.push_back({"train-step", nullptr, 0, iteration, begin, us(Clock::now()) - begin});
    }
    tracing_ = false;
    iteration_ = 0;
    ++timer_iterations_;
  }
  if (trace_rank_ && !written_ && iteration == opts_.profile_step_end) write_trace();
}

void StepProfiler::span(const char* name, const char* arg_name, int arg, Clock::time_point begin,
                        Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (iteration_ == 0) return;  // not a training step's work
  if (timers_) {
    const std::vector<const char*>& names = timer_names();
    for (size_t i = 0; i < names.size(); ++i)
      if (std::string_view(names[i]) == name)
        timer_seconds_[i] += std::chrono::duration<double>(end - begin).count();
  }
  if (!tracing_) return;
  const double ts =
      origin_unix_us_ + std::chrono::duration<double, std::micro>(begin - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - begin).count();
  events_.push_back({name, arg_name, arg, iteration_, ts, dur});
}

void StepProfiler::add_timers(StepMetrics& m, Communicator& world) {
  if (!timers_) return;
  if (m.iteration % opts_.log_interval != 0 && m.iteration != m.train_iters) return;
  std::vector<double> seconds;
  int64_t iterations = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seconds.swap(timer_seconds_);
    timer_seconds_.assign(timer_names().size(), 0.0);
    iterations = std::max<int64_t>(timer_iterations_, 1);
    timer_iterations_ = 0;
  }
  world.all_reduce(seconds.data(), seconds.size(), ReduceOp::Max);
  for (size_t i = 0; i < seconds.size(); ++i)  // a phase no rank ran (no pipeline, ...): none
    if (seconds[i] > 0) m.timers.emplace_back(timer_names()[i], seconds[i] / double(iterations));
}

void StepProfiler::finish() {
  if (!trace_rank_ || written_) return;
  if (!events_.empty()) {
    write_trace();
    return;
  }
  sink_.message("profile: no trace from rank " + std::to_string(rank_) + ": iterations " +
                std::to_string(opts_.profile_step_start + 1) + "-" +
                std::to_string(opts_.profile_step_end) + " did not run");
}

void StepProfiler::write_trace() {
  written_ = true;
  const std::filesystem::path dir(opts_.profile_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (dir / ("rank-" + std::to_string(rank_) + ".json")).string();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    OMNI_REQUIRE(out, "--profile: cannot write the trace '", path, "'");
    out << "{\"traceEvents\": [\n  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << rank_
        << ", \"tid\": 0, \"args\": {\"name\": \"omnitron rank " << rank_ << "\"}}";
    char buf[96];
    for (const Event& e : events_) {
      out << ",\n  {\"name\": \"" << e.name << "\", \"ph\": \"X\", ";
      std::snprintf(buf, sizeof buf, "\"ts\": %.3f, \"dur\": %.3f, ", e.ts_us, e.dur_us);
      out << buf << "\"pid\": " << rank_
          << ", \"tid\": 0, \"args\": {\"iteration\": " << e.iteration;
      if (e.arg_name) out << ", \"" << e.arg_name << "\": " << e.arg;
      out << "}}";
    }
    out << "\n], \"displayTimeUnit\": \"ms\"}\n";
    out.flush();
    OMNI_REQUIRE(out, "--profile: writing the trace '", path, "' failed");
  }
  std::filesystem::rename(tmp, path, ec);
  OMNI_REQUIRE(!ec, "--profile: cannot write the trace '", path, "': ", ec.message());
  sink_.message("profile: wrote " + path + " (" + std::to_string(events_.size()) +
                " events; open it in chrome://tracing or ui.perfetto.dev)");
  events_.clear();
}

}  // namespace omni
