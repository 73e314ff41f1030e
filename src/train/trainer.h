// The training loop: micro-batches with gradient accumulation, global-norm clipping,
// the LR schedule, the optimizer step, periodic evaluation and metrics.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "comm/process_grid.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "model/gpt_model.h"
#include "optim/distributed_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/zero_sharding.h"
#include "train/document_masks.h"
#include "train/expert_grads.h"
#include "train/metrics.h"

namespace omni {

class CheckpointWriter;
class DownstreamEvaluation;
struct RankState;
struct ScoredSequence;

struct TrainResult {
  std::vector<double> train_losses;                    // one per iteration run
  std::vector<double> step_seconds;                    // one per iteration
  std::vector<std::pair<int64_t, double>> val_losses;  // (iteration, loss)
  double tokens_per_sec = 0;                           // over the whole run
  double seconds = 0;
  // train_losses[0] is iteration first_iteration (the step after a loaded checkpoint);
  // last_iteration is the last step run (or loaded, when none ran).
  int64_t first_iteration = 1, last_iteration = 0;
  // Why the run stopped before --train-iters: "exit interval", "exit duration" or
  // "signal"; empty when it ran to the end.
  std::string exit_reason;
  std::vector<std::string> saved;  // checkpoint directories written, in order
  int64_t skipped_iterations = 0;  // fp16 steps whose gradients overflowed (no update)
};

class Trainer {
 public:
  // `opts` must be finalized. peak_gflops is the machine's rate MFU is measured against
  // (0: not reported). eod is the tokenizer's end-of-document id, needed by
  // --eod-mask-loss, --reset-position-ids and --reset-attention-mask.
  // With --load, the model (and unless --finetune the optimizer, iteration and data
  // position) come from the checkpoint; with --exit-signal-handler, --exit-signal and SIGINT
  // are caught from construction to destruction.
  // `world` holds the ranks of the parallel layout the options ask for (tensor, pipeline,
  // context and data parallel); null: this process alone. opts.data_parallel_size must
  // already be the layout's (set before finalize). Construction is collective.
  Trainer(const Options& opts, std::unique_ptr<TrainingData> data, double peak_gflops = 0,
          std::optional<int32_t> eod = std::nullopt, Communicator* world = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // Trains from the current iteration to --train-iters, saving every --save-interval
  // and at the end; stops early (after saving) on --exit-interval,
  // --exit-duration-in-mins or a caught signal.
  TrainResult run(MetricsSink& sink);
  // Writes a checkpoint of the current state to --save; returns its directory.
  std::string save(MetricsSink& sink);
  // Mean validation loss over --eval-iters micro-batches (of every data-parallel rank).
  double evaluate();
  // Each sequence's log-likelihood of its continuation, computed by the forward validation
  // runs, whatever the layout; every rank gets them all. Collective. (downstream_eval.cpp)
  std::vector<double> log_likelihoods(const std::vector<ScoredSequence>& sequences);
  // --eval-task: scored at iteration 0 of a fresh run, when due() and at the end.
  void set_downstream_evaluation(std::unique_ptr<DownstreamEvaluation> evaluation);
  // This rank's part of the model in float32: the model itself (on the CPU, or a GPU's in
  // device memory), or when a GPU trains in bf16/f16, a one-rank CPU copy of the fp32 master
  // weights made at this call.
  GPTModel<float>& model();
  const ProcessGrid& grid() const { return *grid_; }
  // "attention: flash (...) -- --attention-backend auto: ...", for the start-up lines.
  const std::string& attention_line() const { return attention_line_; }
  // On the CPU, the GEMMs' kernel (backend/cpu/gemm.h): "fp32 GEMMs: oneDNN ... dnnl_sgemm", or
  // "bf16 GEMMs: ..." under --bf16; empty on a GPU.
  const std::string& gemm_line() const { return gemm_line_; }
  int64_t iteration() const { return iteration_; }
  // Bytes of memory this rank's parameters, gradients and optimizer states occupy: the
  // resident pages of their buffers, measured (mincore); under ZeRO 2/3 the largest seen
  // during the steps since the last reset_peak (bench/bench_zero_memory.cpp).
  struct HeldMemory {
    int64_t params = 0, grads = 0, optimizer = 0;
  };
  HeldMemory held_memory(bool reset_peak = false);
  void track_memory_peak() {  // before run(): ZeRO 2/3 sample their buffers at every change
    if (zero_) zero_->set_track_peak(true);
  }
  int64_t consumed_samples() const { return consumed_samples_; }

 private:
  // One micro-batch's data on this rank (and its context-parallel share).
  struct Batch {
    std::vector<int32_t> tokens, labels, positions, key_start;
    std::vector<float> loss_mask;
    MicroBatch full;
    ContextParallelBatch local;
  };
  struct Step {
    double loss = 0, grad_norm = 0, lr = 0;
    bool skipped = false;  // fp16: the gradients overflowed, no update
    MoEStepMetrics moe;
  };
  Step train_step(int64_t iteration);
  // Micro-batches per data-parallel rank in the step that starts now.
  int step_micro_batches() const {
    return batch_schedule_.batch_at(consumed_samples_) /
           (opts_.micro_batch_size * opts_.data_parallel_size);
  }
  // The model in its storage type (float; bf16 or f16 on a GPU), with its pipeline schedule.
  template <typename T>
  struct Staged {
    Staged(const TransformerConfig& config, int micro_batch, uint64_t seed,
           const ModelParallel& parallel, const ops::Exec& exec, Communicator& pp)
        : model(config, micro_batch, seed, parallel, exec), pipeline(model, pp) {}
    GPTModel<T> model;
    PipelineExecutor<T> pipeline;
  };
  // f(staged) for the model's storage type; f returns the same type for each.
  template <typename F>
  decltype(auto) with_model(F&& f) {
    return std::visit([&](auto& staged) -> decltype(auto) { return f(*staged); }, model_);
  }
  // The schedule's run (PipelineExecutor::run) over the model.
  double run_pipeline(int num_microbatches, const std::function<const MicroBatch&(int)>& batch,
                      bool train, double grad_scale);
  // The model's parameter layout and float gradients (whatever its storage type).
  const std::vector<ParamInfo>& model_infos();
  const Tensor& model_grads();
  // The parameters the optimizer updates: the fp32 master under mixed precision, else the
  // (float) model's own.
  ParameterSet<float>& optimizer_params();
  // Reads micro-batch `m` of this step (training: from consumed sample `first`) into
  // batches_[m], with document masks when the options ask for them, and slices it for
  // context parallelism.
  void read_batch(int m, int64_t first, bool train);
  // --calculate-per-token-loss: the unmasked tokens of the step's micro-batches on every
  // data-parallel rank, set as each micro-batch's loss divisor (collective over data
  // parallel); 0 without the flag.
  double per_token_loss_divisor(int microbatches);
  // Micro-batch m as this rank trains on it (its context-parallel share, if any).
  const MicroBatch& batch(int m) const;
  // The parameters' squared gradient norm over `ranges` of the flat buffer, each
  // parameter counted once across the model-parallel ranks.
  double gradient_norm_squared(const std::vector<ShardRange>& ranges);
  // The sum of op over `ranges` of a buffer laid out like the parameters, with the same rule.
  double sum_over_params(const float* data, const std::vector<ShardRange>& ranges,
                         const std::function<double(const float*, size_t)>& op);
  // ops::sum_squares on the model's device.
  std::function<double(const float*, size_t)> sum_squares_op() const;
  // What this rank holds and writes of the model and (with_optimizer) its optimizer's
  // states, for sharded checkpoints (checkpoint/sharded_checkpoint.h).
  // reading: what a --load fills, all this rank holds (writing: its share of the one copy).
  RankState rank_state(bool with_optimizer, bool reading = false);
  // --async-save: publishes the pending save once every rank's files are durable (`wait`:
  // waits for them). Collective.
  void finish_save(MetricsSink& sink, bool wait);
  // --log-params-norm and --log-num-zeros-in-grad (collective over the model-parallel ranks).
  void add_step_statistics(StepMetrics& m, bool skipped);
  // Sum of the last stage's per-micro-batch losses, averaged over data-parallel ranks and
  // handed to every pipeline stage.
  double reduce_loss(double loss_sum, int microbatches) const;
  void load(const std::string& dir);

  Options opts_;
  std::unique_ptr<TrainingData> data_;
  double peak_gflops_;
  std::unique_ptr<Communicator> own_world_;
  std::unique_ptr<ProcessGrid> grid_;
  ops::Exec exec_;  // where the model trains: the CPU, or a GPU
  std::string attention_line_, gemm_line_;
  std::variant<std::unique_ptr<Staged<float>>, std::unique_ptr<Staged<bf16>>,
               std::unique_ptr<Staged<f16>>>
      model_;
  std::unique_ptr<GPTModel<float>> host_model_;  // model()'s copy of a 16-bit GPU model
  std::unique_ptr<DataParallelBuckets<float>> ddp_;
  bool sparse_embedding_ = false;  // the tied embedding's last rows gathered sparsely
  // Expert parallelism: the experts' gradients, reduced over their own group.
  std::unique_ptr<ExpertGradients> expert_grads_;
  std::unique_ptr<MixedPrecision> mixed_;                        // --bf16, --fp16
  std::unique_ptr<GradScaler> scaler_;                           // --fp16 (dynamic) or --loss-scale
  std::unique_ptr<Optimizer<float>> optimizer_;                  // or:
  std::unique_ptr<DistributedOptimizer<float>> dist_optimizer_;  // --use-distributed-optimizer
  std::unique_ptr<ZeroSharding> zero_;                           // --zero-stage 2, 3
  bool grads_zeroed_ = false;  // the last update left the gradients zero (Optimizer::step)
  // Under ZeRO 2/3 with --moe-router-enable-expert-bias: the expert biases' flat ranges, which
  // every rank's bias update writes whole (train_step backs them first).
  std::vector<std::pair<int64_t, int64_t>> zero_expert_bias_;
  // The word embeddings' flat range when the first and last pipeline stages each hold a
  // copy (tied, pipeline > 1): summed across the two before data-parallel reduction.
  std::pair<int64_t, int64_t> shared_embedding_{0, 0};
  int64_t iteration_ = 0;         // completed steps
  int64_t lr_steps_ = 0;          // completed updates (fp16 skips some)
  int64_t lr_samples_ = 0;        // their samples: the schedule's position (Megatron's num_steps)
  BatchSchedule batch_schedule_;  // the global batch of each step (--rampup-batch-size)
  int64_t consumed_samples_ = 0;
  int64_t consumed_valid_samples_ = 0;  // Megatron's consumed_valid_samples
  int64_t last_saved_ = -1;
  std::unique_ptr<CheckpointWriter> checkpoint_writer_;
  bool signal_handler_installed_ = false;
  DocumentMaskOptions doc_masks_;
  std::vector<Batch> batches_;
  std::unique_ptr<DownstreamEvaluation> downstream_;
};

}  // namespace omni
