// Peer benchmark: OpenMPI's MPI_Allreduce (float sum), the same sweep as
// `lockstep bench allreduce`. Run by bench/peers/compare.sh, never in CI.
// Prints one JSON object per size on rank 0: bytes, time_us (median).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 1; i < argc; ++i) {
    const std::size_t bytes = std::strtoull(argv[i], nullptr, 10);
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> buf(count, 1.0f);
    const int reps =
        static_cast<int>(std::clamp<double>(2e8 / std::max<double>(double(bytes) * size, 1), 5, 500));
    std::vector<double> samples;
    for (int r = 0; r < reps + 2; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (r >= 2) samples.push_back(MPI_Wtime() - t0);
    }
    std::sort(samples.begin(), samples.end());
    if (rank == 0) {
      std::printf(
          "{\"peer\": \"openmpi\", \"algorithm\": \"MPI_Allreduce\", \"bytes\": %zu, \"time_us\": %.2f}\n",
          bytes, samples[samples.size() / 2] * 1e6);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
