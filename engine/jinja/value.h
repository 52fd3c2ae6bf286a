// The values a Jinja template computes with, modelled on the Python objects jinja2 uses
// (transformers renders chat templates with jinja2, so Python's semantics are the reference):
// undefined, None, bool, int, float, str (UTF-8), list and tuple, dict (insertion-ordered,
// string keys), namespace (the one mutable object a sandboxed template may change), and
// callables (macros, globals such as range). Lists and dicts are immutable and shared, so
// copying a Value is cheap; a namespace is shared by reference, as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace pdserve::jinja {

class Value;
class Dict;
struct CallArgs;

// A macro, a caller() block or a global function. Errors are Status values (raise_exception
// is one).
struct Callable {
  std::string name;
  std::function<StatusOr<Value>(const CallArgs&)> call;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() : data_(Undefined{}) {}
  // An undefined value remembers why it is undefined ("'x' is undefined", "'dict' object has
  // no attribute 'y'"): the error when it is used further.
  static Value undefined(std::string reason) { return Value(Data(Undefined{std::move(reason)})); }
  static Value none() { return Value(Data(std::in_place_type<None>)); }
  static Value boolean(bool b) { return Value(Data(std::in_place_type<bool>, b)); }
  static Value integer(int64_t i) { return Value(Data(std::in_place_type<int64_t>, i)); }
  static Value number(double d) { return Value(Data(std::in_place_type<double>, d)); }
  static Value string(std::string s) { return Value(Data(std::in_place_type<std::string>, std::move(s))); }
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(Dict d);
  static Value namespace_of(Dict d);
  static Value callable(std::string name, std::function<StatusOr<Value>(const CallArgs&)> call);

  Kind kind() const { return Kind(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // int, float or bool: Python's numbers (bool is an int there).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_tuple() const { return is_list() && std::get<ListPtr>(data_)->tuple; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  // int, bool or float as a double.
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const std::vector<Value>& as_list() const { return std::get<ListPtr>(data_)->items; }
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  // The namespace's attributes; mutable through any copy of the value, as in Python.
  Dict& namespace_attributes() const { return *std::get<NamespacePtr>(data_); }
  const Callable& as_callable() const { return *std::get<CallablePtr>(data_); }
  const std::string& undefined_reason() const { return std::get<Undefined>(data_).reason; }

  // Python's truth: empty strings and containers, 0, None and undefined are false.
  bool truthy() const;
  // Python's type names, for error messages ("str", "list", "dict", ...).
  std::string type_name() const;

 private:
  struct Undefined {
    std::string reason;
  };
  struct None {};
  struct ListData {
    std::vector<Value> items;
    bool tuple = false;
  };
  using ListPtr = std::shared_ptr<const ListData>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NamespacePtr = std::shared_ptr<Dict>;
  using CallablePtr = std::shared_ptr<const Callable>;
  using Data = std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, NamespacePtr,
                            CallablePtr>;

  explicit Value(Data data) : data_(std::move(data)) {}

  Data data_;
};

// A dict: keys in insertion order, as Python's dict keeps them (the order tojson writes).
class Dict {
 public:
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
};

// The arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Python's == (1 == 1.0, lists and dicts element-wise, different types unequal).
bool equal(const Value& a, const Value& b);
// Python's <: numbers, strings (by code point) and lists; other pairs are a TypeError.
StatusOr<bool> less(const Value& a, const Value& b);
// str(value) as Python prints it (None, True, 1.5, ['a', 1], {'k': 'v'}); undefined is "".
std::string to_str(const Value& v);
// repr(value) as Python writes it ('text' quoted).
std::string to_repr(const Value& v);
// Python's repr of a float: the shortest digits that round-trip, "1e-05", "1e+16", "2.0".
std::string float_repr(double d);

}  // namespace pdserve::jinja
