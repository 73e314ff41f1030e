// The two tokenizers that need no file: Megatron's NullTokenizer (text is already ids) and
// a byte-level tokenizer (UTF-8 bytes as ids, the demo's tokenizer).
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// A token quoted in an error message, cut short so a bad multi-megabyte line stays readable.
std::string quoted(std::string_view token) {
  constexpr size_t kMax = 40;
  if (token.size() <= kMax) return "'" + std::string(token) + "'";
  return "'" + std::string(token.substr(0, kMax)) + "...'";
}

// Megatron's _NullTokenizer (megatron/training/tokenizer/tokenizer.py): built from
// --vocab-size N, it reports vocab_size = N + 1 and eod = eos = N (`_vocab_size_without_eod
// = vocab_size; _eod_id = _vocab_size_without_eod; vocab_size -> _vocab_size_without_eod + 1`),
// so id N is the end-of-document token appended after the N ordinary ids. It has no bos and
// no pad (cls/sep/mask are -1).
// Megatron's tokenize is `[int(x) for x in text.split(' ')]`; we split on any run of
// whitespace (so "", "  " and a trailing newline give no ids instead of int('') failing),
// accept only unsigned decimal digits, and reject ids outside [0, N] (N being eod), which
// Megatron would silently write into the dataset.
class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size_without_eod)
      : eod_(static_cast<int32_t>(vocab_size_without_eod)) {}

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && is_space(text[i])) ++i;
      size_t end = i;
      while (end < text.size() && !is_space(text[end])) ++end;
      if (end == i) break;
      std::string_view token = text.substr(i, end - i);
      ids.push_back(parse_id(token));
      i = end;
    }
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) text += ' ';
      text += std::to_string(ids[i]);
    }
    return text;
  }

  int64_t vocab_size() const override { return int64_t{eod_} + 1; }
  std::optional<int32_t> eod() const override { return eod_; }
  std::string describe() const override {
    return "NullTokenizer (" + std::to_string(vocab_size()) + " tokens, eod " +
           std::to_string(eod_) + ")";
  }

 private:
  int32_t parse_id(std::string_view token) const {
    int64_t value = -1;
    bool digits = true;
    for (char c : token) digits = digits && c >= '0' && c <= '9';
    auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    OMNI_REQUIRE(digits && ec == std::errc() && end == token.data() + token.size(),
                 "NullTokenizer: ", quoted(token),
                 " is not a token id (the text must be whitespace-separated decimal ids in [0, ",
                 eod_, "])");
    OMNI_REQUIRE(value <= eod_, "NullTokenizer: token id ", quoted(token), " is outside [0, ", eod_,
                 "] (--vocab-size ", eod_, " plus the eod id ", eod_, ")");
    return static_cast<int32_t>(value);
  }

  int32_t eod_;  // = --vocab-size
};

// UTF-8 bytes as ids 0..255 and back; any byte sequence (invalid UTF-8, NUL) round-trips.
// 256 ids, all of them bytes: there is no id left for an end-of-document, bos or pad token,
// so eod/bos/pad are none (a dataset built with it cannot --append-eod).
class ByteLevelTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string text(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      OMNI_REQUIRE(ids[i] >= 0 && ids[i] < 256, "ByteLevelTokenizer: cannot decode id ", ids[i],
                   " (ids are bytes, 0..255)");
      text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return text;
  }

  int64_t vocab_size() const override { return 256; }
  std::string describe() const override { return "ByteLevelTokenizer (256 tokens)"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_null_tokenizer(const TokenizerOptions& o) {
  // The eod id N and the size N + 1 must fit the int32 ids the datasets store.
  OMNI_REQUIRE(o.vocab_size > 0 && o.vocab_size < std::numeric_limits<int32_t>::max(),
               "--vocab-size: NullTokenizer needs a positive number of ids below ",
               std::numeric_limits<int32_t>::max(), " (got ", o.vocab_size, ")");
  return std::make_unique<NullTokenizer>(o.vocab_size);
}

std::unique_ptr<Tokenizer> make_byte_level_tokenizer(const TokenizerOptions& /*o*/) {
  return std::make_unique<ByteLevelTokenizer>();
}

}  // namespace omni
