// Where a --tokenizer-model's files are: the path itself (a file), a directory holding
// them, or a Hugging Face hub id ("meta-llama/Llama-3.1-8B", as Primus's model configs name
// tokenizers) found in the local cache as the hub's own tools lay it out:
//   $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
//     models--ORG--NAME/snapshots/REVISION/tokenizer.json   (refs/main names REVISION)
// Nothing is downloaded.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace omni {

// The hub cache folders searched, in order (from `env`: HF_HUB_CACHE, HF_HOME, HOME).
std::vector<std::string> hf_hub_cache_dirs(const std::map<std::string, std::string>& env);

// The first of `files` (file names, "tokenizer.json") that `model` provides: `model` itself
// when it is a file, DIR/FILE for a directory, the cached snapshot's FILE for a hub id.
// A hub id with no local copy raises UsageError, one line saying where to put the files;
// anything else that holds none of `files` raises UsageError naming what was looked for.
std::string find_tokenizer_file(const std::string& model, const std::vector<std::string>& files,
                                const std::map<std::string, std::string>& env);
// The same, with the process environment.
std::string find_tokenizer_file(const std::string& model, const std::vector<std::string>& files);

}  // namespace omni
