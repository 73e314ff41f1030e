#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/options.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace omni::cli {

inline bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// The training data the options name: --mock-data, --data-path/--data-file-list, or
// --train-text (the demo corpus when none is given).
std::unique_ptr<TrainingData> open_training_data(Options& opts);
int data_samples(const std::vector<std::string>& args);
int preprocess(const std::vector<std::string>& args);
int merge_datasets(const std::vector<std::string>& args);

int train(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int info(const std::vector<std::string>& args);
int convert(const std::vector<std::string>& args);   // cmd_convert.cpp
int plot(const std::vector<std::string>& args);      // cmd_plot.cpp
int evaluate(const std::vector<std::string>& args);  // cmd_evaluate.cpp

}  // namespace omni::cli
