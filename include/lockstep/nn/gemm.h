// Matrix products: the fast path (OpenBLAS) and its naive sibling.
//
// Row-major C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C,
// where op(X) is X or X^T. With beta == 0, C is overwritten (never read).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::nn {

enum class Trans { No, Yes };

void sgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// Triple loop with double accumulation; the reference sgemm is tested against.
void sgemm_naive(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc);

// OpenBLAS keeps one process-wide thread count. The trainer sets it once at
// start-up: 1 when replicas share the cores, all cores for a single replica.
void set_blas_threads(int threads);
int blas_threads();
// The kernel family OpenBLAS selected for this CPU (e.g. "SkylakeX").
std::string blas_core_name();

}  // namespace lockstep::nn
