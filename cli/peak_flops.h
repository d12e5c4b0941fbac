#pragma once

namespace lockstep::cli {

// Peak sgemm FLOP/s of this machine on all cores, measured now: the best of
// a few 2048^3 OpenBLAS sgemm calls with one BLAS thread per core. Takes ~0.5 s.
double measure_peak_sgemm_flops();

}  // namespace lockstep::cli
