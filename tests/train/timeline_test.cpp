#include "lockstep/train/timeline.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "lockstep/error.h"
#include "temp_dir_test.h"

namespace lockstep::train {
namespace {

using nlohmann::json;

// Two replicas, two steps, every phase; fixed times in microseconds.
std::vector<TimelineEvent> small_timeline() {
  std::vector<TimelineEvent> ev;
  for (std::int64_t step = 0; step < 2; ++step) {
    const double t = 10000.0 * step;
    for (int r = 0; r < 2; ++r) {
      const std::string s = "#s" + std::to_string(step);
      ev.push_back({r, Track::Compute, Phase::Forward, step, "forward " + s, t + 0, t + 1000, 0});
      ev.push_back(
          {r, Track::Compute, Phase::Backward, step, "backward 1.weight " + s, t + 1000, t + 2500, 0});
      ev.push_back(
          {r, Track::Compute, Phase::Backward, step, "backward 0.weight " + s, t + 2500, t + 4000, 0});
      ev.push_back(
          {r, Track::Comm, Phase::Allreduce, step, "allreduce bucket 0 " + s, t + 2500, t + 5000, 4096});
      ev.push_back({r, Track::Compute, Phase::Exposed, step, "exposed comm " + s, t + 4000, t + 5000, 0});
      ev.push_back({r, Track::Compute, Phase::Optimizer, step, "optimizer " + s, t + 5000, t + 5500 + r, 0});
    }
  }
  return ev;
}

// What a real run looks like: `replicas` rows of ~20 events for one step.
std::vector<TimelineEvent> busy_step(int replicas, std::int64_t step, double t0) {
  std::vector<TimelineEvent> ev;
  for (int r = 0; r < replicas; ++r) {
    double t = t0 + 37.0 * r;
    ev.push_back({r, Track::Compute, Phase::Forward, step, "forward", t, t + 2100, 0});
    t += 2100;
    const double bwd_start = t;
    for (int layer = 11; layer >= 0; --layer) {
      const double d = 180 + 15 * layer + 3 * r;
      ev.push_back({r, Track::Compute, Phase::Backward, step, "backward " + std::to_string(layer) + ".weight",
                    t, t + d, 0});
      t += d;
    }
    double c = bwd_start + 900;
    for (int b = 0; b < 5; ++b) {
      const double d = 700 + 40 * b;
      ev.push_back({r, Track::Comm, Phase::Allreduce, step, "allreduce bucket " + std::to_string(b), c, c + d,
                    std::uint64_t(1) << (20 + b % 2)});
      c += d + 20;
    }
    const double comm_end = c - 20;
    if (comm_end > t) {
      ev.push_back({r, Track::Compute, Phase::Exposed, step, "exposed comm", t, comm_end, 0});
      t = comm_end;
    }
    ev.push_back({r, Track::Compute, Phase::Optimizer, step, "optimizer", t, t + 400, 0});
  }
  return ev;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

// A small well-formedness checker, enough for what we emit: matched tags,
// self-closing tags, quoted attributes, entities only where '&' appears,
// exactly one root element. Returns "" or the first defect.
std::string xml_defect(const std::string& s) {
  std::vector<std::string> open;
  int roots = 0;
  std::string root;
  auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == ':' || c == '_';
  };
  auto entity_ok = [&](std::size_t i) {  // s[i] == '&'
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
      if (s.compare(i, std::strlen(e), e) == 0) return true;
    return false;
  };
  std::size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '&') {
      if (!entity_ok(i)) return "raw '&' at offset " + std::to_string(i);
      ++i;
    } else if (c != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(c)))
        return "text outside the root at offset " + std::to_string(i);
      ++i;
    } else if (s.compare(i, 2, "</") == 0) {
      std::size_t j = i + 2;
      while (j < s.size() && name_char(s[j])) ++j;
      const std::string name = s.substr(i + 2, j - i - 2);
      if (j >= s.size() || s[j] != '>') return "bad closing tag at offset " + std::to_string(i);
      if (open.empty() || open.back() != name)
        return "mismatched </" + name + "> at offset " + std::to_string(i);
      open.pop_back();
      i = j + 1;
    } else {
      std::size_t j = i + 1;
      while (j < s.size() && name_char(s[j])) ++j;
      const std::string name = s.substr(i + 1, j - i - 1);
      if (name.empty()) return "raw '<' at offset " + std::to_string(i);
      for (;;) {  // attributes
        while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
        if (j >= s.size()) return "unterminated <" + name + ">";
        if (s[j] == '>' || s.compare(j, 2, "/>") == 0) break;
        const std::size_t a = j;
        while (j < s.size() && name_char(s[j])) ++j;
        if (j == a || j + 1 >= s.size() || s[j] != '=' || (s[j + 1] != '"' && s[j + 1] != '\''))
          return "unquoted or malformed attribute in <" + name + "> at offset " + std::to_string(a);
        const char q = s[j + 1];
        const std::size_t end = s.find(q, j + 2);
        if (end == std::string::npos) return "unterminated attribute in <" + name + ">";
        for (std::size_t k = j + 2; k < end; ++k) {
          if (s[k] == '<') return "'<' in an attribute of <" + name + ">";
          if (s[k] == '&' && !entity_ok(k)) return "raw '&' in an attribute of <" + name + ">";
        }
        j = end + 1;
        if (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j])) && s[j] != '>' && s[j] != '/')
          return "attributes not separated in <" + name + ">";
      }
      if (open.empty()) {
        ++roots;
        root = name;
      }
      if (s[j] == '>') {
        open.push_back(name);
        i = j + 1;
      } else {
        i = j + 2;
      }
    }
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  if (roots != 1 || root != "svg")
    return "expected one root <svg>, found " + std::to_string(roots) + " roots";
  return "";
}

TEST(XmlChecker, CatchesDefects) {
  EXPECT_EQ(xml_defect("<svg a=\"1\"><g/><text>a &amp; b</text></svg>"), "");
  EXPECT_NE(xml_defect("<svg><g></svg>"), "");
  EXPECT_NE(xml_defect("<svg a=1></svg>"), "");
  EXPECT_NE(xml_defect("<svg>a & b</svg>"), "");
  EXPECT_NE(xml_defect("<svg>a < b</svg>"), "");
  EXPECT_NE(xml_defect("<svg></svg><svg></svg>"), "");
  EXPECT_NE(xml_defect("<g></g>"), "");
}

TEST(Timeline, PhaseNames) {
  EXPECT_STREQ(to_string(Phase::Forward), "forward");
  EXPECT_STREQ(to_string(Phase::Backward), "backward");
  EXPECT_STREQ(to_string(Phase::Optimizer), "optimizer");
  EXPECT_STREQ(to_string(Phase::Exposed), "exposed");
  EXPECT_STREQ(to_string(Phase::Allreduce), "allreduce");
}

using ChromeTrace = lockstep::testing::TempDirTest;

TEST_F(ChromeTrace, HoldsEveryEventExactly) {
  const auto events = small_timeline();
  const auto path = dir_ / "trace.json";
  write_chrome_trace(path, events, 2);
  const json doc = json::parse(read_all(path));
  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  std::vector<json> x, names, sort;
  for (const json& e : doc.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 0);
    if (e.at("ph") == "X") x.push_back(e);
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names.push_back(e);
    if (e.at("ph") == "M" && e.at("name") == "thread_sort_index") sort.push_back(e);
  }
  ASSERT_EQ(x.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const TimelineEvent& e = events[i];
    EXPECT_EQ(x[i].at("name"), e.name);
    EXPECT_EQ(x[i].at("cat"), to_string(e.phase));
    EXPECT_EQ(x[i].at("ts").get<double>(), e.start_us);
    EXPECT_EQ(x[i].at("dur").get<double>(), e.end_us - e.start_us);
    EXPECT_EQ(x[i].at("tid"), 2 * e.replica + (e.track == Track::Comm ? 1 : 0));
    EXPECT_EQ(x[i].at("args").at("step"), e.step);
    if (e.bytes > 0)
      EXPECT_EQ(x[i].at("args").at("bytes"), e.bytes);
    else
      EXPECT_FALSE(x[i].at("args").contains("bytes"));
  }
  ASSERT_EQ(names.size(), 4u);
  ASSERT_EQ(sort.size(), 4u);
  const char* expected[] = {"replica 0 compute", "replica 0 comm", "replica 1 compute", "replica 1 comm"};
  for (int tid = 0; tid < 4; ++tid) {
    EXPECT_EQ(names[tid].at("tid"), tid);
    EXPECT_EQ(names[tid].at("args").at("name"), expected[tid]);
    EXPECT_EQ(sort[tid].at("tid"), tid);
    EXPECT_EQ(sort[tid].at("args").at("sort_index"), tid);
  }
}

// Perfetto turns ts and dur into nanoseconds each on its own
// (llround(us x 1000)) and ends a slice at ts + dur. Events that touch must
// still touch then: one that ended 1 ns inside the next on its track is a
// partial overlap, which Perfetto drops. These times are off the nanosecond
// grid, as a process group's are after the clock offset moves them
// (gather_timeline); written as they came, the first ended at 4013316 ns and
// the second began at 4013315 ns.
TEST_F(ChromeTrace, EventsThatTouchStillTouchInWholeNanoseconds) {
  const std::vector<TimelineEvent> events = {
      {0, Track::Compute, Phase::Backward, 0, "backward 1", 2904.0788, 4013.3154},
      {0, Track::Compute, Phase::Exposed, 0, "exposed comm", 4013.3154, 5000.0},
      {0, Track::Compute, Phase::Optimizer, 0, "optimizer", 5000.0, 5000.4996}};
  const auto path = dir_ / "trace.json";
  write_chrome_trace(path, events, 1);
  const auto perfetto_ns = [](const json& us) { return std::llround(us.get<double>() * 1000); };
  std::vector<std::pair<long long, long long>> slices;  // [begin, end) in ns, as Perfetto reads them
  const json doc = json::parse(read_all(path));
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const long long begin = perfetto_ns(e.at("ts"));
    slices.emplace_back(begin, begin + perfetto_ns(e.at("dur")));
  }
  ASSERT_EQ(slices.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(slices[i].first, std::llround(events[i].start_us * 1000)) << events[i].name;
    EXPECT_EQ(slices[i].second, std::llround(events[i].end_us * 1000)) << events[i].name;
  }
  for (std::size_t i = 1; i < slices.size(); ++i) EXPECT_EQ(slices[i - 1].second, slices[i].first) << i;
}

TEST_F(ChromeTrace, ReplacesAnOldFileAndLeavesNoTemporaries) {
  const auto path = dir_ / "trace.json";
  std::ofstream(path) << "old";
  write_chrome_trace(path, small_timeline(), 2);
  EXPECT_TRUE(json::accept(read_all(path)));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST_F(ChromeTrace, EmptyTimelineIsStillATrace) {
  const auto path = dir_ / "trace.json";
  write_chrome_trace(path, {}, 1);
  EXPECT_EQ(json::parse(read_all(path)).at("traceEvents").size(), 5u);  // process name + 2 x 2 thread rows
}

TEST_F(ChromeTrace, UnwritablePathThrowsIoErrorNamingIt) {
  const auto path = dir_ / "no such dir" / "trace.json";
  try {
    write_chrome_trace(path, small_timeline(), 2);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST_F(ChromeTrace, RejectsEventsOfUnknownReplicas) {
  EXPECT_THROW(write_chrome_trace(dir_ / "t.json", small_timeline(), 1), InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "t.json"));
}

TEST(TimelineSvg, DrawsOneBarPerEventOfTheStepOnly) {
  const auto events = small_timeline();
  const std::string svg = render_timeline_svg(events, 2, 1);
  EXPECT_EQ(xml_defect(svg), "");
  EXPECT_EQ(count(svg, "class=\"bar\""), 12u);
  EXPECT_EQ(count(svg, "data-phase=\"exposed\""), 2u);
  EXPECT_EQ(count(svg, "data-phase=\"allreduce\""), 2u);
  EXPECT_NE(svg.find("#s1"), std::string::npos);
  EXPECT_EQ(svg.find("#s0"), std::string::npos);  // every step-0 name ends in "#s0"
  // Wall time 5.501 ms; replica 0 waited 1 ms on communication.
  EXPECT_NE(svg.find("step 1: wall time 5.501 ms, exposed comm on replica 0 1.000 ms"), std::string::npos);
  EXPECT_NE(svg.find("<title>forward #s1: 1.000 ms"), std::string::npos);
  EXPECT_NE(svg.find("url(#exposed)"), std::string::npos);
}

TEST(TimelineSvg, EscapesNames) {
  std::vector<TimelineEvent> events = {
      {0, Track::Compute, Phase::Forward, 3, "a<&>\"b", 0, 100000, 0},
  };
  const std::string svg = render_timeline_svg(events, 1, 3);
  EXPECT_EQ(xml_defect(svg), "");
  EXPECT_NE(svg.find("a&lt;&amp;&gt;&quot;b"), std::string::npos);
  EXPECT_EQ(svg.find("a<&>"), std::string::npos);
}

TEST(TimelineSvg, EightBusyReplicasStayWellFormed) {
  auto events = busy_step(8, 4, 1e6);
  const auto other = busy_step(8, 5, 2e6);
  events.insert(events.end(), other.begin(), other.end());
  const std::string svg = render_timeline_svg(events, 8, 4);
  EXPECT_EQ(xml_defect(svg), "");
  EXPECT_EQ(count(svg, "class=\"bar\""), events.size() / 2);
  EXPECT_EQ(count(svg, ">replica "), 8u);
}

TEST(TimelineSvg, UnknownStepThrows) {
  EXPECT_THROW(render_timeline_svg(small_timeline(), 2, 7), InvalidArgument);
  EXPECT_THROW(render_timeline_svg({}, 2, 0), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::train
