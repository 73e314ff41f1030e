#include "data/tokenizers/hf_hub.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace omni {

namespace fs = std::filesystem;

namespace {

std::string get(const std::map<std::string, std::string>& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

// "org/name" (or "name"): what the hub's from_pretrained takes, as opposed to a path.
bool is_hub_id(const std::string& s) {
  if (s.empty() || s[0] == '/' || s[0] == '.' || s[0] == '~' || s.back() == '/') return false;
  const size_t slash = s.find('/');
  return slash == std::string::npos || s.find('/', slash + 1) == std::string::npos;
}

std::string joined(const std::vector<std::string>& files) {
  std::string out;
  for (size_t i = 0; i < files.size(); ++i)
    out += (i == 0 ? "" : i + 1 == files.size() ? " or " : ", ") + files[i];
  return out;
}

// The snapshot the cache's refs/main names, else the newest snapshot holding one of `files`.
std::string find_in_snapshots(const fs::path& repo, const std::vector<std::string>& files) {
  std::vector<fs::path> snapshots;
  if (std::ifstream ref(repo / "refs" / "main"); ref) {
    std::string revision;
    std::getline(ref, revision);
    if (!revision.empty()) snapshots.push_back(repo / "snapshots" / revision);
  }
  std::error_code ec;
  std::vector<fs::path> others;
  for (const auto& entry : fs::directory_iterator(repo / "snapshots", ec))
    if (entry.is_directory()) others.push_back(entry.path());
  std::sort(others.begin(), others.end(), [](const fs::path& a, const fs::path& b) {
    std::error_code e;
    return fs::last_write_time(a, e) > fs::last_write_time(b, e);
  });
  snapshots.insert(snapshots.end(), others.begin(), others.end());
  for (const fs::path& s : snapshots)
    for (const std::string& f : files)
      if (fs::exists(s / f)) return (s / f).string();
  return "";
}

}  // namespace

std::vector<std::string> hf_hub_cache_dirs(const std::map<std::string, std::string>& env) {
  if (const std::string hub = get(env, "HF_HUB_CACHE"); !hub.empty()) return {hub};
  if (const std::string home = get(env, "HF_HOME"); !home.empty())
    return {(fs::path(home) / "hub").string()};
  const std::string xdg = get(env, "XDG_CACHE_HOME");
  if (!xdg.empty()) return {(fs::path(xdg) / "huggingface" / "hub").string()};
  return {(fs::path(get(env, "HOME")) / ".cache" / "huggingface" / "hub").string()};
}

std::string find_tokenizer_file(const std::string& model, const std::vector<std::string>& files,
                                const std::map<std::string, std::string>& env) {
  OMNI_REQUIRE(!model.empty(), "--tokenizer-model: needs a ", joined(files),
               ", a directory holding it, or a Hugging Face model id");
  if (fs::is_regular_file(model)) return model;
  if (fs::is_directory(model)) {
    for (const std::string& f : files)
      if (fs::exists(fs::path(model) / f)) return (fs::path(model) / f).string();
    throw UsageError("--tokenizer-model " + model + ": the directory holds no " + joined(files));
  }
  if (!is_hub_id(model)) return model;  // a missing file: the tokenizer says so
  std::string folder = "models--" + model;
  for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/', p))
    folder.replace(p, 1, "--");
  const std::vector<std::string> caches = hf_hub_cache_dirs(env);
  for (const std::string& cache : caches)
    if (std::string f = find_in_snapshots(fs::path(cache) / folder, files); !f.empty()) return f;
  throw UsageError(
      "--tokenizer-model " + model +
      ": a Hugging Face model id with no local copy (nothing is downloaded); put its " +
      joined(files) + " in " + (fs::path(caches.front()) / folder).string() +
      "/snapshots/main/ (HF_HUB_CACHE or HF_HOME choose the cache), or give "
      "--tokenizer-model a directory holding it");
}

std::string find_tokenizer_file(const std::string& model, const std::vector<std::string>& files) {
  std::map<std::string, std::string> env;
  for (const char* name : {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"})
    if (const char* v = std::getenv(name)) env[name] = v;
  return find_tokenizer_file(model, files, env);
}

}  // namespace omni
