// omnitron evaluate: a model's scores on multiple-choice tasks (train/downstream_eval.h),
// from a checkpoint or a Hugging Face directory (--load), or as initialised from --seed
// (the chance baseline), under any parallel layout the options and launcher give.
#include <cstdio>

#include "backend/device_selection.h"
#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "train/downstream_eval.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace omni::cli {

namespace {

const char* const kHelp =
    "usage: omnitron evaluate [--load DIR] --task [NAME=]FILE[,...] [options]\n"
    "\n"
    "Scores a model on multiple-choice tasks by the log-likelihood of each choice given\n"
    "its context, as lm-evaluation-harness: acc (the largest summed log-likelihood is the\n"
    "right choice) and acc_norm (divided by the choice's length in bytes first). A task is\n"
    "JSON lines of {\"context\", \"choices\", \"label\"}, or HellaSwag's or ARC's published\n"
    "rows, read as they are. --load takes an omnitron checkpoint or a Hugging Face model\n"
    "directory (with its tokenizer.json, or --tokenizer-type); without --load the model is\n"
    "the one the options describe, as initialised from --seed. Under mpirun, the layout\n"
    "options (--tensor-model-parallel-size, ...) split the model as training does; the\n"
    "scores do not depend on them. --eval-task-samples FILE writes every example's\n"
    "log-likelihoods, --metrics-file and --tensorboard-dir the scores, --eval-task-limit N\n"
    "scores the first N examples, --micro-batch-size sets how many choices run together.\n";

}  // namespace

int evaluate(const std::vector<std::string>& raw_args) {
  if (wants_help(raw_args)) {
    std::printf("%s", kHelp);
    return 0;
  }
  Communicator& world = world_communicator();
  if (world.rank() != 0)
    OMNI_CHECK(std::freopen("/dev/null", "w", stdout), "cannot silence rank ", world.rank());
  // Training's checks apply to the options; what only training reads gets a harmless value.
  // With --load, no data is read: mock data stands for it (training's checks of data
  // options would otherwise apply to the tokenizer's vocabulary).
  std::vector<std::string> args = {"--train-iters", "1"};
  Options named;
  parse_options(raw_args, named);
  if (!named.load.empty() && !named.mock_data && named.data_path.empty() &&
      named.data_file_list.empty() && named.train_text.empty())
    args.push_back("--mock-data");
  args.insert(args.end(), raw_args.begin(), raw_args.end());
  RunOptions run = resolve_run_options(args, world.size());
  Options& opts = run.opts;
  OMNI_REQUIRE(!opts.eval_task.empty(),
               "evaluate needs --task FILE (jsonl of {context, choices, label}, or HellaSwag's "
               "or ARC's rows)");
  OMNI_REQUIRE(resolve_device(opts.device).device.kind == DeviceKind::CPU || opts.device == "auto",
               "--device ", opts.device,
               ": evaluate runs on the CPU in this version; use "
               "--device cpu or auto");
  opts.device = "cpu";
  opts.no_load_optim = true;  // the weights and the iteration, not the optimizer
  opts.save.clear();
  opts.exit_signal_handler = false;
  opts.progress = false;
  if (world.rank() != 0) {
    opts.metrics_file.clear();
    opts.tensorboard_dir.clear();
    opts.eval_task_samples.clear();
  }
  // The tasks are read and tokenised before the model is built: their errors come first.
  std::unique_ptr<DownstreamEvaluation> evaluation =
      make_downstream_evaluation(opts, run.tokenizer.get());
  Trainer trainer(opts, make_mock_data(opts.model.vocab_size, opts.seed), 0.0,
                  run.tokenizer ? run.tokenizer->eod() : std::nullopt, &world);
  const std::string model =
      opts.load.empty() ? "the model initialised from --seed " + std::to_string(opts.seed)
                        : opts.load + " at iteration " + std::to_string(trainer.iteration());
  std::printf("omnitron evaluate: %s | %lld parameters", model.c_str(),
              (long long)opts.model.num_parameters());
  if (world.size() > 1)
    std::printf(" | %d ranks = tensor %d x context %d x pipeline %d x data %d", world.size(),
                opts.tensor_model_parallel_size, opts.context_parallel_size,
                opts.pipeline_model_parallel_size, opts.data_parallel_size);
  std::printf("\n");
  if (run.tokenizer) std::printf("  tokenizer: %s\n", run.tokenizer->describe().c_str());
  for (const MultipleChoiceTask& t : evaluation->tasks())
    std::printf("  task %s: %zu examples from %s\n", t.name.c_str(), t.examples.size(),
                t.path.c_str());
  std::fflush(stdout);
  MetricsSink sink(opts);
  evaluation->run(trainer, sink);
  return 0;
}

}  // namespace omni::cli
