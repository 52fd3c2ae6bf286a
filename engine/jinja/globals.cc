// The global functions (engine/jinja/builtins.h): jinja2's range, namespace and dict, and the
// two transformers adds to every chat template, raise_exception and strftime_now.
#include <ctime>

#include "engine/jinja/builtins.h"

namespace pdserve::jinja {
namespace {

StatusOr<Value> range(const CallArgs& args, const ValueLimits& limits) {
  if (!args.keyword.empty()) return absl::InvalidArgumentError("range() takes no keyword arguments");
  std::vector<int64_t> n;
  for (const Value& v : args.positional) {
    if (!v.is_int() && !v.is_bool()) return absl::InvalidArgumentError(absl::StrCat("range() needs integers, not ", v.type_name()));
    n.push_back(v.is_bool() ? int64_t(v.as_bool()) : v.as_int());
  }
  if (n.empty() || n.size() > 3) return absl::InvalidArgumentError("range() takes 1 to 3 arguments");
  const int64_t start = n.size() == 1 ? 0 : n[0];
  const int64_t stop = n.size() == 1 ? n[0] : n[1];
  const int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= limits.max_list_items)
      return absl::ResourceExhaustedError(absl::StrCat("range() past the template limit of ", limits.max_list_items, " items"));
    out.push_back(Value::integer(i));
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
  }
  return Value::list(std::move(out));
}

// namespace(mapping?, key=value...) and dict(mapping?, key=value...).
StatusOr<Dict> mapping_from_args(const std::string& function, const CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) return absl::InvalidArgumentError(absl::StrCat(function, "() takes at most one positional argument"));
  if (!args.positional.empty()) {
    if (!args.positional[0].is_dict()) return absl::InvalidArgumentError(absl::StrCat(function, "() needs a mapping"));
    d = args.positional[0].as_dict();
  }
  for (const auto& [k, v] : args.keyword) d.set(k, v);
  return d;
}

}  // namespace

Dict global_functions(std::chrono::system_clock::time_point now, const ValueLimits& limits) {
  Dict g;
  g.set("range", Value::callable("range", [limits](const CallArgs& args) { return range(args, limits); }));
  g.set("namespace", Value::callable("namespace", [](const CallArgs& args) -> StatusOr<Value> {
          PD_ASSIGN_OR_RETURN(Dict d, mapping_from_args("namespace", args));
          return Value::namespace_of(std::move(d));
        }));
  g.set("dict", Value::callable("dict", [](const CallArgs& args) -> StatusOr<Value> {
          PD_ASSIGN_OR_RETURN(Dict d, mapping_from_args("dict", args));
          return Value::dict(std::move(d));
        }));
  g.set("raise_exception", Value::callable("raise_exception", [](const CallArgs& args) -> StatusOr<Value> {
          PD_ASSIGN_OR_RETURN(auto p, bind_arguments("raise_exception()", args, {"message"}));
          return absl::InvalidArgumentError(p[0] ? to_str(*p[0]) : "raise_exception() called");
        }));
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  g.set("strftime_now", Value::callable("strftime_now", [t](const CallArgs& args) -> StatusOr<Value> {
          PD_ASSIGN_OR_RETURN(auto p, bind_arguments("strftime_now()", args, {"format"}));
          if (!p[0] || !p[0]->is_string()) return absl::InvalidArgumentError("strftime_now() needs a format string");
          std::tm local{};
          localtime_r(&t, &local);
          char buf[512];
          const size_t n = p[0]->as_string().empty() ? 0 : std::strftime(buf, sizeof buf, p[0]->as_string().c_str(), &local);
          if (n == 0 && !p[0]->as_string().empty())
            return absl::InvalidArgumentError("strftime_now(): the format gives no text or more than 512 bytes");
          return Value::string(std::string(buf, n));
        }));
  return g;
}

}  // namespace pdserve::jinja
