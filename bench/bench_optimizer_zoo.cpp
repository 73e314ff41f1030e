// Trains the demo model (omnitron train's preset: a byte-level GPT on the King James Bible)
// once per optimizer of the zoo, each at a learning rate chosen for it, and prints the final
// validation loss and the training time of each: figures for the README, not a test.
//
//   build/bench_optimizer_zoo [--train-iters N] [--binary PATH] [--optimizers a,b,...]
//                             [--extra "FLAGS"]
//     (default 700 steps, ./omnitron beside this program, every optimizer below; FLAGS are
//     added to every run, e.g. "--shampoo-update-freq 10" for a short run)
// Everything but the optimizer, its learning rate and the length is the demo's (cosine
// schedule, warmup 40, weight decay 0.1, beta2 0.95); checkpoints go to a temporary folder.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

struct Choice {
  const char* optimizer;
  const char* lr;  // the peak learning rate (--min-lr stays the demo's 1e-4 where lower)
  const char* extra;
};

// The learning rates: the demo's 2e-3 for the Adam family; sign-based updates (Lion,
// SophiaG with its estimate at 0) at a tenth of it; LAMB's trust ratio and SGD's raw
// gradient want larger ones.
const Choice kChoices[] = {
    {"adam", "2e-3", ""},
    {"lamb", "2e-2", ""},
    {"lion", "2e-4", "--min-lr 1e-5"},
    {"muon", "2e-3", ""},
    {"adamwschedulefree", "2e-3", "--lr-decay-style constant"},
    {"sgdschedulefree", "0.5", "--lr-decay-style constant"},
    {"adam8bit", "2e-3", ""},
    {"sophiag", "2e-4", "--min-lr 1e-5"},
    {"galoreadamw", "2e-3", ""},
    {"galoreadamw8bit", "2e-3", ""},
    {"galoreadamw8bitperlayer", "2e-3", ""},
    {"shampoo", "2e-3", ""},
};

std::string run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "";
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  pclose(p);
  return out;
}

// The number after `key` in the last line that has it, or -1.
double last_number_after(const std::string& out, const std::string& key) {
  const size_t at = out.rfind(key);
  return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + key.size());
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string iters = "700", only, extra;
  std::string binary = (fs::path(argv[0]).parent_path() / "omnitron").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--train-iters")
      iters = argv[i + 1];
    else if (flag == "--binary")
      binary = argv[i + 1];
    else if (flag == "--optimizers")
      only = "," + std::string(argv[i + 1]) + ",";
    else if (flag == "--extra")
      extra = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_optimizer_zoo: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const std::string save = (fs::temp_directory_path() / "omnitron_bench_optimizer_zoo").string();
  std::printf("demo model, %s steps; validation loss in nats per byte\n", iters.c_str());
  std::printf("%-24s %-8s %10s %10s\n", "optimizer", "lr", "val loss", "time (s)");
  for (const Choice& c : kChoices) {
    if (!only.empty() && only.find("," + std::string(c.optimizer) + ",") == std::string::npos)
      continue;
    fs::remove_all(save);
    const std::string out =
        run(binary + " train --no-progress --max-new-tokens 0 --train-iters " + iters +
            " --eval-interval " + iters + " --save " + save + " --optimizer " + c.optimizer +
            " --lr " + c.lr + " " + c.extra + " " + extra);
    const double loss = last_number_after(out, "final validation loss ");
    const double seconds = last_number_after(out.substr(out.rfind("done: ") + 1), " in ");
    if (loss < 0) {
      std::printf("%-24s %-8s failed:\n%s\n", c.optimizer, c.lr, out.c_str());
      continue;
    }
    std::printf("%-24s %-8s %10.4f %10.1f\n", c.optimizer, c.lr, loss, seconds);
    std::fflush(stdout);
  }
  fs::remove_all(save);
  return 0;
}
