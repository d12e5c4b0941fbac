// OpenBLAS kernel selection for the command-line tool.
#pragma once

namespace lockstep::cli {

// Debian 12's OpenBLAS (0.3.21) does not know recent AVX-512 CPUs such as
// AMD Zen 4/5 and falls back to its AVX2 "Haswell" kernels, which run sgemm
// at about half the speed of its AVX-512 "SkylakeX" kernels on this machine
// (docs/results.md). OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded,
// so when the variable is unset, the CPU has AVX-512 and OpenBLAS chose an
// AVX2 kernel, the tool re-executes itself once with OPENBLAS_CORETYPE=SkylakeX.
// Set OPENBLAS_CORETYPE yourself to choose another kernel.
void maybe_reexec_for_blas(char** argv);

}  // namespace lockstep::cli
