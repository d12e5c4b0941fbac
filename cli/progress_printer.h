// `lockstep train`'s progress lines on standard error.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "lockstep/train/trainer.h"

namespace lockstep::cli {

class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) == 1) {}
  void operator()(const train::Progress& p) {
    if (quiet_) return;
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %lld  step %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  step %.1f ms (comm %.1f, "
                  "exposed %.1f)",
                  (long long)p.epoch + 1, (long long)p.step, (long long)p.total_steps, p.loss, p.lr,
                  p.samples_per_s, p.times.step_ms, p.times.comm_ms, p.times.exposed_comm_ms);
    if (p.grad_norm) {  // --clip-grad-norm
      const std::size_t used = std::strlen(line);
      std::snprintf(line + used, sizeof line - used, "  grad norm max %.3g (clipped %lld)", *p.grad_norm,
                    (long long)p.clipped);
    }
    // On a terminal one line is rewritten in place; elsewhere every update is a line.
    if (tty_) std::fprintf(stderr, "\r\033[K%s", line);
    if (p.test_accuracy) {
      std::fprintf(stderr, "%s  test accuracy %.4f\n", tty_ ? "" : line, *p.test_accuracy);
    } else if (!tty_) {
      std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }

 private:
  bool quiet_;
  bool tty_;
};

}  // namespace lockstep::cli
