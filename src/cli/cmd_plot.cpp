// omnitron plot: a run's curves from its --metrics-file, for people who would rather look
// than read. Writes one self-contained page (inline SVG, no script) or one SVG image with
// training loss, validation loss, tokens/s and TFLOP/s against the iteration, and each
// downstream task's acc and acc_norm (--eval-task), several runs overlaid with a legend.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "cli/commands.h"

namespace omni::cli {

namespace {

const char* const kHelp =
    "usage: omnitron plot METRICS.jsonl [MORE.jsonl ...] [--output FILE.html|FILE.svg]\n"
    "                     [--title TEXT]\n"
    "\n"
    "Draws the curves of one or more runs from the files `omnitron train --metrics-file`\n"
    "writes: training loss, validation loss, tokens/s, TFLOP/s and each downstream task's\n"
    "acc and acc_norm (--eval-task) against the iteration,\n"
    "the runs overlaid, each named by its file. FILE.html is a page that opens in any\n"
    "browser (no script, nothing fetched); FILE.svg is one image. --output defaults to the\n"
    "first file with .html in place of its extension.\n";

struct Point {
  double x, y;
};

// One run: its name and a series per chart key.
struct Run {
  std::string name;
  std::map<std::string, std::vector<Point>> series;
};

struct Chart {
  std::string key;  // the --metrics-file member; for a downstream task, TASK_acc(_norm)
  std::string title;
};

const Chart kCharts[] = {{"lm_loss", "training loss"},
                         {"val_loss", "validation loss"},
                         {"tokens_per_sec", "throughput (tokens/s)"},
                         {"tflops", "TFLOP/s"}};

// The fixed charts, then two per downstream task of any run (train --eval-task).
std::vector<Chart> charts_of(const std::vector<Run>& runs) {
  std::vector<Chart> charts(std::begin(kCharts), std::end(kCharts));
  std::set<std::string> tasks;
  for (const Run& r : runs)
    for (const auto& [key, points] : r.series)
      if (key.ends_with("_acc")) tasks.insert(key.substr(0, key.size() - 4));
  for (const std::string& t : tasks)
    for (const char* metric : {"acc", "acc_norm"})
      charts.push_back({t + "_" + metric, "downstream task " + t + ": " + metric});
  return charts;
}

// Colour-blind-safe palette (Okabe and Ito), repeated past eight runs.
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};

Run read_run(const std::string& path) {
  std::ifstream in(path);
  OMNI_REQUIRE(in, path, ": cannot read the file");
  Run run;
  run.name = std::filesystem::path(path).stem().string();
  int records = 0, line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    json::Value v;
    try {
      v = json::parse(line, where);
    } catch (const UsageError& e) {
      throw UsageError(where + ": not a JSON object (" + e.what() + ")");
    }
    OMNI_REQUIRE(v.is_object(), where, ": expected a JSON object, as --metrics-file writes");
    const json::Value* it = v.find("iteration");
    OMNI_REQUIRE(it && it->is_number(), where, ": no \"iteration\" number in the object");
    const json::Value* task = v.find("task");
    OMNI_REQUIRE(!task || task->is_string(), where, ": \"task\" is not a string");
    const std::vector<std::pair<std::string, std::string>> members =
        task
            ? std::vector<std::pair<std::string, std::string>>{{"acc", task->str() + "_acc"},
                                                               {"acc_norm",
                                                                task->str() + "_acc_norm"}}
            : std::vector<std::pair<std::string, std::string>>{{"lm_loss", "lm_loss"},
                                                               {"val_loss", "val_loss"},
                                                               {"tokens_per_sec", "tokens_per_sec"},
                                                               {"tflops", "tflops"}};
    for (const auto& [member, key] : members) {
      const json::Value* y = v.find(member);
      if (!y || y->is_null()) continue;  // null: not finite when it was logged
      OMNI_REQUIRE(y->is_number(), where, ": \"", member, "\" is not a number");
      run.series[key].push_back({it->num(), y->num()});
    }
    ++records;
  }
  OMNI_REQUIRE(records > 0, path,
               ": no metrics in the file (expected one JSON object per line, as "
               "`omnitron train --metrics-file` writes)");
  return run;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    const char* entity = c == '&'   ? "&amp;"
                         : c == '<' ? "&lt;"
                         : c == '>' ? "&gt;"
                         : c == '"' ? "&quot;"
                                    : nullptr;
    if (entity) {
      out += entity;
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Round tick positions (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {2.0, 5.0, 10.0})
    if (raw > step) step = m * power;
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return out;
}

// The range of one chart's values over all runs, widened when it is a single value.
const std::vector<Point>& series_of(const Run& r, const std::string& key) {
  static const std::vector<Point> none;
  const auto it = r.series.find(key);
  return it == r.series.end() ? none : it->second;
}

std::pair<double, double> value_range(const std::vector<Run>& runs, const std::string& key,
                                      bool x) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const Run& r : runs)
    for (const Point& p : series_of(r, key)) {
      lo = std::min(lo, x ? p.x : p.y);
      hi = std::max(hi, x ? p.x : p.y);
    }
  if (lo == hi) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.05;
    return {lo - pad, hi + pad};
  }
  // Values get a margin so that no point sits on the frame; iterations span the width.
  const double pad = x ? 0.0 : (hi - lo) * 0.05;
  return {lo - pad, hi + pad};
}

constexpr int kWidth = 640, kHeight = 320;
constexpr int kLeft = 70, kRight = 20, kTop = 34, kBottom = 44;

// One chart as an <svg> element at (x, y) of its parent (ignored in HTML).
std::string chart_svg(const std::vector<Run>& runs, const Chart& chart, int x, int y) {
  std::ostringstream s;
  s << "<svg x=\"" << x << "\" y=\"" << y << "\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"12\" data-chart=\"" << xml_escape(chart.key)
    << "\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kWidth / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">"
    << xml_escape(chart.title) << "</text>\n";
  bool any = false;
  for (const Run& r : runs) any = any || !series_of(r, chart.key).empty();
  if (!any) {
    s << "<text x=\"" << kWidth / 2 << "\" y=\"" << kHeight / 2
      << "\" text-anchor=\"middle\" fill=\"#777\">not in these metrics files</text>\n</svg>\n";
    return s.str();
  }
  const auto [x0, x1] = value_range(runs, chart.key, true);
  const auto [y0, y1] = value_range(runs, chart.key, false);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const auto px = [&](double v) { return kLeft + (v - x0) / (x1 - x0) * plot_w; };
  const auto py = [&](double v) { return kTop + (y1 - v) / (y1 - y0) * plot_h; };
  for (double t : ticks(y0, y1))
    s << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << number(py(t))
      << "\" y2=\"" << number(py(t)) << "\" stroke=\"#ddd\"/><text x=\"" << kLeft - 6 << "\" y=\""
      << number(py(t) + 4) << "\" text-anchor=\"end\">" << number(t) << "</text>\n";
  for (double t : ticks(x0, x1))
    s << "<line x1=\"" << number(px(t)) << "\" x2=\"" << number(px(t)) << "\" y1=\"" << kTop
      << "\" y2=\"" << kTop + plot_h << "\" stroke=\"#eee\"/><text x=\"" << number(px(t))
      << "\" y=\"" << kTop + plot_h + 16 << "\" text-anchor=\"middle\">" << number(t)
      << "</text>\n";
  s << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
    << plot_h << "\" fill=\"none\" stroke=\"#444\"/>\n"
    << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 8
    << "\" text-anchor=\"middle\">iteration</text>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& points = series_of(runs[r], chart.key);
    if (points.empty()) continue;
    const char* colour = kColours[r % std::size(kColours)];
    s << "<polyline class=\"series\" data-run=\"" << xml_escape(runs[r].name) << "\" fill=\"none\" "
      << "stroke=\"" << colour << "\" stroke-width=\"1.8\" points=\"";
    for (size_t i = 0; i < points.size(); ++i)
      s << (i ? " " : "") << number(px(points[i].x)) << ',' << number(py(points[i].y));
    s << "\"/>\n";
    // Markers where the points are few enough to tell apart (and a lone point is visible).
    if (points.size() <= 60)
      for (const Point& p : points)
        s << "<circle cx=\"" << number(px(p.x)) << "\" cy=\"" << number(py(p.y))
          << "\" r=\"2.5\" fill=\"" << colour << "\"/>\n";
  }
  // Legend, top right inside the plot, on a veil so the curves under it do not hide it.
  s << "<rect x=\"" << kLeft + plot_w - 156 << "\" y=\"" << kTop + 2 << "\" width=\"152\" "
    << "height=\"" << 16 * runs.size() + 6 << "\" fill=\"white\" fill-opacity=\"0.85\" "
    << "stroke=\"#ccc\"/>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const double ly = kTop + 14 + 16 * double(r);
    s << "<rect x=\"" << kLeft + plot_w - 150 << "\" y=\"" << ly - 9 << "\" width=\"12\" "
      << "height=\"3\" fill=\"" << kColours[r % std::size(kColours)] << "\"/><text x=\""
      << kLeft + plot_w - 132 << "\" y=\"" << ly - 4 << "\">" << xml_escape(runs[r].name)
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::string html_page(const std::vector<Run>& runs, const std::string& title) {
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
    << xml_escape(title) << "</title>\n<style>body{font-family:sans-serif;margin:24px;}"
    << "svg{margin:8px;border:1px solid #ccc;}</style>\n</head>\n<body>\n<h1>" << xml_escape(title)
    << "</h1>\n<p>";
  for (size_t r = 0; r < runs.size(); ++r)
    s << (r ? ", " : "") << "<span style=\"color:" << kColours[r % std::size(kColours)]
      << "\">&#9632;</span> " << xml_escape(runs[r].name);
  s << "</p>\n<div>\n";
  for (const Chart& c : charts_of(runs)) s << chart_svg(runs, c, 0, 0);
  s << "</div>\n</body>\n</html>\n";
  return s.str();
}

// The charts two by two in one SVG document.
std::string svg_image(const std::vector<Run>& runs, const std::string& title) {
  std::ostringstream s;
  const std::vector<Chart> charts = charts_of(runs);
  const int width = 2 * kWidth, height = 40 + int(charts.size() + 1) / 2 * kHeight;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
    << "width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << ' '
    << height << "\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\""
    << width / 2 << "\" y=\"26\" text-anchor=\"middle\" font-family=\"sans-serif\" "
    << "font-size=\"18\">" << xml_escape(title) << "</text>\n";
  for (size_t c = 0; c < charts.size(); ++c)
    s << chart_svg(runs, charts[c], int(c % 2) * kWidth, 40 + int(c / 2) * kHeight);
  s << "</svg>\n";
  return s.str();
}

}  // namespace

int plot(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf("%s", kHelp);
    return 0;
  }
  std::vector<std::string> inputs;
  std::string output, title;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--output" || a == "--title") {
      OMNI_REQUIRE(i + 1 < args.size(), a, " needs a value");
      (a == "--output" ? output : title) = args[++i];
    } else {
      OMNI_REQUIRE(a.rfind("--", 0) != 0, "unknown option '", a,
                   "' (plot takes metrics files, --output FILE and --title TEXT)");
      inputs.push_back(a);
    }
  }
  OMNI_REQUIRE(!inputs.empty(), "plot needs at least one metrics file (see omnitron plot --help)");
  if (output.empty()) output = std::filesystem::path(inputs[0]).replace_extension(".html").string();
  const std::string ext = std::filesystem::path(output).extension().string();
  OMNI_REQUIRE(ext == ".html" || ext == ".htm" || ext == ".svg", "--output '", output,
               "': expected a .html or .svg file name");
  std::vector<Run> runs;
  for (const std::string& path : inputs) runs.push_back(read_run(path));
  // Runs named alike (run1/metrics.jsonl, run2/metrics.jsonl) are told apart by their path.
  bool names_clash = false;
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < i; ++j) names_clash = names_clash || runs[i].name == runs[j].name;
  if (names_clash)
    for (size_t i = 0; i < runs.size(); ++i) runs[i].name = inputs[i];
  if (title.empty()) title = "omnitron: " + runs[0].name + (runs.size() > 1 ? " and others" : "");
  const std::string text = ext == ".svg" ? svg_image(runs, title) : html_page(runs, title);
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  OMNI_REQUIRE(out, "--output: cannot write '", output, "'");
  std::printf("wrote %s (%zu run%s)\n", output.c_str(), runs.size(), runs.size() > 1 ? "s" : "");
  return 0;
}

}  // namespace omni::cli
