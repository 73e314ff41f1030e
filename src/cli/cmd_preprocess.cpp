// `omnitron preprocess` (Megatron's tools/preprocess_data.py) and `omnitron merge-datasets`
// (tools/merge_datasets.py).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/commands.h"
#include "config/options.h"
#include "data/preprocess/preprocess.h"
#include "data/tokenizers/tokenizer.h"
#include "train/run_options.h"

namespace omni::cli {

namespace {

std::vector<std::string> split_commas(const std::string& list, const char* flag) {
  std::vector<std::string> items;
  size_t begin = 0;
  for (;;) {
    const size_t comma = list.find(',', begin);
    std::string item = list.substr(begin, comma - begin);
    OMNI_REQUIRE(!item.empty(), flag, " '", list, "': empty name in the list");
    items.push_back(std::move(item));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

// One line rewritten in place on a terminal; elsewhere (a log file) a line every ~10 s.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool enabled) : live_(enabled && ::isatty(::fileno(stdout))) {}

  void operator()(const PreprocessProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done) {
      if (printed_live_) std::printf("\n");
      return;
    }
    if (!live_ && now - last_ < std::chrono::seconds(10)) return;
    last_ = now;
    std::printf("%s%lld documents, %.1f MB read, %.1f MB/s%s", live_ ? "\r" : "",
                static_cast<long long>(p.documents), p.bytes_read / 1e6, p.mb_per_second(),
                live_ ? "   " : "\n");
    printed_live_ = live_;
    std::fflush(stdout);
  }

 private:
  bool live_;
  bool printed_live_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

int preprocess(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "usage: omnitron preprocess --input FILE --output-prefix PREFIX --tokenizer-type NAME\n"
        "           [tokenizer files] [--json-keys K[,K...]] [--append-eod] [--workers N]\n"
        "\n"
        "Tokenises a jsonl (one JSON object per line; also .jsonl.zst) or a plain-text file\n"
        "(one document per line) into Megatron's PREFIX_{key}_document.bin/.idx, one per json\n"
        "key: uint16 tokens when the vocabulary is under 65500, else int32. A malformed line\n"
        "stops the run naming FILE:LINE, and no output is written or replaced.\n%s",
        options_help().c_str());
    return 0;
  }
  Options opts;
  parse_options(args, opts);
  OMNI_REQUIRE(!opts.input.empty(), "preprocess needs --input FILE (jsonl, .jsonl.zst or text)");
  OMNI_REQUIRE(!opts.output_prefix.empty(), "preprocess needs --output-prefix PREFIX");
  OMNI_REQUIRE(!opts.tokenizer.type.empty(),
               "preprocess needs --tokenizer-type (e.g. GPT2BPETokenizer with --vocab-file and "
               "--merge-file)");
  OMNI_REQUIRE(opts.workers >= 0, "--workers must be 0 (all cores) or positive (got ", opts.workers,
               ")");
  PreprocessConfig config;
  config.input = opts.input;
  config.output_prefix = opts.output_prefix;
  config.json_keys = split_commas(opts.json_keys, "--json-keys");
  config.append_eod = opts.append_eod;
  config.workers = opts.workers;
  const std::unique_ptr<Tokenizer> tokenizer = open_tokenizer(opts);

  std::printf("omnitron preprocess: %s with %s, keys %s%s\n", config.input.c_str(),
              tokenizer->describe().c_str(), opts.json_keys.c_str(),
              config.append_eod ? ", eod appended" : "");
  std::fflush(stdout);
  ProgressPrinter printer(opts.progress);
  const PreprocessStats stats =
      omni::preprocess(config, *tokenizer, [&](const PreprocessProgress& p) { printer(p); });
  const PreprocessProgress& p = stats.progress;
  std::printf("done: %lld documents, %.1f MB in %.1f s (%.1f MB/s, %.0f documents/s), %d workers\n",
              static_cast<long long>(p.documents), p.bytes_read / 1e6, p.seconds, p.mb_per_second(),
              p.seconds > 0 ? p.documents / p.seconds : 0.0, stats.workers);
  for (const PreprocessOutput& out : stats.outputs)
    std::printf("  %s.bin/.idx: %lld documents, %lld tokens (%s)\n", out.prefix.c_str(),
                static_cast<long long>(out.documents), static_cast<long long>(out.tokens),
                indexed_dtype_name(stats.dtype));
  return 0;
}

int merge_datasets(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "usage: omnitron merge-datasets --input DIR|PREFIX,PREFIX,... --output-prefix PREFIX\n"
        "\n"
        "Concatenates Megatron .bin/.idx datasets of one dtype into PREFIX.bin/.idx, keeping\n"
        "document boundaries, as Megatron's tools/merge_datasets.py. --input is a directory\n"
        "(every NAME.bin/NAME.idx pair in it, in sorted order) or a comma-separated list of\n"
        "prefixes (in the order given).\n");
    return 0;
  }
  Options opts;
  parse_options(args, opts);
  OMNI_REQUIRE(!opts.input.empty(),
               "merge-datasets needs --input DIR (every .bin/.idx pair in it) or "
               "--input PREFIX,PREFIX,...");
  OMNI_REQUIRE(!opts.output_prefix.empty(), "merge-datasets needs --output-prefix PREFIX");
  const std::vector<std::string> prefixes = resolve_merge_inputs(opts.input);
  const auto start = std::chrono::steady_clock::now();
  const MergeStats stats = merge_indexed_datasets(prefixes, opts.output_prefix);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("merged %lld datasets into %s.bin/.idx: %lld documents, %lld tokens (%s) in %.1f s\n",
              static_cast<long long>(stats.datasets), opts.output_prefix.c_str(),
              static_cast<long long>(stats.documents), static_cast<long long>(stats.tokens),
              indexed_dtype_name(stats.dtype), seconds);
  return 0;
}

}  // namespace omni::cli
