// Megatron's HuggingFaceTokenizer for byte-level BPE tokenizer.json files (Llama 3,
// Qwen2.5, GPT-2 style): model.vocab + model.merges, added_tokens matched literally
// before pre-tokenisation (as the tokenizers library does), the pre_tokenizer's Split
// regex followed by ByteLevel.
#include "base/error.h"
#include "base/json.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {

namespace {

// ByteLevel's own regex (use_regex: true), GPT-2's.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The Split regex of the pre_tokenizer (alone or inside a Sequence); ByteLevel with
// use_regex gives GPT-2's. Throws for pre-tokenizers this engine does not reproduce.
std::string pretokenizer_pattern(const json::Value* pre, const std::string& path) {
  const std::string where = "--tokenizer-model " + path + ": pre_tokenizer";
  OMNI_REQUIRE(pre && pre->is_object(), where, ": expected an object (byte-level BPE)");
  std::vector<const json::Value*> steps;
  const json::Value* type = pre->find("type");
  if (type && type->is_string() && type->str() == "Sequence") {
    const json::Value* list = pre->find("pretokenizers");
    OMNI_REQUIRE(list && list->is_array(), where, ": Sequence without pretokenizers");
    for (const auto& step : list->arr()) steps.push_back(&step);
  } else {
    steps.push_back(pre);
  }
  std::string pattern;
  bool byte_level = false;
  for (const json::Value* step : steps) {
    const json::Value* t = step->find("type");
    const std::string name = t && t->is_string() ? t->str() : "";
    if (name == "Split") {
      const json::Value* p = step->find("pattern");
      const json::Value* regex = p ? p->find("Regex") : nullptr;
      OMNI_REQUIRE(regex && regex->is_string() && pattern.empty(), where,
                   ": expected one Split with a Regex pattern");
      const json::Value* behavior = step->find("behavior");
      OMNI_REQUIRE(behavior && behavior->is_string() && behavior->str() == "Isolated", where,
                   ": only Split with behavior Isolated is supported");
      pattern = regex->str();
    } else if (name == "ByteLevel") {
      byte_level = true;
      const json::Value* use_regex = step->find("use_regex");
      if (use_regex && use_regex->is_bool() && use_regex->boolean()) {
        OMNI_REQUIRE(pattern.empty(), where, ": both a Split regex and ByteLevel's regex");
        pattern = kByteLevelPattern;
      }
      const json::Value* prefix = step->find("add_prefix_space");
      OMNI_REQUIRE(!(prefix && prefix->is_bool() && prefix->boolean()), where,
                   ": ByteLevel add_prefix_space is not supported");
    } else {
      throw UsageError(where + ": '" + name + "' is not supported (Split and ByteLevel are)");
    }
  }
  OMNI_REQUIRE(byte_level && !pattern.empty(), where,
               ": expected a ByteLevel pre-tokenizer with a Split regex or use_regex");
  return pattern;
}

}  // namespace

std::unique_ptr<Tokenizer> make_huggingface_tokenizer(const TokenizerOptions& o) {
  OMNI_REQUIRE(!o.tokenizer_model.empty(),
               "--tokenizer-model: HuggingFaceTokenizer needs a tokenizer.json");
  const std::string& path = o.tokenizer_model;
  const json::Value doc = json::parse(bpe::read_file(path, "--tokenizer-model"), path);
  const std::string where = "--tokenizer-model " + path;
  const json::Value* model = doc.find("model");
  OMNI_REQUIRE(model && model->is_object(), where, ": expected a 'model' object");
  const json::Value* type = model->find("type");
  OMNI_REQUIRE(type && type->is_string() && type->str() == "BPE", where,
               ": model.type must be BPE (byte-level BPE tokenizer.json)");
  const json::Value* normalizer = doc.find("normalizer");
  OMNI_REQUIRE(!normalizer || normalizer->is_null(), where, ": normalizers are not supported");

  bpe::BpeModel m;
  m.name = o.type.empty() ? "HuggingFaceTokenizer" : o.type;  // Primus names its kinds
  m.rule = bpe::MergeRule::kPairRank;
  m.pattern = pretokenizer_pattern(doc.find("pre_tokenizer"), path);
  const json::Value* ignore = model->find("ignore_merges");
  m.ignore_merges = ignore && ignore->is_bool() && ignore->boolean();

  const json::Value* vocab = model->find("vocab");
  OMNI_REQUIRE(vocab && vocab->is_object(), where, ": expected model.vocab, an object");
  bpe::TokenMap by_text;
  for (const auto& [text, id] : vocab->obj()) {
    OMNI_REQUIRE(id.is_number() && id.num() >= 0 && id.num() < 1e9, where, ": model.vocab['", text,
                 "'] is not a non-negative integer");
    const auto index = int32_t(id.num());
    const auto bytes = bpe::unicode_to_bytes(text);
    OMNI_REQUIRE(bytes, where, ": model.vocab token '", text,
                 "' is not ByteLevel-encoded (only byte-level BPE is supported)");
    if (size_t(index) >= m.id_bytes.size()) m.id_bytes.resize(size_t(index) + 1);
    m.id_bytes[size_t(index)] = *bytes;
    m.token_ids.emplace(*bytes, index);
    by_text.emplace(text, index);
  }

  const json::Value* merges = model->find("merges");
  OMNI_REQUIRE(merges && merges->is_array(), where, ": expected model.merges, an array");
  int32_t rank = 0;
  for (const auto& merge : merges->arr()) {
    std::string left, right;
    if (merge.is_string()) {  // "a b"
      const size_t space = merge.str().find(' ');
      OMNI_REQUIRE(space != std::string::npos, where, ": merge '", merge.str(),
                   "' is not two tokens separated by a space");
      left = merge.str().substr(0, space);
      right = merge.str().substr(space + 1);
    } else {  // ["a", "b"]
      OMNI_REQUIRE(merge.is_array() && merge.arr().size() == 2 && merge.arr()[0].is_string() &&
                       merge.arr()[1].is_string(),
                   where, ": merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
      left = merge.arr()[0].str();
      right = merge.arr()[1].str();
    }
    const auto l = by_text.find(left), r = by_text.find(right), j = by_text.find(left + right);
    OMNI_REQUIRE(l != by_text.end() && r != by_text.end() && j != by_text.end(), where, ": merge '",
                 left, " ", right, "' uses a token missing from model.vocab");
    const uint64_t key = (uint64_t(uint32_t(l->second)) << 32) | uint32_t(r->second);
    m.pair_merges.emplace(key, std::make_pair(rank++, j->second));
  }

  // Added tokens, special or not, are cut out of the text before pre-tokenisation
  // (lstrip/rstrip/single_word are not honoured; Llama 3 and Qwen2.5 set none).
  if (const json::Value* added = doc.find("added_tokens"); added && added->is_array()) {
    for (const auto& tok : added->arr()) {
      const json::Value* id = tok.find("id");
      const json::Value* content = tok.find("content");
      OMNI_REQUIRE(id && id->is_number() && content && content->is_string(), where,
                   ": added_tokens entries need 'id' and 'content'");
      const auto index = int32_t(id->num());
      if (size_t(index) >= m.id_bytes.size()) m.id_bytes.resize(size_t(index) + 1);
      m.id_bytes[size_t(index)] = content->str();
      m.special_tokens.emplace_back(content->str(), index);
    }
  }
  // Megatron takes eod from the tokenizer's eos token, which lives in
  // tokenizer_config.json; these are the names Llama 3 and Qwen2.5 give it.
  for (const auto& [text, id] : m.special_tokens) {
    if (text == "<|end_of_text|>" || text == "<|endoftext|>") m.eod = id;
    if (text == "<|begin_of_text|>") m.bos = id;
  }
  m.vocab_size = int64_t(m.id_bytes.size());
  return std::make_unique<bpe::BpeTokenizer>(std::move(m), path);
}

}  // namespace omni
