// A job's restarts (LOCKSTEP_RESTART_COUNT) and --auto-resume: Note
// [Restarts] in restarts.cpp.
#pragma once

#include <string>

#include "lockstep/comm/communicator.h"
#include "train_flags.h"

namespace lockstep::cli {

// Reads the restart count into `f` (no --inject after the first run), and
// under --auto-resume takes --checkpoint's file as --resume when it is there.
void take_restart(TrainFlags& f);

// "--resume" or "--auto-resume": the flag that gave the checkpoint.
std::string resume_flag(const TrainFlags& f);

// The message for --auto-resume's file refused (`why`: resume_from's).
std::string auto_resume_refusal(const std::string& file, std::string why);

// Throws InvalidArgument on a rank whose --auto-resume found another step
// than rank 0's: a collective every rank joins.
void check_auto_resume_agrees(const TrainFlags& f, comm::Communicator& group);

}  // namespace lockstep::cli
