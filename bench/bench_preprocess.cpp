// Preprocessing throughput: `omnitron preprocess` on a synthetic jsonl (made once, kept in
// /tmp), with the GPT-2 tokenizer when data/tokenizers/gpt2/{vocab.json,merges.txt} exist
// (scripts/fetch_tokenizers.sh), else the byte-level tokenizer. Prints MB/s, documents/s and
// peak resident memory; never passes or fails on time.
//
//   build/bench_preprocess [--size-mb N (1024)] [--workers N (0: all cores)]
//                          [--tokenizer-dir DIR (data/tokenizers/gpt2)] [--keep-output]
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "data/preprocess/preprocess.h"
#include "data/tokenizers/tokenizer.h"

namespace {

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

// Documents of 50..2000 words drawn from a small vocabulary, with some punctuation, digits,
// escapes and non-ASCII text so that the JSON decoder and the tokenizer both have work to do.
void make_corpus(const std::string& path, int64_t bytes) {
  static const char* kWords[] = {
      "the",    "of",    "and",      "to",       "in",       "a",        "is",    "that",
      "for",    "it",    "as",       "was",      "with",     "be",       "by",    "on",
      "not",    "he",    "this",     "are",      "or",       "his",      "from",  "at",
      "which",  "but",   "have",     "an",       "had",      "they",     "you",   "were",
      "their",  "one",   "all",      "we",       "can",      "her",      "has",   "there",
      "been",   "if",    "more",     "when",     "will",     "would",    "who",   "so",
      "model",  "data",  "training", "parallel", "gradient", "tensor",   "layer", "token",
      "Zürich", "naïve", "café",     "日本語",   "données",  "Ελληνικά", "2024",  "3.14159",
      "don't",  "it's",  "we'll",    "(see",     "above)",   "--",       "e.g.",  "\\\"quoted\\\"",
  };
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::FILE* f = std::fopen((path + ".tmp").c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::mt19937_64 rng(1234);
  std::string line;
  int64_t written = 0;
  for (int64_t doc = 0; written < bytes; ++doc) {
    const int words = 50 + static_cast<int>(rng() % 1950);
    line = "{\"id\": " + std::to_string(doc) + ", \"text\": \"";
    for (int w = 0; w < words; ++w) {
      if (w) line += (rng() % 40 == 0) ? "\\n" : (rng() % 12 == 0 ? ". " : " ");
      line += kWords[rng() % kNumWords];
    }
    line += "\"}\n";
    std::fwrite(line.data(), 1, line.size(), f);
    written += static_cast<int64_t>(line.size());
  }
  std::fclose(f);
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t size_mb = 1024;
  int workers = 0;
  bool keep_output = false;
  std::string tokenizer_dir = "data/tokenizers/gpt2";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size-mb" && i + 1 < argc)
      size_mb = std::atoll(argv[++i]);
    else if (a == "--workers" && i + 1 < argc)
      workers = std::atoi(argv[++i]);
    else if (a == "--tokenizer-dir" && i + 1 < argc)
      tokenizer_dir = argv[++i];
    else if (a == "--keep-output")
      keep_output = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_preprocess [--size-mb N] [--workers N] [--tokenizer-dir DIR] "
                   "[--keep-output]\n");
      return 2;
    }
  }

  const std::string corpus =
      "/tmp/omnitron_bench_preprocess_" + std::to_string(size_mb) + "mb.jsonl";
  if (!std::filesystem::exists(corpus)) {
    std::printf("generating %s (%lld MiB)...\n", corpus.c_str(), static_cast<long long>(size_mb));
    std::fflush(stdout);
    make_corpus(corpus, size_mb << 20);
  }

  omni::TokenizerOptions to;
  const std::string vocab = tokenizer_dir + "/vocab.json", merges = tokenizer_dir + "/merges.txt";
  if (std::filesystem::exists(vocab) && std::filesystem::exists(merges)) {
    to.type = "GPT2BPETokenizer";
    to.vocab_file = vocab;
    to.merge_file = merges;
  } else {
    std::printf(
        "note: no %s and %s (scripts/fetch_tokenizers.sh): using the byte-level tokenizer\n",
        vocab.c_str(), merges.c_str());
    to.type = "ByteLevelTokenizer";
  }
  const std::unique_ptr<omni::Tokenizer> tokenizer = omni::make_tokenizer(to);

  omni::PreprocessConfig config;
  config.input = corpus;
  config.output_prefix = "/tmp/omnitron_bench_preprocess_out";
  config.append_eod = tokenizer->eod().has_value();
  config.workers = workers;
  const double rss_before = peak_rss_mib();
  const omni::PreprocessStats stats = omni::preprocess(config, *tokenizer, {});
  const omni::PreprocessProgress& p = stats.progress;
  const omni::PreprocessOutput& out = stats.outputs.at(0);
  std::printf("bench_preprocess: %s, %.1f MB jsonl, %lld documents, %lld tokens (%s)\n",
              tokenizer->describe().c_str(), p.bytes_read / 1e6,
              static_cast<long long>(p.documents), static_cast<long long>(out.tokens),
              omni::indexed_dtype_name(stats.dtype));
  std::printf(
      "  %d workers (%u hardware threads): %.2f s, %.1f MB/s, %.0f documents/s, "
      "%.2f M tokens/s\n",
      stats.workers, std::thread::hardware_concurrency(), p.seconds, p.mb_per_second(),
      p.documents / p.seconds, out.tokens / p.seconds / 1e6);
  std::printf("  peak RSS %.1f MiB (%.1f MiB before preprocessing: tokenizer and process)\n",
              peak_rss_mib(), rss_before);
  if (!keep_output)
    for (const char* ext : {".bin", ".idx"}) std::filesystem::remove(out.prefix + ext);
  return 0;
}
