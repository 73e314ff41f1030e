// Megatron's TikTokenizer option names over an OpenAI *.tiktoken ranks file.
//
// Ids are tiktoken's own: token id = rank, plus the encoding's special tokens at their
// OpenAI ids, so r50k/cl100k/o200k files give the ids of tiktoken and of npm
// gpt-tokenizer. This deliberately differs from Megatron's CustomTikTokenizer
// (megatron/training/tokenizer/tokenizer.py), which reads a JSON vocabulary (not a
// .tiktoken file), reserves ids 0..num_special_tokens-1 (default 1000) for
// ["<unk>", "<s>", "</s>", ...] padded with "<SPECIAL_i>", shifts every rank up by
// num_special_tokens, and encodes with encode_ordinary (special tokens in text are not
// recognised). That layout only makes sense for vocabularies trained with it (Nemotron);
// it is not implemented here.
#include <array>

#include "base/error.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {

namespace {

// Patterns from openai/tiktoken tiktoken_ext/openai_public.py (pat_str of each encoding).
// r50k_base / p50k_base: GPT-2's.
constexpr const char* kR50kPattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// cl100k_base (--tiktoken-pattern v1).
constexpr const char* kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
// o200k_base (--tiktoken-pattern v2): the seven alternatives joined with '|'.
constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::optional<std::string> base64_decode(std::string_view s) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[uint8_t(alphabet[i])] = int8_t(i);
    return t;
  }();
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : s) {
    if (c == '=') break;
    const int8_t v = table[uint8_t(c)];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_tiktoken_tokenizer(const TokenizerOptions& o) {
  OMNI_REQUIRE(!o.tokenizer_model.empty(),
               "--tokenizer-model: TikTokenizer needs a *.tiktoken ranks file");
  OMNI_REQUIRE(o.tiktoken_pattern.empty() || o.tiktoken_pattern == "v1" ||
                   o.tiktoken_pattern == "v2",
               "--tiktoken-pattern: expected v1 (cl100k) or v2 (o200k), got '", o.tiktoken_pattern,
               "'");
  const std::string& path = o.tokenizer_model;
  const std::string text = bpe::read_file(path, "--tokenizer-model");
  bpe::BpeModel m;
  m.name = "TikTokenizer";
  m.rule = bpe::MergeRule::kTokenRank;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto bytes = space == std::string_view::npos ? std::nullopt
                                                       : base64_decode(line.substr(0, space));
    int64_t rank = -1;
    if (bytes) {
      rank = 0;
      for (const char c : line.substr(space + 1)) {
        if (c < '0' || c > '9' || rank > (1 << 30)) {
          rank = -1;
          break;
        }
        rank = rank * 10 + (c - '0');
      }
      if (space + 1 == line.size()) rank = -1;
    }
    OMNI_REQUIRE(rank >= 0, "--tokenizer-model ", path, ":", line_no,
                 ": expected 'base64-token rank', got '", line, "'");
    if (size_t(rank) >= m.id_bytes.size()) m.id_bytes.resize(size_t(rank) + 1);
    m.id_bytes[size_t(rank)] = *bytes;
    m.token_ids.emplace(*bytes, int32_t(rank));
  }
  const size_t ranks = m.token_ids.size();
  // The special tokens of each OpenAI encoding (openai_public.py), told apart by size.
  std::vector<std::pair<std::string, int32_t>> specials;
  if (ranks == 50256 || ranks == 50280) {  // r50k_base, p50k_base
    m.pattern = kR50kPattern;
    specials = {{"<|endoftext|>", 50256}};
  } else {
    m.pattern = o.tiktoken_pattern == "v2" ? kO200kPattern
                : o.tiktoken_pattern == "v1" ? kCl100kPattern
                : ranks == 199998            ? kO200kPattern
                                             : kCl100kPattern;
    if (ranks == 100256)
      specials = {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258},
                  {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
                  {"<|endofprompt|>", 100276}};
    else if (ranks == 199998)
      specials = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
  }
  for (const auto& [s, id] : specials) {
    if (size_t(id) >= m.id_bytes.size()) m.id_bytes.resize(size_t(id) + 1);
    m.id_bytes[size_t(id)] = s;
    if (s == "<|endoftext|>") m.eod = id;
  }
  m.special_tokens = std::move(specials);
  m.vocab_size = int64_t(m.id_bytes.size());
  return std::make_unique<bpe::BpeTokenizer>(std::move(m), path);
}

}  // namespace omni
