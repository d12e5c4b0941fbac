// The merged timeline, drawn two ways: Chrome's trace event format for
// Perfetto (every step, zoomable) and a hand-written SVG of one step (for
// reports; no library, so it opens anywhere and diffs as text).
#include "lockstep/train/timeline.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <vector>

#include "lockstep/atomic_file.h"
#include "lockstep/error.h"

namespace lockstep::train {
namespace fs = std::filesystem;
namespace {

// Both outputs reject the same impossible input, before touching any file.
void check_events(const char* caller, std::span<const TimelineEvent> events, int replicas) {
  if (replicas <= 0)
    throw InvalidArgument(std::string(caller) + ": replicas must be positive, got " +
                          std::to_string(replicas) + ".");
  for (const TimelineEvent& e : events) {
    if (e.replica < 0 || e.replica >= replicas)
      throw InvalidArgument(std::string(caller) + ": event '" + e.name + "' belongs to replica " +
                            std::to_string(e.replica) + " but there are " + std::to_string(replicas) +
                            " replicas.");
    if (!std::isfinite(e.start_us) || !std::isfinite(e.end_us) || e.end_us < e.start_us)
      throw InvalidArgument(std::string(caller) + ": event '" + e.name + "' of replica " +
                            std::to_string(e.replica) + " runs from " + std::to_string(e.start_us) +
                            " us to " + std::to_string(e.end_us) + " us, which is not an interval.");
  }
}

// Chrome thread id: rows sort as replica 0 compute, replica 0 comm, replica 1 ...
int thread_id(int replica, Track track) {
  return 2 * replica + (track == Track::Comm ? 1 : 0);
}

// ---- SVG ----

__attribute__((format(printf, 1, 2))) std::string strf(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// Text for XML content and attribute values. Control characters other than
// tab and newline are not allowed in XML 1.0 at all, so they become spaces.
std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
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
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? ' ' : c;
    }
  }
  return out;
}

// Tick spacing of 1, 2 or 5 x 10^k giving at most `max_ticks` intervals.
double tick_spacing(double span_ms, int max_ticks) {
  const double raw = span_ms / max_ticks;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * decade >= raw * (1 - 1e-9)) return m * decade;
  return 10 * decade;
}

struct PhaseStyle {
  const char* label;
  const char* fill;
  const char* text;  // colour of a label drawn on the bar
};

PhaseStyle style_of(Phase phase) {
  switch (phase) {
    case Phase::Forward:
      return {"forward", "#4c78a8", "#ffffff"};
    case Phase::Backward:
      return {"backward", "#f58518", "#ffffff"};
    case Phase::Optimizer:
      return {"optimizer", "#54a24b", "#ffffff"};
    case Phase::Allreduce:
      return {"allreduce", "#9d6fc4", "#ffffff"};
    case Phase::Exposed:
      return {"exposed comm", "url(#exposed)", "#7f0000"};
  }
  return {"?", "#888888", "#000000"};
}

// Layout, in px. A replica's row is a compute lane with a thinner comm lane
// below it; the axis and the legend sit under the last row.
constexpr double kWidth = 1000, kLeft = 100, kRight = 24, kTop = 44;
constexpr double kComputeH = 18, kLaneGap = 2, kCommH = 9, kRowGap = 12;
constexpr double kRowH = kComputeH + kLaneGap + kCommH + kRowGap;
constexpr double kPlotW = kWidth - kLeft - kRight;
constexpr double kCharW = 5.6;  // average advance of a 10 px sans-serif glyph

}  // namespace

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::Exposed:
      return "exposed";
    case Phase::Allreduce:
      return "allreduce";
  }
  return "unknown";
}

void write_chrome_trace(const fs::path& path, std::span<const TimelineEvent> events, int replicas) {
  check_events("write_chrome_trace", events, replicas);
  using nlohmann::json;
  // One event per line: the file stays greppable and diffable.
  std::vector<json> trace;
  trace.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "lockstep"}}}});
  for (int r = 0; r < replicas; ++r) {
    for (Track track : {Track::Compute, Track::Comm}) {
      const int tid = thread_id(r, track);
      const std::string name = "replica " + std::to_string(r) + (track == Track::Comm ? " comm" : " compute");
      trace.push_back(
          {{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", tid}, {"args", {{"name", name}}}});
      trace.push_back({{"ph", "M"},
                       {"name", "thread_sort_index"},
                       {"pid", 0},
                       {"tid", tid},
                       {"args", {{"sort_index", tid}}}});
    }
  }
  // Note [Whole nanoseconds]: Perfetto reads ts and dur (microseconds) as
  // llround(x * 1000) ns each and ends a slice at ts + dur, so two roundings
  // where the event had one end. For times off the nanosecond grid (a rank's
  // events moved by its clock offset, gather_timeline), one event then ended
  // 1 ns after the next on its track began: a partial overlap, which Perfetto
  // drops (slice_drop_overlapping_complete_event; ~10% of a 3-process trace's
  // events). Both ends are rounded to whole nanoseconds first, and dur is
  // their difference, so events that touch still touch.
  const auto ns = [](double us) { return std::llround(us * 1000); };
  for (const TimelineEvent& e : events) {
    json args = {{"step", e.step}};
    if (e.bytes > 0) args["bytes"] = e.bytes;
    const long long begin = ns(e.start_us), end = ns(e.end_us);
    trace.push_back({{"ph", "X"},
                     {"name", e.name},
                     {"cat", to_string(e.phase)},
                     {"ts", double(begin) / 1000},
                     {"dur", double(end - begin) / 1000},
                     {"pid", 0},
                     {"tid", thread_id(e.replica, e.track)},
                     {"args", args}});
  }
  std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (std::size_t i = 0; i < trace.size(); ++i) {
    // Names are not checked for UTF-8 anywhere upstream; replace bad bytes
    // rather than fail the whole run's trace over one label.
    text += trace[i].dump(-1, ' ', false, json::error_handler_t::replace);
    text += i + 1 < trace.size() ? ",\n" : "\n";
  }
  text += "]}\n";
  write_file_atomically(path, text, "the Chrome trace");
}

std::string render_timeline_svg(std::span<const TimelineEvent> events, int replicas, std::int64_t step) {
  check_events("render_timeline_svg", events, replicas);
  std::vector<const TimelineEvent*> chosen;
  for (const TimelineEvent& e : events)
    if (e.step == step) chosen.push_back(&e);
  if (chosen.empty()) {
    std::string held = "the timeline is empty";
    if (!events.empty()) {
      const auto [lo, hi] = std::minmax_element(events.begin(), events.end(),
                                                [](const auto& a, const auto& b) { return a.step < b.step; });
      held = "the timeline holds steps " + std::to_string(lo->step) + " to " + std::to_string(hi->step);
    }
    throw InvalidArgument("render_timeline_svg: step " + std::to_string(step) + " has no events (" + held +
                          ").");
  }

  double t0 = chosen[0]->start_us, t1 = chosen[0]->end_us, exposed0_us = 0;
  for (const TimelineEvent* e : chosen) {
    t0 = std::min(t0, e->start_us);
    t1 = std::max(t1, e->end_us);
    if (e->replica == 0 && e->phase == Phase::Exposed) exposed0_us += e->end_us - e->start_us;
  }
  const double wall_ms = (t1 - t0) / 1000;
  const double tick = tick_spacing(std::max(wall_ms, 1e-3), 10);
  const double axis_ms = std::max(tick, std::ceil(wall_ms / tick - 1e-9) * tick);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(tick) + 1e-9)));
  auto x_of = [&](double us) { return kLeft + (us - t0) / 1000 / axis_ms * kPlotW; };
  const double axis_y = kTop + replicas * kRowH;
  const double height = axis_y + 78;

  std::string s = strf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, height, kWidth, height);
  s += "<defs><pattern id=\"exposed\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
       "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fde0dd\"/>"
       "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d62728\" stroke-width=\"3\"/></pattern></defs>\n";
  s += strf("<rect width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", kWidth, height);
  const double exposed_pct = wall_ms > 0 ? 100 * exposed0_us / 1000 / wall_ms : 0;
  s += strf(
      "<text x=\"%.0f\" y=\"22\" font-size=\"15\" font-weight=\"bold\">step %lld: wall time %.3f ms, "
      "exposed comm on replica 0 %.3f ms (%.1f%%)</text>\n",
      kLeft, static_cast<long long>(step), wall_ms, exposed0_us / 1000, exposed_pct);

  // Grid and axis first, so the bars cover the grid lines.
  for (int i = 0; i * tick <= axis_ms * (1 + 1e-9); ++i) {
    const double x = kLeft + i * tick / axis_ms * kPlotW;
    s += strf("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#dddddd\"/>", x, kTop - 4, x,
              axis_y);
    s += strf("<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">%.*f</text>\n", x,
              axis_y + 16, decimals, i * tick);
  }
  s += strf("<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#444444\"/>\n", kLeft, axis_y,
            kLeft + kPlotW, axis_y);
  s += strf(
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">time since the step "
      "began (ms)</text>\n",
      kLeft + kPlotW / 2, axis_y + 32);

  for (int r = 0; r < replicas; ++r) {
    const double y = kTop + r * kRowH;
    s += strf(
        "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" dominant-baseline=\"central\">replica %d</text>",
        kLeft - 8, y + kComputeH / 2, r);
    s += strf(
        "<text x=\"%.0f\" y=\"%.1f\" font-size=\"9\" fill=\"#777777\" text-anchor=\"end\" "
        "dominant-baseline=\"central\">comm</text>\n",
        kLeft - 8, y + kComputeH + kLaneGap + kCommH / 2);
    s += strf("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#f4f4f4\"/>", kLeft, y,
              kPlotW, kComputeH);
    s += strf("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#f4f4f4\"/>\n", kLeft,
              y + kComputeH + kLaneGap, kPlotW, kCommH);
  }

  for (const TimelineEvent* e : chosen) {
    const PhaseStyle st = style_of(e->phase);
    const bool comm = e->track == Track::Comm;
    const double x = x_of(e->start_us);
    const double w = std::max(1.0, x_of(e->end_us) - x);  // never vanish
    const double y = kTop + e->replica * kRowH + (comm ? kComputeH + kLaneGap : 0);
    const double h = comm ? kCommH : kComputeH;
    // A white outline separates back-to-back bars (the backward layers).
    const char* stroke = e->phase == Phase::Exposed ? " stroke=\"#d62728\" stroke-width=\"1.5\""
                                                    : " stroke=\"#ffffff\" stroke-width=\"1\"";
    std::string tip = e->name + ": " + strf("%.3f ms", (e->end_us - e->start_us) / 1000) +
                      strf(" (%.3f to %.3f ms), replica %d %s", (e->start_us - t0) / 1000,
                           (e->end_us - t0) / 1000, e->replica, comm ? "comm" : "compute");
    if (e->bytes > 0) tip += ", " + std::to_string(e->bytes) + " bytes";
    s += strf(
        "<rect class=\"bar\" data-phase=\"%s\" data-replica=\"%d\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
        "height=\"%.0f\" fill=\"%s\"%s>",
        to_string(e->phase), e->replica, x, y, w, h, st.fill, stroke);
    s += "<title>" + xml_escape(tip) + "</title></rect>";
    // A label only where it fits; the tooltip always has the full name.
    if (!comm && w > e->name.size() * kCharW + 6)
      s += strf(
               "<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\" dominant-baseline=\"central\" "
               "pointer-events=\"none\">",
               x + 3, y + h / 2, st.text) +
           xml_escape(e->name) + "</text>";
    s += "\n";
  }

  double lx = kLeft;
  const double ly = axis_y + 50;
  for (Phase p : {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Allreduce, Phase::Exposed}) {
    const PhaseStyle st = style_of(p);
    const char* stroke = p == Phase::Exposed ? " stroke=\"#d62728\" stroke-width=\"1.5\"" : "";
    s += strf("<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"12\" fill=\"%s\"%s/>", lx, ly, st.fill,
              stroke);
    s += strf("<text x=\"%.0f\" y=\"%.0f\" dominant-baseline=\"central\">%s</text>\n", lx + 20, ly + 6,
              st.label);
    lx += 20 + std::string(st.label).size() * 7.0 + 24;
  }
  s += strf(
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" fill=\"#555555\" dominant-baseline=\"central\">"
      "compute lane on top, comm lane below</text>\n",
      lx + 16, ly + 6);
  s += "</svg>\n";
  return s;
}

}  // namespace lockstep::train
