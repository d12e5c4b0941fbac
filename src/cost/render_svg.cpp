// The plan as an SVG plot: efficiency (left axis) and cost per million
// useful samples (right axis) against replica count (log2 axis). Written by
// hand, like the trainer's timeline: no library, opens anywhere, diffs as text.
#include <algorithm>
#include <cmath>

#include "format.h"
#include "plan_internal.h"
#include "lockstep/cost/render.h"

namespace lockstep::cost {
namespace {

using detail::strf;

constexpr double kWidth = 760, kHeight = 440, kLeft = 70, kRight = 80, kTop = 50, kBottom = 70;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out;
}

// A "nice" upper bound: 1, 2 or 5 x 10^k at or above v.
double nice_ceiling(double v) {
  if (!(v > 0)) return 1;
  const double decade = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * decade >= v * (1 - 1e-9)) return m * decade;
  return 10 * decade;
}

}  // namespace

std::string plan_svg(const Plan& plan) {
  const auto& rows = plan.rows;
  const double lo = std::log2(double(rows.front().replicas)), hi = std::log2(double(rows.back().replicas));
  const double span = std::max(hi - lo, 1.0);
  auto x_of = [&](int n) { return kLeft + (std::log2(double(n)) - lo) / span * kPlotW; };
  double eff_max = 1, cost_max = 0;
  for (const PlanRow& r : rows) {
    eff_max = std::max(eff_max, r.efficiency);
    cost_max = std::max(cost_max, r.cost_per_million_useful_samples);
  }
  cost_max = nice_ceiling(cost_max);
  auto y_eff = [&](double e) { return kTop + kPlotH * (1 - e / eff_max); };
  auto y_cost = [&](double c) { return kTop + kPlotH * (1 - c / cost_max); };

  std::string s = strf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, kHeight, kWidth, kHeight);
  s += strf("<rect width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  s += "<text x=\"" + strf("%.0f", kLeft) + "\" y=\"24\" font-size=\"15\" font-weight=\"bold\">" +
       xml_escape("lockstep plan: " + plan.model + ", micro-batch " +
                  std::to_string(plan.options.step.micro_batch)) +
       "</text>\n";

  // Grid and axes.
  for (int i = 0; i <= 5; ++i) {
    const double f = i / 5.0, y = kTop + kPlotH * (1 - f);
    s += strf("<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>", kLeft, y,
              kLeft + kPlotW, y);
    s += strf("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#1f77b4\">%.2f</text>", kLeft - 6,
              y + 4, f * eff_max);
    s += strf("<text x=\"%.0f\" y=\"%.1f\" fill=\"#d95f02\">%.3g</text>\n", kLeft + kPlotW + 6, y + 4,
              f * cost_max);
  }
  for (const PlanRow& r : rows) {
    const double x = x_of(r.replicas);
    s += strf("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#eeeeee\"/>", x, kTop, x,
              kTop + kPlotH);
    s += strf("<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", x, kTop + kPlotH + 18,
              r.replicas);
  }
  s += strf("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#444444\"/>\n",
            kLeft, kTop, kPlotW, kPlotH);
  s += strf("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">replicas</text>\n", kLeft + kPlotW / 2,
            kTop + kPlotH + 38);
  s += strf(
      "<text transform=\"translate(18 %.0f) rotate(-90)\" text-anchor=\"middle\" fill=\"#1f77b4\">efficiency "
      "</text>\n",
      kTop + kPlotH / 2);
  s += strf(
      "<text transform=\"translate(%.0f %.0f) rotate(90)\" text-anchor=\"middle\" fill=\"#d95f02\">cost per "
      "million samples</text>\n",
      kWidth - 16, kTop + kPlotH / 2);

  // The threshold and the recommended limit.
  // The binding threshold: --min-efficiency, or the cost increase as an efficiency.
  const double floor = detail::efficiency_floor(plan.options);
  const double ty = y_eff(floor);
  const std::string label = floor > plan.options.min_efficiency
                                ? strf("efficiency %.2f (--max-cost-increase %.2f)", floor, plan.options.max_cost_increase)
                                : strf("min efficiency %.2f", floor);
  s += strf(
      "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#1f77b4\" stroke-dasharray=\"5 4\"/>"
      "<text x=\"%.0f\" y=\"%.1f\" fill=\"#1f77b4\" font-size=\"10\">%s</text>\n",
      kLeft, ty, kLeft + kPlotW, ty, kLeft + 4, ty - 4, label.c_str());
  const int limit = plan.recommendation.max_replicas;
  if (limit > 0 && limit >= rows.front().replicas) {
    const double x = x_of(limit);
    s += strf(
        "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#2ca02c\" stroke-width=\"2\"/>"
        "<text x=\"%.1f\" y=\"%.0f\" fill=\"#2ca02c\" font-size=\"10\">pays up to %d</text>\n",
        x, kTop, x, kTop + kPlotH, x + 4, kTop + 12, limit);
  }

  // The two series.
  std::string eff_pts, cost_pts;
  for (const PlanRow& r : rows) {
    eff_pts += strf("%.1f,%.1f ", x_of(r.replicas), y_eff(r.efficiency));
    cost_pts += strf("%.1f,%.1f ", x_of(r.replicas), y_cost(r.cost_per_million_useful_samples));
  }
  s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"" + eff_pts + "\"/>\n";
  s += "<polyline fill=\"none\" stroke=\"#d95f02\" stroke-width=\"2\" points=\"" + cost_pts + "\"/>\n";
  for (const PlanRow& r : rows) {
    const double x = x_of(r.replicas);
    s += strf(
        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f77b4\"><title>%d replicas: efficiency %.3f (%s)"
        "</title></circle>",
        x, y_eff(r.efficiency), r.replicas, r.efficiency, to_string(r.bound));
    s += strf(
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"#d95f02\"><title>%d replicas: %.4g per "
        "million samples</title></rect>\n",
        x - 3.5, y_cost(r.cost_per_million_useful_samples) - 3.5, r.replicas,
        r.cost_per_million_useful_samples);
  }

  // Legend.
  const double ly = kHeight - 18;
  s += strf(
      "<circle cx=\"%.0f\" cy=\"%.0f\" r=\"4\" fill=\"#1f77b4\"/><text x=\"%.0f\" y=\"%.0f\">efficiency "
      "(against one replica)</text>",
      kLeft, ly - 4, kLeft + 10, ly);
  s += strf(
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"7\" height=\"7\" fill=\"#d95f02\"/><text x=\"%.0f\" "
      "y=\"%.0f\">cost "
      "%s (price %.3g per device-hour)</text>\n",
      kLeft + 250, ly - 8, kLeft + 262, ly, detail::per_million(plan.options.critical_batch > 0),
      plan.options.price_per_device_hour);
  s += "</svg>\n";
  return s;
}

}  // namespace lockstep::cost
