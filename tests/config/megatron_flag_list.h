// Megatron-LM's flags as test data (tests/fixtures/megatron_flags.tsv).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace omni {

struct MegatronFlag {
  std::string flag;
  bool takes_value;
  std::vector<std::string> test_value;  // the words after the flag
};

inline std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

inline std::vector<MegatronFlag> megatron_flags() {
  std::ifstream in(std::string(OMNITRON_FIXTURE_DIR) + "/megatron_flags.tsv");
  std::vector<MegatronFlag> flags;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string flag, takes, value;
    std::getline(fields, flag, '\t');
    std::getline(fields, takes, '\t');
    std::getline(fields, value, '\t');
    flags.push_back(
        {flag, takes == "yes", takes == "yes" ? words(value) : std::vector<std::string>{}});
  }
  return flags;
}

}  // namespace omni
