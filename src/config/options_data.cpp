// Megatron's data and tokenizer groups: where samples come from and how text becomes tokens.
#include "config/option_rows.h"

#include <cstdlib>

namespace omni::option_rows {

void add_data_options(std::vector<OptionDef>& t) {
  const std::string D = "data";
  t.push_back(toggle("--mock-data", D, "random tokens (with --vocab-size) instead of a corpus",
                     [](Options& o) -> bool& { return o.mock_data; }));
  t.push_back(
      text("--train-text", "FILE", D,
           "plain-text corpus, tokenised byte-level (default: the King James Bible demo corpus)",
           [](Options& o) -> std::string& { return o.train_text; }));
  OptionDef data_path = text("--data-path", "[W] PREFIX ...", D,
                             "Megatron indexed data: PREFIX, or weights and prefixes to blend",
                             [](Options& o) -> std::string& { return o.data_path; });
  data_path.many = true;
  t.push_back(std::move(data_path));
  for (auto [flag, split] :
       {std::pair{"--train-data-path", "training"}, std::pair{"--valid-data-path", "validation"},
        std::pair{"--test-data-path", "test"}}) {
    const std::string f = flag;
    OptionDef d = text(f, "[W] PREFIX ...", D,
                       std::string("the ") + split +
                           " datasets, each used whole (as --data-path; not with it or --split)",
                       [f](Options& o) -> std::string& {
                         return f == "--train-data-path"   ? o.train_data_path
                                : f == "--valid-data-path" ? o.valid_data_path
                                                           : o.test_data_path;
                       });
    d.many = true;
    t.push_back(std::move(d));
  }
  // Megatron evaluates the test split once after training; no split's test part is
  // evaluated here, so its datasets are only opened (a wrong path still fails).
  t.back().set = [set = t.back().set](Options& o, const std::string& v) {
    set(o, v);
    plumbing("--test-data-path", "[W] PREFIX ...",
             "its datasets are opened and checked, but the test evaluation after training is "
             "not built")
        .set(o, v);
  };
  t.push_back(text("--data-cache-path", "DIR", D,
                   "where the sample indices are cached (default: beside the data)",
                   [](Options& o) -> std::string& { return o.data_cache_path; }));
  t.push_back(text("--data-args-path", "FILE", D, "a file holding --data-path's value",
                   [](Options& o) -> std::string& { return o.data_args_path; }));
  t.push_back(text("--data-file-list", "FILE", D,
                   "Megatron-DeepSpeed data list: one 'weight prefix corpus' line per dataset",
                   [](Options& o) -> std::string& { return o.data_file_list; }));
  t.push_back(text("--tokenizer-type", "NAME", D,
                   "GPT2BPETokenizer, TikTokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
                   "Llama2Tokenizer, NullTokenizer, ByteLevelTokenizer, or Primus's "
                   "Llama3Tokenizer, Llama4Tokenizer, MixtralTokenizer, DeepSeekV2Tokenizer, "
                   "DeepSeekV3Tokenizer",
                   [](Options& o) -> std::string& { return o.tokenizer.type; }));
  t.push_back(text("--vocab-file", "FILE", D, "GPT-2 vocab.json",
                   [](Options& o) -> std::string& { return o.tokenizer.vocab_file; }));
  t.push_back(text("--merge-file", "FILE", D, "GPT-2 merges.txt",
                   [](Options& o) -> std::string& { return o.tokenizer.merge_file; }));
  t.push_back(text("--tokenizer-model", "FILE", D,
                   "*.tiktoken ranks, Hugging Face tokenizer.json or SentencePiece .model; for "
                   "Hugging Face and SentencePiece kinds also a directory, or a hub id "
                   "(org/name) found in the local Hugging Face cache",
                   [](Options& o) -> std::string& { return o.tokenizer.tokenizer_model; }));
  t.push_back(text("--tiktoken-pattern", "v1|v2", D, "TikTokenizer pre-tokenisation pattern",
                   [](Options& o) -> std::string& { return o.tokenizer.tiktoken_pattern; }));
  t.push_back(toggle("--eod-mask-loss", D, "no loss on end-of-document tokens",
                     [](Options& o) -> bool& { return o.eod_mask_loss; }));
  t.push_back(toggle("--reset-position-ids", D,
                     "positions restart after each end-of-document token",
                     [](Options& o) -> bool& { return o.reset_position_ids; }));
  t.push_back(toggle("--reset-attention-mask", D,
                     "tokens attend only within their document (packed samples)",
                     [](Options& o) -> bool& { return o.reset_attention_mask; }));
  add_alias(t, "--dataloader-inter-document-masking", "--reset-attention-mask");
  add_alias(t, "--encoder-seq-length", "--seq-length");
  // Megatron's blends build each dataset 0.5% larger than its share (blended_dataset.cpp).
  t.push_back(OptionDef{"--mid-level-dataset-surplus", "X", D,
                        "extra share each blended dataset is built with: 0.005 (the one built)",
                        [](Options&, const std::string& v) {
                          if (std::strtod(v.c_str(), nullptr) != 0.005)
                            throw NotBuiltError("--mid-level-dataset-surplus " + v,
                                                "a blend surplus other than 0.005");
                        },
                        nullptr});
  for (const char* flag : {"--no-pad-vocab-size", "--disable-pad-vocab-size"})
    t.push_back(toggle(
        flag, D, "no padding of the embedding rows (--make-vocab-size-divisible-by is ignored)",
        [](Options& o) -> bool& { return o.pad_vocab_size; }, false));
  t.push_back(text("--split", "A,B,C", D, "train, validation, test weights of the corpus",
                   [](Options& o) -> std::string& { return o.split; }));
  t.push_back(number<int>("--print-samples", "N", D,
                          "omnitron data-samples: how many training samples to print",
                          [](Options& o) -> int& { return o.print_samples; }));
}

}  // namespace omni::option_rows
