// The profile format: a hand-written profile, a round trip, and bad files.
#include "lockstep/cost/profile.h"

#include <gtest/gtest.h>

#include <fstream>

#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

// What `lockstep train --profile` is to write for the default MLP at 8 x 32.
constexpr const char* kProfile = R"({
  "format": "lockstep-profile", "version": 1,
  "model": "mlp 784-512-512-10", "replicas": 8, "micro_batch": 32,
  "step_compute_ms": 4.0, "activation_bytes_per_sample": 11368,
  "layers": [
    {"name": "1", "param_bytes": 1607680, "forward_ms": 0.60, "backward_ms": 0.90},
    {"name": "3", "param_bytes": 1050624, "forward_ms": 0.40, "backward_ms": 0.80},
    {"name": "5", "param_bytes": 20520,   "forward_ms": 0.05, "backward_ms": 0.05}
  ]})";

std::string error_of(const std::string& text) {
  try {
    parse_profile(text, "p.json");
  } catch (const IoError& e) {  // a malformed file, as a malformed weights file
    return e.what();
  }
  return "";
}

TEST(Profile, ReadsAHandWrittenProfile) {
  const Profile p = parse_profile(kProfile, "p.json");
  EXPECT_EQ(p.model, "mlp 784-512-512-10");
  EXPECT_EQ(p.replicas, 8);
  EXPECT_EQ(p.micro_batch, 32);
  ASSERT_EQ(p.layers.size(), 3u);
  EXPECT_EQ(p.layers[0].name, "1");
  EXPECT_DOUBLE_EQ(p.param_bytes(), 1607680 + 1050624 + 20520);
  EXPECT_NEAR(p.forward_ms(), 1.05, 1e-12);
  EXPECT_NEAR(p.backward_ms(), 1.75, 1e-12);
  EXPECT_NEAR(p.optimizer_ms(), 1.2, 1e-12);
  EXPECT_DOUBLE_EQ(p.activation_bytes_per_sample, 11368);
}

TEST(Profile, RoundTripsThroughJson) {
  const Profile p = parse_profile(kProfile, "p.json");
  const Profile q = parse_profile(profile_to_json(p), "again");
  EXPECT_EQ(q.model, p.model);
  ASSERT_EQ(q.layers.size(), p.layers.size());
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    EXPECT_EQ(q.layers[i].name, p.layers[i].name);
    EXPECT_DOUBLE_EQ(q.layers[i].param_bytes, p.layers[i].param_bytes);
    EXPECT_DOUBLE_EQ(q.layers[i].backward_ms, p.layers[i].backward_ms);
  }
  EXPECT_DOUBLE_EQ(q.step_compute_ms, p.step_compute_ms);
}

TEST(Profile, ReadsAFile) {
  const auto path = std::filesystem::path(LOCKSTEP_TEST_TMPDIR) / "profile_test.json";
  std::ofstream(path) << kProfile;
  EXPECT_EQ(read_profile(path).layers.size(), 3u);
  EXPECT_THROW(read_profile(path.string() + ".missing"), IoError);
}

TEST(Profile, BadProfilesNameTheProblem) {
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  // The parser's message without its exception id, and a binary file's bytes
  // escaped, not written raw to the terminal (found by a sweep of hostile flag
  // values: plan --profile on a random file).
  EXPECT_EQ(error_of("{not json").find("json.exception"), std::string::npos) << error_of("{not json");
  EXPECT_NE(error_of("{not json").find("p.json: not valid JSON: parse error at line 1"), std::string::npos)
      << error_of("{not json");
  const std::string binary = error_of("\xff\xfe");
  EXPECT_NE(binary.find("\\xff"), std::string::npos) << binary;
  EXPECT_EQ(binary.find('\xff'), std::string::npos) << binary;
  EXPECT_NE(error_of("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "other", "version": 1})").find("\"format\""), std::string::npos);
  std::string s = kProfile;
  EXPECT_NE(
      error_of(std::string(s).replace(s.find("\"replicas\": 8"), 13, "\"replicas\": -8")).find("replicas"),
      std::string::npos);
  EXPECT_NE(error_of(std::string(s).replace(s.find("\"forward_ms\": 0.60"), 18, "\"forward_ms\": \"x\""))
                .find("layer 0's \"forward_ms\" is not a number"),
            std::string::npos);
  EXPECT_NE(
      error_of(std::string(s).replace(s.find("\"param_bytes\": 20520,"), 21, "")).find("layer 2 has no"),
      std::string::npos);
  // 1e300 bytes were planned as "1e+291 GB of gradients" in 1 ms.
  EXPECT_NE(error_of(std::string(s).replace(s.find("\"param_bytes\": 20520,"), 21, "\"param_bytes\": 1e300,"))
                .find("layer 2's \"param_bytes\" is"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(s).replace(s.find("4.0,"), 4, "1.0,")).find("step_compute_ms"),
            std::string::npos);
  // A step of no time planned as NaN efficiency and infinite samples/s.
  std::string zero = s;
  zero.replace(zero.find("4.0,"), 4, "0.0,");
  for (const char* t : {"0.60", "0.90", "0.40", "0.80", "0.05", "0.05"}) zero.replace(zero.find(t), 4, "0.00");
  EXPECT_NE(error_of(zero).find("\"step_compute_ms\" must be positive"), std::string::npos) << error_of(zero);
  // Other types and numbers past a double or an int are named, not thrown as
  // json's own type_error / out_of_range, nor cut (3.5 samples) or overflowed.
  const auto replaced = [&](const std::string& from, const std::string& to) {
    return error_of(std::string(s).replace(s.find(from), from.size(), to));
  };
  EXPECT_NE(replaced("\"version\": 1", "\"version\": \"1\"").find("\"version\": 1"), std::string::npos);
  EXPECT_NE(replaced("\"model\": \"mlp 784-512-512-10\"", "\"model\": 5").find("\"model\" must be a string"),
            std::string::npos);
  EXPECT_NE(replaced("\"name\": \"1\"", "\"name\": 1").find("layer 0's \"name\" must be a string"),
            std::string::npos);
  EXPECT_NE(replaced("\"micro_batch\": 32", "\"micro_batch\": 3.5").find("a whole number"), std::string::npos);
  EXPECT_NE(replaced("\"replicas\": 8", "\"replicas\": 1e12").find("\"replicas\" must be a whole number"),
            std::string::npos);
  EXPECT_NE(replaced("\"param_bytes\": 20520", "\"param_bytes\": 1e400").find("not valid JSON"), std::string::npos);
  EXPECT_LT(replaced("\"param_bytes\": 20520", "\"param_bytes\": 1e300").size(), 200u) << "300 digits";
  const std::string no_layers =
      R"({"format": "lockstep-profile", "version": 1, "replicas": 1, "micro_batch": 1,
    "step_compute_ms": 1, "layers": []})";
  EXPECT_NE(error_of(no_layers).find("non-empty array"), std::string::npos);
  EXPECT_NE(error_of(no_layers).find("docs/cost-model.md"), std::string::npos);
}

TEST(Profile, ScaleComputeKeepsTheOptimizer) {
  const Profile p = scale_compute(parse_profile(kProfile, "p.json"), 2);
  EXPECT_NEAR(p.forward_ms(), 2.1, 1e-12);
  EXPECT_NEAR(p.optimizer_ms(), 1.2, 1e-12);
}

}  // namespace
}  // namespace lockstep::cost
