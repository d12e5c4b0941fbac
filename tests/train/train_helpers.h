// Test helpers for the trainer's tests: a small bucketed configuration, the
// check that a configuration is refused with a message, and bitwise equality.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <span>
#include <string>

#include "lockstep/error.h"
#include "lockstep/train/trainer.h"

namespace lockstep::testing {

// Small steps on synthetic_data's 48 features: MLP 48-32-16-10 (2.3k
// parameters) with a bucket per layer, 12 steps of 16 samples a replica, no evaluation.
inline train::TrainConfig bucketed_config(int replicas) {
  train::TrainConfig c;
  c.replicas = replicas;
  c.micro_batch = 16;
  c.hidden = {32, 16};
  c.steps = 12;
  c.evaluate = false;
  c.first_bucket_mb = 0.0005;  // a bucket per layer of the 2.3k-parameter model (48-32-16-10)
  c.bucket_mb = 0.001;
  c.timeout = std::chrono::seconds(20);
  return c;
}

// train() throws InvalidArgument whose message holds `says`.
inline void expect_refused(const train::TrainConfig& c, const data::ImageClassificationData& data,
                           const std::string& says) {
  try {
    train::train(c, data);
    ADD_FAILURE() << "not refused: " << says;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

// The same floats, bit for bit (NaNs and signed zeros included).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace lockstep::testing
