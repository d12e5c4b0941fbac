// The checks of `lockstep train`'s flags that need no data: outputs,
// combinations, and --timeline-step (train_flag_checks.cpp). Each throws
// InvalidArgument naming the flags.
#pragma once

#include <vector>

#include "lockstep/data/dataset.h"
#include "output_files.h"
#include "train_flags.h"

namespace lockstep::cli {

// The files the run writes, by flag.
std::vector<NamedFile> output_files(const TrainFlags& f);

void check_outputs(const TrainFlags& f);
void check_flag_combinations(const TrainFlags& f);
void check_timeline_step(const TrainFlags& f, const data::ImageClassificationData& data);

}  // namespace lockstep::cli
