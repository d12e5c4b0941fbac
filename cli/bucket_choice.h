// The gradient buckets `lockstep train` takes when no bucket flag says
// (bucket_choice.cpp): one on shared cores, or a resumed checkpoint's.
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/data/dataset.h"
#include "peak_flops.h"
#include "train_flags.h"

namespace lockstep::cli {

// Whether --bucket-mb or --first-bucket-mb was given.
bool bucket_flag_given(const TrainFlags& f);

// Sets one bucket in f.config where the cores are shared (Note [One bucket
// on shared cores]); `group`: the process group, or null for threads. Every
// rank of a group must call it.
void one_bucket_if_cores_are_shared(TrainFlags& f, comm::Communicator* group, const HostCores& host);

// Sets f.config's bucket size to the resumed checkpoint's, when it is one
// lockstep train takes by itself and no bucket flag was given.
void buckets_from_checkpoint(TrainFlags& f, const data::ImageClassificationData& data);

}  // namespace lockstep::cli
