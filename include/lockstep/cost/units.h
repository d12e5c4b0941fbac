// Numbers with units for `lockstep plan`'s flags. Each throws InvalidArgument
// naming the flag and the text, with an example of what would be accepted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::cost {

// A positive count with an optional decimal suffix: "25.6M", "138e6", "4k".
// Suffixes k/K, M, G (or B, billion: "7B"), T.
double parse_count(std::string_view text, std::string_view flag, std::string_view example = "25.6M or 138e6");
// A byte size: "16GB", "16GiB", "512MiB", "80G" (bytes; K/M/G/T decimal, Ki/Mi/Gi/Ti binary).
double parse_bytes(std::string_view text, std::string_view flag);
// A replica list: "1,2,4,8" or a doubling range "1-64" (1, 2, 4, ..., 64).
// Values 1..65536, strictly increasing.
std::vector<int> parse_replicas(std::string_view text, std::string_view flag);

}  // namespace lockstep::cost
