#include "data/tokenizers/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/error.h"

namespace omni::bpe {

std::string read_file(const std::string& path, const std::string& option) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UsageError(option + ": cannot read '" + path +
                     "' (the tokenizer files come from scripts/setup.sh, which runs "
                     "scripts/fetch_tokenizers.sh)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

const std::array<char32_t, 256>& byte_to_unicode() {
  // GPT-2's encoder.py: printable Latin-1 bytes stand for themselves, the other 68 bytes
  // take code points 256, 257, ... in byte order.
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

std::optional<std::string> unicode_to_bytes(std::string_view token) {
  static const std::unordered_map<char32_t, uint8_t> inverse = [] {
    std::unordered_map<char32_t, uint8_t> m;
    for (int b = 0; b < 256; ++b) m[byte_to_unicode()[b]] = uint8_t(b);
    return m;
  }();
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const auto c = uint8_t(token[i]);
    char32_t cp;
    int len;
    if (c < 0x80) cp = c, len = 1;
    else if ((c >> 5) == 0x6) cp = c & 0x1F, len = 2;
    else if ((c >> 4) == 0xE) cp = c & 0x0F, len = 3;
    else if ((c >> 3) == 0x1E) cp = c & 0x07, len = 4;
    else return std::nullopt;
    if (i + len > token.size()) return std::nullopt;
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(token[i + k]) & 0x3F);
    i += len;
    const auto it = inverse.find(cp);
    if (it == inverse.end()) return std::nullopt;
    out += char(it->second);
  }
  return out;
}

// A compiled PCRE2 pattern: UTF (invalid UTF-8 in the subject is allowed and never
// matches), UCP (\s, \p{L} etc. are Unicode-aware), JIT.
struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;

  Regex(const std::string& pattern, const std::string& source) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset,
                         nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw UsageError(detail::concat(source, ": pre-tokenizer pattern does not compile at offset ",
                                      offset, ": ", reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  }
  ~Regex() { pcre2_code_free(code); }

  // The first match at or after `from`: (start, end), or nullopt.
  std::optional<std::pair<size_t, size_t>> find(std::string_view text, size_t from,
                                                 pcre2_match_data* md) const {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from,
                               0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw InternalError(detail::concat("[bpe] pcre2_match failed: ",
                                         reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    return std::make_pair(size_t(ov[0]), size_t(ov[1]));
  }
};

namespace {

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

// Pre-token -> ids, one per thread (encode is const and called from several workers);
// cleared when another tokenizer uses the thread or when it grows past a bound.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};
constexpr size_t kMaxCachedWords = 1 << 20;
constexpr size_t kMaxCachedWordBytes = 256;

std::atomic<uint64_t> next_serial{1};

std::string quote_literal(std::string_view s) {
  // \Q...\E quotes everything but "\E" itself.
  std::string out = "\\Q";
  size_t pos = 0;
  for (size_t e; (e = s.find("\\E", pos)) != std::string_view::npos; pos = e + 2)
    out.append(s.substr(pos, e - pos)).append("\\E\\\\E\\Q");
  out.append(s.substr(pos)).append("\\E");
  return out;
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeModel model, const std::string& source)
    : model_(std::move(model)), serial_(next_serial++) {
  for (int b = 0; b < 256; ++b) {
    const auto it = model_.token_ids.find(std::string(1, char(b)));
    OMNI_REQUIRE(it != model_.token_ids.end(), source, ": the vocabulary has no token for byte ",
                 b, " (only byte-level BPE vocabularies are supported)");
    byte_ids_[b] = it->second;
  }
  pretokenizer_ = std::make_unique<Regex>(model_.pattern, source);
  if (!model_.special_tokens.empty()) {
    // Longest first, so that a special token that is a prefix of another loses.
    auto specials = model_.special_tokens;
    std::stable_sort(specials.begin(), specials.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    std::string alternation;
    for (const auto& [text, id] : specials) {
      if (text.empty()) continue;
      if (!alternation.empty()) alternation += '|';
      alternation += quote_literal(text);
      special_ids_.emplace(text, id);
    }
    if (!alternation.empty()) specials_ = std::make_unique<Regex>(alternation, source);
  }
}

BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::describe() const {
  return detail::concat(model_.name, " (", model_.vocab_size, " tokens)");
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[uint8_t(word[0])]);
    return;
  }
  if (model_.ignore_merges || model_.rule == MergeRule::kTokenRank) {
    // tiktoken also looks the whole piece up first; the result is the same as merging.
    const auto it = model_.token_ids.find(word);
    if (it != model_.token_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // parts[i] covers bytes [start[i], start[i+1]) with id ids[i]; rank[i] is the rank of
  // merging parts i and i+1 (max when they do not merge), merged[i] the resulting id.
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  const size_t n = word.size();
  std::vector<uint32_t> start(n + 1);
  std::vector<int32_t> ids(n), rank(n), merged(n);
  for (size_t i = 0; i < n; ++i) start[i] = uint32_t(i), ids[i] = byte_ids_[uint8_t(word[i])];
  start[n] = uint32_t(n);
  size_t parts = n;

  auto pair_rank = [&](size_t i) {
    if (i + 1 >= parts) return std::make_pair(kNone, 0);
    if (model_.rule == MergeRule::kPairRank) {
      const uint64_t key = (uint64_t(uint32_t(ids[i])) << 32) | uint32_t(ids[i + 1]);
      const auto it = model_.pair_merges.find(key);
      return it == model_.pair_merges.end() ? std::make_pair(kNone, 0) : it->second;
    }
    const auto it = model_.token_ids.find(word.substr(start[i], start[i + 2] - start[i]));
    return it == model_.token_ids.end() ? std::make_pair(kNone, 0)
                                        : std::make_pair(it->second, it->second);
  };
  for (size_t i = 0; i < parts; ++i) std::tie(rank[i], merged[i]) = pair_rank(i);

  // Merge the lowest-ranked pair (leftmost on ties) until none merges. Pre-tokens are
  // short, so a linear scan beats a heap.
  for (;;) {
    size_t best = 0;
    int32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < parts; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best_rank == kNone) break;
    ids[best] = merged[best];
    for (size_t i = best + 1; i + 1 < parts; ++i) {
      ids[i] = ids[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
      start[i] = start[i + 1];
    }
    start[parts - 1] = start[parts];
    --parts;
    std::tie(rank[best], merged[best]) = pair_rank(best);
    if (best > 0) std::tie(rank[best - 1], merged[best - 1]) = pair_rank(best - 1);
  }
  out.insert(out.end(), ids.begin(), ids.begin() + long(parts));
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  thread_local WordCache cache;
  thread_local MatchData match;
  if (cache.owner != serial_) {
    cache.words.clear();
    cache.owner = serial_;
  }
  auto emit = [&](std::string_view piece) {
    if (piece.size() > kMaxCachedWordBytes) {
      encode_word(piece, out);
      return;
    }
    const auto it = cache.words.find(piece);
    if (it != cache.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    const size_t before = out.size();
    encode_word(piece, out);
    if (cache.words.size() >= kMaxCachedWords) cache.words.clear();
    cache.words.emplace(std::string(piece),
                        std::vector<int32_t>(out.begin() + long(before), out.end()));
  };
  size_t pos = 0;
  while (pos < text.size()) {
    const auto m = pretokenizer_->find(text, pos, match.md);
    const size_t begin = m ? m->first : text.size();
    // Bytes no alternative matches (invalid UTF-8) are a pre-token of their own.
    if (begin > pos) emit(text.substr(pos, begin - pos));
    if (!m) break;
    size_t end = m->second;
    if (end == begin) {  // an empty match: take one byte so the scan advances
      end = begin + 1;
    }
    emit(text.substr(begin, end - begin));
    pos = end;
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (!specials_) {
    encode_ordinary(text, out);
    return out;
  }
  thread_local MatchData match;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto m = specials_->find(text, pos, match.md);
    if (!m || m->second == m->first) {
      encode_ordinary(text.substr(pos), out);
      break;
    }
    encode_ordinary(text.substr(pos, m->first - pos), out);
    out.push_back(special_ids_.find(text.substr(m->first, m->second - m->first))->second);
    pos = m->second;
  }
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    OMNI_REQUIRE(id >= 0 && size_t(id) < model_.id_bytes.size(), model_.name, ": token id ", id,
                 " is outside the vocabulary (", model_.id_bytes.size(), " ids)");
    out += model_.id_bytes[size_t(id)];
  }
  return out;
}

}  // namespace omni::bpe
