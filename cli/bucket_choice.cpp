#include "bucket_choice.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "process_group_flags.h"
#include "train_as_rank.h"

namespace lockstep::cli {

bool bucket_flag_given(const TrainFlags& f) {
  return f.cmd->get_option("--bucket-mb")->count() > 0 || f.cmd->get_option("--first-bucket-mb")->count() > 0;
}

// Note [One bucket on shared cores]: buckets exist so that the all-reduce
// of the last layers' gradients runs while backward computes the first
// layers'. That needs a core to run it. Where a host runs at least as many
// replicas as it has cores, every core is computing backward, so nothing
// overlaps, and each bucket past the first only adds an all-reduce's fixed
// cost: its rounds' latency, and waking the threads that wait on them.
// Measured on this 2-core machine (docs/results.md, "One bucket on shared
// cores"): over Gloo, 2 x 128 1.24x and 8 x 32 1.42x faster in one bucket;
// 8 ranks on 4 test hosts at 1 Gbit/s 1.20x; over MPI 1.02x; in process no
// change (the shared-memory all-reduce runs after backward anyway). The same
// holds for a process that may use no more cores than it runs replicas: bound
// to them (taskset; mpirun binds a rank to one core) or held to them by its
// cgroup's CPU quota (a container). So with --overlap auto and no bucket
// flag, such a run takes one bucket. A modelled link keeps the buckets: its
// delay is a sleep, not a core's work.
// Every rank takes the same decision (the bucket layout is checked across
// ranks), in one small all-reduce that every rank joins whatever its flags:
// one bucket if some host is so loaded and no rank was told otherwise (a
// bucket flag, --overlap on|off, a link), so that ranks whose flags differ
// only in ways that did not change the layout before still agree on it.
void one_bucket_if_cores_are_shared(TrainFlags& f, comm::Communicator* group, const HostCores& host) {
  auto& c = f.config;
  const bool eligible = c.overlap == train::Overlap::Auto && !c.link.enabled() && !c.deterministic &&
                        !bucket_flag_given(f) && c.replicas > 1;
  const int ranks_here = group == nullptr ? c.replicas : ranks_on_this_host(*group);
  const int replicas_in_process = group == nullptr ? c.replicas : 1;
  const bool shared = ranks_here >= host.cores || replicas_in_process >= host.process;
  // {some host's or process's cores are shared, some rank is not eligible}: one max.
  float votes[2] = {shared ? 1.0f : 0.0f, eligible ? 0.0f : 1.0f};
  if (group != nullptr) comm::allreduce(*group, std::span(votes), {.op = comm::ReduceOp::Max});
  if (votes[0] > 0 && votes[1] == 0) {
    c.bucket_mb = 0;
    c.one_bucket_on_shared_cores = true;
  }
}

// --resume with no bucket flag: the checkpoint's layout, if it is one of the
// two lockstep train takes by itself (the defaults, or one bucket), whatever
// this run's host would take. The layout shapes the weights over processes,
// and a resumed run keeps the writer's settings.
void buckets_from_checkpoint(TrainFlags& f, const data::ImageClassificationData& data) {
  auto& c = f.config;
  if (!f.resume || bucket_flag_given(f) || c.deterministic) return;
  const auto transport = comm::to_string(backend_of(f.group));
  const auto layout = [&](const std::vector<std::pair<std::string, std::string>>& fields) {
    const auto it = std::find_if(fields.begin(), fields.end(), [](const auto& field) {
      return field.first.rfind("bucket layout", 0) == 0;
    });
    return it == fields.end() ? std::string() : it->second;
  };
  const std::string theirs = layout(f.resume->fields);
  if (theirs == layout(train::trajectory_fields(c, data, transport))) return;
  for (const double bucket_mb : {train::TrainConfig{}.bucket_mb, 0.0}) {
    auto other = c;
    other.bucket_mb = bucket_mb;
    if (layout(train::trajectory_fields(other, data, transport)) == theirs) {
      c.bucket_mb = bucket_mb;
      c.one_bucket_on_shared_cores = false;
      c.buckets_from_checkpoint = true;
      return;
    }
  }
}

}  // namespace lockstep::cli
