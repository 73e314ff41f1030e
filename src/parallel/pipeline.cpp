#include "parallel/pipeline.h"

#include <cstring>
#include <deque>
#include <map>

#include "base/error.h"
#include "base/trace.h"
#include "parallel/schedules.h"

namespace omni {

namespace {
// Message tags: activations go forward, gradients backward; between two ranks each kind
// arrives in the order it was sent, which is the order the schedule consumes it.
constexpr int kActivationTag = 1, kGradientTag = 2;
}  // namespace

template <typename T>
PipelineExecutor<T>::PipelineExecutor(PipelineChunks<T>& model, Communicator& pp)
    : model_(model), pp_(pp) {}

template <typename T>
double PipelineExecutor<T>::run(int num_microbatches,
                                const std::function<const MicroBatch&(int)>& batch, bool train,
                                double grad_scale) {
  const int pp = pp_.size(), rank = pp_.rank(), vp = model_.num_chunks();
  const int C = model_.hidden_size();
  const int last_stage = pp * vp - 1;
  // Neighbours of chunk c: virtual stage s = c * pp + rank.
  auto stage = [&](int chunk) { return chunk * pp + rank; };
  const int next = (rank + 1) % pp, prev = (rank + pp - 1) % pp;

  std::map<std::pair<int, int>, int> slot_of;  // (chunk, micro-batch) -> activation slot
  std::vector<std::vector<int>> free_slots(vp);
  std::vector<int> slots_used(vp, 0);
  auto take_slot = [&](int chunk, int m) {
    int s;
    if (free_slots[chunk].empty()) {
      s = slots_used[chunk]++;
    } else {
      s = free_slots[chunk].back();
      free_slots[chunk].pop_back();
    }
    slot_of[{chunk, m}] = s;
    return s;
  };

  // Buffers in the model's device memory; sends in flight with theirs, oldest first.
  // Completed ones return their buffers to `spare` as the schedule goes on, so a step holds
  // no more of them than the pipeline has in flight.
  const ops::Exec& x = model_.exec();
  const Device device = model_.device();
  std::vector<Tensor> spare;
  auto buffer = [&](size_t n) {
    for (size_t i = 0; i < spare.size(); ++i)
      if (size_t(spare[i].numel()) >= n) {
        Tensor t = std::move(spare[i]);
        spare.erase(spare.begin() + long(i));
        return t;
      }
    return Tensor::zeros({int64_t(n)}, dtype_of<T>(), device, x.memory());
  };
  struct Send {
    Tensor buffer;
    std::unique_ptr<CommRequest> request;
  };
  std::deque<Send> sends;
  auto send = [&](const T* data, size_t n, int peer, int tag) {
    while (!sends.empty() && sends.front().request->test()) {
      spare.push_back(std::move(sends.front().buffer));
      sends.pop_front();
    }
    sends.push_back({buffer(n), nullptr});
    T* copy = sends.back().buffer.template data<T>();
    ops::copy(x, copy, data, n);
    sends.back().request = pp_.isend(copy, n * sizeof(T), peer, tag);
  };
  Tensor received;
  auto receive = [&](size_t n, int peer, int tag) -> const T* {
    if (!received.defined() || size_t(received.numel()) < n) received = buffer(n);
    pp_.recv(received.template data<T>(), n * sizeof(T), peer, tag);
    return received.template data<T>();
  };

  double loss_sum = 0;
  for (const PipelineOp& op : pipeline_schedule(pp, rank, num_microbatches, vp, !train)) {
    const MicroBatch& mb = batch(op.microbatch);
    const size_t n = size_t(model_.stage_rows(mb)) * C;
    const int s = stage(op.chunk);
    if (op.pass == PipelinePass::Forward) {
      const T* input = nullptr;
      if (s > 0) {
        TraceSpan span("forward-recv", "microbatch", op.microbatch);
        input = receive(n, prev, kActivationTag);
      }
      double loss = 0;
      TraceSpan span("forward-compute", "microbatch", op.microbatch);
      const T* out = model_.chunk_forward(op.chunk, take_slot(op.chunk, op.microbatch), mb, input,
                                          train, grad_scale, &loss);
      span.end();
      if (s == last_stage) {
        loss_sum += loss;
      } else {
        send(out, n, next, kActivationTag);
      }
      if (!train) free_slots[op.chunk].push_back(slot_of[{op.chunk, op.microbatch}]);
    } else {
      const T* grad = nullptr;
      if (s < last_stage) {
        TraceSpan span("backward-recv", "microbatch", op.microbatch);
        grad = receive(n, next, kGradientTag);
      }
      TraceSpan span("backward-compute", "microbatch", op.microbatch);
      const int slot = slot_of.at({op.chunk, op.microbatch});
      const bool last = op.microbatch == num_microbatches - 1;
      model_.set_grads_ready_hook(last || every_microbatch_ ? grads_ready_ : nullptr);
      const T* d_input = model_.chunk_backward(op.chunk, slot, mb, grad);
      span.end();
      model_.set_grads_ready_hook(nullptr);
      free_slots[op.chunk].push_back(slot);
      if (s > 0) send(d_input, n, prev, kGradientTag);
    }
  }
  for (Send& send : sends) send.request->wait();
  return loss_sum;
}

template class PipelineExecutor<float>;
template class PipelineExecutor<double>;
template class PipelineExecutor<bf16>;
template class PipelineExecutor<f16>;

}  // namespace omni
