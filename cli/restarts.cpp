#include "restarts.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>

#include "lockstep/comm/collectives.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

// Note [Restarts]
// `lockstep launch --max-restarts N` starts a failed job again, every rank,
// with LOCKSTEP_RESTART_COUNT = 1, 2, ... (torchrun's
// TORCHELASTIC_RESTART_COUNT). A restart stands for recovery from a
// transient failure (a killed process, a lost host), so faults injected with
// --inject fire in the job's first run only: `--inject throw@25:1
// --max-restarts 1` shows a failure recovered from, where injecting it again
// would fail every restart alike. Every rank has the same count, so they
// agree (--inject is a handshake field).
//
// --auto-resume goes on from --checkpoint's file when it is there, and starts
// afresh when it is not: the one command a restarted job (or a scheduler's
// requeue) runs every time. Resumed runs end as the unbroken run would, bit
// for bit, so a job restarted from its last checkpoint ends with the weights
// of a job that never failed; what a restart costs is the steps since that
// checkpoint. Every rank looks for the file itself: across hosts it must be
// on a shared filesystem (a rank that finds another step than rank 0, or
// none, is refused, naming the file and both steps:
// check_auto_resume_agrees).
std::int64_t restart_count() {
  const char* env = std::getenv("LOCKSTEP_RESTART_COUNT");
  if (env == nullptr || *env == '\0') return 0;
  const std::string text = env;
  if (text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw InvalidArgument("LOCKSTEP_RESTART_COUNT is '" + text +
                          "', not a whole number; it is lockstep launch's count of restarts, so unset it.");
  }
  return std::stoll(text);
}

}  // namespace

void take_restart(TrainFlags& f) {
  f.restart = restart_count();
  if (f.restart > 0) f.config.inject.clear();  // Note [Restarts]
  if (!f.auto_resume) return;
  std::error_code ec;  // a file that cannot be looked at is taken as there: reading it says why
  if (!std::filesystem::exists(f.checkpoint_file, ec) && !ec) return;
  f.resume_file = f.checkpoint_file;
  f.auto_resumed = true;
  f.init_file.clear();  // the checkpoint holds the weights the run reached from it
}

// The flag that gave the checkpoint a run goes on from, for its messages.
std::string resume_flag(const TrainFlags& f) {
  return f.auto_resumed ? "--auto-resume" : "--resume";
}

// resume_from's refusal of the file --auto-resume found, with the remedies
// that flag has: a run that must start afresh needs another --checkpoint
// file (there is no --resume to leave out).
std::string auto_resume_refusal(const std::string& file, std::string why) {
  const auto replace = [&](const std::string& from, const std::string& to) {
    if (const auto at = why.find(from); at != std::string::npos) why.replace(at, from.size(), to);
  };
  replace("--resume: ", "");
  replace("start afresh without --resume", "give another --checkpoint file to start afresh");
  return "--auto-resume found " + file + ", and cannot go on from it: " + why;
}

// Note [Restarts]: every rank looks for --auto-resume's file itself. A rank
// that found another step than rank 0 (across hosts: a file not on a shared
// filesystem, or a stale copy) is refused here, naming the file and both
// steps; the handshake would say only that the steps differ, and to give
// every rank the same flags, which they have. One broadcast every rank joins,
// whatever its flags.
void check_auto_resume_agrees(const TrainFlags& f, comm::Communicator& group) {
  const std::int64_t mine[2] = {f.auto_resume ? 1 : 0, f.resume ? f.resume->steps_done : 0};
  std::int64_t rank0[2] = {mine[0], mine[1]};
  comm::broadcast(group, std::as_writable_bytes(std::span(rank0)), 0);
  if (!f.auto_resume || rank0[0] == 0 || rank0[1] == mine[1]) return;
  const std::string here = mine[1] > 0 ? "found " + f.checkpoint_file + " of step " + std::to_string(mine[1])
                                       : "did not find " + f.checkpoint_file;
  const std::string there =
      rank0[1] > 0 ? "goes on from its copy after step " + std::to_string(rank0[1]) : "did not find it";
  throw InvalidArgument(
      "--auto-resume: this rank " + here + ", and rank 0 " + there +
      "; every rank reads the checkpoint, so across hosts it must be one file on a filesystem "
      "every host sees.");
}

}  // namespace lockstep::cli
