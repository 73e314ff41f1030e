// GPT-2 BPE encoding speed, single-threaded, beside npm gpt-3-encoder's on the same text.
// Figures only. Text: data/kjv.txt if present, else the fixture mixed.txt repeated.
//   bench_tokenizer [TEXT]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "data/tokenizers/tokenizer_impl.h"

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// gpt-3-encoder slows down badly on one multi-megabyte string, so it encodes the text
// in chunks of about 64 KB cut at line ends (which does not change GPT-2's pre-tokens).
const char* kNodeScript = R"(
const fs = require('fs');
const enc = require('gpt-3-encoder');
const text = fs.readFileSync(process.argv[2], 'utf8');
const chunks = [];
for (let i = 0; i < text.length;) {
  let j = text.indexOf('\n', i + 65536);
  j = j < 0 ? text.length : j + 1;
  chunks.push(text.slice(i, j));
  i = j;
}
enc.encode(chunks[0]);
const t0 = process.hrtime.bigint();
let n = 0;
for (const c of chunks) n += enc.encode(c).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log((Buffer.byteLength(text) / 1e6 / s).toFixed(2) + ' MB/s (' + n + ' ids)');
)";

}  // namespace

int main(int argc, char** argv) {
  const fs::path root = fs::path(__FILE__).parent_path().parent_path();
  fs::path text_path = argc > 1 ? fs::path(argv[1]) : root / "data" / "kjv.txt";
  std::string text;
  if (fs::exists(text_path)) {
    text = read_text(text_path);
  } else {
    const fs::path fixture = root / "tests/fixtures/tokenizers/mixed.txt";
    const std::string mixed = read_text(fixture);
    if (mixed.empty()) {  // both paths are relative to the build folder (__FILE__)
      std::fprintf(stderr, "bench_tokenizer: cannot read %s or %s (run it in the build folder)\n",
                   text_path.c_str(), fixture.c_str());
      return 1;
    }
    while (text.size() < (8u << 20)) text += mixed;
    text_path = fs::temp_directory_path() / "omnitron_bench_tokenizer.txt";
    std::ofstream(text_path, std::ios::binary) << text;
  }
  omni::TokenizerOptions o;
  o.vocab_file = (root / "data/tokenizers/gpt2/vocab.json").string();
  o.merge_file = (root / "data/tokenizers/gpt2/merges.txt").string();
  const auto tok = omni::make_gpt2_bpe_tokenizer(o);
  const double mb = double(text.size()) / 1e6;
  std::printf("text: %s (%.2f MB)\n", text_path.c_str(), mb);

  // First pass fills the word cache from cold; the second is the steady state a
  // preprocessing worker reaches after its first documents.
  for (const char* label : {"cold cache", "warm cache"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok->encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("omnitron GPT2BPETokenizer, 1 thread, %s: %.2f MB/s (%zu ids)\n", label, mb / s,
                ids.size());
  }

  const fs::path script = fs::temp_directory_path() / "omnitron_bench_tokenizer.cjs";
  std::ofstream(script) << kNodeScript;
  std::printf("npm gpt-3-encoder (node), 1 thread: ");
  std::fflush(stdout);
  if (std::system("command -v node >/dev/null 2>&1") != 0) {
    std::printf("not measured: node is not installed\n");
    return 0;
  }
  // The reference encoder, installed from npm beside the tokenizer files on first use.
  std::error_code ec;
  const fs::path js = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path() /
                      "data" / "tokenizers" / "js";
  if (!fs::exists(js / "node_modules" / "gpt-3-encoder")) {
    const std::string install = "npm install --silent --no-save --prefix '" + js.string() +
                                "' gpt-3-encoder@1.1.4 >/dev/null 2>&1";
    if (std::system(install.c_str()) != 0) {
      std::printf("not measured: `npm install gpt-3-encoder@1.1.4` failed\n");
      return 0;
    }
  }
  const std::string cmd = "NODE_PATH='" + (js / "node_modules").string() + "' node '" +
                          script.string() + "' '" + text_path.string() + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) std::printf("not measured: the node script failed\n");
  return 0;
}
