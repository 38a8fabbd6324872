// A small SVG line chart, written as text: axes with rounded ticks, one polyline with point
// markers per series, a legend. No dependency (gnuplot is optional on the machines the
// benchmarks run on, and a chart of a few points needs none).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvvm::cli {

struct SvgSeries {
  std::string name;
  std::string color;                              // any SVG colour, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
};

struct SvgChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<SvgSeries> series;
};

// A complete SVG document. Non-finite points are left out; text is XML-escaped. Axes start at 0
// and end past the largest value (1 when every value is 0 or there is none).
std::string render_svg_line_chart(const SvgChart& chart);

// `text` with &, <, >, " and ' escaped for XML text and attributes.
std::string xml_escape(const std::string& text);

}  // namespace kvvm::cli
