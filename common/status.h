// Status and StatusOr for errors that cross module boundaries (abseil's), plus the two
// propagation macros every module uses. Errors are returned, never thrown, across modules.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pdserve {
using absl::Status;
using absl::StatusOr;
}  // namespace pdserve

#define PD_STATUS_CONCAT_INNER(a, b) a##b
#define PD_STATUS_CONCAT(a, b) PD_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define PD_RETURN_IF_ERROR(expr)               \
  do {                                         \
    ::absl::Status pd_status_ = (expr);        \
    if (!pd_status_.ok()) return pd_status_;   \
  } while (0)

// `PD_ASSIGN_OR_RETURN(auto x, StatusOrExpr)`: unwraps the value or returns the error.
#define PD_ASSIGN_OR_RETURN(lhs, expr) \
  PD_ASSIGN_OR_RETURN_IMPL(PD_STATUS_CONCAT(pd_statusor_, __LINE__), lhs, expr)
#define PD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
