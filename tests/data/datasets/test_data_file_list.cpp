// Megatron-DeepSpeed's DATA_FILE_LIST files (--data-file-list): "weight prefix corpus" per
// line, as argonne-lcf/Megatron-DeepSpeed's ALCF/data-lists/<machine>/*.txt are written (a few
// older ones have no corpus column). Our fixture is written in that format; the real lists
// are read from a copy of that repository when one is present (OMNITRON_MDS_REPO: a checkout,
// or a bare clone such as the one the `fetch` tool makes), else the test says where it looked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/process.h"
#include "data/datasets/blended_dataset.h"

namespace fs = std::filesystem;

namespace {

int dataset_lines(const fs::path& list) {
  std::ifstream in(list);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    n += line.find_first_not_of(" \t\r") != std::string::npos;
  return n;
}

TEST(DataFileList, ReadsTheMegatronDeepSpeedLayout) {
  const auto list = omni::read_data_file_list(std::string(OMNITRON_FIXTURE_DIR) +
                                              "/data_lists/megatron_deepspeed_style.txt");
  ASSERT_EQ(list.size(), 5u);
  EXPECT_DOUBLE_EQ(list[0].weight, 0.0041);
  EXPECT_EQ(list[0].prefix,
            "/lus/project/datasets/corpus_v1_Llama2Tokenizer/web-0000_text_document");
  EXPECT_DOUBLE_EQ(list[2].weight, 0.0007405667281569194);
  EXPECT_EQ(
      list[3].prefix,
      "/lus/project/datasets/corpus_v1_Llama2Tokenizer/papers/fused_0001_of_0002_text_document");
  EXPECT_EQ(list[4].prefix, "/lus/project/datasets/books-0000_text_document");  // no corpus
}

// The lists in ALCF/data-lists of the given repository, unpacked to a temporary folder when
// it is a bare clone; empty when there is none.
fs::path real_data_lists(std::string* looked) {
  const char* env = std::getenv("OMNITRON_MDS_REPO");
  const fs::path repo = env ? env : OMNITRON_MDS_REPO;
  *looked = repo.string();
  if (fs::is_directory(repo / "ALCF" / "data-lists")) return repo / "ALCF" / "data-lists";
  if (!fs::exists(repo / "HEAD")) return {};
  const fs::path out = fs::path(::testing::TempDir()) / "omnitron_mds_lists";
  fs::remove_all(out);
  fs::create_directories(out);
  const ProcessResult r =
      run_command("git --git-dir='" + repo.string() +
                  "' archive HEAD ALCF/data-lists | tar -x -C '" + out.string() + "'");
  if (r.exit_code != 0) {
    *looked += " (git archive failed: " + r.output + ")";
    return {};
  }
  return out / "ALCF" / "data-lists";
}

TEST(DataFileList, EveryListOfMegatronDeepSpeedParses) {
  std::string looked;
  const fs::path dir = real_data_lists(&looked);
  if (dir.empty() || !fs::is_directory(dir)) {
    std::printf(
        "no copy of argonne-lcf/Megatron-DeepSpeed at %s (set OMNITRON_MDS_REPO to a "
        "checkout or bare clone): skipped\n",
        looked.c_str());
    GTEST_SKIP();
  }
  int lists = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".txt") continue;
    const auto parsed = omni::read_data_file_list(entry.path().string());
    EXPECT_EQ(int(parsed.size()), dataset_lines(entry.path())) << entry.path();
    for (const auto& p : parsed) {
      EXPECT_GT(p.weight, 0.0) << entry.path() << ": " << p.prefix;
      EXPECT_EQ(p.prefix.rfind('/', 0), 0u) << entry.path() << ": " << p.prefix;  // absolute
    }
    ++lists;
  }
  std::printf("%d data lists of %s parsed\n", lists, looked.c_str());
  EXPECT_GT(lists, 0);
}

}  // namespace
