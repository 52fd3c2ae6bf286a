#include "engine/jinja/evaluator.h"

#include <cmath>
#include <unordered_map>

#include "absl/strings/match.h"
#include "engine/jinja/py_string.h"

namespace pdserve::jinja {
namespace {

// Errors from builtins carry no position; the innermost expression that failed adds its own.
Status located(SourcePosition at, const Status& s) {
  if (absl::StartsWith(s.message(), "template line ")) return s;
  return Status(s.code(), absl::StrCat("template line ", at.line, " column ", at.column, ": ", s.message()));
}

Status undefined_error(const Value& v) {
  return absl::InvalidArgumentError(v.undefined_reason());
}

Status operand_error(const char* op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'"));
}

bool is_integral(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t integral(const Value& v) { return v.is_bool() ? int64_t(v.as_bool()) : v.as_int(); }

// Python's slice.indices(length) followed by the walk it describes.
std::vector<size_t> slice_positions(int64_t length, const Value& start, const Value& stop, const Value& step_value) {
  const int64_t step = step_value.is_none() || step_value.is_undefined() ? 1 : integral(step_value);
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = integral(v);
    if (i < 0) i += length;
    if (step > 0) return std::clamp<int64_t>(i, 0, length);
    return std::clamp<int64_t>(i, -1, length - 1);
  };
  const int64_t begin = clamp(start, step > 0 ? 0 : length - 1);
  const int64_t end = clamp(stop, step > 0 ? length : -1);
  std::vector<size_t> out;
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) out.push_back(size_t(i));
  return out;
}

class Evaluator {
 public:
  Evaluator(const Dict& context, const RenderOptions& options)
      : context_(context), options_(options), globals_(global_functions(options.now, options.value_limits)) {
    frames_.push_back(Frame{{}, kRoot});
  }

  StatusOr<std::string> run(const Program& program) {
    std::string out;
    PD_ASSIGN_OR_RETURN(Flow flow, render_body(program.body, out));
    (void)flow;
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  static constexpr size_t kRoot = size_t(-1);

  // A scope; lookups go on to `parent` (a macro's body sees the template's top level only).
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    size_t parent;
  };

  class DepthGuard {
   public:
    explicit DepthGuard(Evaluator& e) : e_(e) { ++e_.depth_; }
    ~DepthGuard() { --e_.depth_; }
    Status check() const {
      if (e_.depth_ > e_.options_.max_depth)
        return absl::ResourceExhaustedError(
            absl::StrCat("nesting deeper than the template limit of ", e_.options_.max_depth, " (macro recursion?)"));
      return absl::OkStatus();
    }

   private:
    Evaluator& e_;
  };

  Value lookup(const std::string& name) const {
    for (size_t i = frames_.size() - 1; i != kRoot; i = frames_[i].parent) {
      auto it = frames_[i].vars.find(name);
      if (it != frames_[i].vars.end()) return it->second;
    }
    if (const Value* v = context_.find(name)) return *v;
    if (const Value* v = globals_.find(name)) return *v;
    return Value::undefined(absl::StrCat("'", name, "' is undefined"));
  }

  void push_frame(size_t parent) { frames_.push_back(Frame{{}, parent}); }
  void pop_frame() { frames_.pop_back(); }

  Status append(std::string& out, const std::string& text) {
    out += text;
    if (out.size() > options_.max_output_bytes)
      return absl::ResourceExhaustedError(
          absl::StrCat("the output grew past the template limit of ", options_.max_output_bytes, " bytes"));
    return absl::OkStatus();
  }

  Status count_iteration(SourcePosition at) {
    if (++iterations_ > options_.max_loop_iterations)
      return error_at(at, absl::StrCat("more loop iterations than the template limit of ", options_.max_loop_iterations));
    return absl::OkStatus();
  }

  StatusOr<Flow> render_body(const std::vector<Node>& body, std::string& out) {
    DepthGuard guard(*this);
    PD_RETURN_IF_ERROR(guard.check());
    for (const Node& n : body) {
      PD_ASSIGN_OR_RETURN(Flow flow, render_node(n, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> render_node(const Node& n, std::string& out) {
    switch (n.kind) {
      case NodeKind::kText:
        PD_RETURN_IF_ERROR(append(out, n.text));
        return Flow::kNormal;
      case NodeKind::kOutput: {
        PD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        PD_RETURN_IF_ERROR(append(out, to_str(v)));
        return Flow::kNormal;
      }
      case NodeKind::kIf: {
        PD_ASSIGN_OR_RETURN(Value cond, eval(*n.expr));
        return render_body(cond.truthy() ? n.body : n.else_body, out);
      }
      case NodeKind::kFor: return render_for(n, out);
      case NodeKind::kSet: {
        PD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        PD_RETURN_IF_ERROR(assign(*n.target, v));
        return Flow::kNormal;
      }
      case NodeKind::kSetBlock: {
        std::string captured;
        PD_ASSIGN_OR_RETURN(Flow flow, render_body(n.body, captured));
        PD_RETURN_IF_ERROR(assign(*n.target, Value::string(std::move(captured))));
        return flow;
      }
      case NodeKind::kMacro: {
        const Node* macro = &n;
        frames_.back().vars[n.name] = Value::callable(
            n.name, [this, macro](const CallArgs& args) { return call_macro(*macro, args); });
        return Flow::kNormal;
      }
      case NodeKind::kCallBlock: return render_call_block(n, out);
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      case NodeKind::kBlock: return render_body(n.body, out);
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> render_for(const Node& n, std::string& out) {
    PD_ASSIGN_OR_RETURN(Value iterable, eval(*n.expr));
    auto listed = iterate(iterable);
    if (!listed.ok()) return located(n.expr->position, listed.status());
    std::vector<Value> items = *std::move(listed);
    if (n.filter) {
      std::vector<Value> kept;
      push_frame(frames_.size() - 1);
      for (Value& item : items) {
        Status s = count_iteration(n.position);
        if (s.ok()) s = assign(*n.target, item);
        StatusOr<Value> keep = s.ok() ? eval(*n.filter) : StatusOr<Value>(s);
        if (!keep.ok()) {
          pop_frame();
          return keep.status();
        }
        if (keep->truthy()) kept.push_back(std::move(item));
      }
      pop_frame();
      items = std::move(kept);
    }
    if (items.empty()) return render_body(n.else_body, out);
    push_frame(frames_.size() - 1);
    const int64_t length = int64_t(items.size());
    Status status;
    for (int64_t i = 0; i < length && status.ok(); ++i) {
      status = count_iteration(n.position);
      if (!status.ok()) break;
      Dict loop;
      loop.set("index", Value::integer(i + 1));
      loop.set("index0", Value::integer(i));
      loop.set("revindex", Value::integer(length - i));
      loop.set("revindex0", Value::integer(length - i - 1));
      loop.set("first", Value::boolean(i == 0));
      loop.set("last", Value::boolean(i == length - 1));
      loop.set("length", Value::integer(length));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("loop.previtem is undefined at the first item"));
      loop.set("nextitem", i + 1 < length ? items[size_t(i + 1)] : Value::undefined("loop.nextitem is undefined at the last item"));
      frames_.back().vars["loop"] = Value::dict(std::move(loop));
      status = assign(*n.target, items[size_t(i)]);
      if (!status.ok()) break;
      StatusOr<Flow> flow = render_body(n.body, out);
      if (!flow.ok()) {
        status = flow.status();
        break;
      }
      if (*flow == Flow::kBreak) break;
    }
    pop_frame();
    PD_RETURN_IF_ERROR(status);
    return Flow::kNormal;
  }

  StatusOr<Value> call_macro(const Node& macro, const CallArgs& args) {
    DepthGuard guard(*this);
    PD_RETURN_IF_ERROR(guard.check());
    if (args.positional.size() > macro.params.size())
      return error_at(macro.position, absl::StrCat("macro '", macro.name, "' takes ", macro.params.size(),
                                                   " argument(s), got ", args.positional.size()));
    push_frame(0);
    Frame& frame = frames_.back();
    for (size_t i = 0; i < args.positional.size(); ++i) frame.vars[macro.params[i]] = args.positional[i];
    for (const auto& [key, value] : args.keyword) {
      if (key == "caller") {
        frame.vars["caller"] = value;
        continue;
      }
      auto p = std::find(macro.params.begin(), macro.params.end(), key);
      if (p == macro.params.end()) {
        pop_frame();
        return error_at(macro.position, absl::StrCat("macro '", macro.name, "' has no argument '", key, "'"));
      }
      frame.vars[key] = value;
    }
    Status status;
    for (size_t i = 0; i < macro.params.size() && status.ok(); ++i) {
      if (frames_.back().vars.count(macro.params[i])) continue;
      Value v = Value::undefined(absl::StrCat("'", macro.params[i], "' (an argument of macro '", macro.name, "' not given) is undefined"));
      if (macro.defaults[i]) {
        StatusOr<Value> d = eval(*macro.defaults[i]);
        if (!d.ok()) status = d.status();
        else v = *std::move(d);
      }
      frames_.back().vars[macro.params[i]] = std::move(v);
    }
    std::string out;
    if (status.ok()) {
      StatusOr<Flow> flow = render_body(macro.body, out);
      if (!flow.ok()) status = flow.status();
    }
    pop_frame();
    PD_RETURN_IF_ERROR(status);
    return Value::string(std::move(out));
  }

  StatusOr<Flow> render_call_block(const Node& n, std::string& out) {
    const Expr& call = *n.expr;
    PD_ASSIGN_OR_RETURN(Value callee, eval(*call.operands[0]));
    if (!callee.is_callable()) return error_at(call.position, "a call block needs a macro");
    PD_ASSIGN_OR_RETURN(CallArgs args, eval_args(call));
    // caller() renders the block's body where the block is written.
    const size_t site = frames_.size() - 1;
    const Node* block = &n;
    args.keyword.emplace_back("caller", Value::callable("caller", [this, site, block](const CallArgs&) -> StatusOr<Value> {
                                push_frame(site);
                                std::string body;
                                StatusOr<Flow> flow = render_body(block->body, body);
                                pop_frame();
                                if (!flow.ok()) return flow.status();
                                return Value::string(std::move(body));
                              }));
    auto result = callee.as_callable().call(args);
    if (!result.ok()) return located(call.position, result.status());
    PD_RETURN_IF_ERROR(append(out, to_str(*result)));
    return Flow::kNormal;
  }

  Status assign(const Expr& target, const Value& v) {
    if (target.kind == ExprKind::kName) {
      frames_.back().vars[target.name] = v;
      return absl::OkStatus();
    }
    if (target.kind == ExprKind::kAttribute) {
      const Value object = lookup(target.operands[0]->name);
      if (!object.is_namespace())
        return error_at(target.position, absl::StrCat("cannot assign attribute '", target.name, "' of '",
                                                      target.operands[0]->name, "': not a namespace"));
      object.namespace_attributes().set(target.name, v);
      return absl::OkStatus();
    }
    auto items = iterate(v);
    if (!items.ok()) return located(target.position, items.status());
    if (items->size() != target.operands.size())
      return error_at(target.position, absl::StrCat("cannot unpack ", items->size(), " value(s) into ",
                                                    target.operands.size(), " names"));
    for (size_t i = 0; i < items->size(); ++i) PD_RETURN_IF_ERROR(assign(*target.operands[i], (*items)[i]));
    return absl::OkStatus();
  }

  StatusOr<CallArgs> eval_args(const Expr& e) {
    CallArgs args;
    for (size_t i = 1; i < e.operands.size(); ++i) {
      PD_ASSIGN_OR_RETURN(Value v, eval(*e.operands[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.keywords) {
      PD_ASSIGN_OR_RETURN(Value v, eval(*expr));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  StatusOr<Value> eval(const Expr& e) {
    DepthGuard guard(*this);
    if (Status s = guard.check(); !s.ok()) return located(e.position, s);
    StatusOr<Value> v = eval_inner(e);
    if (!v.ok()) return located(e.position, v.status());
    if (Status s = check_value_size(*v, options_.value_limits); !s.ok()) return located(e.position, s);
    return v;
  }

  StatusOr<Value> eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const ExprPtr& x : e.operands) {
          PD_ASSIGN_OR_RETURN(Value v, eval(*x));
          items.push_back(std::move(v));
        }
        return Value::list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          PD_ASSIGN_OR_RETURN(Value key, eval(*e.operands[i]));
          if (!key.is_string()) return error_at(e.operands[i]->position, "dict literal keys must be strings");
          PD_ASSIGN_OR_RETURN(Value value, eval(*e.operands[i + 1]));
          d.set(key.as_string(), std::move(value));
        }
        return Value::dict(std::move(d));
      }
      case ExprKind::kAttribute: {
        PD_ASSIGN_OR_RETURN(Value object, eval(*e.operands[0]));
        if (object.is_undefined()) return undefined_error(object);
        // For a dict, jinja2 looks up `.name` as a Python attribute first: the methods.
        if (object.is_dict()) {
          if (std::optional<Value> method = method_of(object, e.name)) return *method;
        }
        return get_item(object, Value::string(e.name));
      }
      case ExprKind::kSubscript: {
        PD_ASSIGN_OR_RETURN(Value object, eval(*e.operands[0]));
        PD_ASSIGN_OR_RETURN(Value key, eval(*e.operands[1]));
        return get_item(object, key);
      }
      case ExprKind::kSlice: return eval_slice(e);
      case ExprKind::kUnary: {
        PD_ASSIGN_OR_RETURN(Value v, eval(*e.operands[0]));
        if (v.is_undefined()) return undefined_error(v);
        if (is_integral(v)) {
          if (e.op == Op::kPos) return Value::integer(integral(v));
          if (integral(v) == INT64_MIN) return absl::OutOfRangeError("integer overflow");
          return Value::integer(-integral(v));
        }
        if (v.is_float()) return Value::number(e.op == Op::kNeg ? -v.as_double() : v.as_double());
        return absl::InvalidArgumentError(absl::StrCat("bad operand type for unary ", e.op == Op::kNeg ? "-" : "+",
                                                       ": '", v.type_name(), "'"));
      }
      case ExprKind::kBinary: {
        PD_ASSIGN_OR_RETURN(Value a, eval(*e.operands[0]));
        PD_ASSIGN_OR_RETURN(Value b, eval(*e.operands[1]));
        return binary(e.op, a, b);
      }
      case ExprKind::kCompare: {
        PD_ASSIGN_OR_RETURN(Value left, eval(*e.operands[0]));
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          PD_ASSIGN_OR_RETURN(Value right, eval(*e.operands[i + 1]));
          PD_ASSIGN_OR_RETURN(bool holds, compare(e.compare_ops[i], left, right));
          if (!holds) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::kAnd: {
        PD_ASSIGN_OR_RETURN(Value a, eval(*e.operands[0]));
        if (!a.truthy()) return a;
        return eval(*e.operands[1]);
      }
      case ExprKind::kOr: {
        PD_ASSIGN_OR_RETURN(Value a, eval(*e.operands[0]));
        if (a.truthy()) return a;
        return eval(*e.operands[1]);
      }
      case ExprKind::kNot: {
        PD_ASSIGN_OR_RETURN(Value a, eval(*e.operands[0]));
        return Value::boolean(!a.truthy());
      }
      case ExprKind::kConditional: {
        PD_ASSIGN_OR_RETURN(Value cond, eval(*e.operands[1]));
        if (cond.truthy()) return eval(*e.operands[0]);
        if (!e.operands[2]) return Value::undefined("an inline if without else whose condition is false is undefined");
        return eval(*e.operands[2]);
      }
      case ExprKind::kCall: {
        PD_ASSIGN_OR_RETURN(Value callee, eval(*e.operands[0]));
        if (callee.is_undefined()) return undefined_error(callee);
        if (!callee.is_callable())
          return absl::InvalidArgumentError(absl::StrCat("'", callee.type_name(), "' object is not callable"));
        PD_ASSIGN_OR_RETURN(CallArgs args, eval_args(e));
        return callee.as_callable().call(args);
      }
      case ExprKind::kFilter: {
        PD_ASSIGN_OR_RETURN(Value subject, eval(*e.operands[0]));
        PD_ASSIGN_OR_RETURN(CallArgs args, eval_args(e));
        return apply_filter(e.name, subject, args);
      }
      case ExprKind::kTest: {
        PD_ASSIGN_OR_RETURN(Value subject, eval(*e.operands[0]));
        PD_ASSIGN_OR_RETURN(CallArgs args, eval_args(e));
        PD_ASSIGN_OR_RETURN(bool passes, apply_test(e.name, subject, args));
        return Value::boolean(passes != e.negated);
      }
    }
    return absl::InternalError("unknown expression");
  }

  StatusOr<Value> eval_slice(const Expr& e) {
    PD_ASSIGN_OR_RETURN(Value object, eval(*e.operands[0]));
    Value bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.operands[size_t(i) + 1]) {
        bounds[i] = Value::none();
        continue;
      }
      PD_ASSIGN_OR_RETURN(bounds[i], eval(*e.operands[size_t(i) + 1]));
      if (!bounds[i].is_none() && !is_integral(bounds[i]))
        return absl::InvalidArgumentError("slice indices must be integers or None");
    }
    if (!bounds[2].is_none() && integral(bounds[2]) == 0) return absl::InvalidArgumentError("slice step cannot be zero");
    if (object.is_undefined()) return undefined_error(object);
    if (object.is_list()) {
      const auto& items = object.as_list();
      std::vector<Value> out;
      for (size_t i : slice_positions(int64_t(items.size()), bounds[0], bounds[1], bounds[2])) out.push_back(items[i]);
      return Value::list(std::move(out), object.is_tuple());
    }
    if (object.is_string()) {
      const std::vector<std::string> cps = code_points(object.as_string());
      std::string out;
      for (size_t i : slice_positions(int64_t(cps.size()), bounds[0], bounds[1], bounds[2])) out += cps[i];
      return Value::string(std::move(out));
    }
    return absl::InvalidArgumentError(absl::StrCat("'", object.type_name(), "' object cannot be sliced"));
  }

  StatusOr<bool> compare(Op op, const Value& a, const Value& b) {
    switch (op) {
      case Op::kEq: return equal(a, b);
      case Op::kNe: return !equal(a, b);
      case Op::kLt: return less(a, b);
      case Op::kGt: return less(b, a);
      case Op::kLe: {
        PD_ASSIGN_OR_RETURN(bool gt, less(b, a));
        return !gt;
      }
      case Op::kGe: {
        PD_ASSIGN_OR_RETURN(bool lt, less(a, b));
        return !lt;
      }
      case Op::kIn:
      case Op::kNotIn: {
        CallArgs args;
        args.positional.push_back(b);
        PD_ASSIGN_OR_RETURN(bool in, apply_test("in", a, args));
        return in == (op == Op::kIn);
      }
      default: return absl::InternalError("not a comparison");
    }
  }

  StatusOr<Value> binary(Op op, const Value& a, const Value& b) {
    if (op == Op::kConcat) return Value::string(to_str(a) + to_str(b));
    if (a.is_undefined()) return undefined_error(a);
    if (b.is_undefined()) return undefined_error(b);
    const char* symbol = op == Op::kAdd ? "+" : op == Op::kSub ? "-" : op == Op::kMul ? "*" : op == Op::kDiv ? "/"
                         : op == Op::kFloorDiv ? "//" : op == Op::kMod ? "%" : "**";
    const ValueLimits& limits = options_.value_limits;
    if (is_integral(a) && is_integral(b)) {
      const int64_t x = integral(a), y = integral(b);
      int64_t r = 0;
      switch (op) {
        case Op::kAdd:
          if (__builtin_add_overflow(x, y, &r)) return absl::OutOfRangeError("integer overflow");
          return Value::integer(r);
        case Op::kSub:
          if (__builtin_sub_overflow(x, y, &r)) return absl::OutOfRangeError("integer overflow");
          return Value::integer(r);
        case Op::kMul:
          if (__builtin_mul_overflow(x, y, &r)) return absl::OutOfRangeError("integer overflow");
          return Value::integer(r);
        case Op::kDiv:
          if (y == 0) return absl::InvalidArgumentError("division by zero");
          return Value::number(double(x) / double(y));
        case Op::kFloorDiv:
        case Op::kMod: {
          if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) return absl::OutOfRangeError("integer overflow");
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            --q;
            m += y;
          }
          return Value::integer(op == Op::kFloorDiv ? q : m);
        }
        case Op::kPow: {
          if (y < 0) return Value::number(std::pow(double(x), double(y)));
          int64_t result = 1;
          for (int64_t i = 0; i < y; ++i) {
            if (__builtin_mul_overflow(result, x, &result)) return absl::OutOfRangeError("integer overflow");
            if (result == 0 || result == 1) break;
          }
          if (result == 1 && x == -1 && y % 2 == 1) result = -1;
          return Value::integer(result);
        }
        default: break;
      }
    }
    if (a.is_number() && b.is_number()) {
      const double x = a.as_double(), y = b.as_double();
      switch (op) {
        case Op::kAdd: return Value::number(x + y);
        case Op::kSub: return Value::number(x - y);
        case Op::kMul: return Value::number(x * y);
        case Op::kDiv:
          if (y == 0) return absl::InvalidArgumentError("float division by zero");
          return Value::number(x / y);
        case Op::kFloorDiv:
          if (y == 0) return absl::InvalidArgumentError("float floor division by zero");
          return Value::number(std::floor(x / y));
        case Op::kMod: {
          if (y == 0) return absl::InvalidArgumentError("float modulo by zero");
          double m = std::fmod(x, y);
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::number(m);
        }
        case Op::kPow: return Value::number(std::pow(x, y));
        default: break;
      }
    }
    if (op == Op::kAdd && a.is_string() && b.is_string()) return Value::string(a.as_string() + b.as_string());
    if (op == Op::kAdd && a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (op == Op::kMul && (((a.is_string() || a.is_list()) && is_integral(b)) || ((b.is_string() || b.is_list()) && is_integral(a)))) {
      const Value& seq = is_integral(b) ? a : b;
      const int64_t n = std::max<int64_t>(0, is_integral(b) ? integral(b) : integral(a));
      const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
      const size_t limit = seq.is_string() ? limits.max_string_bytes : limits.max_list_items;
      if (unit > 0 && uint64_t(n) > limit / unit)
        return absl::ResourceExhaustedError("a repetition past the template's size limit");
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value::string(std::move(out));
      }
      std::vector<Value> out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
      return Value::list(std::move(out), seq.is_tuple());
    }
    if (op == Op::kMod && a.is_string()) return absl::InvalidArgumentError("printf-style '%' string formatting is not supported");
    return operand_error(symbol, a, b);
  }

  const Dict& context_;
  const RenderOptions& options_;
  const Dict globals_;
  std::vector<Frame> frames_;
  int depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

StatusOr<std::string> render(const Program& program, const Dict& context, const RenderOptions& options) {
  return Evaluator(context, options).run(program);
}

}  // namespace pdserve::jinja
