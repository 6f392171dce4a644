#include "bench/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace tqkv::bench {
namespace {

const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Fmt(double v) {
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e12) {  // whole numbers (token counts) in full
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (v != 0 && (std::fabs(v) >= 10000 || std::fabs(v) < 0.01)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// A "nice" axis step for the range [0, hi].
double NiceStep(double hi, int ticks) {
  const double raw = hi / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

void DrawPanel(std::ostringstream& o, const Panel& p, double ox, double oy, double w, double h) {
  const double l = ox + 70, r = ox + w - 20, t = oy + 40, b = oy + h - 55;
  double xmin = 1e300, xmax = -1e300, ymax = 0;
  std::set<double> xs;
  for (const auto& s : p.series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymax = std::max(ymax, s.y[i]);
      xs.insert(s.x[i]);
    }
  }
  if (xs.empty()) return;
  if (ymax <= 0) ymax = 1;
  // Headroom above the data for the legend, which sits at the top left.
  const double headroom = 1.08 + 0.07 * p.series.size();
  const double ystep = NiceStep(ymax * headroom, 5);
  const double ytop = std::ceil(ymax * headroom / ystep) * ystep;
  auto Y = [&](double v) { return b - (b - t) * v / ytop; };
  o << "<text x='" << ox + w / 2 << "' y='" << oy + 22
    << "' text-anchor='middle' font-size='15' font-weight='bold'>" << Escape(p.title) << "</text>\n";
  for (double v = 0; v <= ytop + 1e-9; v += ystep) {
    o << "<line x1='" << l << "' y1='" << Y(v) << "' x2='" << r << "' y2='" << Y(v)
      << "' stroke='#ddd'/>\n<text x='" << l - 6 << "' y='" << Y(v) + 4
      << "' text-anchor='end' font-size='11'>" << Fmt(v) << "</text>\n";
  }
  o << "<line x1='" << l << "' y1='" << b << "' x2='" << r << "' y2='" << b << "' stroke='#000'/>\n";
  o << "<line x1='" << l << "' y1='" << t << "' x2='" << l << "' y2='" << b << "' stroke='#000'/>\n";
  o << "<text x='" << (l + r) / 2 << "' y='" << b + 38 << "' text-anchor='middle' font-size='12'>"
    << Escape(p.x_label) << "</text>\n";
  o << "<text transform='translate(" << ox + 16 << "," << (t + b) / 2
    << ") rotate(-90)' text-anchor='middle' font-size='12'>" << Escape(p.y_label) << "</text>\n";
  std::vector<double> xv(xs.begin(), xs.end());
  if (p.bars) {
    const double group = (r - l) / xv.size();
    const double bw = group * 0.8 / std::max<size_t>(1, p.series.size());
    for (size_t g = 0; g < xv.size(); ++g) {
      const double gx = l + g * group + group * 0.1;
      o << "<text x='" << gx + group * 0.4 << "' y='" << b + 16
        << "' text-anchor='middle' font-size='11'>" << Fmt(xv[g]) << "</text>\n";
      for (size_t si = 0; si < p.series.size(); ++si) {
        const auto& s = p.series[si];
        for (size_t i = 0; i < s.x.size(); ++i) {
          if (s.x[i] != xv[g]) continue;
          o << "<rect x='" << gx + si * bw << "' y='" << Y(s.y[i]) << "' width='" << bw * 0.92
            << "' height='" << b - Y(s.y[i]) << "' fill='" << kColors[si % 10] << "'/>\n";
        }
      }
    }
  } else {
    auto X = [&](double v) { return xmax > xmin ? l + (r - l) * (v - xmin) / (xmax - xmin) : (l + r) / 2; };
    for (double v : xv) {
      o << "<text x='" << X(v) << "' y='" << b + 16 << "' text-anchor='middle' font-size='11'>"
        << Fmt(v) << "</text>\n";
    }
    for (size_t si = 0; si < p.series.size(); ++si) {
      const auto& s = p.series[si];
      std::string pts;
      for (size_t i = 0; i < s.x.size(); ++i) pts += Fmt(X(s.x[i])) + "," + Fmt(Y(s.y[i])) + " ";
      o << "<polyline fill='none' stroke-width='2.5' stroke='" << kColors[si % 10] << "' points='"
        << pts << "'/>\n";
      for (size_t i = 0; i < s.x.size(); ++i) {
        o << "<circle cx='" << X(s.x[i]) << "' cy='" << Y(s.y[i]) << "' r='3.5' fill='"
          << kColors[si % 10] << "'><title>" << Escape(s.name) << ": " << Fmt(s.y[i])
          << "</title></circle>\n";
      }
    }
  }
  // Legend, top-left inside the plot.
  for (size_t si = 0; si < p.series.size(); ++si) {
    const double ly = t + 8 + si * 16;
    o << "<rect x='" << l + 10 << "' y='" << ly - 9 << "' width='12' height='10' fill='"
      << kColors[si % 10] << "'/>\n<text x='" << l + 27 << "' y='" << ly
      << "' font-size='11'>" << Escape(p.series[si].name) << "</text>\n";
  }
}

}  // namespace

std::string RenderSvg(const std::vector<Panel>& panels, const std::string& note) {
  const double pw = 520, ph = 380;
  const double width = pw * std::max<size_t>(1, panels.size()), height = ph + 30;
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
    << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (size_t i = 0; i < panels.size(); ++i) DrawPanel(o, panels[i], i * pw, 0, pw, ph);
  o << "<text x='10' y='" << height - 10 << "' font-size='11' fill='#444'>" << Escape(note)
    << "</text>\n</svg>\n";
  return o.str();
}

}  // namespace tqkv::bench
