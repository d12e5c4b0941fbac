#include "train_as_rank.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"
#include "process_group_flags.h"
#include "restarts.h"
#include "train_and_report.h"
#include "train_flag_checks.h"

namespace lockstep::cli {

// The ranks of a process group on this host: LOCAL_WORLD_SIZE (or mpirun's
// OMPI_COMM_WORLD_LOCAL_SIZE) when set, else the ranks the group found on
// this rank's node (its host name and address), else the whole group.
int ranks_on_this_host(const comm::Communicator& group) {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* env = std::getenv(name);
    if (env != nullptr && *env != '\0') return train::local_world_size(group.size());
  }
  const std::vector<int> nodes = group.nodes();
  if (nodes.size() != static_cast<std::size_t>(group.size())) return group.size();
  const int mine = nodes[static_cast<std::size_t>(group.rank())];
  return static_cast<int>(std::count(nodes.begin(), nodes.end(), mine));
}

namespace {

// A rank's error names the rank, and reaches the other ranks at once (abort).
[[noreturn]] void rethrow_as_rank(comm::Communicator& group) {
  const std::string rank = "rank " + std::to_string(group.rank());
  const auto named = [&](const std::string& what) {
    return what.rfind(rank + ":", 0) == 0 || what.rfind(rank + " ", 0) == 0 ? what : rank + ": " + what;
  };
  try {
    throw;
  } catch (const CommAborted& e) {
    throw CommAborted(named(e.what()));  // another rank's failure: the group knows already
  } catch (const InvalidArgument& e) {
    if (!group.aborted()) group.abort(named(e.what()));
    throw InvalidArgument(named(e.what()));
  } catch (const TimeoutError& e) {  // main() says what to do about it
    if (!group.aborted()) group.abort(named(e.what()));
    throw TimeoutError(named(e.what()));
  } catch (const std::exception& e) {
    if (!group.aborted()) group.abort(named(e.what()));
    throw Error(named(e.what()));
  }
}

// Rank 0 writes a group's outputs. An output flag given to another rank
// only would be ignored without a word: that rank says so (one broadcast of
// which outputs rank 0 has, before training).
void warn_outputs_rank0_lacks(const TrainFlags& f, comm::Communicator& group) {
  const std::pair<const char*, const std::string*> outputs[] = {
      {"--save", &f.save_file},        {"--report", &f.report_file},   {"--trace", &f.trace_file},
      {"--timeline-svg", &f.svg_file}, {"--profile", &f.profile_file}, {"--checkpoint", &f.checkpoint_file}};
  std::uint8_t mine = 0;
  for (std::size_t i = 0; i < std::size(outputs); ++i)
    if (!outputs[i].second->empty()) mine |= std::uint8_t(1u << i);
  std::uint8_t rank0 = mine;
  comm::broadcast(group, std::as_writable_bytes(std::span(&rank0, 1)), 0);
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    if ((mine & ~rank0) & (1u << i)) {
      const std::string line =
          "lockstep: warning: rank " + std::to_string(group.rank()) + ": " + outputs[i].first +
          " is written by rank 0 alone, which was not given it, so nothing will be written; "
          "give " +
          outputs[i].first + " to rank 0.\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
    }
  }
}

}  // namespace

int train_as_rank(TrainFlags& f, const data::ImageClassificationData& data) {
  f.group.timeout_s = f.timeout_s;
  std::ostringstream warnings;
  const auto options = process_group_options(f.group, warnings);
  // --replicas against the world size, before the rendezvous where that is
  // known (flag or WORLD_SIZE, which process_group_options has read for gloo;
  // under mpirun, its own variable): a rank started alone would wait the
  // whole rendezvous timeout.
  const auto check_replicas = [&](int world) {
    if (f.replicas_option->count() > 0 && world > 0 && f.config.replicas != world) {
      throw InvalidArgument("--replicas " + std::to_string(f.config.replicas) +
                            " does not match the world size " + std::to_string(world) +
                            " of the process group; leave --replicas out.");
    }
  };
  check_replicas(backend_of(f.group) == comm::Backend::Mpi ? mpirun_world_size() : options.world_size);
  const auto group = connect_group(f.group, options);
  if (group->rank() == 0) std::cerr << warnings.str() << std::flush;
  try {
    auto& c = f.config;
    check_replicas(group->size());  // where it was not known before
    c.replicas = group->size();
    if (group->rank() == 0) check_outputs(f);
    warn_outputs_rank0_lacks(f, *group);
    check_auto_resume_agrees(f, *group);
    return train_and_report(f, data, group.get());
  } catch (...) {
    rethrow_as_rank(*group);
  }
}

}  // namespace lockstep::cli
