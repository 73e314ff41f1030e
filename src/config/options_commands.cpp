// omnitron's own commands: preprocess (as Megatron's tools/preprocess_data.py), the
// configuration files, and sampling.
#include "config/option_rows.h"

#include <tuple>

#include "base/error.h"

namespace omni::option_rows {

void add_command_options(std::vector<OptionDef>& t) {
  const std::string P = "preprocess (omnitron preprocess, as Megatron's preprocess_data.py)";
  t.push_back(text("--input", "FILE", P, "jsonl, .jsonl.zst or plain text (one document per line)",
                   [](Options& o) -> std::string& { return o.input; }));
  t.push_back(text("--json-keys", "K[,K]", P, "jsonl fields to tokenise, one output each",
                   [](Options& o) -> std::string& { return o.json_keys; }));
  t.push_back(text("--output-prefix", "PREFIX", P, "writes PREFIX_{key}_document.bin/.idx",
                   [](Options& o) -> std::string& { return o.output_prefix; }));
  t.push_back(toggle("--append-eod", P, "end every document with the tokenizer's eod",
                     [](Options& o) -> bool& { return o.append_eod; }));
  t.push_back(number<int>("--workers", "N", P, "tokenising threads (0: all cores)",
                          [](Options& o) -> int& { return o.workers; }));
  const std::string Y = "configuration files (train, data-samples)";
  for (auto [flag, metavar, help] :
       {std::tuple{"--config", "FILE",
                   "Primus-style YAML (bases:/extends:, model: + overrides:, "
                   "${VAR:default}); command-line flags win"},
        std::tuple{"--print-config", "",
                   "check the options as train does, print them with their files, stop"}}) {
    const std::string f = flag;
    t.push_back(OptionDef{f, metavar, Y, help,
                          [f](Options&, const std::string&) {
                            throw UsageError(f + " is read by train and data-samples only");
                          },
                          [](const Options&) { return std::string(); }});
  }
  const std::string S = "sampling (generate, and the sample after training)";
  t.push_back(text("--prompt", "TEXT", S, "text to continue",
                   [](Options& o) -> std::string& { return o.prompt; }));
  t.push_back(number<double>("--temperature", "X", S, "softmax temperature (0: greedy)",
                             [](Options& o) -> double& { return o.temperature; }));
  t.push_back(number<int>("--top-k", "N", S, "sample among the N likeliest tokens (0: all)",
                          [](Options& o) -> int& { return o.top_k; }));
  t.push_back(number<int>("--max-new-tokens", "N", S,
                          "tokens to generate (0: no sample after training)",
                          [](Options& o) -> int& { return o.max_new_tokens; }));
}

}  // namespace omni::option_rows
