// The demo model against a downstream task built from its own corpus, through the binary:
// trained briefly on the King James Bible it tells a word's true ending from three others
// well above chance, and the untrained model (the same run's iteration 0) picks at chance.
//
// The task (kjv_spelling), written here from data/kjv.txt at test time: each example is a
// verse, as the corpus lays it out, up to the first two letters of one of its words (five
// letters or more, lower case, followed by a space or punctuation); the choices are that
// word's true rest and the rests of three other words of the same length from other
// chapters (all four the same number of bytes, so a model that knows nothing has no length
// to go by: chance is 1/4). The corpus is found as the demo finds it ($OMNITRON_DATA_DIR,
// then data/ of the checkout, where scripts/setup.sh writes it); the test skips, saying
// where it looked, without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/process.h"
#include "base/json.h"

namespace {

namespace fs = std::filesystem;

// The directory that holds kjv.txt, or empty; `looked` says where it looked.
fs::path find_corpus_dir(std::string& looked) {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("OMNITRON_DATA_DIR")) dirs.emplace_back(env);
  dirs.push_back(fs::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path() / "data");
  for (const fs::path& d : dirs) {
    looked += (looked.empty() ? "" : ", ") + (d / "kjv.txt").string();
    std::error_code ec;
    if (fs::file_size(d / "kjv.txt", ec) > 1000000 && !ec) return d;
  }
  return {};
}

// SplitMix64: the same sequence on every platform (std's distributions are not).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

struct Word {
  size_t verse;  // offset of the verse's first byte ("  N ...")
  size_t at;     // offset of the word
  size_t length;
  int chapter;
};

bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Every word a question can be asked about: in a verse, at least 20 bytes after its start
// and at most 100, 5 letters or more, starting lower case, after a space or line break and
// before a space, a line break or punctuation.
std::vector<Word> candidate_words(const std::string& text) {
  std::vector<Word> words;
  int chapter = 0;
  size_t verse = std::string::npos;
  bool after_blank = true;
  for (size_t line = 0; line < text.size();) {
    size_t end = text.find('\n', line);
    if (end == std::string::npos) end = text.size();
    const bool blank = end == line;
    if (blank) {
      verse = std::string::npos;
    } else if (text.compare(line, 2, "  ") == 0 && line + 2 < end && text[line + 2] >= '0' &&
               text[line + 2] <= '9') {
      verse = line;
    } else if (after_blank) {
      ++chapter;  // "Genesis 1", "Song of Solomon 2", between blank lines
      verse = std::string::npos;
    }
    if (verse != std::string::npos) {
      for (size_t i = line; i < end;) {
        if (!is_letter(text[i])) {
          ++i;
          continue;
        }
        size_t j = i;
        while (j < end && is_letter(text[j])) ++j;
        const char before = i > 0 ? text[i - 1] : '\n';
        const char after = j < text.size() ? text[j] : '\n';
        if (j - i >= 5 && text[i] >= 'a' && text[i] <= 'z' && (before == ' ' || before == '\n') &&
            std::string(" \n,.;:?!").find(after) != std::string::npos && i - verse >= 20 &&
            i - verse <= 100)
          words.push_back({verse, i, j - i, chapter});
        i = j;
      }
    }
    after_blank = blank;
    line = end + 1;
  }
  return words;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += {'\\', c};
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out + "\"";
}

// Writes `examples` rows of {context, choices, label, target_delimiter: ""} to `path`.
int write_spelling_task(const std::string& text, const std::string& path, int examples,
                        uint64_t seed) {
  constexpr size_t kPrefix = 2;
  const std::vector<Word> words = candidate_words(text);
  std::map<size_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < words.size(); ++i) by_length[words[i].length].push_back(i);
  Rng rng{seed};
  std::ofstream out(path);
  std::set<size_t> used;
  int written = 0;
  for (int tries = 0; written < examples && tries < 100 * examples; ++tries) {
    const size_t pick = rng.below(words.size());
    if (!used.insert(pick).second) continue;
    const Word& w = words[pick];
    const std::string rest = text.substr(w.at + kPrefix, w.length - kPrefix);
    const std::vector<size_t>& pool = by_length[w.length];
    std::vector<std::string> others;
    for (int draw = 0; others.size() < 3 && draw < 1000; ++draw) {
      const Word& o = words[pool[rng.below(pool.size())]];
      const std::string other = text.substr(o.at + kPrefix, o.length - kPrefix);
      bool fresh = o.chapter != w.chapter && other != rest;
      for (const std::string& s : others) fresh = fresh && s != other;
      if (fresh) others.push_back(other);
    }
    if (others.size() < 3) continue;
    const size_t label = rng.below(4);
    others.insert(others.begin() + static_cast<std::ptrdiff_t>(label), rest);
    out << "{\"context\": " << json_string(text.substr(w.verse, w.at + kPrefix - w.verse))
        << ", \"choices\": [";
    for (size_t c = 0; c < others.size(); ++c) out << (c ? ", " : "") << json_string(others[c]);
    out << "], \"label\": " << label << ", \"target_delimiter\": \"\"}\n";
    ++written;
  }
  return written;
}

// iteration -> acc of `task` in a --metrics-file.
std::map<int, double> task_acc(const std::string& metrics, const std::string& task) {
  std::map<int, double> acc;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const omni::json::Value v = omni::json::parse(line, metrics);
    if (const omni::json::Value* t = v.find("task"); t && t->str() == task)
      acc[static_cast<int>(v.find("iteration")->num())] = v.find("acc")->num();
  }
  return acc;
}

// 300 examples of 4 choices: chance is 0.25 with a binomial standard deviation of
// sqrt(0.25 * 0.75 / 300) = 0.025. Stated before measuring: the untrained model within
// 3 standard deviations of chance (0.175..0.325); the trained one at 0.45 or more, 8 above.
constexpr int kExamples = 300;
constexpr double kChance = 0.25, kChanceBound = 0.075, kLearned = 0.45;

TEST(KjvTask, TheDemoModelSpellsTheBiblesWordsWellAboveChanceAndARandomOneAtChance) {
  std::string looked;
  const fs::path data = find_corpus_dir(looked);
  if (data.empty())
    GTEST_SKIP() << "the demo corpus is missing (looked for " << looked
                 << "): run scripts/setup.sh";
  const std::string dir = ::testing::TempDir() + "omnitron_cli_kjv_task";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string task = dir + "/kjv_spelling.jsonl";
  ASSERT_EQ(write_spelling_task(read_text((data / "kjv.txt").string()), task, kExamples, 1),
            kExamples);

  // The demo's preset (no data option: the KJV, byte level, rope), smaller and shorter.
  const std::string model =
      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 "
      "--micro-batch-size 16 ";
  const ProcessResult r = run_omnitron_env(
      "OMNITRON_DATA_DIR=" + data.string(),
      "train " + model +
          "--train-iters 300 --lr 3e-3 --lr-warmup-iters 20 --eval-iters 0 --log-interval 100 "
          "--no-progress --max-new-tokens 0 --save " +
          dir + "/model --eval-task kjv_spelling=" + task +
          " --eval-task-interval 300 --metrics-file " + dir + "/metrics.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("training the demo"), std::string::npos) << r.output;
  const std::map<int, double> acc = task_acc(dir + "/metrics.jsonl", "kjv_spelling");
  ASSERT_EQ(acc.size(), 2u) << r.output;
  EXPECT_NEAR(acc.at(0), kChance, kChanceBound) << "untrained\n" << r.output;
  EXPECT_GE(acc.at(300), kLearned) << "after 300 iterations\n" << r.output;

  // `omnitron evaluate` of the saved model gives the score training printed at its end.
  const ProcessResult e =
      run_omnitron("evaluate --load " + dir + "/model --task kjv_spelling=" + task +
                   " --micro-batch-size 16 --metrics-file " + dir + "/evaluate.jsonl");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const std::map<int, double> evaluated = task_acc(dir + "/evaluate.jsonl", "kjv_spelling");
  ASSERT_EQ(evaluated.size(), 1u) << e.output;
  EXPECT_DOUBLE_EQ(evaluated.begin()->second, acc.at(300)) << e.output;
}

}  // namespace
