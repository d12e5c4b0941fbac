// Built-in models: parameter counts exact, FLOPs as documented, and
// readiness where it matters (VGG-16's big layers ready first).
#include "lockstep/cost/models.h"

#include <gtest/gtest.h>

#include "lockstep/cost/step_cost.h"
#include "lockstep/error.h"

namespace lockstep::cost {
namespace {

TEST(Models, MlpParameterBytesAreExact) {
  const ModelSpec m = mlp_model(784, {512, 512}, 10);
  EXPECT_EQ(m.name, "mlp 784-512-512-10");
  ASSERT_EQ(m.layers.size(), 3u);
  EXPECT_DOUBLE_EQ(m.layers[0].params, 784 * 512 + 512);
  EXPECT_DOUBLE_EQ(m.layers[1].params, 512 * 512 + 512);
  EXPECT_DOUBLE_EQ(m.layers[2].params, 512 * 10 + 10);
  EXPECT_DOUBLE_EQ(m.params(), 669706);
  // docs/results.md: 3.21 MFLOP per sample (no input gradient for the first layer).
  EXPECT_DOUBLE_EQ(m.flops_per_sample(), 3209216);
  const ModelSpec big = mlp_model(784, {1024, 1024, 1024}, 10);
  EXPECT_DOUBLE_EQ(big.params(), (784 * 1024 + 1024) + 2 * (1024 * 1024 + 1024) + (1024 * 10 + 10));
  const Profile p = profile_from_spec(m, device_preset("cpu"), 32, 5);
  EXPECT_DOUBLE_EQ(p.param_bytes(), 4 * 669706);
  EXPECT_EQ(p.layers[0].name, "1");
  EXPECT_EQ(p.layers[2].name, "5");
}

TEST(Models, CnnParameterCountsMatchThePapers) {
  EXPECT_NEAR(cnn_model("resnet50").params(), 25.557e6, 0.01e6);
  EXPECT_NEAR(cnn_model("resnet101").params(), 44.549e6, 0.01e6);
  EXPECT_DOUBLE_EQ(cnn_model("vgg16").params(), 138357544);
  EXPECT_NEAR(cnn_model("inception3").params(), 23.8e6, 0.1e6);
  // Forward multiply-adds: ResNet-50 ~4.1G, VGG-16 ~15.5G.
  EXPECT_NEAR(cnn_model("resnet50").flops_per_sample() / 6, 4.05e9, 0.1e9);
  EXPECT_NEAR(cnn_model("vgg16").flops_per_sample() / 6, 15.4e9, 0.2e9);
}

TEST(Models, Vgg16sFullyConnectedGradientsAreReadyFirst) {
  // fc6..fc8 hold 89% of the parameters and are the last layers: their
  // bucket is ready after a sliver of backward.
  const Profile p = profile_from_spec(cnn_model("vgg16"), device_preset("v100"), 32, 5);
  const StepPrediction s = predict_step(p, {.replicas = 8, .micro_batch = 32});
  ASSERT_GE(s.buckets.size(), 2u);
  double fc = 0;
  for (std::size_t i = p.layers.size() - 3; i < p.layers.size(); ++i) fc += p.layers[i].param_bytes;
  EXPECT_GT(fc / p.param_bytes(), 0.85);
  EXPECT_LT(s.buckets[0].ready_ms - p.forward_ms(), 0.05 * p.backward_ms());
  double early = 0;  // bytes in buckets ready within the first 5% of backward
  for (const auto& b : s.buckets)
    if (b.ready_ms - p.forward_ms() < 0.05 * p.backward_ms()) early += b.bytes;
  EXPECT_GT(early / p.param_bytes(), 0.85);
}

TEST(Models, MlpsBigFirstLayerIsReadyLast) {
  const Profile p = profile_from_spec(mlp_model(784, {512, 512}, 10), device_preset("cpu"), 32, 5);
  const StepPrediction s = predict_step(p, {.replicas = 8, .micro_batch = 32});
  ASSERT_EQ(s.buckets.size(), 2u);
  EXPECT_NEAR(s.buckets.back().ready_ms, p.forward_ms() + p.backward_ms(), 1e-9);
  EXPECT_NEAR(s.buckets.back().bytes, p.layers[0].param_bytes, 1e-6);
}

TEST(Models, BadNamesAndShapesAreRejected) {
  EXPECT_THROW(cnn_model("resnet51"), InvalidArgument);
  EXPECT_THROW(device_preset("tpu"), InvalidArgument);
  EXPECT_THROW(mlp_model(784, {512, 0}, 10), InvalidArgument);
  EXPECT_THROW(profile_from_spec(mlp_model(4, {4}, 2), Device{.name = "x"}, 1, 5), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::cost
