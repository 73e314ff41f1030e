// The indexed-dataset reader under random corruption for a time budget (the CI test runs a
// fixed 2000 cases): every corrupted or truncated .idx/.bin must load and read in bounds
// or be refused with a UsageError. Prints how many cases ran and how they ended.
//
//   build/bench_fuzz_indexed [--seconds N]   (default 60)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/datasets/indexed_dataset.h"

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--seconds") seconds = std::atof(argv[i + 1]);
  const std::string dir = std::filesystem::temp_directory_path() / "omnitron_fuzz_indexed";
  std::filesystem::create_directories(dir);
  const std::string valid = dir + "/valid", fuzz = dir + "/fuzz";
  {
    omni::IndexedDatasetWriter w(valid, omni::IndexedDtype::kUInt16);
    std::mt19937 gen(7);
    for (int d = 0; d < 64; ++d) {
      std::vector<int32_t> doc(1 + gen() % 40);
      for (int32_t& t : doc) t = static_cast<int32_t>(gen() % 65536);
      w.add_document(doc);
    }
    w.finalize();
  }
  const std::vector<char> idx = read_all(valid + ".idx"), bin = read_all(valid + ".bin");
  std::mt19937_64 rng(std::random_device{}());
  long cases = 0, loaded = 0, refused = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<int32_t> out(1 << 16);
  while (std::chrono::steady_clock::now() < until) {
    std::vector<char> i2 = idx, b2 = bin;
    std::vector<char>& target = rng() % 4 ? i2 : b2;
    switch (rng() % 3) {
      case 0: target.resize(rng() % (target.size() + 1)); break;        // truncate
      case 1: target[rng() % target.size()] = static_cast<char>(rng()); break;  // one byte
      default:                                                            // a burst of bytes
        for (int k = 0; k < 8; ++k) target[rng() % target.size()] = static_cast<char>(rng());
    }
    write_all(fuzz + ".idx", i2);
    write_all(fuzz + ".bin", b2);
    ++cases;
    try {
      omni::IndexedDataset data(fuzz);
      for (int64_t s = 0; s < data.num_sequences(); ++s) {
        const int64_t n = data.sequence_length(s);
        if (n > static_cast<int64_t>(out.size())) out.resize(n);
        data.read(s, 0, n, out.data());
      }
      ++loaded;
    } catch (const omni::UsageError&) {
      ++refused;
    }
  }
  std::printf("indexed-dataset fuzz: %ld cases in %.0f s: %ld loaded and read in bounds, %ld "
              "refused with a message, 0 crashes\n",
              cases, seconds, loaded, refused);
  std::filesystem::remove_all(dir);
  return 0;
}
