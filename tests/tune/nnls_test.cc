#include "tune/nnls.h"

#include <gtest/gtest.h>

namespace pdserve::tune {
namespace {

Matrix matrix(int rows, int cols, std::vector<double> values) {
  Matrix m(rows, cols);
  m.values = std::move(values);
  return m;
}

struct NnlsCase {
  const char* name;
  Matrix a;
  std::vector<double> y;
  std::vector<double> expected;
};

TEST(Nnls, SolvesTable) {
  const NnlsCase cases[] = {
      // Consistent, positive solution: plain least squares, x = (1, 2).
      {"exact", matrix(3, 2, {1, 0, 0, 1, 1, 1}), {1, 2, 3}, {1, 2}},
      // Overdetermined by hand: A = [1 1; 1 2; 1 3], y = (1, 2, 2): normal equations
      // [3 6; 6 14]·x = (5, 11) → x = (2/3, 1/2).
      {"least_squares", matrix(3, 2, {1, 1, 1, 2, 1, 3}), {1, 2, 2}, {2.0 / 3, 0.5}},
      // Unconstrained solution is (2, −1) (y = 2 − t at t = 0, 1, 2); with x ≥ 0 the slope is
      // 0 and the intercept the mean of y, 1.
      {"negative_clamped", matrix(3, 2, {1, 0, 1, 1, 1, 2}), {2, 1, 0}, {1, 0}},
      // Lawson–Hanson must step back: columns enter as 2, 0, 1 and the three-column solution
      // (7, 5/3, −1) is infeasible, so column 2 leaves again. The optimum, by enumerating
      // every active set: (5, 7/6, 0).
      {"step_back", matrix(4, 3, {0, 3, 2, 1, 0, 2, 0, 0, 0, 0, 3, 1}), {3, 5, 0, 4}, {5, 7.0 / 6, 0}},
      // Decreasing data with no intercept column: only x = 0 is feasible and best.
      {"all_zero", matrix(2, 1, {1, 2}), {-1, -2}, {0}},
      // A zero column gets coefficient 0.
      {"zero_column", matrix(2, 2, {1, 0, 2, 0}), {1, 2}, {1, 0}},
      // Duplicate (dependent) columns: the fit is still exact.
      {"dependent_columns", matrix(2, 2, {1, 1, 2, 2}), {2, 4}, {2, 0}},
  };
  for (const NnlsCase& c : cases) {
    SCOPED_TRACE(c.name);
    StatusOr<std::vector<double>> x = nnls(c.a, c.y);
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_EQ(x->size(), c.expected.size());
    for (size_t j = 0; j < c.expected.size(); ++j) EXPECT_NEAR((*x)[j], c.expected[j], 1e-9) << "x" << j;
  }
}

TEST(Nnls, ScaledColumnsKeepPrecision) {
  // The prefill law's features: 1, l, l² over l up to 8192 (column norms 1e0 … 1e8).
  const double a = 2e-3, b = 5e-6, c = 3e-10;
  std::vector<double> ls = {16, 64, 256, 1024, 4096, 8192};
  Matrix m(static_cast<int>(ls.size()), 3);
  std::vector<double> y;
  for (size_t i = 0; i < ls.size(); ++i) {
    m.at(static_cast<int>(i), 0) = 1;
    m.at(static_cast<int>(i), 1) = ls[i];
    m.at(static_cast<int>(i), 2) = ls[i] * ls[i];
    y.push_back(a + b * ls[i] + c * ls[i] * ls[i]);
  }
  StatusOr<std::vector<double>> x = nnls(m, y);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_NEAR((*x)[0] / a, 1, 1e-8);
  EXPECT_NEAR((*x)[1] / b, 1, 1e-8);
  EXPECT_NEAR((*x)[2] / c, 1, 1e-8);
}

TEST(Nnls, RejectsBadInput) {
  EXPECT_EQ(nnls(Matrix(0, 0), {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nnls(matrix(2, 1, {1, 1}), {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nnls(matrix(1, 1, {std::nan("")}), {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nnls(matrix(1, 1, {1}), {std::numeric_limits<double>::infinity()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::tune
