#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>

#include "backend/attention_backend.h"
#include "backend/cpu/gemm.h"
#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_interchange.h"
#include "checkpoint/sharded_checkpoint.h"
#include "model/moe_layer.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer_zoo.h"
#include "parallel/schedules.h"
#include "train/downstream_eval.h"
#include "train/flops.h"
#include "train/moe_step.h"
#include "train/profiler.h"

namespace omni {

namespace {

// Megatron's --exit-signal-handler: the handler only records the signal; the training
// loop checks after each step, saves and returns (library code never exits the process).
volatile std::sig_atomic_t g_exit_signal = 0;
struct sigaction g_previous_handled, g_previous_int;

extern "C" void record_exit_signal(int signal) {
  g_exit_signal = signal;
}

int g_handled_signal = SIGTERM;  // --exit-signal

void install_exit_signal_handler(int signal) {
  g_exit_signal = 0;
  g_handled_signal = signal;
  struct sigaction sa = {};
  sa.sa_handler = record_exit_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(signal, &sa, &g_previous_handled);
  if (signal != SIGINT) sigaction(SIGINT, &sa, &g_previous_int);
}

void restore_signal_handlers() {
  sigaction(g_handled_signal, &g_previous_handled, nullptr);
  if (g_handled_signal != SIGINT) sigaction(SIGINT, &g_previous_int, nullptr);
}

// The tokens of `mb` that count in the loss.
double unmasked_tokens(const MicroBatch& mb) {
  const size_t n = size_t(mb.batch) * mb.seq;
  if (!mb.loss_mask) return double(n);
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += mb.loss_mask[i];
  return s;
}

}  // namespace

Trainer::Trainer(const Options& opts, std::unique_ptr<TrainingData> data, double peak_gflops,
                 std::optional<int32_t> eod, Communicator* world)
    : opts_(opts), data_(std::move(data)), peak_gflops_(peak_gflops) {
  if (!world) {
    own_world_ = make_self_communicator();
    world = own_world_.get();
  }
  const ParallelLayout layout{.tp = opts.tensor_model_parallel_size,
                              .cp = opts.context_parallel_size,
                              .ep = opts.expert_model_parallel_size,
                              .pp = opts.pipeline_model_parallel_size,
                              .etp = opts.expert_tensor_parallel_size,
                              .tp_pp_dp_mapping = opts.use_tp_pp_dp_mapping};
  grid_ = std::make_unique<ProcessGrid>(*world, layout);
  OMNI_CHECK(grid_->dp_size() == opts.data_parallel_size, "[trainer] options finalized for ",
             opts.data_parallel_size, " data-parallel ranks, the layout has ", grid_->dp_size());
  opts_.data_parallel_rank = grid_->dp_rank();

  PipelineSplit split;
  split.num_layers = opts.model.num_layers;
  split.pipeline_model_parallel_size = layout.pp;
  split.num_layers_per_virtual_pipeline_stage = opts.num_layers_per_virtual_pipeline_stage;
  if (opts.decoder_first_pipeline_num_layers > 0)
    split.decoder_first_pipeline_num_layers = opts.decoder_first_pipeline_num_layers;
  if (opts.decoder_last_pipeline_num_layers > 0)
    split.decoder_last_pipeline_num_layers = opts.decoder_last_pipeline_num_layers;
  ModelParallel mp;
  mp.tp = &grid_->tp(), mp.cp = &grid_->cp(), mp.sequence_parallel = opts.sequence_parallel;
  mp.ulysses = opts.cp_comm_type == "a2a";
  mp.ep = &grid_->ep();
  mp.expert_tp = &grid_->expert_tp(), mp.tp_cp = &grid_->tp_cp();
  mp.expert_tp_ep = grid_->expert_tp_ep();
  for (const LayerRange& r : pipeline_rank_layers(split, grid_->pp_rank()))
    mp.chunks.push_back({r.begin, r.end});
  mp.pre_process = grid_->is_first_stage(), mp.post_process = grid_->is_last_stage();
  const bool gpu_device = opts.device == "cuda" || opts.device == "hip";
  if (gpu_device) {
    // The one model with its parameters, gradients, activations and optimizer states in the
    // GPU's memory, every op through the GPU half of the seam.
    const GpuBackend* gpu = gpu_backend();
    if (!gpu)
      throw UsageError("--device " + opts.device +
                       ": this omnitron was built without a GPU backend");
    // Several ranks on real GPUs talk through NCCL/RCCL (cmd_train makes that world); the
    // emulator's device memory is host memory, which the in-process communicator moves.
    OMNI_CHECK(world->size() == 1 || gpu->memory_is_host_memory() || world->device_memory(),
               "[trainer] ", world->size(), " GPU ranks over the '", world->name(),
               "' communicator, which moves host memory only");
    exec_ = ops::Exec{gpu};
    if (opts.zero_stage >= 2) {  // ZeRO 2/3 release and recommit parts of the flat buffers
      std::string why;
      mp.params_memory = releasable_memory(gpu, &why);
      OMNI_REQUIRE(mp.params_memory, "--zero-stage ", opts.zero_stage, " on --device ", opts.device,
                   ": not built yet (", why, ")");
    }
  }
  // On a GPU, --bf16 and --fp16 store weights and activations in 16 bits (fp32 gradients
  // and master weights); the CPU computes in float with values rounded to them (below).
  const uint64_t seed = static_cast<uint64_t>(opts.seed);
  if (gpu_device && opts.bf16)
    model_ = std::make_unique<Staged<bf16>>(opts.model, opts.micro_batch_size, seed, mp, exec_,
                                            grid_->pp());
  else if (gpu_device && opts.fp16)
    model_ = std::make_unique<Staged<f16>>(opts.model, opts.micro_batch_size, seed, mp, exec_,
                                           grid_->pp());
  else
    model_ = std::make_unique<Staged<float>>(opts.model, opts.micro_batch_size, seed, mp, exec_,
                                             grid_->pp());
  Recompute recompute;
  if (opts.recompute_granularity == "selective") recompute.granularity = Recompute::Selective;
  if (opts.recompute_granularity == "full") {
    recompute.granularity = Recompute::Full;
    recompute.num_layers = opts.recompute_method == "block" ? opts.recompute_num_layers : 0;
  }
  with_model([&](auto& m) { m.model.set_recompute(recompute); });
  {  // --attention-backend: which kernel this run's attention uses, and why.
    const TransformerConfig& m = opts.model;
    ops::AttentionDims dims{opts.micro_batch_size, m.seq_length / layout.cp,
                            m.num_attention_heads / layout.tp, m.query_groups() / layout.tp,
                            m.head_dim()};
    dims.dropout.p = m.attention_dropout;
    const bool mixed = opts.bf16 || opts.fp16;
    AttentionSupport support = attention_support(
        gpu_device, dims, mixed ? (opts.bf16 ? DType::BF16 : DType::F16) : DType::F32);
    if (gpu_device && support.fused_unsupported.empty() &&
        (opts.reset_attention_mask || layout.cp > 1))
      support.fused_unsupported = "packed documents and context-parallel key blocks run our kernel";
    if (gpu_device && m.multi_latent_attention)  // backend/gpu/backend.cu's padded path
      support.fused_unsupported = "multi-latent attention runs our kernel (values zero-padded)";
    std::string why;
    const AttentionBackend backend =
        choose_attention_backend(opts.attention_backend, support, &why);
    attention_line_ = describe_attention_backend(backend, why);
    if (!gpu_device)
      gemm_line_ = opts.bf16 ? "bf16 GEMMs: " + ops::describe_cpu_bf16_gemm()
                             : "fp32 GEMMs: " + ops::describe_cpu_fp32_gemm();
    if (exec_.gpu) exec_.gpu->use_fused_attention(backend == AttentionBackend::Fused);
  }
  // The last stage's copy of the word embeddings: tied, or multi-token prediction's.
  if (layout.pp > 1 &&
      (!opts.model.untie_embeddings_and_output_weights || opts.model.mtp_num_layers > 0))
    for (const ParamInfo& e : model_infos())
      if (e.name == "embedding.word_embeddings.weight")
        shared_embedding_ = {e.offset, e.offset + e.numel};
  // Under expert parallelism the experts' gradients are reduced over their own group.
  // ZeRO 2/3 close a bucket at each layer's start, so a layer is a run of whole buckets.
  const std::vector<int64_t> zero_boundaries =
      opts.zero_stage >= 2 ? zero_bucket_boundaries(model_infos()) : std::vector<int64_t>{};
  expert_grads_ = ExpertGradients::make(*grid_, model_infos(), model_grads(), opts.ddp_bucket_size,
                                        opts.use_distributed_optimizer, exec_, zero_boundaries);
  // --overlap-grad-reduce with a tied embedding: its bucket starts as the last micro-batch's
  // backward begins, and that micro-batch's input-embedding rows follow sparsely
  // (GPTModel::set_deferred_embedding_grads) where they are fewer than the vocabulary's.
  const auto embedding = with_model([](auto& m) { return m.model.embedding_range(); });
  sparse_embedding_ = opts.overlap_grad_reduce && grid_->dp_cp().size() > 1 && layout.pp == 1 &&
                      layout.tp == 1 && layout.cp == 1 && !exec_.gpu && opts.zero_stage < 2 &&
                      !opts.model.untie_embeddings_and_output_weights &&
                      opts.model.mtp_num_layers == 0 && embedding.second > embedding.first &&
                      int64_t(opts.micro_batch_size) * opts.model.seq_length * grid_->dp_size() <
                          opts.model.vocab_size;
  ddp_ = std::make_unique<DataParallelBuckets<float>>(
      grid_->dp_cp(), ExpertGradients::dense(*grid_, model_infos()), model_grads(),
      opts.ddp_bucket_size,
      opts.use_distributed_optimizer ? GradReduce::ReduceScatter : GradReduce::AllReduce, exec_,
      opts.zero_stage >= 2 ? zero_boundaries
      : sparse_embedding_  ? std::vector<int64_t>{embedding.second}
                           : std::vector<int64_t>{});
  if (sparse_embedding_) {
    ddp_->start_first(embedding.first, embedding.second);
    with_model([](auto& m) { m.model.set_deferred_embedding_grads(true); });
  }
  // --overlap-grad-reduce: buckets start as soon as their layers' gradients are final (last
  // micro-batch only); the shared word embeddings wait for their sum across the two stages.
  // Without it (Megatron's default) ddp_->finish() starts them all after the backward pass.
  auto grads_ready = [this](int64_t begin, int64_t end) {
    if (!opts_.overlap_grad_reduce) return;
    if (begin < shared_embedding_.second && shared_embedding_.first < end) {
      if (begin < shared_embedding_.first) ddp_->mark_ready(begin, shared_embedding_.first);
      if (shared_embedding_.second < end) ddp_->mark_ready(shared_embedding_.second, end);
      return;
    }
    ddp_->mark_ready(begin, end);
  };
  if (opts.zero_stage >= 2) {  // every micro-batch's gradients reduced as they are final
    // MoE: the experts' buckets, over the expert-data-parallel group, a second set.
    std::vector<DataParallelBuckets<float>*> sets = {ddp_.get()};
    if (expert_grads_) sets.push_back(&expert_grads_->buckets());
    with_model([&](auto& m) {  // the model's flat buffers (a GPU's: 16-bit values)
      zero_ = std::make_unique<ZeroSharding>(opts.zero_stage, sets, m.model.params(), exec_);
      m.pipeline.set_grads_ready_hook([this](int64_t b, int64_t e) { zero_->grads_ready(b, e); },
                                      true);
      m.model.set_params_hook(
          [this](int64_t b, int64_t e, bool use) { zero_->use_params(b, e, use); });
    });
    if (opts.model.moe_router_enable_expert_bias)
      for (const ParamInfo& p : model_infos())
        if (p.name.find("mlp.router.expert_bias") != std::string::npos)
          zero_expert_bias_.emplace_back(p.offset, p.offset + p.numel);
  } else {
    with_model([&](auto& m) { m.pipeline.set_grads_ready_hook(grads_ready); });
  }
  if (opts.bf16 || opts.fp16) {
    const DType dtype = opts.bf16 ? DType::BF16 : DType::F16;
    if (zero_) zero_->commit_params(true);  // the master's copy reads them all (stage 3: zeros)
    with_model([&](auto& m) {
      if constexpr (std::is_same_v<std::decay_t<decltype(m.model)>, GPTModel<float>>)
        // The CPU's float values rounded to dtype. Megatron keeps bf16 gradients in fp32 and
        // fp16 ones in fp16.
        mixed_ = std::make_unique<MixedPrecision>(m.model.params(), dtype,
                                                  opts.bf16 ? DType::F32 : dtype);
      else  // a 16-bit model on the GPU (fp32 gradients)
        mixed_ = std::make_unique<MixedPrecision>(m.model.params(), exec_, mp.params_memory);
    });
    scaler_ = make_grad_scaler(opts.loss_scale, dtype);
    if (zero_) {  // the master's ranges this rank steps; the model's rounding touched them all
      mixed_->keep_only(zero_->shard());
      zero_->release_params();
    }
  }
  if (opts.use_distributed_optimizer) {
    dist_optimizer_ = std::make_unique<DistributedOptimizer<float>>(
        opts.optim, *ddp_, optimizer_params(), exec_, &grid_->tp());
    dist_optimizer_->set_gather_params(!zero_);  // zero_->params_updated() gathers
    if (expert_grads_) {
      expert_grads_->make_optimizer(opts.optim, optimizer_params());
      expert_grads_->optimizer()->set_gather_params(!zero_);
    }
  } else {
    // Experts split over another group than tp (ETP != TP): the zoo reduces their tensors'
    // per-tensor quantities over it.
    Communicator* etp =
        grid_->expert_tp().size() != grid_->tp().size() ? &grid_->expert_tp() : nullptr;
    std::vector<bool> expert;
    if (etp)
      for (const ParamInfo& p : optimizer_params().infos())
        expert.push_back(is_expert_parameter(p.name));
    optimizer_ = std::make_unique<Optimizer<float>>(opts.optim, optimizer_params(), exec_,
                                                    &grid_->tp(), etp, std::move(expert));
  }

  batches_.resize(std::max(opts.grad_accumulation_steps(), 1));
  batch_schedule_ = opts.batch_schedule;
  if (batch_schedule_.global_batch_size == 0)
    batch_schedule_.global_batch_size = opts.global_batch_size;
  doc_masks_ = {eod.value_or(-1), opts.reset_position_ids, opts.reset_attention_mask,
                opts.eod_mask_loss};
  OMNI_REQUIRE(!doc_masks_.any() || eod.has_value(),
               "--eod-mask-loss, --reset-position-ids and --reset-attention-mask need a "
               "tokenizer with an end-of-document token (--tokenizer-type)");
  if (!opts_.load.empty()) load(opts_.load);
  if (opts_.exit_signal_handler) {
    install_exit_signal_handler(opts_.exit_signal);
    signal_handler_installed_ = true;
  }
}

Trainer::~Trainer() {
  if (signal_handler_installed_) restore_signal_handlers();
}

void Trainer::set_downstream_evaluation(std::unique_ptr<DownstreamEvaluation> evaluation) {
  downstream_ = std::move(evaluation);
}

GPTModel<float>& Trainer::model() {
  if (auto* f = std::get_if<std::unique_ptr<Staged<float>>>(&model_)) return (*f)->model;
  OMNI_REQUIRE(grid_->world().size() == 1,
               "a float32 copy of a 16-bit GPU model is made for one-rank runs only");
  if (!host_model_)
    host_model_ = std::make_unique<GPTModel<float>>(opts_.model, 1, uint64_t(opts_.seed));
  ops::download(exec_, host_model_->params().values(), mixed_->master().values(),
                size_t(mixed_->master().size()));
  return *host_model_;
}

double Trainer::run_pipeline(int num_microbatches,
                             const std::function<const MicroBatch&(int)>& batch, bool train,
                             double grad_scale) {
  // --bf16 on the CPU: the model's GEMMs round their operands to bf16 (fp32 accumulation), as
  // a GPU's do; the float model's weights are bf16 values already (MixedPrecision).
  ops::CpuBf16Gemms bf16_gemms(opts_.bf16 && !exec_.gpu);
  const double loss = with_model(
      [&](auto& m) { return m.pipeline.run(num_microbatches, batch, train, grad_scale); });
  // ZeRO 3: a forward-only pass (evaluation) leaves no all-gather in flight into a save.
  if (zero_ && !train) zero_->end_use();
  return loss;
}

const std::vector<ParamInfo>& Trainer::model_infos() {
  return with_model(
      [](auto& m) -> const std::vector<ParamInfo>& { return m.model.params().infos(); });
}

const Tensor& Trainer::model_grads() {
  return with_model([](auto& m) -> const Tensor& { return m.model.params().grads_tensor(); });
}

ParameterSet<float>& Trainer::optimizer_params() {
  if (mixed_) return mixed_->master();
  return std::get<std::unique_ptr<Staged<float>>>(model_)->model.params();
}

RankState Trainer::rank_state(bool with_optimizer, bool reading) {
  // One replica (the first data- and context-parallel rank) writes each model slice, the
  // first tensor-parallel rank the tensors all hold whole (the first expert tensor-parallel
  // rank the experts' fc2 biases), the first stage tied embeddings;
  // the distributed optimizer's ranks each write their shard of its states.
  ParameterSet<float>& params = optimizer_params();
  const int64_t n = params.size();
  const bool replica = grid_->dp_rank() == 0 && grid_->cp_rank() == 0;
  // What a replica writes: all it holds, less the experts where another rank of its expert
  // data-parallel group writes them (a tp rank past the first, with whole experts: ETP 1).
  // A read fills all the rank holds: each rank holding the same experts reads them (and
  // their optimizer states), not only the one that writes them.
  const bool other_writes_experts = expert_grads_ && grid_->expert_dp().rank() != 0 && !reading;
  auto replica_spans = [&](float* data) {
    if (!other_writes_experts) return std::vector<FlatSpan>{{0, n, data}};
    std::vector<FlatSpan> spans;
    int64_t at = 0;
    for (const ShardRange& r : expert_grads_->ranges()) {
      if (r.begin > at) spans.push_back({at, r.begin, data + at});
      at = std::max(at, r.end);
    }
    if (at < n) spans.push_back({at, n, data + at});
    return spans;
  };
  RankState state;
  state.infos = params.infos();
  state.padded_vocab = opts_.model.padded_vocab_size();
  state.exec = exec_;
  if (zero_) {  // each rank holds (stage 3, a sharded master) and writes its shard of the values
    StateBuffer values{"", {}, true};
    for (const ShardRange& r : zero_->shard())  // the experts' too, over their own group
      values.spans.push_back({r.begin, r.end, params.values() + r.begin});
    state.buffers.push_back(std::move(values));
  } else {
    state.buffers.push_back({"", replica_spans(params.values()), replica});
  }
  // Expert parallelism: the first expert-data-parallel rank of each expert-parallel rank
  // writes its experts (the first data-parallel rank writes all it holds above).
  const bool expert_writer =
      expert_grads_ && grid_->expert_dp().rank() == 0 && !replica && !zero_ && !reading;
  auto expert_spans = [&](float* data) {
    std::vector<FlatSpan> spans;
    for (const ShardRange& r : expert_grads_->ranges())
      spans.push_back({r.begin, r.end, data + r.begin});
    return spans;
  };
  if (expert_writer) state.buffers.push_back({"", expert_spans(params.values()), true});
  const std::vector<std::string> names = !with_optimizer ? std::vector<std::string>{}
                                         : optimizer_    ? optimizer_->state_names()
                                                         : dist_optimizer_->state_names();
  for (const std::string& name : names) {
    StateBuffer b{"optimizer." + name + ".", {}, true};
    if (optimizer_) {
      b.spans = replica_spans(optimizer_->state_buffer(name)), b.written = replica;
      if (expert_writer)
        state.buffers.push_back({b.prefix, expert_spans(optimizer_->state_buffer(name)), true});
    } else {
      for (const DistributedOptimizer<float>* o :
           {dist_optimizer_.get(), expert_grads_ ? expert_grads_->optimizer() : nullptr}) {
        if (!o) continue;
        float* s = o->shard_state(name);
        for (const ShardRange& r :
             o == dist_optimizer_.get() ? ddp_->shard() : expert_grads_->shard()) {
          b.spans.push_back({r.begin, r.end, s});
          s += r.end - r.begin;
        }
      }
    }
    state.buffers.push_back(std::move(b));
  }
  const bool tp_lead = grid_->tp_rank() == 0;
  const bool etp_lead = grid_->expert_tp().rank() == 0;  // experts' fc2 biases (etp_replicated)
  const bool second_copy = shared_embedding_.second > 0 && !grid_->is_first_stage();
  state.writes = [tp_lead, etp_lead, second_copy](const ParamInfo& p) {
    return (tp_lead || !p.tp_replicated) && (etp_lead || !p.etp_replicated) &&
           !(second_copy && p.name == "embedding.word_embeddings.weight");
  };
  return state;
}

void Trainer::load(const std::string& dir) {
  // --finetune takes the weights only; --no-load-optim keeps the position but starts the
  // optimizer afresh. (--no-load-rng: there is no RNG state; see checkpoint.h.)
  const bool resume = !opts_.finetune, with_optimizer = resume && !opts_.no_load_optim;
  ParameterSet<float>& params = optimizer_params();
  // A checkpoint's read writes this rank's shard under stage 3, a Hugging Face read all.
  if (zero_) zero_->commit_params(is_hf_model_dir(dir));
  if (zero_ && mixed_) mixed_->commit_all();  // a GPU's sharded master
  TrainingProgress p;
  if (is_hf_model_dir(dir)) {  // each rank reads only its part's elements
    std::vector<float> local(size_t(params.size()));
    load_hf_weights(dir, params.infos(), local.data());
    ops::upload(exec_, params.values(), local.data(), local.size());
  } else {  // each rank reads the byte ranges of its part (sharded_checkpoint.h)
    const CheckpointReader reader(dir);
    const bool states = with_optimizer && reader.optimizer().name != "none";
    const OptimizerKind kind = optimizer_ ? optimizer_->kind() : dist_optimizer_->kind();
    if (states) reader.check_optimizer(checkpoint_optimizer_name(kind));
    reader.read(rank_state(states, true));
    if (states) {
      if (optimizer_) {
        optimizer_->set_steps(reader.optimizer().steps);
        for (const std::string& name : optimizer_->scalar_names())  // the zoo's
          optimizer_->scalar(name) = reader.optimizer_scalar(name);
      } else {
        dist_optimizer_->set_steps(reader.optimizer().steps);
        if (expert_grads_) expert_grads_->optimizer()->set_steps(reader.optimizer().steps);
        for (const std::string& name : dist_optimizer_->scalar_names())
          dist_optimizer_->scalar(name) = reader.optimizer_scalar(name);
      }
    }
    p = reader.progress();
  }
  if (mixed_) {
    mixed_->release_rest();  // under ZeRO 2/3 the load wrote the whole master
    mixed_->copy_master_to_model();
  }
  if (zero_) zero_->params_updated(), zero_->release_params();
  if (resume) {
    iteration_ = p.iteration;
    lr_steps_ = p.lr_schedule_iteration >= 0 ? p.lr_schedule_iteration : p.iteration;
    // Checkpoints from before the schedule counted samples held only its step count, made
    // with a constant batch.
    lr_samples_ =
        p.lr_schedule_samples >= 0 ? p.lr_schedule_samples : lr_steps_ * opts_.global_batch_size;
    consumed_samples_ = p.consumed_samples;
    consumed_valid_samples_ = p.consumed_valid_samples;
    if (scaler_ && p.loss_scaler) scaler_->load_state(*p.loss_scaler);
  }
}

std::string Trainer::save(MetricsSink& sink) {
  OMNI_REQUIRE(!opts_.save.empty(), "saving a checkpoint needs --save DIR");
  TraceSpan span("save-checkpoint");  // Megatron's timer name
  OMNI_CHECK(!zero_ || !zero_->prefetch_in_flight(),
             "[zero] a parameter all-gather in flight into a checkpoint's read");
  TrainingProgress progress;
  progress.iteration = iteration_, progress.consumed_samples = consumed_samples_;
  progress.consumed_valid_samples = consumed_valid_samples_;
  progress.lr_schedule_iteration = lr_steps_;
  progress.lr_schedule_samples = lr_samples_;
  if (scaler_) progress.loss_scaler = scaler_->state();
  CheckpointOptimizer optimizer;
  if (!opts_.no_save_optim) {
    optimizer.name =
        checkpoint_optimizer_name(optimizer_ ? optimizer_->kind() : dist_optimizer_->kind());
    optimizer.steps = optimizer_ ? optimizer_->steps() : dist_optimizer_->steps();
    for (const std::string& name :  // the zoo's scalars (optimizer_zoo.h)
         optimizer_ ? optimizer_->scalar_names() : dist_optimizer_->scalar_names())
      optimizer.scalars.emplace_back(
          name, optimizer_ ? optimizer_->scalar(name) : dist_optimizer_->scalar(name));
  }
  // Every rank writes its part at once (--async-save: from a copy, in the background).
  if (!checkpoint_writer_) checkpoint_writer_ = std::make_unique<CheckpointWriter>(grid_->world());
  const std::string dir = checkpoint_writer_->save(
      opts_.save, opts_, progress, optimizer, rank_state(!opts_.no_save_optim), opts_.async_save);
  last_saved_ = iteration_;
  sink.message(
      (opts_.async_save ? "saving checkpoint at iteration " : "saved checkpoint at iteration ") +
      std::to_string(iteration_) + " to " + dir);
  return dir;
}

void Trainer::finish_save(MetricsSink& sink, bool wait) {
  if (!checkpoint_writer_ || !checkpoint_writer_->pending()) return;
  const std::string dir = checkpoint_writer_->finish(wait);
  if (!dir.empty()) sink.message("checkpoint " + dir + " is complete and the latest");
}

void Trainer::read_batch(int m, int64_t first, bool train) {
  TraceSpan span("batch-generator", "microbatch", m);
  const int mb = opts_.micro_batch_size, seq = opts_.model.seq_length;
  const size_t n = size_t(mb) * seq;
  if (m >= int(batches_.size())) batches_.resize(m + 1);
  Batch& b = batches_[m];
  b.tokens.resize(n), b.labels.resize(n);
  if (train)
    data_->train_samples(first, mb, seq, b.tokens.data(), b.labels.data());
  else
    data_->valid_samples(first, mb, seq, b.tokens.data(), b.labels.data());
  b.full = {b.tokens.data(), b.labels.data(), nullptr, mb, seq};
  // Dropout's key: the samples' global index and the iteration being trained (train_step's).
  b.full.first_sample = first, b.full.iteration = iteration_ + 1;
  if (doc_masks_.any()) {
    b.positions.resize(n), b.key_start.resize(n), b.loss_mask.resize(n);
    document_masks(b.tokens.data(), mb, seq, doc_masks_, b.positions.data(), b.key_start.data(),
                   b.loss_mask.data());
    b.full.loss_mask = b.loss_mask.data();
    if (doc_masks_.reset_position_ids) b.full.position_ids = b.positions.data();
    if (doc_masks_.reset_attention_mask) b.full.key_start = b.key_start.data();
  }
  if (grid_->cp_size() > 1) b.local.slice(b.full, grid_->cp_size(), grid_->cp_rank());
}

double Trainer::per_token_loss_divisor(int microbatches) {
  if (!opts_.calculate_per_token_loss) return 0;
  double tokens = 0;
  for (int m = 0; m < microbatches; ++m) tokens += unmasked_tokens(batches_[m].full);
  grid_->dp().all_reduce(&tokens, 1);
  for (int m = 0; m < microbatches; ++m) {
    batches_[m].full.loss_divisor = tokens;
    if (grid_->cp_size() > 1) batches_[m].local.set_loss_divisor(tokens);
  }
  return tokens;
}

const MicroBatch& Trainer::batch(int m) const {
  return grid_->cp_size() > 1 ? batches_[m].local.batch() : batches_[m].full;
}

double Trainer::gradient_norm_squared(const std::vector<ShardRange>& ranges) {
  return sum_over_params(optimizer_params().grads(), ranges, sum_squares_op());
}

std::function<double(const float*, size_t)> Trainer::sum_squares_op() const {
  return [x = exec_](const float* data, size_t n) { return ops::sum_squares(x, data, n); };
}

double Trainer::sum_over_params(const float* data, const std::vector<ShardRange>& ranges,
                                const std::function<double(const float*, size_t)>& op) {
  const ParameterSet<float>& params = optimizer_params();
  const bool tp_lead = grid_->tp_rank() == 0;
  double sum = 0;
  for (const ParamInfo& p : params.infos()) {
    if (p.tp_replicated && !tp_lead) continue;                   // the same tensor on every TP rank
    if (expert_grads_ && is_expert_parameter(p.name)) continue;  // expert_grads_->sum
    if (shared_embedding_.second > 0 && !grid_->is_first_stage() &&
        p.offset == shared_embedding_.first)
      continue;  // the last stage's copy of the word embeddings
    for (const ShardRange& r : ranges) {
      const int64_t b = std::max(r.begin, p.offset), e = std::min(r.end, p.offset + p.numel);
      if (b < e) sum += op(data + b, size_t(e - b));
    }
  }
  return sum;
}

double Trainer::reduce_loss(double loss_sum, int microbatches) const {
  double loss = grid_->is_last_stage() ? loss_sum / microbatches : 0.0;
  grid_->dp().all_reduce(&loss, 1);
  loss /= grid_->dp_size();
  grid_->pp().all_reduce(&loss, 1);  // only the last stage's is non-zero
  return loss;
}

Trainer::Step Trainer::train_step(int64_t iteration) {
  const int mb = opts_.micro_batch_size, accum = step_micro_batches();
  float* grads = model_grads().data<float>();
  if (zero_)
    zero_->begin_step();
  else if (!grads_zeroed_)
    ops::zero(exec_, grads, size_t(model_grads().numel()));
  grads_zeroed_ = false;
  for (int m = 0; m < accum; ++m)
    read_batch(
        m, micro_batch_first_sample(consumed_samples_, m, mb, grid_->dp_rank(), grid_->dp_size()),
        true);
  auto batch = [this](int m) -> const MicroBatch& { return this->batch(m); };
  // Each micro-batch's mean loss is scaled by 1/accum, so the accumulated gradient is that
  // of the global batch's mean loss. Context-parallel ranks each hold part of it, and the
  // data-parallel reduction averages over dp x cp ranks: hence the factor cp. Under fp16
  // the loss is multiplied by the loss scale too. --calculate-per-token-loss: each
  // micro-batch's loss is its token sum over the global batch's tokens, summed (not
  // averaged) over micro-batches and data-parallel ranks, as Megatron's
  // finalize_model_grads divides the summed gradients by the global token count.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const bool per_token = per_token_loss_divisor(accum) > 0;
  TraceSpan forward_backward("forward-backward");
  const double loss_sum =
      run_pipeline(accum, batch, true,
                   loss_scale * grid_->cp_size() * (per_token ? grid_->dp_size() : 1.0 / accum));
  forward_backward.end();
  TraceSpan grads_sync("all-grads-sync");
  const int64_t samples = int64_t(accum) * mb * grid_->dp_size();
  consumed_samples_ += samples;
  if (shared_embedding_.second > 0) {
    const int64_t b = shared_embedding_.first, e = shared_embedding_.second;
    grid_->embedding().all_reduce(grads + b, size_t(e - b));
    if (opts_.overlap_grad_reduce) ddp_->mark_ready(b, e);
  }
  if (zero_)
    zero_->finish();  // the experts' buckets too
  else
    ddp_->finish();
  if (sparse_embedding_)
    with_model([this](auto& m) { m.model.add_deferred_embedding_grads(grid_->dp_cp()); });
  if (expert_grads_ && !zero_) expert_grads_->finish();
  // Replicated tensors whose gradient each tensor-parallel rank computed a part of.
  for (const ParamInfo& p : model_infos())
    if (p.tp_partial_grad) grid_->tp().all_reduce(grads + p.offset, size_t(p.numel));
  grads_sync.end();
  TraceSpan optimizer_span("optimizer");
  ops::CpuFp32Gemms fp32_gemms;  // the optimizers' GEMMs (Muon, Shampoo, GaLore): fp32 masters
  Step step;
  // The expert bias's update writes the whole bias, in the model and the master, on every
  // rank: under ZeRO 2/3 the ranges outside the rank's shards are backed for it (a GPU's;
  // stage 3's values given back at their layer's next use, the master's after it).
  for (const auto& [begin, end] : zero_expert_bias_) {
    zero_->commit_values(begin, end);
    if (mixed_) mixed_->commit(begin, end);
  }
  step.moe = with_model([&](auto& m) {  // the expert bias's update, the MoE figures
    return finish_moe_step(m.model, *grid_, accum, mixed_ ? &mixed_->master() : nullptr);
  });
  if (!zero_expert_bias_.empty() && mixed_) mixed_->release_rest();
  step.loss =
      per_token ? reduce_loss(loss_sum * grid_->dp_size(), 1) : reduce_loss(loss_sum, accum);
  step.lr = learning_rate(opts_.lr_schedule, lr_samples_);
  if (mixed_) {
    // Round the gradients to their storage type, unscale them into the master's; an
    // overflow on any rank skips the step everywhere (Megatron all-reduces found_inf).
    // The model's gradients are not read again: zeroed by this pass where it can.
    double found_inf = mixed_->unscale_and_check(float(loss_scale), &grads_zeroed_) ? 1.0 : 0.0;
    grid_->world().all_reduce(&found_inf, 1, ReduceOp::Max);
    if (scaler_) {
      scaler_->update(found_inf > 0);
      if (found_inf > 0) {
        step.skipped = true;
        step.grad_norm = NAN;
        return step;
      }
    }
  }
  ParameterSet<float>& master = optimizer_params();
  double norm2 = gradient_norm_squared(
      dist_optimizer_ ? ddp_->shard() : std::vector<ShardRange>{{0, master.size()}});
  if (expert_grads_) {  // the experts' part added, one collective per group
    expert_grads_->complete_sums(&norm2, {{master.grads(), sum_squares_op()}});
  } else {
    grid_->model_parallel().all_reduce(&norm2, 1);
    if (dist_optimizer_) grid_->dp_cp().all_reduce(&norm2, 1);
  }
  step.grad_norm = std::sqrt(norm2);
  OMNI_REQUIRE(std::isfinite(step.grad_norm) || !opts_.check_for_nan_in_loss_and_grad, "iteration ",
               iteration, ": the gradient norm is not finite (lm loss ", step.loss,
               "); lower --lr or enable --clip-grad (--no-check-for-nan-in-loss-and-grad trains "
               "on)");
  // Megatron: clip_coeff = max_norm / (total_norm + 1e-6), applied when below 1. The whole
  // optimizer applies it as its update reads the gradients (one pass over them fewer),
  // unless the clipped gradients' zeros are to be counted.
  double clip = 1.0;
  if (opts_.optim.clip_grad > 0) {
    const double coeff = opts_.optim.clip_grad / (step.grad_norm + 1e-6);
    if (coeff < 1.0) {
      if (zero_) {  // only this rank's shard of the gradients is held
        dist_optimizer_->scale_gradients(master, coeff);
        if (expert_grads_) expert_grads_->optimizer()->scale_gradients(master, coeff);
      } else if (dist_optimizer_ || opts_.log_num_zeros_in_grad)
        scale_gradients(master, coeff, exec_);
      else
        clip = coeff;
    }
  }
  if (dist_optimizer_) {
    dist_optimizer_->step(master, step.lr);
    if (expert_grads_) expert_grads_->optimizer()->step(master, step.lr);
  } else {
    // Where nothing reads the gradients after the update (they are the model's own, and no
    // count of their zeros follows), the update zeroes them as it reads them.
    if (optimizer_->step(master, step.lr, clip, !mixed_ && !opts_.log_num_zeros_in_grad))
      grads_zeroed_ = true;
  }
  if (mixed_) mixed_->copy_master_to_model();
  if (zero_) zero_->params_updated();
  ++lr_steps_;
  lr_samples_ += samples;
  return step;
}

void Trainer::add_step_statistics(StepMetrics& m, bool skipped) {
  // As Megatron: the norm of the (fp32 main) parameters and the zeros of their gradients after
  // clipping, each parameter counted once across the model-parallel ranks; the distributed
  // optimizer's ranks each count their shard.
  const bool norm = opts_.log_params_norm, zeros = opts_.log_num_zeros_in_grad && !skipped;
  if (!norm && !zeros) return;
  ParameterSet<float>& master = optimizer_params();
  const std::vector<ShardRange> ranges =
      dist_optimizer_ ? ddp_->shard() : std::vector<ShardRange>{{0, master.size()}};
  const std::function<double(const float*, size_t)> count_zeros =
      [x = exec_](const float* data, size_t n) { return ops::count_zeros(x, data, n); };
  const std::function<double(const float*, size_t)> nothing = [](const float*, size_t) {
    return 0.0;
  };
  double sums[2] = {norm ? sum_over_params(master.values(), ranges, sum_squares_op()) : 0,
                    zeros ? sum_over_params(master.grads(), ranges, count_zeros) : 0};
  if (expert_grads_) {
    expert_grads_->complete_sums(sums, {{master.values(), norm ? sum_squares_op() : nothing},
                                        {master.grads(), zeros ? count_zeros : nothing}});
  } else {
    grid_->model_parallel().all_reduce(sums, 2);
    if (dist_optimizer_) grid_->dp_cp().all_reduce(sums, 2);
  }
  if (norm) m.params_norm = std::sqrt(sums[0]);
  if (zeros) m.num_zeros_in_grad = int64_t(sums[1]);
}

double Trainer::evaluate() {
  const int mb = opts_.micro_batch_size, n = opts_.eval_iters;
  if (n == 0) return NAN;
  // As Megatron's evaluate: --eval-iters iterations of one global batch each (its
  // --eval-global-batch-size, the training one), read as training reads its batches from
  // where the last evaluation stopped (consumed_valid_samples, kept in checkpoints), so the
  // loss is that of the same samples at every layout.
  const int dp = grid_->dp_size(), accum = opts_.grad_accumulation_steps();
  auto batch = [this](int m) -> const MicroBatch& { return this->batch(m); };
  double loss_sum = 0;
  for (int i = 0; i < n; ++i) {
    for (int m = 0; m < accum; ++m)
      read_batch(m, micro_batch_first_sample(consumed_valid_samples_, m, mb, grid_->dp_rank(), dp),
                 false);
    loss_sum += run_pipeline(accum, batch, false, 0.0);
    consumed_valid_samples_ += opts_.global_batch_size;
  }
  return reduce_loss(loss_sum, n * accum);
}

TrainResult Trainer::run(MetricsSink& sink) {
  using clock = std::chrono::steady_clock;
  TrainResult result;
  const auto run_start = clock::now();
  StepProfiler profiler(opts_, grid_->world().rank(), sink);
  double train_seconds = 0, tokens_trained = 0;
  result.first_iteration = iteration_ + 1;
  int previous_batch = batch_schedule_.batch_at(consumed_samples_);
  if (downstream_ && iteration_ == 0) downstream_->run(*this, sink);  // the untrained model
  for (int64_t it = iteration_ + 1; it <= opts_.train_iters; ++it) {
    // Megatron saves a checkpoint where a ramping batch changes the number of micro-batches.
    const int global_batch = batch_schedule_.batch_at(consumed_samples_);
    if (global_batch != previous_batch && iteration_ != 0 && !opts_.save.empty() &&
        last_saved_ != iteration_)
      result.saved.push_back(save(sink));
    previous_batch = global_batch;
    const double flops_per_iter = megatron_flops_per_iteration(opts_.model, global_batch);
    const double tokens_per_iter = double(global_batch) * opts_.model.seq_length;
    const auto t0 = clock::now();
    profiler.begin_step(it);
    const Step step = train_step(it);
    profiler.end_step(it);
    tokens_trained += tokens_per_iter;
    const double loss = step.loss;
    iteration_ = it;
    const double step_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    train_seconds += step_seconds;
    result.train_losses.push_back(loss);
    result.step_seconds.push_back(step_seconds);
    sink.progress(it, opts_.train_iters, loss, step_seconds);

    // Every step is reported; the sink averages them over --log-interval (and writes
    // TensorBoard every --tensorboard-log-interval), as Megatron's training_log does.
    StepMetrics m;
    m.iteration = it;
    m.train_iters = opts_.train_iters;
    m.consumed_samples = consumed_samples_;
    m.global_batch_size = global_batch;
    m.lm_loss = loss;
    m.lr = step.lr;
    m.grad_norm = step.grad_norm;
    m.loss_scale = scaler_ ? scaler_->scale() : 1.0;
    m.skipped_iterations = step.skipped ? 1 : 0;
    m.moe = step.moe;
    result.skipped_iterations += m.skipped_iterations;
    m.nan_iterations = step.skipped && !std::isfinite(loss) ? 1 : 0;
    m.ms_per_iter = 1000.0 * step_seconds;
    m.tokens_per_sec = tokens_per_iter / step_seconds;
    m.tflops = flops_per_iter / step_seconds / 1e12;
    m.mfu = peak_gflops_ > 0 ? flops_per_iter / step_seconds / (peak_gflops_ * 1e9) : 0.0;
    add_step_statistics(m, step.skipped);
    profiler.add_timers(m, grid_->world());
    sink.log(m);
    const bool eval_now =
        opts_.eval_iters > 0 && ((opts_.eval_interval > 0 && it % opts_.eval_interval == 0 &&
                                  it >= opts_.start_eval_at_iter) ||
                                 it == opts_.train_iters);
    if (eval_now) {
      m.val_loss = evaluate();
      result.val_losses.emplace_back(it, *m.val_loss);
      sink.log_validation(m);
    }
    if (downstream_ && downstream_->due(it)) downstream_->run(*this, sink);
    finish_save(sink, false);  // --async-save: publishes a save once every rank's files are durable
    if (!opts_.save.empty() && opts_.save_interval > 0 && it % opts_.save_interval == 0)
      result.saved.push_back(save(sink));
    // Every rank must stop at the same step: the duration and a caught signal are decided
    // by whichever rank sees them first (as Megatron all-reduces them).
    const double minutes = std::chrono::duration<double>(clock::now() - run_start).count() / 60;
    double stop[2] = {
        opts_.exit_duration_in_mins > 0 && minutes >= opts_.exit_duration_in_mins ? 1.0 : 0.0,
        signal_handler_installed_ && g_exit_signal != 0 ? 1.0 : 0.0};
    if (opts_.exit_duration_in_mins > 0 || signal_handler_installed_)
      grid_->world().all_reduce(stop, 2, ReduceOp::Max);
    if (opts_.exit_interval > 0 && it % opts_.exit_interval == 0)
      result.exit_reason = "exit interval";
    else if (stop[0] > 0)
      result.exit_reason = "exit duration";
    else if (stop[1] > 0)
      result.exit_reason = "signal";
    if (!result.exit_reason.empty() && it < opts_.train_iters) {
      sink.message("exiting at iteration " + std::to_string(it) + " (" + result.exit_reason + ")");
      break;
    }
    result.exit_reason.clear();
  }
  profiler.finish();
  // Megatron saves at the end unless the last step was just saved; Primus's
  // --disable-last-saving skips that save, but not an early exit's.
  const int64_t steps_run = int64_t(result.train_losses.size());
  const bool last_save = !opts_.disable_last_saving || !result.exit_reason.empty();
  if (!opts_.save.empty() && steps_run > 0 && last_saved_ != iteration_ && last_save)
    result.saved.push_back(save(sink));
  finish_save(sink, true);
  result.last_iteration = iteration_;
  result.seconds = std::chrono::duration<double>(clock::now() - run_start).count();
  result.tokens_per_sec = steps_run > 0 ? tokens_trained / train_seconds : 0.0;
  return result;
}

Trainer::HeldMemory Trainer::held_memory(bool reset_peak) {
  ParameterSet<float>& params = optimizer_params();
  const size_t bytes = size_t(params.size()) * sizeof(float);
  HeldMemory m;
  if (zero_) {
    const ZeroSharding::Bytes peak = zero_->peak();
    m.params = peak.params, m.grads = peak.grads;
    if (reset_peak) zero_->reset_peak();
  } else {  // the model's buffers (the CPU's: float, also under --bf16/--fp16)
    m.params = resident_bytes(
        with_model([](auto& s) { return s.model.params().values_tensor().raw(); }), bytes);
    m.grads = resident_bytes(model_grads().raw(), bytes);
  }
  if (mixed_)  // the fp32 master copy counts with the optimizer's states, as ZeRO's K does
    m.optimizer += resident_bytes(params.values(), bytes) + resident_bytes(params.grads(), bytes);
  if (optimizer_ && !is_zoo_optimizer(optimizer_->kind()))  // AdamW's or SGD's float states
    for (const std::string& name : optimizer_->state_names())
      m.optimizer += resident_bytes(optimizer_->state_buffer(name), bytes);
  int64_t shard = 0;
  for (const ShardRange& r : ddp_->shard()) shard += r.end - r.begin;
  if (dist_optimizer_)
    for (const std::string& name : dist_optimizer_->state_names())
      m.optimizer +=
          resident_bytes(dist_optimizer_->shard_state(name), size_t(shard) * sizeof(float));
  if (expert_grads_ && expert_grads_->optimizer()) {  // the experts' shard of the states
    int64_t experts = 0;
    for (const ShardRange& r : expert_grads_->shard()) experts += r.end - r.begin;
    for (const std::string& name : expert_grads_->optimizer()->state_names())
      m.optimizer += resident_bytes(expert_grads_->optimizer()->shard_state(name),
                                    size_t(experts) * sizeof(float));
  }
  return m;
}

}  // namespace omni
