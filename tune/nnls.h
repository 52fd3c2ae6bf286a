// Non-negative least squares, min ‖A·x − y‖₂ subject to x ≥ 0 (Lawson & Hanson, "Solving
// Least Squares Problems", 1974, ch. 23), for the tuner's small dense fits: a step law's
// coefficients are times per unit of work, which a noisy unconstrained fit can make negative
// (and then extrapolate to negative step times).
#pragma once

#include <vector>

#include "common/status.h"

namespace pdserve::tune {

// A dense row-major matrix: rows × cols values.
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<double> values;
  Matrix(int rows_, int cols_) : rows(rows_), cols(cols_), values(static_cast<size_t>(rows_) * cols_, 0.0) {}
  double& at(int r, int c) { return values[static_cast<size_t>(r) * cols + c]; }
  double at(int r, int c) const { return values[static_cast<size_t>(r) * cols + c]; }
};

// The x ≥ 0 minimising ‖A·x − y‖₂. InvalidArgument when the shapes disagree, A is empty or a
// value is not finite; Internal when the active-set iteration does not settle (it always
// does on well-posed input; the cap only guards against a cycle from rounding).
StatusOr<std::vector<double>> nnls(const Matrix& a, const std::vector<double>& y);

}  // namespace pdserve::tune
