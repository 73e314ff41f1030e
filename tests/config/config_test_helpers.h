// Helpers of the config tests: a fresh directory per test for the YAML files it writes, the
// message of an expected UsageError, and the features a refusal names.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "base/error.h"

namespace omni {

class YamlFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string(info->test_suite_name()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::filesystem::path p = dir_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::filesystem::path dir_;
};

inline std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UsageError";
  return "";
}

// The features a command line is refused for, from its error ("FLAGS: not built yet: F; ...").
inline std::set<std::string> refused_features(const std::string& error) {
  std::set<std::string> features;
  const std::string mark = ": not built yet: ";
  for (size_t at = error.find(mark); at != std::string::npos; at = error.find(mark, at + 1)) {
    const size_t start = at + mark.size(), end = error.find("; ", start);
    features.insert(error.substr(start, end == std::string::npos ? end : end - start));
  }
  return features;
}

}  // namespace omni
