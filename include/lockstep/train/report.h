// The end-of-run summary: the card's question (what is replicated, split and
// communicated) answered with this run's numbers, as text and as JSON.
// The JSON fields are documented in docs/report.md.
#pragma once

#include <string>

#include "lockstep/train/trainer.h"

namespace lockstep::train {

std::string summary_text(const TrainConfig& config, const TrainResult& result);
std::string report_json(const TrainConfig& config, const TrainResult& result);

}  // namespace lockstep::train
