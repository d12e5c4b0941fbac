// `lockstep train` as one rank of a process group (--backend gloo|mpi;
// train_as_rank.cpp).
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/data/dataset.h"
#include "train_flags.h"

namespace lockstep::cli {

// The ranks of the group that run on this host.
int ranks_on_this_host(const comm::Communicator& group);

// Joins the process group the flags describe and trains as its rank (the
// exit code); an error names the rank and aborts the group.
int train_as_rank(TrainFlags& f, const data::ImageClassificationData& data);

}  // namespace lockstep::cli
