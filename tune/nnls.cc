#include "tune/nnls.h"

#include <cmath>
#include <optional>

namespace pdserve::tune {
namespace {

// Columns are scaled to unit norm before solving (x ≥ 0 is invariant under positive column
// scaling), so that features of very different sizes (Σl and Σl²) are equally conditioned and
// the tolerances below can be absolute.
constexpr double kRankTolerance = 1e-10;

// Least squares min ‖A_P·z − y‖ over the columns `cols` of `a` by Householder QR; nullopt when
// those columns are numerically dependent.
std::optional<std::vector<double>> solve_on(const Matrix& a, const std::vector<int>& cols,
                                            const std::vector<double>& y) {
  const int m = a.rows;
  const int n = static_cast<int>(cols.size());
  if (n > m) return std::nullopt;
  // Column-major copy of A_P, reduced in place to R.
  std::vector<double> r(static_cast<size_t>(m) * n);
  auto rr = [&](int i, int j) -> double& { return r[static_cast<size_t>(j) * m + i]; };
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) rr(i, j) = a.at(i, cols[j]);
  std::vector<double> b = y;
  std::vector<double> v(m);
  for (int k = 0; k < n; ++k) {
    double norm2 = 0;
    for (int i = k; i < m; ++i) norm2 += rr(i, k) * rr(i, k);
    const double norm = std::sqrt(norm2);
    if (norm <= kRankTolerance) return std::nullopt;
    const double alpha = rr(k, k) > 0 ? -norm : norm;
    double vnorm2 = 0;
    for (int i = k; i < m; ++i) {
      v[i] = rr(i, k) - (i == k ? alpha : 0.0);
      vnorm2 += v[i] * v[i];
    }
    auto reflect = [&](auto&& element) {
      double dot = 0;
      for (int i = k; i < m; ++i) dot += v[i] * element(i);
      const double f = 2 * dot / vnorm2;
      for (int i = k; i < m; ++i) element(i) -= f * v[i];
    };
    for (int j = k; j < n; ++j) reflect([&](int i) -> double& { return rr(i, j); });
    reflect([&](int i) -> double& { return b[i]; });
  }
  std::vector<double> z(n);
  for (int k = n - 1; k >= 0; --k) {
    double s = b[k];
    for (int j = k + 1; j < n; ++j) s -= rr(k, j) * z[j];
    z[k] = s / rr(k, k);
  }
  return z;
}

}  // namespace

StatusOr<std::vector<double>> nnls(const Matrix& a, const std::vector<double>& y) {
  if (a.rows <= 0 || a.cols <= 0) return absl::InvalidArgumentError("nnls: empty matrix");
  if (static_cast<int>(y.size()) != a.rows || a.values.size() != static_cast<size_t>(a.rows) * a.cols)
    return absl::InvalidArgumentError(absl::StrCat("nnls: A is ", a.rows, "x", a.cols, " but y has ", y.size(), " rows"));
  for (double v : a.values)
    if (!std::isfinite(v)) return absl::InvalidArgumentError("nnls: A has a non-finite value");
  double y_norm2 = 0;
  for (double v : y) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("nnls: y has a non-finite value");
    y_norm2 += v * v;
  }

  const int m = a.rows, n = a.cols;
  Matrix scaled = a;
  std::vector<double> scale(n, 0.0);
  for (int j = 0; j < n; ++j) {
    double s2 = 0;
    for (int i = 0; i < m; ++i) s2 += a.at(i, j) * a.at(i, j);
    scale[j] = std::sqrt(s2);
    if (scale[j] > 0)
      for (int i = 0; i < m; ++i) scaled.at(i, j) /= scale[j];
  }

  // A column may enter the passive set only while the residual still points along it by more
  // than rounding.
  const double gradient_tolerance = 1e-12 * std::max(1.0, std::sqrt(y_norm2));
  std::vector<double> x(n, 0.0);
  std::vector<bool> passive(n, false);
  // Columns that proved dependent on the passive set when they entered; they stay out, which
  // loses nothing because the passive set already spans them.
  std::vector<bool> dependent(n, false);
  auto gradient = [&](int j) {
    double g = 0;
    for (int i = 0; i < m; ++i) {
      double residual = y[i];
      for (int k = 0; k < n; ++k) residual -= scaled.at(i, k) * x[k];
      g += scaled.at(i, j) * residual;
    }
    return g;
  };

  const int max_iterations = 30 * n + 30;
  int iterations = 0;
  while (true) {
    int entering = -1;
    double best = gradient_tolerance;
    for (int j = 0; j < n; ++j) {
      if (passive[j] || dependent[j] || scale[j] == 0) continue;
      const double g = gradient(j);
      if (g > best) best = g, entering = j;
    }
    if (entering < 0) break;
    passive[entering] = true;
    while (true) {
      if (++iterations > max_iterations) return absl::InternalError("nnls: the active set did not settle");
      std::vector<int> cols;
      for (int j = 0; j < n; ++j)
        if (passive[j]) cols.push_back(j);
      std::optional<std::vector<double>> z = solve_on(scaled, cols, y);
      if (!z) {
        passive[entering] = false;
        dependent[entering] = true;
        break;
      }
      bool feasible = true;
      for (double v : *z) feasible = feasible && v > 0;
      if (feasible) {
        for (size_t k = 0; k < cols.size(); ++k) x[cols[k]] = (*z)[k];
        break;
      }
      // Step from x towards z as far as x stays non-negative; the coefficient that reaches 0
      // leaves the passive set.
      double step = 1;
      int leaving = -1;
      for (size_t k = 0; k < cols.size(); ++k) {
        const double zk = (*z)[k], xk = x[cols[k]];
        if (zk <= 0 && xk / (xk - zk) < step) step = xk / (xk - zk), leaving = cols[k];
      }
      for (size_t k = 0; k < cols.size(); ++k) x[cols[k]] += step * ((*z)[k] - x[cols[k]]);
      if (leaving >= 0) x[leaving] = 0;
      for (int j : cols)
        if (x[j] <= 0) x[j] = 0, passive[j] = false;
    }
  }
  for (int j = 0; j < n; ++j) x[j] = scale[j] > 0 ? x[j] / scale[j] : 0.0;
  return x;
}

}  // namespace pdserve::tune
