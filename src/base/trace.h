// Named spans of the training thread's work (data loading, each micro-batch's forward and
// backward, gradient reduction, the optimizer), reported to one TraceSink when one is set:
// --profile's Chrome trace and --log-timers-to-tensorboard's timers (train/profiler.h) are
// built from them. With no sink a span costs one atomic load and the StepPlace stores below.
//
//   { TraceSpan span("forward-compute", "microbatch", m); ... }   // ends with the scope
//   TraceSpan sync("all-grads-sync"); ...; sync.end();            // or explicitly
//
// Names are Megatron's timer names (megatron/training/training.py's timers_to_log), so the
// same words appear in a trace, in TensorBoard and in Megatron's own logs.
#pragma once

#include <atomic>
#include <chrono>

namespace omni {

class TraceSink {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~TraceSink() = default;
  // One finished span. `name` and `arg_name` are literals; arg_name is null when the span
  // has no argument (work of the whole step).
  virtual void span(const char* name, const char* arg_name, int arg, Clock::time_point begin,
                    Clock::time_point end) = 0;
};

inline std::atomic<TraceSink*> g_trace_sink{nullptr};

// Where this thread is in the step: its innermost open span, which the collective watchdog
// (comm/watchdog.h) names in a hang report. Relaxed atomics, as the watchdog's thread reads
// them while this one runs; a span costs three more stores.
struct StepPlace {
  std::atomic<const char*> name{nullptr};
  std::atomic<const char*> arg_name{nullptr};
  std::atomic<int> arg{0};
  std::atomic<int> layer{-1};  // the transformer layer in progress (-1: none)
};
inline thread_local StepPlace t_step_place;

// Marks the layer in progress, for the same reports: one store per layer.
class StepLayer {
 public:
  explicit StepLayer(int layer) { set(layer); }
  ~StepLayer() { set(-1); }
  void set(int layer) { t_step_place.layer.store(layer, std::memory_order_relaxed); }
  StepLayer(const StepLayer&) = delete;
  StepLayer& operator=(const StepLayer&) = delete;
};

// The sink every span goes to (null: none). The caller keeps it alive until it is unset.
inline void set_trace_sink(TraceSink* sink) {
  g_trace_sink.store(sink);
}

class TraceSpan {
 public:
  explicit TraceSpan(const char* name, const char* arg_name = nullptr, int arg = 0)
      : sink_(g_trace_sink.load(std::memory_order_relaxed)),
        name_(name),
        arg_name_(arg_name),
        arg_(arg) {
    if (sink_) begin_ = TraceSink::Clock::now();
    StepPlace& p = t_step_place;
    prev_name_ = p.name.load(std::memory_order_relaxed);
    prev_arg_name_ = p.arg_name.load(std::memory_order_relaxed);
    prev_arg_ = p.arg.load(std::memory_order_relaxed);
    p.name.store(name, std::memory_order_relaxed);
    p.arg_name.store(arg_name, std::memory_order_relaxed);
    p.arg.store(arg, std::memory_order_relaxed);
  }
  ~TraceSpan() { end(); }
  void end() {
    if (sink_) sink_->span(name_, arg_name_, arg_, begin_, TraceSink::Clock::now());
    sink_ = nullptr;
    if (!placed_) return;
    placed_ = false;
    StepPlace& p = t_step_place;
    p.name.store(prev_name_, std::memory_order_relaxed);
    p.arg_name.store(prev_arg_name_, std::memory_order_relaxed);
    p.arg.store(prev_arg_, std::memory_order_relaxed);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  TraceSink* sink_;
  const char* name_;
  const char* arg_name_;
  int arg_;
  TraceSink::Clock::time_point begin_;
  bool placed_ = true;
  const char* prev_name_;
  const char* prev_arg_name_;
  int prev_arg_;
};

}  // namespace omni
