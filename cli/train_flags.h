// The flags of `lockstep train`, as CLI11 parsed them (train_command.cpp),
// and what the command derives from them before training.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/trainer.h"
#include "process_group_flags.h"

namespace lockstep::cli {

struct TrainFlags {
  train::TrainConfig config;
  std::string data_dir = data::default_data_dir().string();
  std::string hidden = "512,512";
  std::string shuffle = "on";
  std::string schedule = "cosine";
  std::string ragged = "weighted";
  std::string bn_stats = "local";
  std::string algorithm = "auto";
  std::string compress = "none";
  std::string overlap = "auto";
  std::string link_bandwidth, link_latency;
  std::string on_divergence = "stop";
  std::vector<std::string> inject;
  std::string trace_file, svg_file, profile_file;
  std::int64_t svg_step = -1;
  double timeout_s = 60;
  double peak_gflops = 0;  // --peak-gflops: one host's; 0 = measure it
  bool normalize = false;
  bool quiet = false;
  std::string init_file, save_file, report_file;
  std::string checkpoint_file, resume_file;
  bool auto_resume = false;   // --auto-resume: resume_file = checkpoint_file when that exists
  bool auto_resumed = false;  // ... and it did
  std::int64_t restart = 0;   // LOCKSTEP_RESTART_COUNT: Note [Restarts]
  std::optional<train::LoadedCheckpoint> resume;  // read from resume_file before any rendezvous
  CLI::Option* lr_option = nullptr;
  CLI::Option* weight_decay_option = nullptr;
  CLI::Option* hidden_option = nullptr;
  CLI::Option* momentum_option = nullptr;
  CLI::Option* steps_option = nullptr;
  CLI::Option* epochs_option = nullptr;
  ProcessGroupFlags group;  // --backend and the process-group flags
  CLI::Option* replicas_option = nullptr;
  const CLI::App* cmd = nullptr;  // which flags were given
};

}  // namespace lockstep::cli
