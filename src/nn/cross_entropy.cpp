// Softmax cross-entropy, numerically stable: with m = max_j z_j,
//   loss = log(sum_j exp(z_j - m)) - (z_label - m)
//   dz_j = (exp(z_j - m) / sum - [j == label]) * grad_scale
#include <cmath>
#include <string>

#include "lockstep/error.h"
#include "lockstep/nn/loss.h"

namespace lockstep::nn {

LossSum softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t batch,
                              std::int64_t classes, float* dlogits, float grad_scale) {
  if (batch < 0 || classes < 1) {
    throw InvalidArgument("softmax_cross_entropy: batch " + std::to_string(batch) + " of " + std::to_string(classes) +
                          " classes");
  }
  LossSum out;
  for (std::int64_t r = 0; r < batch; ++r) {
    const float* z = logits + r * classes;
    const std::int32_t label = labels[r];
    if (label < 0 || label >= classes) {  // it would index outside the row
      throw InvalidArgument("softmax_cross_entropy: sample " + std::to_string(r) + " has label " +
                            std::to_string(label) + ", outside the " + std::to_string(classes) + " classes [0, " +
                            std::to_string(classes) + ")");
    }
    std::int64_t arg = 0;
    for (std::int64_t j = 1; j < classes; ++j)
      if (z[j] > z[arg]) arg = j;
    const float m = z[arg];
    double sum = 0;
    for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j] - m));
    out.loss_sum += std::log(sum) - static_cast<double>(z[label] - m);
    out.correct += (arg == label);
    if (dlogits != nullptr) {
      float* dz = dlogits + r * classes;
      for (std::int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(z[j] - m)) / sum;
        dz[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  return out;
}

}  // namespace lockstep::nn
