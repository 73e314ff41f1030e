#pragma once

#include <string>
#include <vector>

namespace omni::cli {

int train(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int info(const std::vector<std::string>& args);

}  // namespace omni::cli
