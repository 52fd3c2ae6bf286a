// The syntax tree of a parsed template: expressions (Expr) and statements (Node), only the
// constructs of the chat-template subset (engine/jinja/parser.h says which). A tree is
// immutable once parsed, so one compiled template renders many requests concurrently.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/jinja/source_position.h"
#include "engine/jinja/value.h"

namespace pdserve::jinja {

enum class ExprKind {
  kLiteral,      // literal
  kName,         // name
  kList,         // operands: the items
  kTuple,        // operands: the items
  kDict,         // operands: key, value, key, value, ...
  kAttribute,    // operands[0].name
  kSubscript,    // operands[0][operands[1]]
  kSlice,        // operands[0][start:stop:step]: operands 1..3, each may be null
  kUnary,        // op (kNeg, kPos) operands[0]
  kBinary,       // operands[0] op operands[1]
  kCompare,      // operands[0] compare_ops[0] operands[1] compare_ops[1] ... (chained as in Python)
  kAnd,          // operands[0] and operands[1]
  kOr,           // operands[0] or operands[1]
  kNot,          // not operands[0]
  kConditional,  // operands[0] if operands[1] else operands[2] (null: undefined)
  kCall,         // operands[0](operands[1:]..., keywords...)
  kFilter,       // operands[0] | name(operands[1:]..., keywords...)
  kTest,         // operands[0] is [not] name(operands[1:]...)
};

enum class Op { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat, kNeg, kPos, kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  SourcePosition position;
  Value literal;
  std::string name;
  Op op = Op::kAdd;
  std::vector<Op> compare_ops;
  bool negated = false;  // kTest: "is not".
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

enum class NodeKind {
  kText,       // text
  kOutput,     // {{ expr }}
  kIf,         // {% if expr %} body {% else %} else_body (an elif is an kIf alone in else_body)
  kFor,        // {% for target in expr if filter %} body {% else %} else_body
  kSet,        // {% set target = expr %}; target a name, a tuple of names or name.attribute
  kSetBlock,   // {% set target %} body {% endset %}
  kMacro,      // {% macro name(params=defaults) %} body
  kCallBlock,  // {% call expr %} body: expr is a call whose macro may call caller()
  kBreak,
  kContinue,
  kBlock,      // A body rendered in place: transformers' {% generation %} tag.
};

struct Node {
  NodeKind kind = NodeKind::kText;
  SourcePosition position;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr filter;
  std::vector<Node> body;
  std::vector<Node> else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // One per param; null when it has none.
};

// A parsed template.
struct Program {
  std::vector<Node> body;
};

}  // namespace pdserve::jinja
