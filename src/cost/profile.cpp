// The profile format (lockstep/cost/profile.h, docs/cost-model.md): read,
// checked field by field so that a bad file names what is wrong, and written.
#include "lockstep/cost/profile.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "lockstep-profile";

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw IoError(source + ": " + what + " (the format is in docs/cost-model.md).");
}

double number(const json& j, const char* key, const std::string& where, const std::string& source,
              bool required = true) {
  if (!j.contains(key)) {
    if (!required) return 0;
    bad(source, where + " has no \"" + key + "\"");
  }
  const json& v = j.at(key);
  if (!v.is_number()) bad(source, where + "'s \"" + key + "\" is not a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) bad(source, where + "'s \"" + key + "\" must be zero or positive");
  // A petabyte of parameters, or 30 000 years in ms: past any real profile,
  // and where sums of such values stop being exact in a double.
  if (d > 1e15) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", d);  // not std::to_string's 300 digits
    bad(source, where + "'s \"" + key + "\" is " + text + ", past any real profile (1e15)");
  }
  return d;
}

// A whole number from 1 to `most` (3.5 samples, or 1e12, were cut or overflowed an int).
std::int64_t whole(const json& o, const char* key, const std::string& where, const std::string& source,
                   double most) {
  const double d = number(o, key, where, source);
  if (d < 1 || d > most || d != std::floor(d)) {
    char text[64];
    std::snprintf(text, sizeof text, "a whole number from 1 to %.0f", most);
    bad(source, where + "'s \"" + key + "\" must be " + text);
  }
  return static_cast<std::int64_t>(d);
}

// A string field, or `fallback` when absent; another type is named, not thrown as json's type_error.
std::string text_field(const json& o, const char* key, const std::string& fallback, const std::string& where,
                       const std::string& source) {
  if (!o.contains(key)) return fallback;
  if (!o[key].is_string()) bad(source, where + "'s \"" + key + "\" must be a string");
  return o[key].get<std::string>();
}

}  // namespace

double Profile::param_bytes() const {
  double s = 0;
  for (const auto& l : layers) s += l.param_bytes;
  return s;
}
double Profile::forward_ms() const {
  double s = 0;
  for (const auto& l : layers) s += l.forward_ms;
  return s;
}
double Profile::backward_ms() const {
  double s = 0;
  for (const auto& l : layers) s += l.backward_ms;
  return s;
}
double Profile::optimizer_ms() const {
  return std::max(0.0, step_compute_ms - forward_ms() - backward_ms());
}

Profile parse_profile(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    // Without the library's "[json.exception.parse_error.101] " (as the
    // safetensors reader), and with the byte it "last read" printable: a
    // binary file put raw bytes on the terminal.
    std::string what = e.what();
    if (const auto pos = what.find("] "); what.rfind("[json.exception.", 0) == 0 && pos != std::string::npos)
      what.erase(0, pos + 2);
    std::string shown;
    for (const unsigned char ch : what) {
      if (ch >= 0x20 && ch < 0x7f) {
        shown += char(ch);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", ch);
        shown += hex;
      }
    }
    bad(source, "not valid JSON: " + shown);
  }
  if (!j.is_object()) bad(source, "the top level is not a JSON object");
  if (text_field(j, "format", "", "the profile", source) != kFormat)
    bad(source, std::string("\"format\" must be \"") + kFormat + "\"");
  if (!j.contains("version") || !j["version"].is_number() || j["version"].get<double>() != 1)
    bad(source, "only \"version\": 1 is understood");
  Profile p;
  p.model = text_field(j, "model", "profiled model", "the profile", source);
  p.replicas = static_cast<int>(whole(j, "replicas", "the profile", source, 65536));  // as --replicas
  p.micro_batch = whole(j, "micro_batch", "the profile", source, 1 << 24);            // as --micro-batch
  p.step_compute_ms = number(j, "step_compute_ms", "the profile", source);
  p.activation_bytes_per_sample = number(j, "activation_bytes_per_sample", "the profile", source, false);
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty())
    bad(source, "\"layers\" must be a non-empty array, one object per layer in forward order");
  for (std::size_t i = 0; i < j["layers"].size(); ++i) {
    const json& l = j["layers"][i];
    const std::string where = "layer " + std::to_string(i);
    if (!l.is_object()) bad(source, where + " is not an object");
    LayerCost c;
    c.name = text_field(l, "name", std::to_string(i), where, source);
    c.param_bytes = number(l, "param_bytes", where, source);
    c.forward_ms = number(l, "forward_ms", where, source);
    c.backward_ms = number(l, "backward_ms", where, source);
    p.layers.push_back(std::move(c));
  }
  if (p.param_bytes() <= 0) bad(source, "no layer has parameters, so there is nothing to all-reduce");
  if (!(p.step_compute_ms > 0)) bad(source, "\"step_compute_ms\" must be positive: a step takes time");
  if (p.step_compute_ms < p.forward_ms() + p.backward_ms() - 1e-6)
    bad(source, "\"step_compute_ms\" is less than the layers' forward + backward time");
  return p;
}

Profile read_profile(const std::filesystem::path& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st))
    throw IoError(path.string() + " is a directory, not a profile; give the file `lockstep train --profile` wrote.");
  // A FIFO without a writer would block the open for good.
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw IoError(path.string() + " is not a regular file (a FIFO, device or socket); give the file `lockstep train "
                                  "--profile` wrote.");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(path.string() + ": cannot open the profile; write one with `lockstep train --profile`.");
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw IoError(path.string() + ": reading the profile failed.");
  return parse_profile(text.str(), path.string());
}

std::string profile_to_json(const Profile& p) {
  json layers = json::array();
  for (const auto& l : p.layers)
    layers.push_back({{"name", l.name},
                      {"param_bytes", l.param_bytes},
                      {"forward_ms", l.forward_ms},
                      {"backward_ms", l.backward_ms}});
  const json j = {{"format", kFormat},
                  {"version", 1},
                  {"model", p.model},
                  {"replicas", p.replicas},
                  {"micro_batch", p.micro_batch},
                  {"step_compute_ms", p.step_compute_ms},
                  {"activation_bytes_per_sample", p.activation_bytes_per_sample},
                  {"layers", layers}};
  return j.dump(2) + "\n";
}

Profile scale_compute(const Profile& profile, double factor) {
  if (!(factor > 0) || !std::isfinite(factor))
    throw InvalidArgument("scale_compute: the factor must be a positive number, got " + std::to_string(factor) + ".");
  Profile p = profile;
  const double opt = profile.optimizer_ms();
  for (auto& l : p.layers) {
    l.forward_ms *= factor;
    l.backward_ms *= factor;
  }
  p.step_compute_ms = p.forward_ms() + p.backward_ms() + opt;
  return p;
}

}  // namespace lockstep::cost
