#include "kit/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/format.h"  // number

namespace kvvm::cli {
namespace {

constexpr double kWidth = 640, kHeight = 400;
constexpr double kLeft = 70, kRight = 150, kTop = 40, kBottom = 50;  // margins
constexpr int kTicks = 5;

// A tick step of 1, 2 or 5 times a power of ten giving about kTicks ticks up to `max`.
double tick_step(double max) {
  const double raw = max / kTicks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_svg_line_chart(const SvgChart& chart) {
  double max_x = 0, max_y = 0;
  for (const SvgSeries& series : chart.series) {
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      max_x = std::max(max_x, x);
      max_y = std::max(max_y, y);
    }
  }
  const double x_step = tick_step(max_x > 0 ? max_x : 1);
  const double y_step = tick_step(max_y > 0 ? max_y : 1);
  const double x_end = std::ceil((max_x > 0 ? max_x : 1) / x_step) * x_step;
  const double y_end = std::ceil((max_y > 0 ? max_y * 1.05 : 1) / y_step) * y_step;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const auto px = [&](double x) { return kLeft + x / x_end * plot_w; };
  const auto py = [&](double y) { return kTop + plot_h - y / y_end * plot_h; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << kWidth / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
      << xml_escape(chart.title) << "</text>\n";
  // Grid and ticks.
  for (double x = 0; x <= x_end + x_step / 2; x += x_step) {
    svg << "<line x1=\"" << number(px(x)) << "\" y1=\"" << number(kTop) << "\" x2=\""
        << number(px(x)) << "\" y2=\"" << number(kTop + plot_h) << "\" stroke=\"#ddd\"/>\n";
    svg << "<text x=\"" << number(px(x)) << "\" y=\"" << number(kTop + plot_h + 16)
        << "\" text-anchor=\"middle\">" << number(x) << "</text>\n";
  }
  for (double y = 0; y <= y_end + y_step / 2; y += y_step) {
    svg << "<line x1=\"" << number(kLeft) << "\" y1=\"" << number(py(y)) << "\" x2=\""
        << number(kLeft + plot_w) << "\" y2=\"" << number(py(y)) << "\" stroke=\"#ddd\"/>\n";
    svg << "<text x=\"" << number(kLeft - 6) << "\" y=\"" << number(py(y) + 4)
        << "\" text-anchor=\"end\">" << number(y) << "</text>\n";
  }
  svg << "<rect x=\"" << number(kLeft) << "\" y=\"" << number(kTop) << "\" width=\""
      << number(plot_w) << "\" height=\"" << number(plot_h)
      << "\" fill=\"none\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << number(kLeft + plot_w / 2) << "\" y=\"" << number(kHeight - 10)
      << "\" text-anchor=\"middle\">" << xml_escape(chart.x_label) << "</text>\n";
  svg << "<text transform=\"translate(16 " << number(kTop + plot_h / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << xml_escape(chart.y_label) << "</text>\n";
  // Series and legend.
  for (std::size_t s = 0; s < chart.series.size(); ++s) {
    const SvgSeries& series = chart.series[s];
    const std::string color = xml_escape(series.color.empty() ? "black" : series.color);
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    bool first = true;
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      svg << (first ? "" : " ") << number(px(x)) << "," << number(py(y));
      first = false;
    }
    svg << "\"/>\n";
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      svg << "<circle cx=\"" << number(px(x)) << "\" cy=\"" << number(py(y)) << "\" r=\"3\" fill=\""
          << color << "\"/>\n";
    }
    const double legend_y = kTop + 10 + 20 * static_cast<double>(s);
    svg << "<line x1=\"" << number(kLeft + plot_w + 12) << "\" y1=\"" << number(legend_y)
        << "\" x2=\"" << number(kLeft + plot_w + 32) << "\" y2=\"" << number(legend_y)
        << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n";
    svg << "<text x=\"" << number(kLeft + plot_w + 38) << "\" y=\"" << number(legend_y + 4) << "\">"
        << xml_escape(series.name) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace kvvm::cli
