// SIGINT, SIGTERM, SIGHUP and SIGUSR1 during `lockstep train` (SIGUSR1: what
// mpirun forwards without killing the ranks after it): the first asks the trainer to
// stop at its next stop vote (TrainHooks::stop_requested; about a second
// away: Note [Paced stop votes]), so that the
// run ends as at its last step, with --save, --report and the other outputs
// written; a second ends the process at once (the signal's default action).
//
// Signal actions belong to the process, so this is the command's, not the
// library's: at most one StopOnSignal exists at a time.
#pragma once

namespace lockstep::cli {

class StopOnSignal {
 public:
  // announce: write one line to stderr when the first signal arrives (rank 0).
  explicit StopOnSignal(bool announce);
  ~StopOnSignal();  // restores the actions it replaced
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  bool requested() const { return signal() != 0; }  // any thread
  int signal() const;                                // the first signal's number, 0 if none came
};

}  // namespace lockstep::cli
