// The options of one `omnitron train` (or `data-samples`, or `--print-config`) run, resolved
// in one place from its command line, so every command checks values the same way:
//   1. no data and no --load: the demo's preset (demo_args()) goes first;
//   2. --load DIR (or --auto-continue-train's --save DIR when it holds a checkpoint): the
//      checkpoint's model options go under the command line (over it with
//      --use-checkpoint-args), and a Hugging Face directory brings its tokenizer;
//   3. the command line, parsed once over those;
//   4. the tokenizer, which sets the vocabulary size, and the parallel layout;
//   5. finalize()'s checks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/options.h"
#include "data/tokenizers/tokenizer.h"

namespace omni {

struct RunOptions {
  Options opts;                          // finalized
  std::unique_ptr<Tokenizer> tokenizer;  // null without --tokenizer-type
  bool demo = false;                     // no data named: the demo's preset was used
};

// `args` is the command line after --config's YAML and the environment were merged into it.
RunOptions resolve_run_options(const std::vector<std::string>& args, int world_size);
// The same, given `named`: `args` parsed alone (parse_options onto default Options), which a
// command that checks the command line before resolving it (train's layout check) already
// holds, so that the command line is parsed once. Without a preset (demo or checkpoint
// options) to go under it, `named` is the run's options, and nothing is parsed again.
RunOptions resolve_run_options(const std::vector<std::string>& args, Options named,
                               int world_size);

// `omnitron train` without data options: the demo's flags (any flag given still wins).
std::vector<std::string> demo_args();

// The tokenizer --tokenizer-type names (null when none); sets the model's vocabulary size
// from it.
std::unique_ptr<Tokenizer> open_tokenizer(Options& opts);

}  // namespace omni
