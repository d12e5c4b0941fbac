// Peer benchmark: Gloo's AllreduceRingChunked and AllreduceHalvingDoubling
// (float sum) over TCP on loopback, with a file-store rendezvous. One process
// per rank: gloo_allreduce RANK SIZE STORE_DIR BYTES... Rank 0 prints one JSON
// object per algorithm and size: bytes, time_us (median). Run by
// bench/peers/compare.sh, never in CI.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

template <typename Algorithm>
double median_us(const std::shared_ptr<gloo::Context>& context, std::size_t bytes) {
  const int count = static_cast<int>(bytes / sizeof(float));
  std::vector<float> buf(std::max(count, 1), 1.0f);
  std::vector<float*> ptrs{buf.data()};
  Algorithm algorithm(context, ptrs, count);
  gloo::BarrierAllToOne barrier(context);
  const int reps =
      static_cast<int>(std::clamp<double>(2e8 / std::max<double>(double(bytes) * context->size, 1), 5, 500));
  std::vector<double> samples;
  for (int r = 0; r < reps + 2; ++r) {
    barrier.run();
    const auto t0 = std::chrono::steady_clock::now();
    algorithm.run();
    if (r >= 2)
      samples.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: gloo_allreduce RANK SIZE STORE_DIR BYTES...\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);
  for (int i = 4; i < argc; ++i) {
    const std::size_t bytes = std::strtoull(argv[i], nullptr, 10);
    const double ring = median_us<gloo::AllreduceRingChunked<float>>(context, bytes);
    const double hd = median_us<gloo::AllreduceHalvingDoubling<float>>(context, bytes);
    if (rank == 0) {
      std::printf(
          "{\"peer\": \"gloo\", \"algorithm\": \"AllreduceRingChunked\", \"bytes\": %zu, \"time_us\": "
          "%.2f}\n",
          bytes, ring);
      std::printf(
          "{\"peer\": \"gloo\", \"algorithm\": \"AllreduceHalvingDoubling\", \"bytes\": %zu, \"time_us\": "
          "%.2f}\n",
          bytes, hd);
      std::fflush(stdout);
    }
  }
  return 0;
}
