// Megatron's --profile and --log-timers-to-tensorboard, from the spans of base/trace.h.
//
// --profile writes a Chrome trace (chrome://tracing, ui.perfetto.dev) of the steps in
// Megatron's range: profiling starts when the iteration counter reaches
// --profile-step-start and stops when it reaches --profile-step-end, so the defaults 10 and
// 12 trace iterations 11 and 12. Each rank of --profile-ranks (default: every rank) writes
// PROFILE_DIR/rank-R.json (Options::profile_dir: TENSORBOARD_DIR/../torch_profile, where
// Megatron's PyTorch profiler writes, else ./torch_profile):
//   {"traceEvents": [{"name": "forward-compute", "ph": "X", "ts": Unix µs, "dur": µs, "pid": R,
//                     "tid": 0, "args": {"iteration": 11, "microbatch": 0}}, ...]}
// with one "train-step" event per step and Megatron's timer names for its phases:
// batch-generator, forward-compute, backward-compute (each micro-batch), forward-recv,
// backward-recv (pipeline), forward-backward, all-grads-sync, grad-bucket-start (each
// data-parallel bucket's collective starting), optimizer, params-all-gather.
//
// --log-timers-to-tensorboard: each phase's seconds per iteration over the log interval, the
// maximum over the ranks (as Megatron's timers.write), as "<name>-time" scalars.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "config/options.h"
#include "train/metrics.h"

namespace omni {

class StepProfiler : public TraceSink {
 public:
  // Becomes the trace sink when `opts` ask for a trace on this rank or for timers; the
  // first rank says where traces go.
  StepProfiler(const Options& opts, int world_rank, MetricsSink& sink);
  ~StepProfiler() override;
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each training step (`iteration` counts from 1); spans outside steps (evaluation,
  // checkpoints) are not recorded. end_step writes the trace after the range's last step.
  void begin_step(int64_t iteration);
  void end_step(int64_t iteration);
  // On a logged line's report (--log-timers-to-tensorboard): the timers since the last
  // logged line, per iteration, maximum over `world` (collective: every rank calls it for
  // every report).
  void add_timers(StepMetrics& m, Communicator& world);
  // After the last step: a range cut short (by --train-iters or an early exit) is written
  // with the steps it has.
  void finish();

  // Megatron's timer names, in the order timers are reported.
  static const std::vector<const char*>& timer_names();

  void span(const char* name, const char* arg_name, int arg, Clock::time_point begin,
            Clock::time_point end) override;

 private:
  struct Event {
    const char* name;
    const char* arg_name;
    int arg;
    int64_t iteration;
    double ts_us, dur_us;
  };
  bool in_range(int64_t iteration) const;
  void write_trace();

  const Options& opts_;
  MetricsSink& sink_;
  int rank_;
  bool trace_rank_ = false, timers_ = false;
  std::mutex mutex_;
  int64_t iteration_ = 0;  // the step running; 0 between steps
  bool tracing_ = false, written_ = false;
  Clock::time_point origin_, step_begin_;
  // Timestamps are microseconds of Unix time, so the ranks' files line up when a viewer
  // opens them together.
  double origin_unix_us_ = 0;
  std::vector<Event> events_;
  std::vector<double> timer_seconds_;
  int64_t timer_iterations_ = 0;
};

}  // namespace omni
