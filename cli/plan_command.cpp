// `lockstep plan`: what data parallelism costs for a model, a device and a
// link, where it stops paying, and what to do instead (docs/cost-model.md).
#include <sys/stat.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <optional>

#include "checks.h"
#include "commands.h"
#include "lockstep/comm/modelled_link.h"
#include "lockstep/cost/plan.h"
#include "lockstep/cost/published.h"
#include "lockstep/cost/render.h"
#include "lockstep/cost/units.h"
#include "lockstep/error.h"
#include "output_files.h"

namespace lockstep::cli {
namespace {

struct PlanFlags {
  std::string model = "mlp", hidden = "512,512", profile_file, params;
  double compute_ms = 0;
  int host_cores = 0;
  std::string host_latency = "0";
  std::string device, device_flops, device_memory;
  std::string link_bandwidth = "10Gbit", link_latency = "50us";
  std::string intra_bandwidth = "100GB/s", intra_latency = "5us";
  int per_node = 1, nodes = 0;
  std::string replicas = "1-64";
  std::int64_t micro_batch = 32, accumulate = 1;
  std::string optimizer = "momentum", algorithm = "best", compress = "none";
  double first_bucket_mb = 1, bucket_mb = 25;
  std::string launch = "buckets";
  double cycle_ms = 5;
  double compute_cv = 0;
  int zero = 0;
  double price = 1.0, critical_batch = 0, min_efficiency = 0.8, max_cost_increase = 0.25;
  bool json = false, published = false;
  std::string svg_file;
  CLI::Option *replicas_opt = nullptr, *micro_batch_opt = nullptr;
  CLI::Option *bucket_mb_opt = nullptr, *first_bucket_mb_opt = nullptr;
};

cost::Optimizer optimizer_from(const std::string& name) {
  if (name == "sgd") return cost::Optimizer::Sgd;
  if (name == "adamw") return cost::Optimizer::AdamW;
  return cost::Optimizer::Momentum;
}

// A model's profile from whichever of --profile, --params or --model was
// given (check_combinations has made sure it is one).
// `measured` is the --profile file's, read once by the caller.
cost::Profile build_profile(const PlanFlags& f, const std::optional<cost::Profile>& measured,
                            const cost::Device& device, double passes) {
  if (!f.params.empty()) {
    if (f.compute_ms <= 0)
      throw InvalidArgument(
          "--params needs --compute-ms T: one replica's compute time per step at --micro-batch.");
    // A uniform stream: up to 64 slices of whole parameters, gradients ready
    // evenly through backward. T holds the optimizer's pass over the state
    // too (as a profile's step_compute_ms does); forward and backward share
    // the rest 1:2.
    const double params = cost::parse_count(f.params, "--params");
    if (params != std::floor(params))
      throw InvalidArgument("--params " + f.params + " is not a whole number of parameters.");
    const int slices = static_cast<int>(std::min(64.0, params));
    const double optimizer_ms = std::min(f.compute_ms / 2, passes * 4 * params / device.memory_bandwidth * 1e3);
    const double layers_ms = f.compute_ms - optimizer_ms;
    cost::Profile p{
        .model = f.params + " parameters", .micro_batch = f.micro_batch, .step_compute_ms = f.compute_ms};
    for (int i = 0; i < slices; ++i) {
      const double first = std::floor(params * i / slices), end = std::floor(params * (i + 1) / slices);
      p.layers.push_back({.name = std::to_string(i),
                          .param_bytes = 4 * (end - first),
                          .forward_ms = layers_ms / 3 / slices,
                          .backward_ms = 2 * layers_ms / 3 / slices});
    }
    return p;
  }
  cost::Profile p;
  if (measured) {
    p = *measured;
  } else if (f.model == "mlp") {
    p = cost::profile_from_spec(cost::mlp_model(784, parse_hidden(f.hidden), 10), device, f.micro_batch,
                                passes);
  } else {
    p = cost::profile_from_spec(cost::cnn_model(f.model), device, f.micro_batch, passes);
  }
  if (f.compute_ms > 0) {
    // Rescale forward and backward so that a step at --micro-batch computes for T.
    const double at_batch =
        (p.forward_ms() + p.backward_ms()) * double(f.micro_batch) / double(p.micro_batch);
    if (f.compute_ms <= p.optimizer_ms())
      throw InvalidArgument(
          "--compute-ms " + CLI::detail::to_string(f.compute_ms) +
          " is not more than the optimizer's modelled time; give the whole step's compute.");
    p = cost::scale_compute(p, (f.compute_ms - p.optimizer_ms()) / at_batch);
  }
  return p;
}

// Flags that would be silently ignored in this combination are errors.
void check_combinations(const PlanFlags& f, const CLI::App& cmd) {
  const auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  if (f.published)
    for (const CLI::Option* opt : cmd.get_options())
      if (opt->count() > 0 && opt->get_name() != "--published" && opt->get_name() != "--help")
        throw InvalidArgument("--published prints the fixed published cases; it takes no " + opt->get_name() +
                              ". Drop one of them.");
  const int sources = int(!f.profile_file.empty()) + int(!f.params.empty()) + int(given("--model"));
  if (sources > 1) throw InvalidArgument("give one of --profile, --params or --model, not several.");
  if (given("--device-flops") && (!f.profile_file.empty() || !f.params.empty()))
    throw InvalidArgument("--device-flops sets a built-in model's compute; a profile or --params brings its own "
                          "times (rescale them with --compute-ms).");
  if (given("--nodes") && f.nodes > 0 && given("--replicas"))
    throw InvalidArgument("--nodes M plans 1 and per-node x 1, 2, 4 ... M replicas; give it or --replicas, not both.");
  if (std::int64_t(f.nodes) * f.per_node > 65536)  // the limit --replicas has
    throw InvalidArgument("--nodes " + std::to_string(f.nodes) + " x --per-node " + std::to_string(f.per_node) +
                          " is more than 65536 replicas, the most the plan takes; give fewer nodes.");
  if (given("--hidden") && (!f.profile_file.empty() || !f.params.empty()))
    throw InvalidArgument("--hidden shapes the built-in MLP, not a profile or --params; drop it.");
  if (given("--hidden") && f.model != "mlp")
    throw InvalidArgument("--hidden shapes the built-in MLP only; drop it, or use --model mlp.");
  if (f.launch == "layers" && (given("--bucket-mb") || given("--first-bucket-mb")))
    throw InvalidArgument("--launch layers sends one all-reduce per layer, so bucket sizes do not apply; drop "
                          "--bucket-mb and --first-bucket-mb.");
  if (f.launch == "cycles" && given("--first-bucket-mb"))
    throw InvalidArgument("--launch cycles fuses what is ready up to --bucket-mb; it has no first bucket, so "
                          "drop --first-bucket-mb.");
  if (given("--cycle-ms") && f.launch != "cycles")
    throw InvalidArgument("--cycle-ms applies only with --launch cycles; add --launch cycles or drop it.");
  if (f.per_node == 1) {
    for (const char* flag : {"--intra-bandwidth", "--intra-latency"})
      if (given(flag))
        throw InvalidArgument(std::string(flag) + " is the link between replicas of one node, and --per-node 1 "
                              "puts every replica on a node of its own; give --per-node G or drop it.");
    if (f.algorithm == "hierarchical")
      throw InvalidArgument("--algorithm hierarchical rings inside nodes and then across them; give --per-node G "
                            "(replicas per node) with it.");
  }
  if (given("--svg") && f.svg_file.empty()) throw InvalidArgument("--svg needs a file name.");
  check_outputs({{"--svg", f.svg_file}}, {{"--profile", f.profile_file}});
  // The plot appended to the JSON on standard output would leave neither readable.
  struct stat st {};
  if (f.json && !f.svg_file.empty() && ::stat(f.svg_file.c_str(), &st) == 0 && standard_stream_of(st) == 1) {
    throw InvalidArgument("--svg " + f.svg_file + " is standard output, where --json writes the plan: the two "
                          "would run together. Give --svg a file.");
  }
}

int run_plan(PlanFlags& f) {
  if (f.published) {
    const auto cases = cost::published_cases();
    std::cout << cost::published_table(cases);
    return 0;
  }
  // A measured profile is planned at its own micro-batch unless told otherwise.
  std::optional<cost::Profile> measured;
  if (!f.profile_file.empty()) {
    measured = cost::read_profile(f.profile_file);
    if (f.micro_batch_opt->count() == 0) f.micro_batch = measured->micro_batch;
  }
  const bool cnn = f.model != "mlp" && f.profile_file.empty() && f.params.empty();
  cost::Device device = cost::device_preset(!f.device.empty() ? f.device : cnn ? "v100" : "cpu");
  if (!f.device_flops.empty()) {
    device.flops = cost::parse_count(f.device_flops, "--device-flops", "125T or 1.5e14");
    if (device.flops < 1e6)
      throw InvalidArgument("--device-flops '" + f.device_flops +
                            "' is under a million FLOP/s; give a unit, such as 60G or 125T.");
  }
  if (!f.device_memory.empty()) {
    // Spaces too: parse_bytes trims them, and ' 16' was taken as 16 bytes.
    if (f.device_memory.find_first_not_of("0123456789.eE+- ") == std::string::npos)
      throw InvalidArgument("--device-memory '" + f.device_memory + "' has no unit; give one, such as 16GB or 80GiB.");
    device.memory_bytes = cost::parse_bytes(f.device_memory, "--device-memory");
  }

  cost::PlanOptions o;
  o.device = device;
  o.optimizer = optimizer_from(f.optimizer);
  o.price_per_device_hour = f.price;
  o.critical_batch = f.critical_batch;
  o.min_efficiency = f.min_efficiency;
  o.max_cost_increase = f.max_cost_increase;
  if (f.nodes > 0 && f.replicas_opt->count() == 0) {
    o.replicas = {1};
    for (int m = 1; m <= f.nodes; m *= 2)
      if (m * f.per_node > 1) o.replicas.push_back(m * f.per_node);
    if (o.replicas.back() != f.nodes * f.per_node) o.replicas.push_back(f.nodes * f.per_node);
  } else {
    o.replicas = cost::parse_replicas(f.replicas, "--replicas");
  }
  auto& s = o.step;
  s.micro_batch = f.micro_batch;
  s.accumulate = f.accumulate;
  s.algorithm = cost::algorithm_from_string(f.algorithm);
  s.first_bucket_mb = f.first_bucket_mb;
  s.bucket_mb = f.bucket_mb;
  s.launch = f.launch == "layers"   ? cost::StepOptions::Launch::PerLayer
             : f.launch == "cycles" ? cost::StepOptions::Launch::Cycles
                                    : cost::StepOptions::Launch::Buckets;
  s.cycle_ms = f.cycle_ms;
  s.compute_cv = f.compute_cv;
  s.bf16 = f.compress == "bf16";
  s.zero1 = f.zero == 1;
  if (s.zero1 && s.bf16)
    throw InvalidArgument("--zero 1 reduce-scatters in float32 (as lockstep train does); leave out --compress bf16.");
  if (s.zero1 && f.algorithm != "best" && f.algorithm != "auto" && f.algorithm != "ring")
    throw InvalidArgument("--zero 1 reduce-scatters and all-gathers on the ring (as lockstep train does); leave out "
                          "--algorithm " + f.algorithm + ".");
  if (s.zero1 && f.launch != "buckets")
    throw InvalidArgument("--zero 1 is planned as lockstep train runs it, with gradient buckets; leave out --launch " +
                          f.launch + ".");
  s.reduce_bytes_per_s = device.memory_bandwidth / 3;  // read two operands, write one
  s.host_cores = f.host_cores;
  // What lockstep train does on shared cores (Note [One bucket on shared cores]).
  s.one_bucket_on_shared_cores = f.bucket_mb_opt->count() == 0 && f.first_bucket_mb_opt->count() == 0;
  try {
    s.host_latency_s = std::chrono::duration<double>(comm::parse_latency(f.host_latency)).count();
  } catch (const InvalidArgument&) {
    throw InvalidArgument("bad --host-latency '" + f.host_latency +
                          "': expected a non-negative time with a unit, such as 16us or 0.");
  }
  s.topology.per_node = f.per_node;
  // The link parsers' messages name the value, not the flag: add the flag.
  const auto link = [](const char* flag, const std::string& rate, const char* latency_flag, const std::string& latency) {
    const char* which = flag;
    try {
      const double bytes_per_s = comm::parse_bandwidth(rate);
      which = latency_flag;
      return cost::Link{bytes_per_s, std::chrono::duration<double>(comm::parse_latency(latency)).count()};
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(which) + ": " + e.what());
    }
  };
  s.topology.inter = link("--link-bandwidth", f.link_bandwidth, "--link-latency", f.link_latency);
  s.topology.intra = link("--intra-bandwidth", f.intra_bandwidth, "--intra-latency", f.intra_latency);

  const cost::Profile profile = build_profile(f, measured, device, cost::optimizer_passes(o.optimizer));
  const cost::Plan plan = cost::make_plan(profile, o);
  if (!f.svg_file.empty()) write_file_atomically(f.svg_file, cost::plan_svg(plan), "the plot");
  // The plot on standard output takes it (--json with it is refused above).
  std::ostream& text = takes_standard_output({{"--svg", f.svg_file}}) ? std::cerr : std::cout;
  text << (f.json ? cost::plan_json(plan) : cost::plan_table(plan));
  if (!f.json && !f.svg_file.empty()) text << "plot: " << f.svg_file << "\n";
  return 0;
}

}  // namespace

Action add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Predict what data parallelism costs per replica count, where it stops paying and what to do instead "
      "(no training; docs/cost-model.md)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--model", f->model, "Built-in model")
                     ->check(CLI::IsMember({"mlp", "resnet50", "resnet101", "inception3", "vgg16"}))
      ->check(not_empty());
  cmd->add_option("--hidden", f->hidden, "Hidden layer widths of the MLP")
      ->check(not_empty());
  cmd->add_option("--profile", f->profile_file,
                  "A measured profile (JSON, per-layer parameter bytes and forward/backward ms) instead of a "
                  "built-in model")
      ->check(not_empty());
  cmd->add_option("--params", f->params,
                  "Instead of a model: this many parameters (e.g. 25.6M), with --compute-ms")
      ->check(not_empty());
  cmd->add_option("--compute-ms", f->compute_ms,
                  "One replica's compute per step (forward + backward + optimizer) at --micro-batch, in ms; "
                  "rescales the model's compute")
      ->check(number_in(1e-6, 1e12));  // 1 ns at least: 1e-300 gave samples/s of 300 digits
  cmd->add_option("--device", f->device, "Device preset (default: cpu for the MLP, v100 for the CNNs)")
      ->check(CLI::IsMember({"cpu", "p100", "v100", "a100"}))
      ->check(not_empty());
  cmd->add_option("--device-flops", f->device_flops, "Achieved FLOP/s of one device, e.g. 60G or 6.3T")
      ->check(not_empty());
  cmd->add_option("--device-memory", f->device_memory, "Memory of one device, e.g. 16GB or 80GiB")
      ->check(not_empty());
  cmd->add_option(
      "--link-bandwidth", f->link_bandwidth,
      "Bandwidth between nodes (each replica is a node unless --per-node), e.g. 10Gbit or 12.5GB/s")
      ->check(not_empty());
  cmd->add_option("--link-latency", f->link_latency, "Latency per message between nodes, e.g. 50us")
      ->check(not_empty());
  cmd->add_option("--per-node", f->per_node, "Replicas per node (they share the node's link)")
      ->transform(whole_number_in(1, 1024));
  cmd->add_option("--nodes", f->nodes, "Nodes: plan 1 replica and per-node x 1, 2, 4 ... nodes replicas")
      ->transform(whole_number_in(0, 65536));
  cmd->add_option("--host-cores", f->host_cores,
                  "The replicas time-share this many cores, as lockstep train's in-process replicas do "
                  "(0: a device per replica)")
      ->transform(whole_number_in(0, 1 << 20));
  cmd->add_option("--host-latency", f->host_latency,
                  "Software cost of handing one message to the next rank, per all-reduce round, on top of "
                  "the link's latency, e.g. 16us (lockstep bench allreduce --algorithm ring --sizes 4K "
                  "measures it)")
      ->check(not_empty());
  cmd->add_option("--intra-bandwidth", f->intra_bandwidth, "Bandwidth between replicas of one node")
      ->check(not_empty());
  cmd->add_option("--intra-latency", f->intra_latency, "Latency per message between replicas of one node")
      ->check(not_empty());
  f->replicas_opt = cmd->add_option("--replicas", f->replicas,
                                    "Replica counts: a list (1,2,4,8) or a doubling range (1-64)")
      ->check(not_empty());
  f->micro_batch_opt = cmd->add_option("--micro-batch", f->micro_batch, "Samples per replica per micro-step")
                           ->transform(whole_number_in(std::int64_t{1}, std::int64_t{1} << 24));
  cmd->add_option("--accumulate", f->accumulate, "Micro-steps per optimizer step, one all-reduce each step")
      ->transform(whole_number_in(std::int64_t{1}, std::int64_t{65536}));
  cmd->add_option("--optimizer", f->optimizer, "Optimizer (its state: 0, 1 or 2 x the parameters)")
      ->check(CLI::IsMember({"sgd", "momentum", "adamw"}))
      ->check(not_empty());
  cmd->add_option(
         "--algorithm", f->algorithm,
         "All-reduce algorithm (best: the cheapest per bucket; auto: what `lockstep train` does over a "
         "modelled link)")
      ->check(CLI::IsMember({"best", "auto", "ring", "halving_doubling", "tree", "hierarchical"}));
  f->bucket_mb_opt = cmd->add_option("--bucket-mb", f->bucket_mb,
                  "Gradient bucket size in MiB (0: one bucket after backward); with --launch cycles, the "
                  "fusion cap (0: no fusion)")
      ->check(number_in(0.0, 1e6));
  f->first_bucket_mb_opt = cmd->add_option("--first-bucket-mb", f->first_bucket_mb, "Size in MiB of the first bucket")
      ->check(number_in(0.0, 1e6));
  cmd->add_option("--launch", f->launch,
                  "When all-reduces start (buckets: lockstep's and PyTorch DDP's, a bucket when its last "
                  "gradient is ready; layers: one per layer when it is ready; cycles: Horovod's tensor "
                  "fusion, every --cycle-ms what is ready, fused up to --bucket-mb)")
      ->check(CLI::IsMember({"buckets", "layers", "cycles"}));
  cmd->add_option("--cycle-ms", f->cycle_ms,
                  "With --launch cycles: the time between cycles in ms (Horovod's HOROVOD_CYCLE_TIME)")
      ->check(number_in(0.001, 1e6));
  cmd->add_option("--compute-cv", f->compute_cv,
                  "Stragglers: the coefficient of variation of one replica's compute per step, e.g. 0.04; a "
                  "synchronous step waits for the slowest replica (0: all equal)")
      ->check(number_in(0.0, 1.0));
  cmd->add_option("--compress", f->compress, "All-reduce in bf16 (half the bytes)")
      ->check(CLI::IsMember({"none", "bf16"}))
      ->check(not_empty());
  cmd->add_option("--zero", f->zero,
                  "1: plan lockstep train --zero 1 (optimizer state sharded, gradients reduce-scattered on the "
                  "ring, weights all-gathered after the optimizer)")
      ->transform(whole_number_in(0, 1));  // not IsMember: "--zero: 1.5" said nothing
  cmd->add_option("--price", f->price, "Price of one device-hour, any currency")
      ->check(number_in(0.0, 1e12));
  cmd->add_option("--critical-batch", f->critical_batch,
                  "Critical batch size B_crit (McCandlish et al. 2018); 0: no statistical ceiling")
      ->check(number_in(0.0, 1e15));
  cmd->add_option("--min-efficiency", f->min_efficiency, "Efficiency under which more replicas stop paying")
      ->check(number_in(0.01, 1.0));
  cmd->add_option("--max-cost-increase", f->max_cost_increase,
                  "Largest acceptable rise in cost per sample over one replica (0.25 = 25%)")
      ->check(number_in(0.0, 1e6));
  cmd->add_flag("--json", f->json, "Print JSON instead of the table");
  cmd->add_option("--svg", f->svg_file,
                  "Also plot efficiency and cost per sample against replicas to this SVG file")
      ->check(not_empty());
  cmd->add_flag("--published", f->published,
                "Print the model's predictions beside published scaling results");
  return [f, cmd] {
    check_combinations(*f, *cmd);
    return run_plan(*f);
  };
}

}  // namespace lockstep::cli
