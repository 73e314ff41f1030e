// Helpers of the Hugging Face interchange tests: the fixture directories that
// tests/fixtures/make_hf_fixtures.py and make_hf_deepseek_fixtures.py write, their float64
// PyTorch reference logits, models loaded from a directory as `omnitron train --load DIR`
// loads them, and copies with an edited config.json for the refusals.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_interchange.h"
#include "checkpoint/safetensors.h"
#include "config/options.h"
#include "model/gpt_model.h"

namespace hf_test {

inline const std::string kHf = std::string(OMNITRON_FIXTURE_DIR) + "/hf/";

inline std::string fresh_dir(const std::string& name) {
  // The process id keeps two tests that ctest runs at once out of each other's folders.
  const std::string dir =
      ::testing::TempDir() + "omnitron_hf_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int batch = 0, seq = 0, vocab = 0;
};

inline Reference reference(const std::string& name) {
  const omni::SafetensorsFile f(kHf + name + ".reference.safetensors");
  Reference r;
  const omni::SafetensorsTensor& t = *f.find("tokens");
  const omni::SafetensorsTensor& l = *f.find("logits");
  r.batch = int(t.shape[0]), r.seq = int(t.shape[1]), r.vocab = int(l.shape[2]);
  std::vector<float> tok(size_t(t.numel()));
  omni::read_as_f32(t, tok.data());
  for (float v : tok) r.tokens.push_back(int32_t(v));
  r.logits.resize(size_t(l.numel()));
  omni::read_as_f32(l, r.logits.data());
  return r;
}

// A model built from `dir`'s options (a Hugging Face directory or our checkpoint) and
// loaded from it, as `omnitron train --load DIR` does.
inline std::unique_ptr<omni::GPTModel<float>> load_model(const std::string& dir,
                                                         omni::Options* out = nullptr) {
  omni::Options o;
  omni::load_checkpoint_model_options(dir, o);
  auto m = std::make_unique<omni::GPTModel<float>>(o.model, 2, 1234);
  omni::load_checkpoint(dir, m->params(), nullptr);
  if (out) *out = o;
  return m;
}

inline std::vector<float> values(const omni::GPTModel<float>& m) {
  const auto& p = m.params();
  return std::vector<float>(p.values(), p.values() + p.size());
}

// The largest error of the loaded fixture's logits against the reference, relative to
// max(1, |reference|).
inline double max_logit_error(const std::string& name) {
  const Reference r = reference(name);
  auto m = load_model(kHf + name);
  EXPECT_EQ(m->config().vocab_size, r.vocab);
  const std::vector<float> got = m->forward_logits(r.tokens.data(), r.batch, r.seq);
  EXPECT_EQ(got.size(), r.logits.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < r.logits.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - r.logits[i]) /
                                std::max(1.0, std::abs(double(r.logits[i]))));
  std::printf("%s: max relative logit error vs the PyTorch reference %.3g\n", name.c_str(), worst);
  return worst;
}

// A copy of a fixture directory whose config.json has each (from, to) replacement applied.
inline std::string edited_copy(const std::string& name,
                               const std::vector<std::pair<std::string, std::string>>& edits) {
  const std::string dir = fresh_dir("edited_" + name);
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(kHf + name))
    std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string());
  std::stringstream ss;
  ss << std::ifstream(dir + "/config.json").rdbuf();
  std::string text = ss.str();
  for (const auto& [from, to] : edits) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
  }
  std::ofstream(dir + "/config.json") << text;
  return dir;
}

inline std::string edited_copy(const std::string& name, const std::string& from,
                               const std::string& to) {
  return edited_copy(name, {{from, to}});
}

// Loading `dir` stops with a one-line UsageError that contains `expected`.
inline void expect_load_error(const std::string& dir, const std::string& expected) {
  try {
    load_model(dir);
    ADD_FAILURE() << "no error; expected " << expected;
  } catch (const omni::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(expected), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace hf_test
