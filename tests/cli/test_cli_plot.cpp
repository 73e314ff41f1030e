// omnitron plot: the page holds one polyline per run and chart with a point per logged
// value, and bad input files get errors naming file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "cli/process.h"

namespace {

namespace fs = std::filesystem;

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = (fs::path(::testing::TempDir()) / name).string();
  std::ofstream(path) << text;
  return path;
}

// The lines --metrics-file writes for `n` logged iterations, validation every 2.
std::string metrics_lines(int n, double loss0) {
  std::string s;
  for (int it = 1; it <= n; ++it) {
    s += "{\"iteration\": " + std::to_string(it) +
         ", \"lm_loss\": " + std::to_string(loss0 - 0.1 * it) +
         ", \"tokens_per_sec\": " + std::to_string(1000 + it) + ", \"tflops\": 0.5}\n";
    if (it % 2 == 0)
      s += "{\"iteration\": " + std::to_string(it) +
           ", \"val_loss\": " + std::to_string(loss0 - 0.05 * it) + "}\n";
  }
  return s;
}

// (chart, run) -> number of points of that polyline. The page's charts are <svg> elements
// with data-chart; each run's series a polyline with data-run.
std::map<std::pair<std::string, std::string>, int> polylines(const std::string& page) {
  std::map<std::pair<std::string, std::string>, int> out;
  const std::regex chart_re("data-chart=\"([a-z_]+)\"");
  const std::regex line_re(
      "<polyline class=\"series\" data-run=\"([^\"]*)\"[^>]* points=\"([^\"]*)\"");
  std::string chart;
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, chart_re)) chart = m[1];
    if (std::regex_search(line, m, line_re)) {
      std::istringstream points(m[2].str());
      int n = 0;
      for (std::string p; points >> p;) {
        EXPECT_NE(p.find(','), std::string::npos) << p;
        ++n;
      }
      out[{chart, m[1]}] = n;
    }
  }
  return out;
}

TEST(CliPlot, HtmlPageHasEveryRunsSeriesWithAPointPerValue) {
  const std::string a = temp_file("plot_run_a.jsonl", metrics_lines(6, 5.0));
  const std::string b = temp_file("plot_run_b.jsonl", metrics_lines(4, 4.0));
  const std::string out = (fs::path(::testing::TempDir()) / "plot_runs.html").string();
  auto [code, text] = run_omnitron("plot " + a + " " + b + " --output " + out);
  ASSERT_EQ(code, 0) << text;
  EXPECT_NE(text.find("wrote " + out), std::string::npos) << text;
  const std::string page = read_text(out);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(page.find("<script"), std::string::npos);  // self-contained, nothing to run
  EXPECT_EQ(page.find("http"), std::string::npos);     // nothing fetched
  const auto lines = polylines(page);
  using Key = std::pair<std::string, std::string>;
  EXPECT_EQ(lines, (std::map<Key, int>{{{"lm_loss", "plot_run_a"}, 6},
                                       {{"lm_loss", "plot_run_b"}, 4},
                                       {{"val_loss", "plot_run_a"}, 3},
                                       {{"val_loss", "plot_run_b"}, 2},
                                       {{"tokens_per_sec", "plot_run_a"}, 6},
                                       {{"tokens_per_sec", "plot_run_b"}, 4},
                                       {{"tflops", "plot_run_a"}, 6},
                                       {{"tflops", "plot_run_b"}, 4}}));
  // The legend names both runs.
  EXPECT_NE(page.find(">plot_run_a</text>"), std::string::npos);
  EXPECT_NE(page.find(">plot_run_b</text>"), std::string::npos);
}

TEST(CliPlot, SvgOutputIsOneImageWithTheSameSeries) {
  const std::string a = temp_file("plot_svg.jsonl", metrics_lines(5, 5.0));
  const std::string out = (fs::path(::testing::TempDir()) / "plot_svg.svg").string();
  auto [code, text] = run_omnitron("plot " + a + " --output " + out + " --title 'tiny & run'");
  ASSERT_EQ(code, 0) << text;
  const std::string svg = read_text(out);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find(">tiny &amp; run</text>"), std::string::npos);
  EXPECT_EQ(polylines(svg).at({"lm_loss", "plot_svg"}), 5);
}

TEST(CliPlot, DownstreamTasksGetAnAccAndAnAccNormChartEach) {
  std::string lines = metrics_lines(4, 5.0);
  for (int it : {0, 2, 4})
    for (const char* task : {"kjv", "arc_easy"})
      lines += "{\"iteration\": " + std::to_string(it) + ", \"consumed_samples\": 0, \"task\": \"" +
               task +
               "\", \"examples\": 10, \"acc\": 0.3, \"acc_stderr\": 0.1, \"acc_norm\": 0.4, "
               "\"acc_norm_stderr\": 0.1}\n";
  const std::string a = temp_file("plot_tasks.jsonl", lines);
  const std::string out = (fs::path(::testing::TempDir()) / "plot_tasks.html").string();
  auto [code, text] = run_omnitron("plot " + a + " --output " + out);
  ASSERT_EQ(code, 0) << text;
  const std::string page = read_text(out);
  const auto charts = polylines(page);
  EXPECT_EQ(charts.at({"lm_loss", "plot_tasks"}), 4);
  for (const char* chart : {"kjv_acc", "kjv_acc_norm", "arc_easy_acc", "arc_easy_acc_norm"})
    EXPECT_EQ(charts.at({chart, "plot_tasks"}), 3) << chart;
  EXPECT_NE(page.find(">downstream task kjv: acc_norm</text>"), std::string::npos);
}

TEST(CliPlot, ATrainingRunsMetricsFilePlots) {
  const std::string metrics = (fs::path(::testing::TempDir()) / "plot_train.jsonl").string();
  auto [c1, train] = run_omnitron(
      "train --mock-data --vocab-size 40 --num-layers 1 --hidden-size 16 "
      "--num-attention-heads 2 --seq-length 8 --micro-batch-size 2 --train-iters 6 "
      "--log-interval 2 --eval-iters 1 --eval-interval 3 --no-progress --max-new-tokens 0 "
      "--metrics-file " +
      metrics);
  ASSERT_EQ(c1, 0) << train;
  auto [c2, text] = run_omnitron("plot " + metrics);  // --output defaults to plot_train.html
  ASSERT_EQ(c2, 0) << text;
  const auto lines =
      polylines(read_text((fs::path(::testing::TempDir()) / "plot_train.html").string()));
  EXPECT_EQ(lines.at({"lm_loss", "plot_train"}), 3);   // iterations 2, 4, 6
  EXPECT_EQ(lines.at({"val_loss", "plot_train"}), 2);  // iterations 3, 6
}

void expect_error(const std::string& args, const std::string& needle) {
  auto [code, text] = run_omnitron("plot " + args);
  EXPECT_EQ(code, 2) << text;
  EXPECT_NE(text.find(needle), std::string::npos) << text;
}

TEST(CliPlot, BadInputsAreNamedWithFileAndLine) {
  const std::string dir = ::testing::TempDir();
  expect_error(dir + "plot_missing.jsonl", dir + "plot_missing.jsonl: cannot read");
  const std::string empty = temp_file("plot_empty.jsonl", "\n\n");
  expect_error(empty, empty + ": no metrics in the file");
  const std::string bad =
      temp_file("plot_bad.jsonl", metrics_lines(1, 5.0) + "{\"iteration\": 2,\n");
  expect_error(bad, bad + ":2: not a JSON object");
  const std::string no_it = temp_file("plot_no_it.jsonl", "{\"lm_loss\": 3}\n");
  expect_error(no_it, no_it + ":1: no \"iteration\"");
  const std::string array = temp_file("plot_array.jsonl", "[1, 2]\n");
  expect_error(array, array + ":1: expected a JSON object");
  const std::string text_loss =
      temp_file("plot_text.jsonl", "{\"iteration\": 1, \"lm_loss\": \"x\"}\n");
  expect_error(text_loss, text_loss + ":1: \"lm_loss\" is not a number");
  expect_error("", "plot needs at least one metrics file");
  expect_error(empty + " --output x.png", "expected a .html or .svg");
  expect_error(empty + " --colour red", "unknown option '--colour'");
}

TEST(CliPlot, HelpDescribesTheCommand) {
  auto [code, text] = run_omnitron("plot --help");
  EXPECT_EQ(code, 0);
  EXPECT_NE(text.find("usage: omnitron plot METRICS.jsonl"), std::string::npos) << text;
}

}  // namespace
