// Sharded, parallel checkpoints (DESIGN.md: src/checkpoint). Every rank writes only what it
// owns, all ranks at once, into one iteration directory; rank 0 adds metadata.txt listing
// every stored piece as a box of the one-rank model's tensor (checkpoint_format.h), so a
// checkpoint saved at one layout loads at any other. A load reads only the byte ranges this
// rank's part of each tensor needs (pread), so no rank holds the whole model: memory is the
// rank's shard (and, for a save that does not wait, its copy) plus a buffer the size of one
// tensor.
//
//   RankState state;                     // what this rank holds, where, and what it writes
//   CheckpointWriter writer(world);
//   writer.save(root, opts, progress, optimizer, state, /*async=*/true);  // collective
//   ... train; each step: writer.finish(/*wait=*/false) publishes it once durable everywhere
//   CheckpointReader(root).read(state);  // at any layout
//
// A save goes to ROOT/iter_N.tmp: each rank's files are written and fsync'd (by a writer
// thread under --async-save, from a copy of the rank's shard), then every rank agrees that
// all are durable, rank 0 writes metadata.txt, renames the directory into place and only
// then replaces latest_checkpointed_iteration.txt. A crash before that leaves the previous
// checkpoint the latest.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/ops.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/options.h"
#include "tensor/parameters.h"

namespace omni {

// Elements [begin, end) of a buffer laid out like the parameters' flat buffer, at `data`
// (memory of RankState::exec's device).
struct FlatSpan {
  int64_t begin = 0, end = 0;
  float* data = nullptr;
};

// One buffer of a rank's state: the parameters (prefix "") or an optimizer state
// ("optimizer.exp_avg.": its tensors are stored as that prefix + the parameter's name).
struct StateBuffer {
  std::string prefix;
  std::vector<FlatSpan> spans;  // what this rank holds of it: the whole buffer, or a shard
  bool written = true;          // this rank writes its part (one replica writes each slice)
};

// What one rank holds of the model's state.
struct RankState {
  std::vector<ParamInfo> infos;  // this rank's parameter layout
  // The one-rank model's vocabulary rows (TransformerConfig::padded_vocab_size()): tensor
  // parallelism pads the vocabulary further, and rows past these are padding (not stored;
  // read as zeros). 0: the layout's own rows are the one-rank model's.
  int64_t padded_vocab = 0;
  std::vector<StateBuffer> buffers;
  // Which tensors this rank writes (null: all): tensors every tensor-parallel rank holds
  // whole are written by one of them, a second pipeline stage's copy of tied embeddings not.
  std::function<bool(const ParamInfo&)> writes;
  ops::Exec exec;  // where the spans' memory is
};

// The byte counts of this thread's checkpoint I/O, for tests and figures: data bytes read and
// written (not metadata), and the largest host buffer the reader or writer allocated.
struct CheckpointIoStats {
  int64_t bytes_read = 0, bytes_written = 0, largest_buffer_bytes = 0;
};
CheckpointIoStats& checkpoint_io_stats();

class CheckpointWriter {
 public:
  explicit CheckpointWriter(Communicator& world);
  // Waits for a pending save's files (without publishing it: it never becomes the latest).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective. Writes this rank's part of `state` for `progress.iteration` under `root` and
  // returns the directory it will have. With `async`, the files are written by a thread from
  // a copy of the rank's part, and the save is published by a later finish(); without, it
  // is published before returning. A pending save is finished (waited for) first.
  std::string save(const std::string& root, const Options& opts, const TrainingProgress& progress,
                   const CheckpointOptimizer& optimizer, const RankState& state, bool async);
  // Collective. Publishes the pending save when every rank's files are durable (with `wait`,
  // after waiting for them); returns its directory, or "" when nothing was published. A
  // rank's failed write is a UsageError on every rank.
  std::string finish(bool wait);
  bool pending() const { return bool(pending_); }

 private:
  struct Pending;
  Communicator& world_;
  std::unique_ptr<Pending> pending_;
};

// The latest checkpoint under `root` (either version), opened for reading parts of it.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& root);
  ~CheckpointReader();
  const TrainingProgress& progress() const;
  const CheckpointOptimizer& optimizer() const;  // name "none": a model-only checkpoint
  // UsageError (naming --no-load-optim) unless the checkpoint holds optimizer `name`'s state.
  void check_optimizer(const std::string& name) const;
  // The stored scalar `name` of the optimizer (UsageError when absent).
  double optimizer_scalar(const std::string& name) const;
  // Reads this rank's part of every buffer of `state` (all of its spans; `written` is
  // ignored), element by element the one-rank model's. A tensor missing or of another shape,
  // a truncated file and a shard whose CRC-32 differs are UsageErrors naming the file and
  // the tensor. A shard's CRC-32 is checked where this rank reads all of it (a load at the
  // layout that saved, or at one rank); reading part of a shard checks its file's size.
  void read(const RankState& state) const;
  // Every tensor whose name starts with `prefix` (""; the model's, not "optimizer."'s),
  // whole, in name order (for tests and tools: this holds the whole model).
  std::vector<std::pair<std::string, std::vector<float>>> read_whole(
      const std::string& prefix = "") const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The one-rank model's shape of this rank's tensor `p` (see RankState::padded_vocab).
Shape one_rank_shape(const ParamInfo& p, int64_t padded_vocab);

}  // namespace omni
