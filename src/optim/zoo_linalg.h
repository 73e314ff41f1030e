// Float64 decompositions for the zoo's matrix methods (GaLore's SVD, Shampoo's inverse roots),
// through the LAPACK inside OpenBLAS (dgesdd, dsyevd): deterministic for a given build and
// thread count, so a resumed run takes the same projections as an uninterrupted one.
#pragma once

#include <cstdint>

namespace omni::linalg {

// The first k singular vectors of a [rows, cols] (row-major), by decreasing singular value:
// left: out is [rows, k] (the columns of U); else out is [k, cols] (the rows of V^T). SVD
// leaves each vector's sign free; here each is flipped so that its entry of largest
// magnitude (the first among equals) is positive, which the fixtures' reference does too.
void top_singular_vectors(const double* a, int64_t rows, int64_t cols, int64_t k, bool left,
                          double* out);

// out = (A + epsilon I)^(-1/root) for a symmetric n x n A, from its eigen-decomposition:
// Q diag((max(lambda, 0) + epsilon)^(-1/root)) Q^T (eigenvalues a rounding error below zero
// count as zero).
void symmetric_inverse_root(const double* a, int64_t n, double root, double epsilon, double* out);

}  // namespace omni::linalg
