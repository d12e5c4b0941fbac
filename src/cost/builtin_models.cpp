// Built-in models, layer by layer, and device presets (lockstep/cost/models.h).
//
// FLOPs: a multiply-add is 2 FLOPs. Backward costs twice forward (weight
// gradients + input gradients), except the first layer, which needs no input
// gradient. Activations saved for backward: every layer's output, twice for
// convolutions (the convolution's and the normalisation's); an estimate.
#include <cmath>
#include <string>

#include "lockstep/cost/models.h"
#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

// Accumulates one layer (a ResNet block, an Inception module) from its convolutions.
struct Builder {
  LayerShape layer;
  explicit Builder(std::string name) { layer.name = std::move(name); }
  // in -> out channels, kh x kw kernel, output h x h; batch norm after (2 x out params).
  Builder& conv(double in, double out, double kh, double kw, double h, bool bias = false) {
    const double weights = in * out * kh * kw;
    layer.params += weights + (bias ? out : 2 * out);
    layer.forward_flops += 2 * weights * h * h;
    layer.activation_floats += 2 * out * h * h;
    return *this;
  }
  LayerShape done(bool first = false) {
    layer.backward_flops = layer.forward_flops * (first ? 1 : 2);
    return layer;
  }
};

LayerShape linear(const std::string& name, double in, double out, bool first) {
  return {.name = name,
          .params = in * out + out,
          .forward_flops = 2 * in * out,
          .backward_flops = 2 * in * out * (first ? 1 : 2),
          .activation_floats = in + out};
}

// torchvision's ResNet (v1.5: the stride in the 3x3), 224 x 224 input.
ModelSpec resnet(const std::string& name, const int (&blocks)[4]) {
  ModelSpec m{.name = name};
  m.layers.push_back(Builder("conv1").conv(3, 64, 7, 7, 112).done(true));
  double in = 64, h_in = 56;
  const double mids[4] = {64, 128, 256, 512}, sizes[4] = {56, 28, 14, 7};
  for (int s = 0; s < 4; ++s) {
    const double mid = mids[s], out = 4 * mid, h = sizes[s];
    for (int b = 0; b < blocks[s]; ++b) {
      Builder blk("layer" + std::to_string(s + 1) + "." + std::to_string(b));
      blk.conv(in, mid, 1, 1, b == 0 ? h_in : h).conv(mid, mid, 3, 3, h).conv(mid, out, 1, 1, h);
      if (b == 0) blk.conv(in, out, 1, 1, h);  // downsample
      m.layers.push_back(blk.done());
      in = out;
    }
    h_in = h;
  }
  m.layers.push_back(linear("fc", 2048, 1000, false));
  return m;
}

ModelSpec vgg16() {
  ModelSpec m{.name = "vgg16"};
  const double widths[5] = {64, 128, 256, 512, 512}, sizes[5] = {224, 112, 56, 28, 14};
  const int convs[5] = {2, 2, 3, 3, 3};
  double in = 3;
  for (int s = 0; s < 5; ++s)
    for (int c = 0; c < convs[s]; ++c) {
      Builder b("conv" + std::to_string(s + 1) + "_" + std::to_string(c + 1));
      b.conv(in, widths[s], 3, 3, sizes[s], /*bias=*/true);
      b.layer.activation_floats /= 2;  // no normalisation in VGG
      m.layers.push_back(b.done(s == 0 && c == 0));
      in = widths[s];
    }
  m.layers.push_back(linear("fc6", 25088, 4096, false));
  m.layers.push_back(linear("fc7", 4096, 4096, false));
  m.layers.push_back(linear("fc8", 4096, 1000, false));
  return m;
}

// Inception V3 (Szegedy et al. 2016), 299 x 299, one layer per module; the
// auxiliary classifier is left out. Parameters sum to 23.8M (the paper's count);
// the convolutions' multiply-adds to 5.3G (the paper quotes 5.7G with everything).
ModelSpec inception3() {
  ModelSpec m{.name = "inception3"};
  m.layers.push_back(Builder("stem")
                         .conv(3, 32, 3, 3, 149)
                         .conv(32, 32, 3, 3, 147)
                         .conv(32, 64, 3, 3, 147)
                         .conv(64, 80, 1, 1, 73)
                         .conv(80, 192, 3, 3, 71)
                         .done(true));
  const double in_a[3] = {192, 256, 288}, pool_a[3] = {32, 64, 64};
  for (int i = 0; i < 3; ++i) {
    Builder b(std::string("Mixed_5") + char('b' + i));
    b.conv(in_a[i], 64, 1, 1, 35).conv(in_a[i], 48, 1, 1, 35).conv(48, 64, 5, 5, 35);
    b.conv(in_a[i], 64, 1, 1, 35)
        .conv(64, 96, 3, 3, 35)
        .conv(96, 96, 3, 3, 35)
        .conv(in_a[i], pool_a[i], 1, 1, 35);
    m.layers.push_back(b.done());
  }
  m.layers.push_back(Builder("Mixed_6a")
                         .conv(288, 384, 3, 3, 17)
                         .conv(288, 64, 1, 1, 35)
                         .conv(64, 96, 3, 3, 35)
                         .conv(96, 96, 3, 3, 17)
                         .done());
  const double c7s[4] = {128, 160, 160, 192};
  for (int i = 0; i < 4; ++i) {
    const double c7 = c7s[i];
    Builder b(std::string("Mixed_6") + char('b' + i));
    b.conv(768, 192, 1, 1, 17);
    b.conv(768, c7, 1, 1, 17).conv(c7, c7, 1, 7, 17).conv(c7, 192, 7, 1, 17);
    b.conv(768, c7, 1, 1, 17).conv(c7, c7, 7, 1, 17).conv(c7, c7, 1, 7, 17).conv(c7, c7, 7, 1, 17);
    b.conv(c7, 192, 1, 7, 17).conv(768, 192, 1, 1, 17);
    m.layers.push_back(b.done());
  }
  m.layers.push_back(Builder("Mixed_7a")
                         .conv(768, 192, 1, 1, 17)
                         .conv(192, 320, 3, 3, 8)
                         .conv(768, 192, 1, 1, 17)
                         .conv(192, 192, 1, 7, 17)
                         .conv(192, 192, 7, 1, 17)
                         .conv(192, 192, 3, 3, 8)
                         .done());
  for (double in : {1280.0, 2048.0}) {
    Builder b(in == 1280 ? "Mixed_7b" : "Mixed_7c");
    b.conv(in, 320, 1, 1, 8);
    b.conv(in, 384, 1, 1, 8).conv(384, 384, 1, 3, 8).conv(384, 384, 3, 1, 8);
    b.conv(in, 448, 1, 1, 8).conv(448, 384, 3, 3, 8).conv(384, 384, 1, 3, 8).conv(384, 384, 3, 1, 8);
    b.conv(in, 192, 1, 1, 8);
    m.layers.push_back(b.done());
  }
  m.layers.push_back(linear("fc", 2048, 1000, false));
  return m;
}

}  // namespace

double ModelSpec::params() const {
  double s = 0;
  for (const auto& l : layers) s += l.params;
  return s;
}

double ModelSpec::flops_per_sample() const {
  double s = 0;
  for (const auto& l : layers) s += l.forward_flops + l.backward_flops;
  return s;
}

Device device_preset(std::string_view name) {
  // Achieved FLOP/s are assumptions (docs/cost-model.md): the CPU core from
  // docs/results.md's measured sgemm peak; GPUs at 40% of the datasheet peak.
  if (name == "cpu") return {"cpu", 60e9, 12.0 * (1ull << 30), 20e9};
  if (name == "p100") return {"p100", 0.4 * 10.6e12, 16.0 * (1ull << 30), 732e9};
  if (name == "v100") return {"v100", 0.4 * 15.7e12, 16.0 * (1ull << 30), 900e9};
  if (name == "a100") return {"a100", 0.4 * 156e12, 80.0 * (1ull << 30), 2.0e12};
  throw InvalidArgument("unknown device '" + std::string(name) + "'; choose cpu, p100, v100 or a100.");
}

ModelSpec mlp_model(std::int64_t inputs, const std::vector<std::int64_t>& hidden, std::int64_t classes) {
  if (inputs < 1 || classes < 1) throw InvalidArgument("the MLP needs at least one input and one class.");
  ModelSpec m{.name = "mlp " + std::to_string(inputs)};
  std::int64_t in = inputs;
  std::vector<std::int64_t> widths = hidden;
  widths.push_back(classes);
  for (std::size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1)
      throw InvalidArgument("every MLP width must be positive, got " + std::to_string(widths[i]) + ".");
    // The trainer's names: Linear layers sit at 1, 3, 5, ... between ReLUs.
    m.layers.push_back(linear(std::to_string(2 * i + 1), double(in), double(widths[i]), i == 0));
    m.name += '-';
    m.name += std::to_string(widths[i]);
    in = widths[i];
  }
  return m;
}

ModelSpec cnn_model(std::string_view name) {
  if (name == "resnet50") return resnet("resnet50", {3, 4, 6, 3});
  if (name == "resnet101") return resnet("resnet101", {3, 4, 23, 3});
  if (name == "vgg16") return vgg16();
  if (name == "inception3") return inception3();
  throw InvalidArgument("unknown model '" + std::string(name) +
                        "'; choose mlp, resnet50, resnet101, inception3 or vgg16.");
}

Profile profile_from_spec(const ModelSpec& spec, const Device& device, std::int64_t micro_batch,
                          double optimizer_passes) {
  if (!(device.flops > 0) || !(device.memory_bandwidth > 0))
    throw InvalidArgument("the device's FLOP/s and memory bandwidth must be positive.");
  if (micro_batch < 1) throw InvalidArgument("the micro-batch must be at least 1.");
  Profile p{.model = spec.name, .micro_batch = micro_batch};
  double activations = 0;
  for (const LayerShape& l : spec.layers) {
    p.layers.push_back({.name = l.name,
                        .param_bytes = 4 * l.params,
                        .forward_ms = 1e3 * l.forward_flops * micro_batch / device.flops,
                        .backward_ms = 1e3 * l.backward_flops * micro_batch / device.flops});
    activations += 4 * l.activation_floats;
  }
  p.activation_bytes_per_sample = activations;
  p.step_compute_ms =
      p.forward_ms() + p.backward_ms() + 1e3 * optimizer_passes * p.param_bytes() / device.memory_bandwidth;
  return p;
}

}  // namespace lockstep::cost
