// The config's choices from the text of their flags (declared in
// lockstep/train/trainer.h).
#include <cstdint>
#include <string>
#include <string_view>

#include "lockstep/error.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

const char* to_string(Ragged ragged) {
  switch (ragged) {
    case Ragged::Weighted:
      return "weighted";
    case Ragged::Drop:
      return "drop";
    case Ragged::Pad:
      return "pad";
  }
  return "?";
}

Ragged ragged_from_string(std::string_view name) {
  for (auto r : {Ragged::Weighted, Ragged::Drop, Ragged::Pad})
    if (name == to_string(r)) return r;
  throw InvalidArgument("unknown ragged-shard policy '" + std::string(name) +
                        "'; the choices are: weighted, drop, pad");
}

BnStats bn_stats_from_string(std::string_view name) {
  if (name == "local") return BnStats::Local;
  if (name == "sync") return BnStats::Sync;
  throw InvalidArgument("unknown --bn-stats '" + std::string(name) + "'; the choices are: local, sync");
}

OnDivergence on_divergence_from_string(std::string_view name) {
  if (name == "stop") return OnDivergence::Stop;
  if (name == "repair") return OnDivergence::Repair;
  throw InvalidArgument("unknown --on-divergence '" + std::string(name) + "'; the choices are: stop, repair");
}

Fault fault_from_string(std::string_view spec) {
  const auto bad = [&] {
    return InvalidArgument(
        "bad --inject '" + std::string(spec) +
        "': expected same-seed, or KIND@STEP:RANK with KIND bitflip, bitflip-buffer, nan or throw, e.g. "
        "bitflip@20:3");
  };
  if (spec == "same-seed") return Fault{.kind = Fault::Kind::SameSeed};
  const auto at = spec.find('@'), colon = spec.find(':', at == spec.npos ? 0 : at);
  if (at == spec.npos || colon == spec.npos) throw bad();
  Fault f;
  const auto kind = spec.substr(0, at);
  if (kind == "bitflip") {
    f.kind = Fault::Kind::BitFlip;
  } else if (kind == "bitflip-buffer") {
    f.kind = Fault::Kind::BufferBitFlip;
  } else if (kind == "nan") {
    f.kind = Fault::Kind::NaN;
  } else if (kind == "throw") {
    f.kind = Fault::Kind::Throw;
  } else {
    throw bad();
  }
  const auto number = [&](std::string_view text) {
    std::int64_t v = 0;
    if (text.empty() || text.size() > 12) throw bad();
    for (char ch : text) {
      if (ch < '0' || ch > '9') throw bad();
      v = v * 10 + (ch - '0');
    }
    return v;
  };
  f.step = number(spec.substr(at + 1, colon - at - 1));
  const std::int64_t rank = number(spec.substr(colon + 1));
  if (rank > 1024) throw bad();
  f.rank = static_cast<int>(rank);
  return f;
}

}  // namespace lockstep::train
