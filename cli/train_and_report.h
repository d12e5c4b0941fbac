// `lockstep train` once its flags and data are read: train, then the
// summary, the report and the other outputs (train_and_report.cpp).
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/data/dataset.h"
#include "train_flags.h"

namespace lockstep::cli {

// Trains with the replicas of this process (`group` null) or as the
// group's rank, and writes the outputs from rank 0; the exit code.
int train_and_report(TrainFlags& f, const data::ImageClassificationData& data, comm::Communicator* group);

}  // namespace lockstep::cli
