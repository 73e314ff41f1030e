#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "base/philox.h"
#include "data/datasets/dataset.h"
#include "data/datasets/indexed_dataset.h"

namespace omni {

namespace {

// Megatron's MockGPTDataset: documents of 1 to 4095 tokens, each closed by the
// end-of-document token (so --eod-mask-loss and --reset-* have boundaries to act on). Its
// tokens count up; ours are uniform random other than the end-of-document token. Sample i
// is seq + 1 tokens drawn from (seed, i) alone, starting inside a document.
class MockData final : public TrainingData {
 public:
  MockData(int vocab, uint64_t seed, int32_t eod)
      : vocab_(vocab), seed_(seed), eod_(eod >= 0 && eod < vocab ? eod : vocab - 1) {}
  void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    fill(first, count, seq, tokens, labels, 0);
  }
  void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    fill(first, count, seq, tokens, labels, 1);
  }
  std::string describe() const override {
    return "mock data: uniform random tokens, vocabulary " + std::to_string(vocab_) +
           ", documents of 1 to " + std::to_string(kMaxDocument - 1) +
           " tokens closed by end-of-document token " + std::to_string(eod_);
  }

 private:
  static constexpr uint64_t kMaxDocument = 4096;  // Megatron's max_sequence_length (exclusive)

  void fill(int64_t first, int count, int seq, int32_t* tokens, int32_t* labels,
            uint64_t stream) const {
    std::vector<int32_t> sample(size_t(seq) + 1);
    for (int s = 0; s < count; ++s) {
      PhiloxStream rng(seed_ ^ (stream << 62), static_cast<uint64_t>(first + s));
      // Tokens left in the document the sample starts in, its end-of-document token included.
      uint64_t left = 1 + rng.next_below(1 + rng.next_below(kMaxDocument - 1));
      for (int32_t& token : sample) {
        if (--left == 0) {
          token = eod_;
          left = 1 + rng.next_below(kMaxDocument - 1);
        } else {
          const auto t = static_cast<int32_t>(rng.next_below(uint64_t(vocab_) - 1));
          token = t < eod_ ? t : t + 1;  // every id but the end-of-document one
        }
      }
      std::copy(sample.begin(), sample.end() - 1, tokens + size_t(s) * seq);
      std::copy(sample.begin() + 1, sample.end(), labels + size_t(s) * seq);
    }
  }
  int vocab_;
  uint64_t seed_;
  int32_t eod_;
};

class ByteTextData final : public TrainingData {
 public:
  ByteTextData(std::string path, std::string bytes, size_t train_end, size_t valid_end,
               uint64_t seed)
      : path_(std::move(path)),
        bytes_(std::move(bytes)),
        train_end_(train_end),
        valid_end_(valid_end),
        seed_(seed) {}

  // Training sample i starts at a position drawn from (seed, i) alone.
  void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    for (int s = 0; s < count; ++s) {
      PhiloxStream rng(seed_, static_cast<uint64_t>(first + s));
      size_t start = rng.next_below(train_end_ - seq);
      copy(start, seq, tokens + size_t(s) * seq, labels + size_t(s) * seq);
    }
  }
  // Validation sample i is the i-th consecutive window of the validation part.
  void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    const size_t windows = (valid_end_ - train_end_ - 1) / seq;
    for (int s = 0; s < count; ++s) {
      size_t start = train_end_ + (static_cast<size_t>(first + s) % windows) * seq;
      copy(start, seq, tokens + size_t(s) * seq, labels + size_t(s) * seq);
    }
  }
  std::string describe() const override {
    std::ostringstream os;
    os << path_ << ": " << bytes_.size() << " bytes, byte-level tokens; " << train_end_
       << " train, " << valid_end_ - train_end_ << " validation";
    return os.str();
  }

 private:
  void copy(size_t start, int seq, int32_t* tokens, int32_t* labels) const {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes_.data()) + start;
    for (int t = 0; t < seq; ++t) {
      tokens[t] = b[t];
      labels[t] = b[t + 1];
    }
  }
  std::string path_, bytes_;
  size_t train_end_, valid_end_;
  uint64_t seed_;
};

std::vector<double> parse_split(const std::string& split) {
  std::vector<double> w;
  std::stringstream ss(split);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    double v = std::strtod(part.c_str(), &end);
    OMNI_REQUIRE(!part.empty() && *end == '\0' && v >= 0, "--split: '", split,
                 "' is not a comma-separated list of non-negative weights");
    w.push_back(v);
  }
  while (w.size() < 3) w.push_back(0.0);
  OMNI_REQUIRE(w.size() == 3 && w[0] + w[1] + w[2] > 0, "--split: '", split,
               "' needs up to three weights (train, validation, test) with a positive sum");
  return w;
}

}  // namespace

std::unique_ptr<TrainingData> make_mock_data(int vocab, uint64_t seed, int32_t eod) {
  return std::make_unique<MockData>(vocab, seed, eod);
}

std::unique_ptr<TrainingData> make_byte_text_data(const std::string& path, const std::string& split,
                                                  int seq, uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  OMNI_REQUIRE(in, "--train-text: cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<double> w = parse_split(split);
  const double total = w[0] + w[1] + w[2];
  const size_t train_end = static_cast<size_t>(bytes.size() * (w[0] / total));
  const size_t valid_end = static_cast<size_t>(bytes.size() * ((w[0] + w[1]) / total));
  OMNI_REQUIRE(train_end > size_t(seq) + 1, "--train-text: '", path, "' has ", train_end,
               " training bytes, fewer than one sample of --seq-length ", seq, " + 1");
  OMNI_REQUIRE(valid_end - train_end > size_t(seq) + 1, "--train-text: the validation part of '",
               path, "' (", valid_end - train_end, " bytes by --split ", split,
               ") is shorter than one sample of --seq-length ", seq, " + 1");
  return std::make_unique<ByteTextData>(path, std::move(bytes), train_end, valid_end, seed);
}

std::string demo_corpus_path() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("OMNITRON_DATA_DIR"))
    candidates.push_back(fs::path(dir) / "kjv.txt");
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  fs::path data_dir = ec ? fs::current_path() / "data" : exe.parent_path().parent_path() / "data";
  candidates.push_back(data_dir / "kjv.txt");
  for (const fs::path& p : candidates)
    if (fs::exists(p) && fs::file_size(p) > 0) return p.string();

  // Decode it from Debian's bible-kjv-text with the package's reader.
  const fs::path target = candidates.back();
  OMNI_REQUIRE(std::system("command -v bible >/dev/null 2>&1") == 0, "the demo corpus is missing (",
               target.string(),
               ") and Debian's `bible` program is not installed: run scripts/setup.sh "
               "(apt-get install bible-kjv bible-kjv-text), or pass --train-text FILE");
  fs::create_directories(target.parent_path());
  const fs::path tmp = target.string() + ".tmp";
  const std::string cmd = "bible 'Gen1:1-Rev22:21' > '" + tmp.string() + "'";
  OMNI_REQUIRE(std::system(cmd.c_str()) == 0 && fs::file_size(tmp) > 1000000,
               "decoding the demo corpus with `", cmd, "` failed");
  fs::rename(tmp, target);
  return target.string();
}

}  // namespace omni

namespace omni {

// One document per chapter: a chapter starts at its heading line ("Genesis 1",
// "1 Kings 3", "Song of Solomon 2"), and its bytes are its tokens (ByteLevelTokenizer).
std::string demo_dataset_prefix() {
  namespace fs = std::filesystem;
  const fs::path corpus = demo_corpus_path();
  const std::string prefix = (corpus.parent_path() / "kjv_text_document").string();
  if (fs::exists(prefix + ".idx") && fs::exists(prefix + ".bin") &&
      fs::last_write_time(prefix + ".idx") >= fs::last_write_time(corpus))
    return prefix;
  std::ifstream in(corpus, std::ios::binary);
  OMNI_REQUIRE(in, "cannot read the demo corpus ", corpus.string());
  const auto is_heading = [](const std::string& line) {
    // Book name words (an optional leading 1-3), then a chapter number, nothing else.
    const size_t space = line.rfind(' ');
    if (space == std::string::npos || space + 1 == line.size()) return false;
    for (size_t i = space + 1; i < line.size(); ++i)
      if (line[i] < '0' || line[i] > '9') return false;
    for (size_t i = 0; i < space; ++i) {
      const char c = line[i];
      if (!(std::isalpha(static_cast<unsigned char>(c)) || c == ' ' ||
            (i == 0 && c >= '1' && c <= '3')))
        return false;
    }
    return std::isupper(static_cast<unsigned char>(line[line[0] <= '3' ? 2 : 0])) != 0;
  };
  IndexedDatasetWriter writer(prefix, IndexedDtype::kUInt16);
  std::vector<int32_t> doc;
  std::string line;
  while (std::getline(in, line)) {
    if (is_heading(line) && !doc.empty() && doc.size() > 1) {
      writer.add_document(doc);
      doc.clear();
    }
    for (unsigned char c : line) doc.push_back(c);
    doc.push_back('\n');
  }
  if (!doc.empty()) writer.add_document(doc);
  writer.finalize();
  return prefix;
}

}  // namespace omni
