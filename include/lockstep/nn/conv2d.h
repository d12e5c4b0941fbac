// 2-D convolution kernels, NCHW as PyTorch: the fast path (im2col + sgemm)
// and its naive sibling (direct convolution, double accumulation).
//
// Shapes: x (B, Ci, H, W), weight (Co, Ci, k, k), bias (Co),
//         y (B, Co, Ho, Wo), Ho = (H + 2.pad - k) / stride + 1 (floor).
// Square kernels, the same stride and zero padding on both axes.
#pragma once

#include <cstdint>
#include <span>

namespace lockstep::nn {

struct Conv2dShape {
  std::int64_t in_channels = 1, out_channels = 1;
  std::int64_t height = 1, width = 1;  // of one input image
  std::int64_t kernel = 1, stride = 1, padding = 0;

  std::int64_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  std::int64_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
  std::int64_t patch() const { return in_channels * kernel * kernel; }  // one column of im2col
  std::int64_t in_numel() const { return in_channels * height * width; }
  std::int64_t out_numel() const { return out_channels * out_height() * out_width(); }
};

// Throws InvalidArgument unless every size is positive, padding >= 0 and the
// output is at least 1 x 1.
void check_conv2d_shape(const Conv2dShape& s);

// Floats of scratch the fast kernels need: two im2col matrices of one image.
std::int64_t conv2d_scratch_size(const Conv2dShape& s);

// x -> y = conv(x, w) + b.
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    std::int64_t batch, std::span<float> scratch);
// dy -> dw, db (written, or added to with accumulate) and dx (written unless null).
void conv2d_backward(const Conv2dShape& s, const float* x, const float* w, const float* dy, float* dw,
                     float* db, float* dx, std::int64_t batch, bool accumulate, std::span<float> scratch);

void conv2d_forward_naive(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                          std::int64_t batch);
void conv2d_backward_naive(const Conv2dShape& s, const float* x, const float* w, const float* dy, float* dw,
                           float* db, float* dx, std::int64_t batch, bool accumulate);

}  // namespace lockstep::nn
