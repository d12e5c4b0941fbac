#include "blas_setup.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "lockstep/nn/gemm.h"

namespace lockstep::cli {

void maybe_reexec_for_blas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const std::string core = nn::blas_core_name();
  if (!avx512 || (core != "Haswell" && core != "Zen")) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  execv("/proc/self/exe", argv);
  // If exec fails we simply go on with the kernel OpenBLAS chose.
}

}  // namespace lockstep::cli
