// Softmax cross-entropy over class logits.
#pragma once

#include <cstdint>

namespace lockstep::nn {

struct LossSum {
  double loss_sum = 0;       // sum over the batch of -log softmax(logits)[label]
  std::int64_t correct = 0;  // samples whose arg-max logit is the label
};

// logits: (B, C), labels: (B) with values in [0, C) (another throws InvalidArgument).
// If dlogits is not null, writes dlogits = (softmax(logits) - onehot(label)) * grad_scale,
// the gradient of grad_scale * loss_sum. For the mean over the batch, grad_scale = 1/B.
LossSum softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t batch,
                              std::int64_t classes, float* dlogits, float grad_scale);

}  // namespace lockstep::nn
