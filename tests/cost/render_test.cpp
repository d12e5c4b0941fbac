// The table, JSON and SVG renderings: well-formed and complete.
#include "lockstep/cost/render.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "lockstep/cost/models.h"

namespace lockstep::cost {
namespace {

Plan default_plan() {
  PlanOptions o;
  o.device = device_preset("cpu");
  o.step.micro_batch = 32;
  const Profile p = profile_from_spec(mlp_model(784, {512, 512}, 10), o.device, 32, 5);
  return make_plan(p, o);
}

// Every tag closed in order, attribute quotes balanced, one <svg> root.
void expect_well_formed_xml(const std::string& s) {
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t i = s.find('<'); i != std::string::npos; i = s.find('<', i + 1)) {
    const std::size_t end = s.find('>', i);
    ASSERT_NE(end, std::string::npos) << "unterminated tag at " << i;
    const std::string tag = s.substr(i + 1, end - i - 1);
    ASSERT_EQ(std::count(tag.begin(), tag.end(), '"') % 2, 0) << tag;
    ASSERT_EQ(tag.find('<'), std::string::npos) << tag;
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty()) << tag;
      EXPECT_EQ("/" + open.back(), tag.substr(0, open.back().size() + 1));
      open.pop_back();
    } else if (tag.back() != '/') {
      const std::string name = tag.substr(0, tag.find_first_of(" \n"));
      if (open.empty()) ++roots;
      open.push_back(name);
    } else if (open.empty()) {
      ++roots;
    }
  }
  EXPECT_TRUE(open.empty());
  EXPECT_EQ(roots, 1);
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
}

TEST(Render, JsonHasTheDocumentedRows) {
  const Plan plan = default_plan();
  const auto j = nlohmann::json::parse(plan_json(plan));
  ASSERT_EQ(j["rows"].size(), plan.rows.size());
  for (const char* key : {"replicas", "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "efficiency",
                          "samples_per_s", "cost_per_million_samples", "memory_bytes_per_device"})
    EXPECT_TRUE(j["rows"][0].contains(key)) << key;
  EXPECT_EQ(j["rows"][0]["replicas"], 1);
  EXPECT_DOUBLE_EQ(j["rows"][0]["efficiency"].get<double>(), 1.0);
  EXPECT_TRUE(j["recommendation"]["summary"].is_string());
  EXPECT_FALSE(j["recommendation"]["summary"].get<std::string>().empty());
  EXPECT_GE(j["alternatives"].size(), 6u);
}

// An alternative's cost is per useful sample, and is named so: with a
// critical batch, "data parallel" at 8 replicas costs what row 8's useful
// samples cost, not what its samples cost.
TEST(Render, JsonAlternativesCostUsefulSamplesByThatName) {
  PlanOptions o;
  o.device = device_preset("cpu");
  o.step.micro_batch = 32;
  o.replicas = {1, 8};
  o.critical_batch = 64;
  const Profile p = profile_from_spec(mlp_model(784, {512, 512}, 10), o.device, 32, 5);
  const Plan plan = make_plan(p, o);
  const auto j = nlohmann::json::parse(plan_json(plan));
  const nlohmann::json* dp = nullptr;
  for (const auto& a : j["alternatives"])
    if (a["name"] == "data parallel") dp = &a;
  ASSERT_NE(dp, nullptr);
  ASSERT_EQ((*dp)["replicas"], 8);
  EXPECT_FALSE(dp->contains("cost_per_million_samples"));
  EXPECT_DOUBLE_EQ((*dp)["cost_per_million_useful_samples"].get<double>(),
                   plan.rows[1].cost_per_million_useful_samples);
  EXPECT_GT(plan.rows[1].cost_per_million_useful_samples, plan.rows[1].cost_per_million_samples * 1.5);
}

TEST(Render, SvgIsWellFormed) {
  const std::string svg = plan_svg(default_plan());
  expect_well_formed_xml(svg);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  // A model name with markup in it is escaped.
  Plan plan = default_plan();
  plan.model = "a<b & \"c\"";
  expect_well_formed_xml(plan_svg(plan));
}

TEST(Render, TableEndsWithARecommendation) {
  const std::string t = plan_table(default_plan());
  EXPECT_NE(t.find("replicas"), std::string::npos);
  EXPECT_NE(t.find("Recommendation:"), std::string::npos);
  EXPECT_NE(t.find("ZeRO-3"), std::string::npos);
}

// The header names the link as lockstep train does: "1 ms", not "1e+03 us".
TEST(Render, TableHeaderNamesTheLinkInReadableUnits) {
  PlanOptions o;
  o.device = device_preset("cpu");
  o.step.micro_batch = 32;
  o.step.topology.inter = {.bytes_per_second = 1.25e9, .latency_s = 1e-3};
  const Profile p = profile_from_spec(mlp_model(784, {512, 512}, 10), o.device, 32, 5);
  const std::string t = plan_table(make_plan(p, o));
  EXPECT_NE(t.find("link 10 Gbit/s, 1 ms\n"), std::string::npos) << t.substr(0, 300);
  EXPECT_EQ(t.find("e+"), std::string::npos) << t.substr(0, 300);
}

// --bucket-mb 0 is one bucket, as in lockstep train; the header read
// "buckets 1/0 MiB", a first bucket of 1 MiB and then buckets of nothing.
TEST(Render, TableHeaderSaysOneBucketForBucketMbZero) {
  PlanOptions o;
  o.device = device_preset("cpu");
  o.step.micro_batch = 32;
  o.step.bucket_mb = 0;
  const Profile p = profile_from_spec(mlp_model(784, {512, 512}, 10), o.device, 32, 5);
  const std::string t = plan_table(make_plan(p, o));
  EXPECT_NE(t.find("all-reduce best, one bucket (--bucket-mb 0), accumulate 1"), std::string::npos)
      << t.substr(0, 300);
  EXPECT_EQ(t.find("/0 MiB"), std::string::npos) << t.substr(0, 300);
}

}  // namespace
}  // namespace lockstep::cost
