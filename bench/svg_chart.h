// Minimal SVG charts for benchmark reports: line charts (x numeric) and grouped bar charts.
#ifndef TQKV_BENCH_SVG_CHART_H_
#define TQKV_BENCH_SVG_CHART_H_

#include <string>
#include <vector>

namespace tqkv::bench {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct Panel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool bars = false;  // grouped bars: one group per distinct x, one bar per series
};

// Renders panels side by side into one SVG document, with a note line under them.
std::string RenderSvg(const std::vector<Panel>& panels, const std::string& note);

}  // namespace tqkv::bench

#endif  // TQKV_BENCH_SVG_CHART_H_
