#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "backend/device_selection.h"
#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_interchange.h"
#include "cli/commands.h"
#if defined(OMNITRON_NCCL)
#include "comm/nccl_communicator.h"
#endif
#include "comm/process_grid.h"
#include "comm/rendezvous.h"
#include "comm/watchdog.h"
#include "config/env_overrides.h"
#include "config/options.h"
#include "config/yaml_config.h"
#include "config/yaml_tree.h"
#include "data/datasets/dataset.h"
#include "data/datasets/indexed_dataset.h"
#include "data/datasets/prefetch.h"
#include "generate/sampler.h"
#include "train/downstream_eval.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace omni::cli {

namespace {

// --device: the GPU trains when one is asked for, or (auto) present, and the run is one the
// GPU half of the seam supports (one rank per process); auto falls back to the CPU and says why.
// `note` is printed with the run's set-up lines, so that earlier errors stay one line.
struct DeviceChoice {
  std::string device;  // "cpu", "cuda" or "hip"
  std::string note;
  int gpu = 0;  // the GPU's index: the launcher's local rank modulo the visible GPUs
};

DeviceChoice choose_device(const Options& o, int world_size) {
  const ResolvedDevice d = resolve_device(o.device);
  if (d.device.kind == DeviceKind::CPU) return {"cpu", d.note};
  const std::string name = d.device.kind == DeviceKind::CUDA ? "cuda" : "hip";
  const std::string gpus = std::to_string(d.gpus_visible) + " " +
                           (d.device.kind == DeviceKind::CUDA ? "CUDA" : "HIP") + " GPU" +
                           (d.gpus_visible == 1 ? "" : "s") + " visible";
  std::string why_not;  // "but ..."
#if !defined(OMNITRON_NCCL)
  if (world_size > 1)
    why_not =
        "but GPU ranks talk through NCCL/RCCL, which this build lacks (rebuild with it "
        "installed)";
#else
  (void)world_size;
#endif
  if (why_not.empty()) return {name, "", d.device.index};
  OMNI_REQUIRE(o.device == "auto", "--device ", o.device, ": ", gpus, ", ", why_not,
               "; use --device cpu");
  return {"cpu", "--device auto: " + gpus + ", " + why_not + ", so the CPU trains"};
}

// This process's command line as the user typed it (/proc/self/cmdline), quoted for a shell.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words;
  for (std::string w; std::getline(in, w, '\0');) {
    const bool plain = !w.empty() && w.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
                                         "OPQRSTUVWXYZ0123456789_-+=/.,:@%") == std::string::npos;
    if (plain) {
      words.push_back(w);
      continue;
    }
    std::string quoted = "'";
    for (char c : w) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    words.push_back(quoted + "'");
  }
  return words;
}

// How to start `ranks` ranks of this very command under MPI: "`mpirun -np N <the command
// line>` (or `NPROC=N bash scripts/launch.sh ...`; docs/launching.md)", and what root and a
// build without MPI also need.
std::string mpirun_hint(int ranks) {
  const std::vector<std::string> argv = own_command_line();
  std::string command, after_train;
  for (size_t i = 0; i < argv.size(); ++i) {
    command += " " + argv[i];
    if (i >= 2) after_train += " " + argv[i];
  }
  const std::string n = std::to_string(ranks);
  return "`mpirun -np " + n + command + "` (or `NPROC=" + n + " bash scripts/launch.sh" +
         after_train + "`; docs/launching.md)" +
         (geteuid() == 0 && !std::getenv("OMPI_ALLOW_RUN_AS_ROOT")
              ? "; as root, Open MPI's mpirun also needs --allow-run-as-root"
              : "")
#ifndef OMNITRON_MPI
         + "; this build has no MPI: rebuild with -DOMNITRON_MPI=ON and an MPI installed"
#endif
      ;
}

// torchrun starts one process per GPU and no MPI, and CPU ranks talk through MPI (the
// torchrun world carries host collectives only: comm/rendezvous.h). So under torchrun with
// several ranks the device is a GPU; when the CPU was chosen, rank 0 says in one line how to
// start the same ranks with mpirun, and the other ranks stop quietly with the same code. Runs
// before any collective, so no rank waits at the rendezvous.
void require_gpu_ranks_under_torchrun(const std::string& requested, const DeviceChoice& chosen,
                                      const Communicator& world) {
  if (world.size() == 1 || chosen.device != "cpu" || !torchrun_environment()) return;
  const GpuAvailability here = gpu_availability();
  // auto with GPUs that do not fit the ranks of this node: the line that names both numbers.
  if (requested == "auto" && here.devices > 0)
    resolve_device(here.backend == DeviceKind::HIP ? "hip" : "cuda", here);
  const std::string why = requested == "cpu" ? "--device cpu was asked for"
                          : !chosen.note.empty()
                              ? chosen.note
                              : "--device auto found no GPU: " + why_no_gpu(here);
  if (world.rank() != 0) OMNI_CHECK(std::freopen("/dev/null", "w", stderr), "cannot silence");
  throw UsageError("torchrun started " + std::to_string(world.size()) + " ranks and " + why +
                   "; CPU ranks talk through MPI, which torchrun does not start: run them with " +
                   mpirun_hint(world.size()));
}

// One process asked for model parallelism: say how to start the ranks it needs, with the
// user's own command line, rather than that 1 rank does not divide by the layout.
void require_ranks_for_layout(const Options& o, int world_size) {
  if (world_size != 1) return;
  std::string sizes;
  int ranks = 1;
  for (const auto& [flag, size] :
       {std::pair{"--tensor-model-parallel-size", o.tensor_model_parallel_size},
        std::pair{"--context-parallel-size", o.context_parallel_size},
        std::pair{"--expert-model-parallel-size", o.expert_model_parallel_size},
        std::pair{"--pipeline-model-parallel-size", o.pipeline_model_parallel_size}}) {
    if (size <= 1) continue;
    sizes += (sizes.empty() ? "" : " x ") + std::string(flag) + " " + std::to_string(size);
    ranks *= size;
  }
  // The experts' own tensor-parallel size (a built one, dividing TP or a multiple of it;
  // finalize refuses others): the dense grid (tp cp pp) and the expert grid (etp ep pp) must
  // both divide the world.
  const int etp = built_expert_tensor_parallel_size(o);
  if (etp > 0 && etp != o.tensor_model_parallel_size) {
    sizes += (sizes.empty() ? "" : " with ") + std::string("--expert-tensor-parallel-size ") +
             std::to_string(etp);
    ranks = std::lcm(o.tensor_model_parallel_size * o.context_parallel_size * o.pipeline_model_parallel_size,
                     etp * o.expert_model_parallel_size * o.pipeline_model_parallel_size);
  }
  if (ranks == 1) return;
  const std::string n = std::to_string(ranks);
  throw UsageError(sizes + " needs " + n + " ranks, and this is a single process: start " + n +
                   " with " + mpirun_hint(ranks));
}

}  // namespace

std::optional<int32_t> end_of_document(const Options& opts, const Tokenizer* tokenizer) {
  if (tokenizer) return tokenizer->eod();
  if (opts.mock_data) return opts.model.vocab_size - 1;
  return std::nullopt;
}

std::unique_ptr<TrainingData> open_training_data(Options& opts, std::optional<int32_t> eod) {
  if (opts.mock_data) return make_mock_data(opts.model.vocab_size, opts.seed, eod.value_or(-1));
  if (opts.per_split_data()) {
    DataBlend train, valid, test;
    train.prefixes = parse_data_path(opts.train_data_path, &train.weighted);
    if (!opts.valid_data_path.empty())
      valid.prefixes = parse_data_path(opts.valid_data_path, &valid.weighted);
    if (!opts.test_data_path.empty())
      for (const WeightedPrefix& p : parse_data_path(opts.test_data_path, &test.weighted))
        IndexedDataset check(p.prefix);  // the test split is not evaluated (a note says so)
    return std::make_unique<PrefetchingData>(
        make_megatron_data(train, valid, opts.model.seq_length, opts.seed, opts.train_samples(),
                           opts.valid_samples(), opts.data_cache_path));
  }
  if (!opts.data_path.empty() || !opts.data_file_list.empty()) {
    bool weighted = true;
    const std::vector<WeightedPrefix> prefixes = opts.data_file_list.empty()
                                                     ? parse_data_path(opts.data_path, &weighted)
                                                     : read_data_file_list(opts.data_file_list);
    return std::make_unique<PrefetchingData>(
        make_megatron_data(prefixes, weighted, opts.split, opts.model.seq_length, opts.seed,
                           opts.train_samples(), opts.valid_samples(), opts.data_cache_path));
  }
  if (opts.train_text.empty()) opts.train_text = demo_corpus_path();
  return make_byte_text_data(opts.train_text, opts.split, opts.model.seq_length, opts.seed);
}

// --config FILE (or Primus's EXP=FILE.yaml): the YAML's options go first, then the launcher's
// environment variables (scripts/launch.sh), so the command line wins (CLI > environment > YAML
// overrides > experiment > model > bases). --print-config checks the resolved options as train does
// (resolve_run_options: every error a run would stop on), then prints the YAML options with
// the file and line each came from, the environment's and the command line's flags, and the
// notes; it returns nothing.
std::optional<std::vector<std::string>> with_config(const std::vector<std::string>& raw,
                                                    int world_size) {
  std::vector<std::string> cli;
  std::string config, model;
  bool print_only = false;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == "--config") {
      OMNI_REQUIRE(i + 1 < raw.size(), "--config needs a value (FILE)");
      config = raw[++i];
    } else if (raw[i].rfind("--config=", 0) == 0) {
      config = raw[i].substr(9);
    } else if (raw[i] == "--model") {
      OMNI_REQUIRE(i + 1 < raw.size(), "--model needs a value (a model zoo NAME, or FILE.yaml)");
      model = raw[++i];
    } else if (raw[i].rfind("--model=", 0) == 0) {
      model = raw[i].substr(8);
    } else if (raw[i] == "--print-config") {
      print_only = true;
    } else {
      cli.push_back(raw[i]);
    }
  }
  const std::map<std::string, std::string> env = process_environment();
  // Primus's launch scripts take the experiment from EXP (EXP=examples/megatron/configs/X.yaml).
  if (auto exp = env.find("EXP"); config.empty() && exp != env.end() &&
                                  (exp->second.ends_with(".yaml") || exp->second.ends_with(".yml")))
    config = exp->second;
  std::vector<ConfigEntry> entries;
  if (!config.empty()) entries = resolve_yaml_config(config, env);
  // --model NAME: the zoo's model (configs/models/NAME.yaml), over the --config file's.
  if (!model.empty()) {
    std::string file = model;
    try {
      if (model.find('/') == std::string::npos)
        file = yaml::find_zoo_model(model, std::filesystem::current_path(), env).string();
    } catch (const UsageError& e) {
      throw UsageError(std::string("--model: ") + e.what());
    }
    const std::vector<ConfigEntry> m = resolve_yaml_config(file, env);
    entries.insert(entries.end(), m.begin(), m.end());
  }
  std::vector<EnvOverride> overrides;
  if (env.count("OMNITRON_ENV_OVERRIDES") && env.at("OMNITRON_ENV_OVERRIDES") == "1")
    overrides = env_overrides(env, world_size);
  std::vector<std::string> args = config_entries_to_args(entries);
  for (const EnvOverride& o : overrides) args.insert(args.end(), o.args.begin(), o.args.end());
  args.insert(args.end(), cli.begin(), cli.end());
  if (!print_only) {
    for (const EnvOverride& o : overrides)
      if (!o.note.empty()) std::printf("%s\n", o.note.c_str());
    return args;
  }
  const RunOptions run = resolve_run_options(args, world_size);
  std::printf("%s", format_config_entries(entries).c_str());
  for (const EnvOverride& o : overrides) {
    for (const std::string& a : o.args) std::printf("%s ", a.c_str());
    std::printf(" # environment %s\n", o.source.c_str());
    if (!o.note.empty()) std::printf("%s\n", o.note.c_str());
  }
  for (const std::string& a : cli) std::printf("%s%s", a.rfind("--", 0) ? " " : "\n", a.c_str());
  std::printf("%s", cli.empty() ? "" : "  # command line\n");
  for (const std::string& n : run.opts.notes) std::printf("%s\n", n.c_str());
  return std::nullopt;
}

int data_samples(const std::vector<std::string>& raw_args) {
  if (wants_help(raw_args)) {
    std::printf(
        "usage: omnitron data-samples --data-path ... --seq-length N --global-batch-size N "
        "--train-iters N [--split A,B,C] [--seed N] [--print-samples N]\n"
        "Prints the first training samples in order with their token ids, to compare "
        "with a Megatron run on the same data and flags.\n");
    return 0;
  }
  const std::optional<std::vector<std::string>> resolved = with_config(raw_args, 1);
  if (!resolved) return 0;  // --print-config
  RunOptions run = resolve_run_options(*resolved, 1);
  Options& opts = run.opts;
  std::unique_ptr<TrainingData> data =
      open_training_data(opts, end_of_document(opts, run.tokenizer.get()));
  std::printf("# %s\n", data->describe().c_str());
  const int seq = opts.model.seq_length;
  std::vector<int32_t> tokens(seq), labels(seq);
  for (int64_t k = 0; k < opts.print_samples; ++k) {
    data->train_samples(k, 1, seq, tokens.data(), labels.data());
    std::string origin = data->train_sample_origin(k);
    std::printf("sample %lld%s%s:", (long long)k, origin.empty() ? "" : " | ", origin.c_str());
    for (int t = 0; t < seq; ++t) std::printf(" %d", tokens[t]);
    std::printf(" %d\n", labels[seq - 1]);  // the extra (label) token shared with sample k+1
  }
  return 0;
}

int train(const std::vector<std::string>& raw_args) {
  if (wants_help(raw_args)) {
    std::printf(
        "usage: omnitron train [--config FILE.yaml] [--model NAME] [--print-config] [options]\n"
        "  --model NAME: a model of the zoo (configs/models/NAME.yaml: gpt2_124m, llama3_8b, "
        "...)\n%s",
        options_help().c_str());
    return 0;
  }
  // As Megatron's print_rank_0: one rank reports (errors still reach stderr from any).
  Communicator& world = world_communicator();
  if (world.rank() != 0)
    OMNI_CHECK(std::freopen("/dev/null", "w", stdout), "cannot silence rank ", world.rank());
  const std::optional<std::vector<std::string>> resolved = with_config(raw_args, world.size());
  if (!resolved) return 0;  // --print-config
  Options named;            // the command line parsed once: checked for its layout, then resolved
  parse_options(*resolved, named);
  require_ranks_for_layout(named, world.size());
  RunOptions run = resolve_run_options(*resolved, std::move(named), world.size());
  Options& opts = run.opts;
  if (world.size() > 1) set_hang_report_seconds(opts.hang_report_seconds);
  if (world.size() > 1)
    set_collective_timeout(
        opts.distributed_timeout_minutes * 60,
        "--distributed-timeout-minutes " + find_option("--distributed-timeout-minutes")->get(opts));
  const std::unique_ptr<Tokenizer>& tokenizer = run.tokenizer;
  if (run.demo) {
    std::string line;
    for (const std::string& a : demo_args()) line += " " + a;
    std::printf(
        "no --train-text, --data-path or --mock-data: training the demo, as omnitron train%s ...\n",
        line.c_str());
  }
  if (world.rank() != 0) {  // rank 0 writes the logs
    opts.metrics_file.clear();
    opts.tensorboard_dir.clear();
  }
  if (world.size() > 1) opts.progress = false;  // mpirun's output is a log, not a terminal
  // --logging-level (Python's numbers): 30 (warning) hides the set-up descriptions Megatron
  // logs at info, 40 (error) the notes too; 10 (debug) adds debug lines.
  const int level = opts.logging_level > 0 ? opts.logging_level : 20;
  const bool info = level <= 20;
  if (level < 40)
    for (const std::string& n : opts.notes) std::printf("%s\n", n.c_str());
  if (level <= 10)
    std::printf(
        "  debug: collective timeout %g s (--distributed-timeout-minutes), gradient "
        "reduction %s\n",
        opts.distributed_timeout_minutes * 60,
        opts.overlap_grad_reduce ? "overlapped with the backward pass" : "after the backward pass");
  const DeviceChoice device = choose_device(opts, world.size());
  require_gpu_ranks_under_torchrun(opts.device, device, world);
  opts.device = device.device;
  if (opts.device != "cpu") use_gpu(device.gpu);  // before anything is allocated on it

  // Rank 0 writes what the data needs on first use (the demo corpus, index caches); the
  // others open it after.
  const std::optional<int32_t> eod = end_of_document(opts, tokenizer.get());
  std::unique_ptr<TrainingData> data;
  if (world.rank() == 0) data = open_training_data(opts, eod);
  world.barrier();
  if (world.rank() != 0) data = open_training_data(opts, eod);

  // MFU is against the GPU's dense bf16 peak, or the CPU's measured GEMM rate: sgemm's, or
  // under --bf16 that of the bf16 GEMMs the model's passes then run (backend/cpu/gemm.h).
  double peak = 0.0;
  std::string device_line;
  if (opts.device == "cpu") {
    {
      ops::CpuBf16Gemms bf16_gemms(opts.bf16);
      peak = world.rank() == 0 ? measure_gemm_gflops() : 0.0;
    }
    const std::string why = cpu_threads_reason();
    char text[640];
    std::snprintf(text, sizeof text,
                  "cpu, %d threads (%s%swaiting %s), %s; %s peak %.0f GFLOP/s (MFU is against "
                  "this)",
                  cpu_threads(), why.c_str(), why.empty() ? "" : "; ",
                  openmp_wait_policy().c_str(), blas_config().c_str(),
                  opts.bf16 ? "bf16 GEMM" : "sgemm", peak);
    device_line = text;
  } else {
    const GpuDeviceInfo gpu = gpu_device_info(device.gpu);
    peak = gpu_peak_bf16_tflops(gpu.name) * 1000.0;
    device_line = opts.device + ":" + std::to_string(device.gpu) + " " + gpu.name + ", " +
                  gpu_backend_name() +
                  (peak > 0 ? "; bf16 peak " + std::to_string(int(peak / 1000)) +
                                  " TFLOP/s (MFU is against this)"
                            : "; bf16 peak unknown (no MFU)");
  }
  const TransformerConfig& m = opts.model;
  std::printf(
      "omnitron train: %lld parameters | %d layers, hidden %d, ffn %d, heads %d/%d, %s, %s%s\n",
      (long long)m.num_parameters(), m.num_layers, m.hidden_size, m.ffn_size(),
      m.num_attention_heads, m.query_groups(), to_string(m.normalization),
      to_string(m.position_embedding_type),
      m.swiglu        ? ", SwiGLU"
      : m.openai_gelu ? ", GELU (tanh)"
                      : ", GELU (erf)");
  if (m.num_moe_experts > 0) {
    const std::vector<int> pattern = m.moe_layer_pattern();
    const int moe_layers = static_cast<int>(std::count(pattern.begin(), pattern.end(), 1));
    std::printf("  MoE: %d of %d layers, %d experts (top %d, ffn %d", moe_layers, m.num_layers,
                m.num_moe_experts, m.moe_router_topk, m.moe_ffn_size());
    if (m.moe_shared_expert_intermediate_size > 0)
      std::printf(", shared expert %d", m.moe_shared_expert_intermediate_size);
    std::printf("), %s dispatcher | %lld active parameters a token\n",
                m.moe_token_dispatcher_type.c_str(), (long long)m.num_active_parameters());
  }
  if (info) std::printf("  data: %s\n", data->describe().c_str());
  std::printf(
      "  batch: %d x %d tokens (micro batch %d, %d accumulation steps), %lld iterations, "
      "lr %g -> %g (%s, %g warm-up samples)\n",
      opts.global_batch_size, m.seq_length, opts.micro_batch_size, opts.grad_accumulation_steps(),
      (long long)opts.train_iters, opts.lr, opts.min_lr, opts.lr_decay_style.c_str(),
      opts.lr_schedule.warmup_steps);
  const BatchSchedule& ramp = opts.batch_schedule;
  if (ramp.ramps())
    std::printf("  batch ramp: %d to %d by %d over the first %lld samples\n", ramp.rampup_start,
                ramp.global_batch_size, ramp.rampup_increment, (long long)ramp.rampup_samples);
  if (info) std::printf("  device: %s\n", device_line.c_str());
  if (!device.note.empty()) std::printf("  %s\n", device.note.c_str());
  if (world.size() > 1) {
    std::printf("  layout: %d ranks = tensor %d x context %d%s x pipeline %d x data %d%s%s\n",
                world.size(), opts.tensor_model_parallel_size, opts.context_parallel_size,
                opts.context_parallel_size > 1 && opts.cp_comm_type == "a2a" ? " (Ulysses)" : "",
                opts.pipeline_model_parallel_size, opts.data_parallel_size,
                opts.sequence_parallel ? ", sequence parallel" : "",
                opts.use_distributed_optimizer ? ", distributed optimizer" : "");
    // The experts' own grid (Megatron-Core's: etp x ep x data over each pipeline stage).
    const int etp = opts.expert_tensor_parallel_size > 0 ? opts.expert_tensor_parallel_size
                                                         : opts.tensor_model_parallel_size;
    const int ep = opts.expert_model_parallel_size;
    if (m.num_moe_experts > 0 && (ep > 1 || etp != opts.tensor_model_parallel_size))
      std::printf("  experts: %d ranks a stage = expert tensor %d x expert %d x expert data %d "
                  "(%d experts a rank)\n",
                  world.size() / opts.pipeline_model_parallel_size, etp, ep,
                  world.size() / (opts.pipeline_model_parallel_size * etp * ep),
                  m.num_moe_experts / ep);
  }
  std::fflush(stdout);

  if (tokenizer && info) std::printf("  tokenizer: %s\n", tokenizer->describe().c_str());
  // GPU ranks train over NCCL/RCCL, its unique id sent over the launcher's world (MPI or
  // torchrun's rendezvous), which keeps the host-side work: the barrier above, the watchdog
  // and ending the job.
  std::unique_ptr<Communicator> gpu_world;
#if defined(OMNITRON_NCCL)
  if (opts.device != "cpu" && world.size() > 1) {
    gpu_world = make_nccl_communicator(world);
    if (info) std::printf("  collectives: %s over the GPUs\n", nccl_version().c_str());
  }
#endif
  Trainer trainer(opts, std::move(data), peak, eod, gpu_world ? gpu_world.get() : &world);
  trainer.set_downstream_evaluation(make_downstream_evaluation(opts, tokenizer.get()));
  if (info || device.device != "cpu") std::printf("  %s\n", trainer.attention_line().c_str());
  if (info && !trainer.gemm_line().empty()) std::printf("  %s\n", trainer.gemm_line().c_str());
  if (!opts.load.empty())
    std::printf("  loaded %s at iteration %lld (%lld samples consumed)%s\n", opts.load.c_str(),
                (long long)latest_checkpoint_iteration(opts.load),
                (long long)trainer.consumed_samples(),
                opts.finetune ? ", --finetune: starting at iteration 0" : "");
  MetricsSink sink(opts);
  TrainResult r = trainer.run(sink);
  const int64_t steps = int64_t(r.train_losses.size());
  if (steps == 0) {
    std::printf("nothing to train: the checkpoint is at iteration %lld and --train-iters is %lld\n",
                (long long)r.last_iteration, (long long)opts.train_iters);
    return 0;
  }
  std::printf("done: %lld iterations (%lld to %lld) in %.1f s, %.0f tokens/s", (long long)steps,
              (long long)r.first_iteration, (long long)r.last_iteration, r.seconds,
              r.tokens_per_sec);
  if (!r.val_losses.empty())
    std::printf(", final validation loss %.4f", r.val_losses.back().second);
  if (!r.exit_reason.empty()) std::printf(", stopped early (%s)", r.exit_reason.c_str());
  std::printf("\n");
  if (!r.saved.empty())
    std::printf("saved checkpoint %s (omnitron generate --load %s)\n", r.saved.back().c_str(),
                opts.save.c_str());
  const bool byte_level = !opts.train_text.empty() || opts.tokenizer.type == "ByteLevelTokenizer";
  if (opts.max_new_tokens > 0 && byte_level && world.size() == 1) {
    SamplingOptions so{opts.temperature, opts.top_k, opts.max_new_tokens,
                       static_cast<uint64_t>(opts.seed)};
    std::printf("\n--- sample (temperature %.2f, top-k %d) ---\n%s", so.temperature, so.top_k,
                opts.prompt.c_str());
    std::fflush(stdout);
    sample_bytes(trainer.model(), opts.prompt, so, [](char c) {
      std::fputc(c, stdout);
      std::fflush(stdout);
    });
    std::printf("\n---\n");
  }
  return 0;
}

int generate(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "usage: omnitron generate --load DIR [--prompt TEXT] [--temperature X] [--top-k N] "
        "[--max-new-tokens N] [--seed N]\n");
    return 0;
  }
  Options opts;
  parse_options(args, opts);
  OMNI_REQUIRE(!opts.load.empty(),
               "generate needs --load DIR (a checkpoint directory written by train --save)");
  // Decoding runs on the CPU: a GPU asked for by name is refused, as before any work.
  OMNI_REQUIRE(resolve_device(opts.device).device.kind == DeviceKind::CPU || opts.device == "auto",
               "--device ", opts.device,
               ": generate decodes on the CPU in this version; use "
               "--device cpu or auto");
  load_checkpoint_model_options(opts.load, opts);  // the latest iteration's model
  opts.model.vocab_size = opts.model.vocab_size ? opts.model.vocab_size : 256;
  GPTModel<float> model(opts.model, 1, static_cast<uint64_t>(opts.seed));
  load_checkpoint(opts.load, model.params(), nullptr);
  OMNI_REQUIRE(opts.model.vocab_size == 256,
               "generate decodes byte-level models only for now (this model has vocabulary ",
               opts.model.vocab_size, ")");
  SamplingOptions so{opts.temperature, opts.top_k, opts.max_new_tokens,
                     static_cast<uint64_t>(opts.seed)};
  std::fputs(opts.prompt.c_str(), stdout);
  sample_bytes(model, opts.prompt, so, [](char c) {
    std::fputc(c, stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace omni::cli
