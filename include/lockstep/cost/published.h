// The cost model against published scaling results (docs/cost-model.md):
// each case is the paper's model, batch, hardware and interconnect as inputs,
// and the paper's efficiency beside the prediction.
#pragma once

#include <string>
#include <vector>

namespace lockstep::cost {

struct PublishedCase {
  std::string name;                 // "Goyal et al. 2017, ResNet-50, 256 P100"
  std::string inputs;               // the inputs used, one line
  double published = 0;             // efficiency the paper reports
  double predicted = 0;             // efficiency the model predicts, with the system's launch schedule
  double predicted_size_buckets = 0;  // the same with size buckets of the system's caps instead
  double predicted_no_overlap = 0;  // the same with one bucket after backward (a bound)
  // Stragglers (StepOptions::compute_cv), which no paper reports: c is fitted
  // to the other seven cases (least squares on efficiency, leave one out), and
  // this case is predicted with it. A test of the term's form, not an input
  // from the paper.
  double straggler_cv = 0;          // c fitted without this case
  double predicted_stragglers = 0;  // own schedule, with that c
  // The same with c fitted without any case of this system (all six Horovod
  // rows out at once, say): no case from the same paper helps fit it.
  double straggler_cv_system_out = 0;
  double predicted_stragglers_system_out = 0;
  std::string note;                 // when off by more than 5 points: which term is wrong
};

std::vector<PublishedCase> published_cases();

// Leave out: the grid index k at which curves[j][k] (case j's efficiency at
// the k-th value of c) fits published[j] best, least squares over every case
// j with held_out[j] false. published[j] of a held-out case is never read.
std::size_t fit_leaving_out(const std::vector<std::vector<double>>& curves, const std::vector<double>& published,
                            const std::vector<bool>& held_out);
std::string published_table(const std::vector<PublishedCase>& cases);

}  // namespace lockstep::cost
