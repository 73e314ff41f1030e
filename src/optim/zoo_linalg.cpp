#include "optim/zoo_linalg.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "base/error.h"

// LAPACK's Fortran entry points (OpenBLAS exports them); the trailing lengths are gfortran's
// hidden arguments for the character flags.
extern "C" {
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s,
             double* u, const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork,
             int* iwork, int* info, size_t jobz_len);
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info,
             size_t jobz_len, size_t uplo_len);
}

namespace omni::linalg {

namespace {

// Flips x[0], x[stride], ... (n values) so that the largest in magnitude is positive.
void fix_sign(double* x, int64_t n, int64_t stride) {
  int64_t at = 0;
  for (int64_t i = 1; i < n; ++i)
    if (std::fabs(x[i * stride]) > std::fabs(x[at * stride])) at = i;
  if (x[at * stride] < 0)
    for (int64_t i = 0; i < n; ++i) x[i * stride] = -x[i * stride];
}

}  // namespace

void top_singular_vectors(const double* a, int64_t rows, int64_t cols, int64_t k, bool left,
                          double* out) {
  // Row-major A is column-major A^T [cols, rows] = U' S V'^T: A's right singular vectors are
  // the columns of U', its left ones the rows of V'^T.
  const int m = int(cols), n = int(rows), kk = int(std::min(rows, cols));
  OMNI_REQUIRE(k >= 1 && k <= kk, "[svd] asked for ", k, " singular vectors of a ", rows, "x", cols,
               " matrix");
  std::vector<double> work_a(a, a + rows * cols), s(static_cast<size_t>(kk)), u(size_t(m) * kk),
      vt(size_t(kk) * n);
  std::vector<int> iwork(size_t(8) * kk);
  int info = 0, lwork = -1;
  double query = 0;
  dgesdd_("S", &m, &n, work_a.data(), &m, s.data(), u.data(), &m, vt.data(), &kk, &query, &lwork,
          iwork.data(), &info, 1);
  lwork = int(query);
  std::vector<double> work(size_t(std::max(lwork, 1)));
  dgesdd_("S", &m, &n, work_a.data(), &m, s.data(), u.data(), &m, vt.data(), &kk, work.data(),
          &lwork, iwork.data(), &info, 1);
  OMNI_REQUIRE(info == 0, "[svd] LAPACK dgesdd failed (info ", info, ") on a ", rows, "x", cols,
               " matrix (not finite?)");
  if (left) {  // out[i, j] = V'^T[j, i], column-major with leading dimension kk
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < k; ++j) out[i * k + j] = vt[size_t(i * kk + j)];
    for (int64_t j = 0; j < k; ++j) fix_sign(out + j, rows, k);
  } else {  // out[j, :] = U'[:, j]
    for (int64_t j = 0; j < k; ++j) {
      std::copy_n(u.data() + j * m, cols, out + j * cols);
      fix_sign(out + j * cols, cols, 1);
    }
  }
}

void symmetric_inverse_root(const double* a, int64_t n, double root, double epsilon, double* out) {
  const int nn = int(n);
  std::vector<double> q(a, a + n * n), w(static_cast<size_t>(n));
  int info = 0, lwork = -1, liwork = -1, iquery = 0;
  double query = 0;
  dsyevd_("V", "L", &nn, q.data(), &nn, w.data(), &query, &lwork, &iquery, &liwork, &info, 1, 1);
  lwork = int(query), liwork = iquery;
  std::vector<double> work(size_t(std::max(lwork, 1)));
  std::vector<int> iwork(size_t(std::max(liwork, 1)));
  dsyevd_("V", "L", &nn, q.data(), &nn, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info,
          1, 1);
  OMNI_REQUIRE(info == 0, "[shampoo] LAPACK dsyevd failed (info ", info, ") on a ", n, "x", n,
               " preconditioner (not finite?)");
  for (double& x : w) x = std::pow(std::max(x, 0.0) + epsilon, -1.0 / root);
  // Q is column-major: Q[i, j] = q[j * n + i]; out = Q diag(w) Q^T.
  std::fill_n(out, n * n, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const double* qj = q.data() + j * n;
    for (int64_t i = 0; i < n; ++i) {
      const double s = qj[i] * w[size_t(j)];
      double* row = out + i * n;
      for (int64_t l = 0; l < n; ++l) row[l] += s * qj[l];
    }
  }
}

}  // namespace omni::linalg
