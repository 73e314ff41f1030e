// The omnitron binary. Library code throws; this is the one place that turns an
// exception into a one-line message and an exit code (DESIGN.md invariant 7).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/device.h"
#include "base/error.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "config/options.h"

namespace {

const char* kUsage =
    "usage: omnitron <command> [options]\n"
    "\n"
    "commands:\n"
    "  train           train a model (without --train-text, --data-path or --mock-data: the\n"
    "                  demo, a byte-level GPT on the King James Bible; flags override it)\n"
    "  generate        sample text from weights saved by train --save (--load DIR --prompt T)\n"
    "  preprocess      tokenise jsonl/text into Megatron .bin/.idx (as preprocess_data.py)\n"
    "  merge-datasets  concatenate .bin/.idx datasets (as merge_datasets.py)\n"
    "  data-samples    the first training samples and their token ids, in training order\n"
    "  convert         between omnitron checkpoints and Hugging Face safetensors + config.json\n"
    "  evaluate        score a model on multiple-choice tasks (--load DIR --task FILE): acc,\n"
    "                  acc_norm, as lm-evaluation-harness; HellaSwag and ARC files read as is\n"
    "  plot            a run's loss and throughput curves (--metrics-file) as an HTML page\n"
    "  plan            per-rank memory and predicted step time of a layout on a machine\n"
    "                  (H100, MI300X, ..., cpu); --search --gpus N: the fastest layouts that fit\n"
    "  info            devices, BLAS, GPU backend and the measured peak used for MFU\n"
    "  help            this text and every option\n"
    "\n"
    "Options use Megatron-LM's spelling (--num-layers, --hidden-size, --lr, ...).\n";

// The one-line message, with this rank's place when there are several, then every rank of
// the job ends at once (the failing rank's peers would otherwise wait in a collective forever).
int fail(const std::string& cmd, const char* kind, const char* what, int code) {
  std::string where;
  try {
    const omni::Communicator& world = omni::world_communicator();
    if (world.size() > 1)
      where =
          " [rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) + "]";
  } catch (const std::exception&) {
    // The world itself failed to start (the message says why): report without a rank.
  }
  std::fprintf(stderr, "omnitron %s%s: %s: %s\n", cmd.c_str(), where.c_str(), kind, what);
  omni::abort_world(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  omni::ensure_runtime_environment(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string cmd = args.empty() ? "help" : args[0];
  if (!args.empty()) args.erase(args.begin());
  try {
    if (cmd == "train") return omni::cli::train(args);
    if (cmd == "generate") return omni::cli::generate(args);
    if (cmd == "info") return omni::cli::info(args);
    if (cmd == "data-samples") return omni::cli::data_samples(args);
    if (cmd == "preprocess") return omni::cli::preprocess(args);
    if (cmd == "merge-datasets") return omni::cli::merge_datasets(args);
    if (cmd == "convert") return omni::cli::convert(args);
    if (cmd == "plot") return omni::cli::plot(args);
    if (cmd == "evaluate") return omni::cli::evaluate(args);
    if (cmd == "plan") return omni::cli::plan(args);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      std::printf("%s\noptions:%s", kUsage, omni::options_help().c_str());
      return 0;
    }
    std::fprintf(stderr, "omnitron: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const omni::UsageError& e) {
    return fail(cmd, "error", e.what(), 2);
  } catch (const std::exception& e) {
    return fail(cmd, "internal error", e.what(), 1);
  }
}
