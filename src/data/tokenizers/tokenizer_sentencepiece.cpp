// SentencePieceTokenizer and Llama2Tokenizer: a SentencePiece .model through libsentencepiece,
// wrapped as Megatron wraps it (megatron/training/tokenizer/tokenizer.py, classes
// _SentencePieceTokenizer and _Llama2Tokenizer), so a dataset we preprocess holds the ids
// Megatron's tools/preprocess_data.py writes for the same model and text.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/error.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {
namespace {

std::unique_ptr<sentencepiece::SentencePieceProcessor> load_model(const std::string& path,
                                                                  const char* type) {
  OMNI_REQUIRE(!path.empty(), "--tokenizer-model: ", type,
               " needs a SentencePiece model file (a .model)");
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(path);
  OMNI_REQUIRE(status.ok(), "--tokenizer-model: cannot load '", path,
               "' as a SentencePiece model (", status.ToString(), ")");
  return processor;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string path, bool llama2)
      : path_(std::move(path)), llama2_(llama2), sp_(load_model(path_, type_name())) {
    piece_size_ = sp_->GetPieceSize();
    vocab_size_ = piece_size_;
    if (llama2_) {
      // _Llama2Tokenizer._initalize: the model's vocabulary alone; bos/eos/pad are the model's
      // ids (-1, "not in the model", becomes none here); eod is eos.
      bos_ = model_id(sp_->bos_id());
      pad_ = model_id(sp_->pad_id());
      eod_ = model_id(sp_->eos_id());
    } else {
      // _SentencePieceTokenizer._initalize: <CLS>, <SEP>, <EOD>, <MASK>, then the model's pad,
      // bos and eos pieces become special tokens; a token not among the model's pieces gets the
      // next id after them, and an id the model lacks (-1) stands for '<PAD>', '<BOS>' or
      // '<EOS>'. (--vocab-extra-ids, T5's <extra_id_i>, is not an option of ours: 0.)
      add_special("<CLS>");
      add_special("<SEP>");
      eod_ = add_special("<EOD>");
      add_special("<MASK>");
      pad_ = add_special(model_piece(sp_->pad_id(), "<PAD>"));
      bos_ = add_special(model_piece(sp_->bos_id(), "<BOS>"));
      add_special(model_piece(sp_->eos_id(), "<EOS>"));
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    if (llama2_) {
      // _Llama2Tokenizer.tokenize(s, bos=True, eos=False), as preprocess_data.py calls it:
      // every document starts with bos. Special pieces written in the text are plain text.
      if (bos_) ids.push_back(*bos_);
      append_pieces(text, ids);
      return ids;
    }
    // _SentencePieceTokenizer.tokenize (from NeMo): repeatedly take the earliest occurrence of
    // any special token (ties go to the first added), encode the text before it with the model
    // and emit the special token's id. `next` caches each token's next occurrence so the scan
    // stays linear in the text.
    std::vector<size_t> next(specials_.size(), 0);
    for (size_t k = 0; k < specials_.size(); ++k) next[k] = text.find(specials_[k].first);
    size_t pos = 0;
    while (true) {
      size_t best = std::string_view::npos;
      size_t best_k = 0;
      for (size_t k = 0; k < specials_.size(); ++k) {
        if (next[k] != std::string_view::npos && next[k] < pos)
          next[k] = text.find(specials_[k].first, pos);
        if (next[k] < best) {
          best = next[k];
          best_k = k;
        }
      }
      if (best == std::string_view::npos) break;
      append_pieces(text.substr(pos, best - pos), ids);
      ids.push_back(specials_[best_k].second);
      pos = best + specials_[best_k].first.size();
    }
    append_pieces(text.substr(pos), ids);
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    for (int32_t id : ids)
      OMNI_REQUIRE(id >= 0 && id < vocab_size_, type_name(), ": cannot decode id ", id,
                   " (the vocabulary of '", path_, "' has ids 0..", vocab_size_ - 1, ")");
    if (llama2_) return sp_->DecodeIds(std::vector<int>(ids.begin(), ids.end()));
    // _SentencePieceTokenizer.detokenize (from NeMo): the runs between special ids are decoded
    // by the model, and each special id is written as its token with a space either side
    // ("a<EOD>b" -> "a <EOD> b"), even where the run before it is empty.
    std::string text;
    size_t run_start = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto special = special_by_id_.find(ids[i]);
      if (special == special_by_id_.end()) continue;
      text += decode_pieces(ids.subspan(run_start, i - run_start));
      text += ' ';
      text += special->second;
      text += ' ';
      run_start = i + 1;
    }
    text += decode_pieces(ids.subspan(run_start));
    return text;
  }

  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod() const override { return eod_; }
  std::optional<int32_t> bos() const override { return bos_; }
  std::optional<int32_t> pad() const override { return pad_; }

  std::string describe() const override {
    std::string s = std::string(type_name()) + " (" + std::to_string(vocab_size_) + " tokens";
    if (vocab_size_ > piece_size_)
      s += ": " + std::to_string(piece_size_) + " from the model + " +
           std::to_string(vocab_size_ - piece_size_) + " added";
    return s + ")";
  }

 private:
  const char* type_name() const { return llama2_ ? "Llama2Tokenizer" : "SentencePieceTokenizer"; }

  std::optional<int32_t> model_id(int id) const {
    if (id < 0 || id >= piece_size_) return std::nullopt;
    return id;
  }

  // The model's piece for `id`, or `fallback` where the model has none (Python's IndexError).
  std::string model_piece(int id, const char* fallback) const {
    if (id < 0 || id >= piece_size_) return fallback;
    return sp_->IdToPiece(id);
  }

  // _add_special_token: the model's id when `token` is one of its pieces, else the next id.
  int32_t add_special(const std::string& token) {
    for (const auto& [t, id] : specials_)
      if (t == token) return id;
    int id = sp_->PieceToId(token);
    // PieceToId answers unk_id for a piece it does not know; only the unk piece itself is unk.
    if (id < 0 || id >= piece_size_ || sp_->IdToPiece(id) != token)
      id = static_cast<int>(vocab_size_++);
    specials_.emplace_back(token, id);
    special_by_id_.emplace(id, token);
    return id;
  }

  void append_pieces(std::string_view text, std::vector<int32_t>& ids) const {
    if (text.empty()) return;
    for (int id : sp_->EncodeAsIds(text)) ids.push_back(id);
  }

  std::string decode_pieces(std::span<const int32_t> ids) const {
    return sp_->DecodeIds(std::vector<int>(ids.begin(), ids.end()));
  }

  std::string path_;
  bool llama2_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int64_t piece_size_ = 0;
  int64_t vocab_size_ = 0;  // the model's pieces plus the special tokens added after them
  std::optional<int32_t> eod_, bos_, pad_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // in Megatron's insertion order
  std::unordered_map<int32_t, std::string> special_by_id_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions& o, bool llama2) {
  return std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, llama2);
}

}  // namespace omni
