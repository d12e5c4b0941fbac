#include "evaluate.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "lockstep/comm/collectives.h"
#include "lockstep/nn/loss.h"

namespace lockstep::train::detail {

// Sum-all-reduces a few tallies (loss sums, sample and correct counts). They
// travel as float: counts stay exact below 2^24, and a logged loss needs no
// more than float's 7 digits.
void allreduce_tallies(comm::Communicator& comm, std::span<double> values) {
  std::vector<float> buf(values.begin(), values.end());
  comm::allreduce(comm, buf, {.op = comm::ReduceOp::Sum});
  std::copy(buf.begin(), buf.end(), values.begin());
}

// Accuracy on the test set, split across replicas; every replica gets it.
double evaluate(comm::Communicator& comm, nn::Model& model, const data::Dataset& test) {
  const std::int64_t n = comm.size(), r = comm.rank();
  const std::int64_t begin = test.size * r / n, end = test.size * (r + 1) / n;
  const std::int64_t chunk = 256, features = test.features;
  double tally[2] = {0, 0};   // correct, count
  model.set_training(false);  // dropout off, batch norm on its running statistics
  for (std::int64_t i = begin; i < end; i += chunk) {
    const std::int64_t b = std::min(chunk, end - i);
    auto x = std::span<const float>(test.inputs).subspan(i * features, b * features);
    auto logits = model.forward(x, b);
    auto s = nn::softmax_cross_entropy(logits.data(), test.labels.data() + i, b, model.out_features(),
                                       nullptr, 0.0f);
    tally[0] += double(s.correct);
    tally[1] += double(b);
  }
  model.set_training(true);
  allreduce_tallies(comm, tally);
  return tally[0] / tally[1];
}

}  // namespace lockstep::train::detail
