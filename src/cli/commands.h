#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"
#include "data/datasets/dataset.h"
#include "data/tokenizers/tokenizer.h"

namespace omni::cli {

inline bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// The training data the options name: --mock-data, --data-path/--data-file-list, or
// --train-text (the demo corpus when none is given). `eod`: the end-of-document token that
// --mock-data closes its documents with (end_of_document()).
std::unique_ptr<TrainingData> open_training_data(Options& opts, std::optional<int32_t> eod);
// The end-of-document token: the tokenizer's, or --mock-data's own (its last id) without one.
std::optional<int32_t> end_of_document(const Options& opts, const Tokenizer* tokenizer);
int data_samples(const std::vector<std::string>& args);
int preprocess(const std::vector<std::string>& args);
int merge_datasets(const std::vector<std::string>& args);

int train(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int info(const std::vector<std::string>& args);
int convert(const std::vector<std::string>& args);   // cmd_convert.cpp
int plot(const std::vector<std::string>& args);      // cmd_plot.cpp
int evaluate(const std::vector<std::string>& args);  // cmd_evaluate.cpp
int plan(const std::vector<std::string>& args);      // cmd_plan.cpp

// The command line with --config's YAML, --model's zoo file and the environment merged in
// (cmd_train.cpp); nothing after --print-config, which printed them.
std::optional<std::vector<std::string>> with_config(const std::vector<std::string>& raw,
                                                    int world_size);

}  // namespace omni::cli
