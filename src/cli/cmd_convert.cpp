// omnitron convert: between omnitron checkpoints and Hugging Face model directories
// (src/checkpoint/hf_interchange.h has the mapping).
#include <cstdio>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_interchange.h"
#include "cli/commands.h"
#include "model/gpt_model.h"

namespace omni::cli {

namespace {

const char* kConvertUsage =
    "usage: omnitron convert --load SRC --save DST [--to hf|omnitron] [--dtype f32|bf16|f16]\n"
    "                        [model flags, e.g. --make-vocab-size-divisible-by N]\n"
    "\n"
    "SRC is an omnitron checkpoint directory (its latest iteration) or a Hugging Face model\n"
    "directory (config.json + model.safetensors or a sharded model.safetensors.index.json)\n"
    "of GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM.\n"
    "  --to       hf: write DST/config.json and DST/model.safetensors; omnitron: write a\n"
    "             model-only checkpoint DST/iter_0000000 (training from it starts at\n"
    "             iteration 0 with a fresh optimizer), from a Hugging Face model or as a\n"
    "             one-rank copy (one model.bin) of a checkpoint any layout saved.\n"
    "             Default: the other kind than SRC.\n"
    "  --dtype    how Hugging Face weights are stored (default f32); omnitron stores f32.\n"
    "Flags of the model group given here override what SRC says (e.g. --seq-length).\n";

// Takes `--name VALUE` or `--name=VALUE` out of args; returns whether it was there.
bool take_value(std::vector<std::string>& args, const std::string& name, std::string& value) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      OMNI_REQUIRE(i + 1 < args.size(), name, " needs a value");
      value = args[i + 1];
      args.erase(args.begin() + long(i), args.begin() + long(i) + 2);
      return true;
    }
    if (args[i].rfind(name + "=", 0) == 0) {
      value = args[i].substr(name.size() + 1);
      args.erase(args.begin() + long(i));
      return true;
    }
  }
  return false;
}

}  // namespace

int convert(const std::vector<std::string>& raw_args) {
  if (wants_help(raw_args)) {
    std::printf("%s", kConvertUsage);
    return 0;
  }
  std::vector<std::string> args = raw_args;
  std::string to, dtype_name = "f32";
  take_value(args, "--to", to);
  const bool dtype_given = take_value(args, "--dtype", dtype_name);
  Options opts;
  parse_options(args, opts);
  OMNI_REQUIRE(!opts.load.empty() && !opts.save.empty(),
               "convert needs --load SRC and --save DST (see omnitron convert --help)");
  const bool from_hf = is_hf_model_dir(opts.load);
  if (to.empty()) to = from_hf ? "omnitron" : "hf";
  OMNI_REQUIRE(to == "hf" || to == "omnitron", "--to: '", to, "' is not one of hf, omnitron");
  OMNI_REQUIRE(!from_hf || to == "omnitron", "--to ", to, ": --load '", opts.load,
               "' is already a Hugging Face model directory");
  const DType dtype = parse_dtype(dtype_name);
  OMNI_REQUIRE(!dtype_given || to == "hf",
               "--dtype applies to --to hf (omnitron checkpoints "
               "hold float32)");

  load_checkpoint_model_options(opts.load, opts);
  parse_options(args, opts);  // flags on the command line win
  opts.model.validate();
  // Activation memory is allocated on a model's first forward pass, which convert never runs.
  GPTModel<float> model(opts.model, 1, static_cast<uint64_t>(opts.seed));
  load_checkpoint(opts.load, model.params(), nullptr);
  const long long params = (long long)opts.model.num_parameters();
  if (to == "hf") {
    save_hf_model(opts.save, opts.model, model.params(), dtype);
    std::printf("converted %s (iteration %lld, %lld parameters) to Hugging Face %s weights in %s\n",
                opts.load.c_str(), (long long)latest_checkpoint_iteration(opts.load), params,
                dtype_name.c_str(), opts.save.c_str());
  } else {
    const std::string dir = save_model_checkpoint(opts.save, opts, model.params());
    std::printf("converted %s %s (%lld parameters) to %s\n",
                from_hf ? "Hugging Face model" : "checkpoint", opts.load.c_str(), params,
                dir.c_str());
  }
  return 0;
}

}  // namespace omni::cli
