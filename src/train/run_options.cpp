#include "train/run_options.h"

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_interchange.h"
#include "comm/process_grid.h"
#include "data/datasets/dataset.h"

namespace omni {

// A small GPT (rotary positions, which learn far faster than a learned table at this size)
// byte by byte on the King James Bible, sized to reach a validation loss under 1.45
// nats/byte in under 5 minutes on 2 cores.
std::vector<std::string> demo_args() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string save = ec ? "demo-model" : (exe.parent_path() / "demo-model").string();
  return {"--data-path",
          demo_dataset_prefix(),
          "--tokenizer-type",
          "ByteLevelTokenizer",
          "--num-layers",
          "4",
          "--hidden-size",
          "256",
          "--num-attention-heads",
          "4",
          "--seq-length",
          "256",
          "--position-embedding-type",
          "rope",
          "--micro-batch-size",
          "16",
          "--train-iters",
          "700",
          "--lr",
          "2e-3",
          "--min-lr",
          "1e-4",
          "--lr-decay-style",
          "cosine",
          "--lr-warmup-iters",
          "40",
          "--adam-beta2",
          "0.95",
          "--weight-decay",
          "0.1",
          "--log-interval",
          "50",
          "--eval-interval",
          "100",
          "--eval-iters",
          "20",
          "--hidden-dropout",  // the demo's learning curve, measured without dropout
          "0",
          "--attention-dropout",
          "0",
          "--save",
          save};
}

std::unique_ptr<Tokenizer> open_tokenizer(Options& opts) {
  // Megatron's GPT-2 BPE is the one tokenizer that reads a vocab.json and merges.txt pair.
  if (opts.tokenizer.type.empty() && !opts.tokenizer.vocab_file.empty() &&
      !opts.tokenizer.merge_file.empty()) {
    opts.tokenizer.type = "GPT2BPETokenizer";
    opts.notes.push_back(
        "note: --vocab-file with --merge-file and no --tokenizer-type: GPT2BPETokenizer "
        "(GPT-2's byte-level BPE, the tokenizer those two files describe)");
  }
  if (opts.tokenizer.type.empty()) return nullptr;
  opts.tokenizer.vocab_size = opts.model.vocab_size;  // NullTokenizer's size
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(opts.tokenizer);
  // The model embeds what the tokenizer can produce (Megatron pads it afterwards).
  opts.model.vocab_size = static_cast<int>(tokenizer->vocab_size());
  return tokenizer;
}

RunOptions resolve_run_options(const std::vector<std::string>& command_line, int world_size) {
  Options named;
  parse_options(command_line, named);
  return resolve_run_options(command_line, std::move(named), world_size);
}

RunOptions resolve_run_options(const std::vector<std::string>& command_line, Options parsed,
                               int world_size) {
  RunOptions run;
  Options named = parsed;  // what the command line names: its data and its checkpoint
  // Primus's auto_continue_train: a --save that holds a checkpoint is resumed, with its
  // optimizer and its options, as Primus's trainer sets load, finetune, no_load_optim and
  // use_checkpoint_args; without one, the run starts afresh.
  std::vector<std::string> args = command_line;
  const bool resume = named.auto_continue_train && !named.save.empty() &&
                      std::filesystem::exists(std::filesystem::path(named.save) /
                                              "latest_checkpointed_iteration.txt");
  if (resume) {
    args.insert(args.end(), {"--load", named.save, "--use-checkpoint-args"});
    named.load = named.save;
    named.use_checkpoint_args = true;
  }
  // Megatron's first run (or a re-queued job's) with --load DIR before DIR holds a
  // checkpoint: warn and start from random, unless --exit-on-missing-checkpoint.
  std::string missing_load;
  if (!named.load.empty() && !holds_checkpoint(named.load)) {
    OMNI_REQUIRE(!named.exit_on_missing_checkpoint,
                 "--exit-on-missing-checkpoint: no checkpoint was found under --load '", named.load,
                 "' (missing ", latest_iteration_file(named.load), ")");
    missing_load = named.load;
    named.load.clear();
  }
  run.demo = !named.mock_data && named.train_text.empty() && named.data_path.empty() &&
             named.data_file_list.empty() && named.data_args_path.empty() &&
             !named.per_split_data() && named.load.empty();
  std::vector<std::string> all = run.demo ? demo_args() : std::vector<std::string>{};
  std::vector<std::string> from_checkpoint;
  if (!named.load.empty()) from_checkpoint = checkpoint_model_args(named.load);
  all.insert(all.end(), from_checkpoint.begin(), from_checkpoint.end());
  all.insert(all.end(), args.begin(), args.end());
  if (named.use_checkpoint_args)  // Megatron: the checkpoint's model options win
    all.insert(all.end(), from_checkpoint.begin(), from_checkpoint.end());
  Options& o = run.opts;
  if (all == command_line)  // nothing goes under or over the command line: parsed already
    o = std::move(parsed);
  else
    parse_options(all, o);
  if (resume) o.finetune = o.no_load_optim = false;
  if (!missing_load.empty()) {
    o.load.clear();
    o.notes.push_back("WARNING: could not find the metadata file " +
                      latest_iteration_file(missing_load));
    o.notes.push_back("    will not load any checkpoints and will start from random");
  }
  // A Hugging Face model directory brings its tokenizer too.
  const std::string hf_tokenizer = o.load + "/tokenizer.json";
  if (!o.load.empty() && o.tokenizer.type.empty() && is_hf_model_dir(o.load) &&
      std::filesystem::exists(hf_tokenizer)) {
    o.tokenizer.type = "HuggingFaceTokenizer";
    o.tokenizer.tokenizer_model = hf_tokenizer;
  }
  run.tokenizer = open_tokenizer(o);
  // The parallel layout: data parallel is what the world leaves after TP x CP x PP.
  o.data_parallel_size =
      data_parallel_size(world_size, ParallelLayout{.tp = o.tensor_model_parallel_size,
                                                    .cp = o.context_parallel_size,
                                                    .ep = o.expert_model_parallel_size,
                                                    .pp = o.pipeline_model_parallel_size,
                                                    .etp = built_expert_tensor_parallel_size(o)});
  finalize(o);
  return run;
}

}  // namespace omni
