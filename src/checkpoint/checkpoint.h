// Training checkpoints, laid out as Megatron lays them out: ROOT/iter_0000100/ holds one
// save, ROOT/latest_checkpointed_iteration.txt names the newest complete one.
//
// An iteration directory holds:
//   metadata.txt   "omnitron-checkpoint 2", then `key value` lines: iteration,
//                  consumed_samples, consumed_valid_samples, lr_schedule_iteration and
//                  lr_schedule_samples (the schedule's position in updates and in samples),
//                  optimizer (name and step count), rng (none: see below), loss_scaler
//                  (fp16's scale and trackers, when there is one), the resolved
//                  options one argument per line after `args N`, one line per stored piece
//                  of a tensor, by the one-rank model's names and shapes:
//                    shard NAME FILE BYTE_OFFSET float32 global D,D offset O,O shape S,S
//                          elements FIRST END crc32 HEX
//                  (a box of the global tensor, row-major elements FIRST..END of it stored
//                  contiguously at BYTE_OFFSET; checkpoint_format.h), one line per data file:
//                    file NAME bytes N
//                  and closed by `end`.
//   model.bin, optimizer.bin     a one-rank save's parameters and optimizer state (by
//                  PyTorch's names, "optimizer.exp_avg.<param>"); a save at several ranks
//                  writes model_rankNNNNN.bin and optimizer_rankNNNNN.bin, each rank what it
//                  owns (sharded_checkpoint.h), so any layout loads any checkpoint reading
//                  only the bytes it needs. No optimizer file in a model-only checkpoint
//                  (`optimizer none 0`, as `omnitron convert` writes one), whose loader starts
//                  the optimizer afresh.
// A save is written to ROOT/iter_NNNNNNN.tmp, each file fsync'd, the directory renamed
// into place and only then latest_checkpointed_iteration.txt replaced (temporary + rename):
// a crash at any moment leaves the previous checkpoint the latest and intact
// (DESIGN.md invariant 6). Checkpoints of version 1 (whole tensors, `tensor` lines, a CRC-32
// per file) still load.
//
// Every loading function also accepts a Hugging Face model directory (config.json +
// safetensors, see hf_interchange.h) as `root`: it reads as a model-only checkpoint at
// iteration 0 whose options come from config.json.
//
// There is no RNG state to store: initialisation, data order and dropout's masks are pure
// functions of --seed, the iteration and the consumed-sample count; --no-load-rng is accepted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/options.h"
#include "tensor/parameters.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace omni {

struct TrainingProgress {
  int64_t iteration = 0;         // completed optimizer steps
  int64_t consumed_samples = 0;  // training samples read (the data position)
  // Validation samples read (Megatron's consumed_valid_samples): each evaluation continues
  // through the validation set where the last one stopped.
  int64_t consumed_valid_samples = 0;
  // The learning-rate schedule's position: the iteration, less the steps fp16 skipped
  // (Megatron advances the schedule only on a successful update). -1: the iteration.
  int64_t lr_schedule_iteration = -1;
  // The same position in samples (Megatron's scheduler num_steps); -1: not recorded (older
  // checkpoints, whose batch was constant).
  int64_t lr_schedule_samples = -1;
  std::optional<GradScalerState> loss_scaler;  // --fp16's scaler, when there is one
};

// What a checkpoint records of the optimizer beside its state buffers.
struct CheckpointOptimizer {
  std::string name = "none";  // "adamw", "sgd", a zoo name; "none": a model-only checkpoint
  int64_t steps = 0;
  std::vector<std::pair<std::string, double>> scalars;  // Optimizer::scalar_names()'
  // Whether the zoo's states take each expert of an MoE layer's stacked tensors as a tensor
  // of its own ("optimizer_experts separate", written since the zoo does): earlier checkpoints
  // of MoE models hold adam8bit's, Muon's and GaLore's expert states in another layout.
  bool experts_separate = false;
  // Whether galoreadamw8bit's 8-bit blocks restart at each expert too ("optimizer_experts
  // separate blocks", written since they do): the checkpoints between hold them run across
  // the experts of a stacked tensor.
  bool expert_blocks = false;
};

// The name a checkpoint stores for optimizer kind `k`.
std::string checkpoint_optimizer_name(OptimizerKind k);

// ROOT/iter_0000100 for iteration 100 (Megatron's 7-digit name).
std::string checkpoint_iteration_dir(const std::string& root, int64_t iteration);
std::string latest_iteration_file(const std::string& root);

// Writes the checkpoint for `progress.iteration` under `root` and returns its directory.
std::string save_checkpoint(const std::string& root, const Options& opts,
                            const TrainingProgress& progress, const ParameterSet<float>& params,
                            const Optimizer<float>& optimizer);

// Writes a model-only checkpoint (iteration 0, no optimizer state) under `root`.
std::string save_model_checkpoint(const std::string& root, const Options& opts,
                                  const ParameterSet<float>& params);

// The iteration named by ROOT/latest_checkpointed_iteration.txt (0 for a Hugging Face
// model directory).
int64_t latest_checkpoint_iteration(const std::string& root);

// Whether `root` holds a checkpoint to load (latest_checkpointed_iteration.txt, or a Hugging
// Face model directory). False for a directory that does not exist yet or holds none (a first
// run whose --load is its --save: Megatron then starts from random). A file, or iteration
// directories without the file naming the latest, are a UsageError.
bool holds_checkpoint(const std::string& root);

// Sets the model's architecture options in `opts` from the latest checkpoint under `root`
// (the options stored with it; for a Hugging Face directory, those config.json maps to,
// replacing the architecture in `opts` but for --make-vocab-size-divisible-by), so the
// model can be built before loading.
void load_checkpoint_model_options(const std::string& root, Options& opts);
// The same options as a command line ("--num-layers=4 ..."), to parse under other flags.
std::vector<std::string> checkpoint_model_args(const std::string& root);

// Loads the latest checkpoint under `root` into `params`, and into `optimizer` (state and
// step count) unless it is null or the checkpoint is model-only; returns where training
// stood. Every failure (missing or
// truncated files, a tensor whose shape differs from the model's) is a UsageError naming
// the file, the tensor and the shapes.
TrainingProgress load_checkpoint(const std::string& root, ParameterSet<float>& params,
                                 Optimizer<float>* optimizer);

}  // namespace omni
