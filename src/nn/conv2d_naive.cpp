// Conv2d, the naive sibling: the definition as loops, double accumulation.
//   y[n][co][oh][ow] = b[co] + sum over ci, i, j of
//                      w[co][ci][i][j] . x[n][ci][oh.s - pad + i][ow.s - pad + j]   (0 outside)
// The backward scatters the same products' partial derivatives.
#include <algorithm>
#include <vector>

#include "lockstep/nn/conv2d.h"

namespace lockstep::nn {
namespace {

// Calls f(x index, y index, w index) for every product of the convolution of
// image n that reads inside the input.
template <class F>
void each_product(const Conv2dShape& s, std::int64_t n, F&& f) {
  const std::int64_t ho = s.out_height(), wo = s.out_width(), k = s.kernel;
  for (std::int64_t co = 0; co < s.out_channels; ++co)
    for (std::int64_t oh = 0; oh < ho; ++oh)
      for (std::int64_t ow = 0; ow < wo; ++ow)
        for (std::int64_t ci = 0; ci < s.in_channels; ++ci)
          for (std::int64_t i = 0; i < k; ++i)
            for (std::int64_t j = 0; j < k; ++j) {
              const std::int64_t ih = oh * s.stride - s.padding + i, iw = ow * s.stride - s.padding + j;
              if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) continue;
              f(n * s.in_numel() + (ci * s.height + ih) * s.width + iw,
                n * s.out_numel() + (co * ho + oh) * wo + ow, ((co * s.in_channels + ci) * k + i) * k + j);
            }
}

}  // namespace

void conv2d_forward_naive(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                          std::int64_t batch) {
  // x: (B, Ci, H, W) -> y: (B, Co, Ho, Wo)
  const std::int64_t plane = s.out_height() * s.out_width();
  std::vector<double> acc(static_cast<std::size_t>(s.out_numel()));
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t co = 0; co < s.out_channels; ++co)
      std::fill(acc.begin() + co * plane, acc.begin() + (co + 1) * plane, double(b[co]));
    each_product(s, n, [&](std::int64_t xi, std::int64_t yi, std::int64_t wi) {
      acc[yi - n * s.out_numel()] += double(w[wi]) * x[xi];
    });
    for (std::int64_t i = 0; i < s.out_numel(); ++i) y[n * s.out_numel() + i] = static_cast<float>(acc[i]);
  }
}

void conv2d_backward_naive(const Conv2dShape& s, const float* x, const float* w, const float* dy, float* dw,
                           float* db, float* dx, std::int64_t batch, bool accumulate) {
  // dy: (B, Co, Ho, Wo) -> dW: (Co, Ci, k, k), db: (Co), dx: (B, Ci, H, W)
  const std::int64_t nw = s.out_channels * s.patch(), plane = s.out_height() * s.out_width();
  std::vector<double> gw(static_cast<std::size_t>(nw)), gb(static_cast<std::size_t>(s.out_channels));
  std::vector<double> gx(static_cast<std::size_t>(batch * s.in_numel()));
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t co = 0; co < s.out_channels; ++co)
      for (std::int64_t p = 0; p < plane; ++p) gb[co] += dy[n * s.out_numel() + co * plane + p];
    each_product(s, n, [&](std::int64_t xi, std::int64_t yi, std::int64_t wi) {
      gw[wi] += double(dy[yi]) * x[xi];
      gx[xi] += double(dy[yi]) * w[wi];
    });
  }
  for (std::int64_t i = 0; i < nw; ++i) dw[i] = static_cast<float>(gw[i] + (accumulate ? dw[i] : 0.0));
  for (std::int64_t c = 0; c < s.out_channels; ++c)
    db[c] = static_cast<float>(gb[c] + (accumulate ? db[c] : 0.0));
  if (dx != nullptr)
    for (std::int64_t i = 0; i < batch * s.in_numel(); ++i) dx[i] = static_cast<float>(gx[i]);
}

}  // namespace lockstep::nn
