#include "engine/jinja/parser.h"

#include <cstdlib>
#include <initializer_list>

#include "engine/jinja/builtins.h"

namespace pdserve::jinja {
namespace {

ExprPtr make_expr(ExprKind kind, SourcePosition at) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->position = at;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  StatusOr<Program> run() {
    Program program;
    std::string ended_by;
    PD_ASSIGN_OR_RETURN(program.body, parse_body({}, &ended_by, {}));
    return program;
  }

 private:
  // Counts nesting; past kMaxParseDepth parsing stops with an error.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) { ++p_.depth_; }
    ~DepthGuard() { --p_.depth_; }
    bool too_deep() const { return p_.depth_ > kMaxParseDepth; }

   private:
    Parser& p_;
  };

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().kind == TokenKind::kOperator && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == TokenKind::kName && cur().text == name; }
  Status fail(const std::string& what) const { return error_at(cur().position, what); }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokenKind::kText: return "text";
      case TokenKind::kVariableBegin: return "'{{'";
      case TokenKind::kVariableEnd: return "'}}'";
      case TokenKind::kBlockBegin: return "'{%'";
      case TokenKind::kBlockEnd: return "'%}'";
      case TokenKind::kEnd: return "the end of the template";
      default: return "'" + t.text + "'";
    }
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return fail(absl::StrCat("expected '", op, "', found ", describe(cur())));
    advance();
    return absl::OkStatus();
  }
  Status expect_kind(TokenKind kind, const char* what) {
    if (cur().kind != kind) return fail(absl::StrCat("expected ", what, ", found ", describe(cur())));
    advance();
    return absl::OkStatus();
  }
  StatusOr<std::string> expect_name() {
    if (cur().kind != TokenKind::kName) return fail(absl::StrCat("expected a name, found ", describe(cur())));
    std::string name = cur().text;
    advance();
    return name;
  }

  // Statements until a {% tag %} whose name is in `ends` (consumed, its name in *ended_by) or
  // the end of the template (only allowed when `ends` is empty; `opened` names the block).
  StatusOr<std::vector<Node>> parse_body(std::initializer_list<const char*> ends, std::string* ended_by,
                                         const std::string& opened) {
    DepthGuard guard(*this);
    if (guard.too_deep()) return fail("blocks are nested too deeply");
    std::vector<Node> body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::kEnd) {
        if (ends.size() == 0) return body;
        return error_at(t.position, absl::StrCat("unclosed '", opened, "' block: expected '", *ends.begin(),
                                                 "' before the end of the template"));
      }
      if (t.kind == TokenKind::kText) {
        Node n;
        n.kind = NodeKind::kText;
        n.position = t.position;
        n.text = t.text;
        body.push_back(std::move(n));
        advance();
        continue;
      }
      if (t.kind == TokenKind::kVariableBegin) {
        Node n;
        n.kind = NodeKind::kOutput;
        n.position = t.position;
        advance();
        PD_ASSIGN_OR_RETURN(n.expr, parse_tuple_expression(true));
        PD_RETURN_IF_ERROR(expect_kind(TokenKind::kVariableEnd, "'}}'"));
        body.push_back(std::move(n));
        continue;
      }
      if (t.kind != TokenKind::kBlockBegin) return fail(absl::StrCat("unexpected ", describe(t)));
      advance();
      if (cur().kind != TokenKind::kName) return fail(absl::StrCat("expected a tag name, found ", describe(cur())));
      for (const char* end : ends) {
        if (cur().text == end) {
          *ended_by = end;
          advance();
          return body;
        }
      }
      PD_ASSIGN_OR_RETURN(Node n, parse_statement());
      body.push_back(std::move(n));
    }
  }

  StatusOr<Node> parse_statement() {
    const Token tag = cur();
    Node n;
    n.position = tag.position;
    advance();
    if (tag.text == "if") return parse_if(std::move(n));
    if (tag.text == "for") return parse_for(std::move(n));
    if (tag.text == "set") return parse_set(std::move(n));
    if (tag.text == "macro") return parse_macro(std::move(n));
    if (tag.text == "call") return parse_call_block(std::move(n));
    if (tag.text == "break" || tag.text == "continue") {
      if (loop_depth_ == 0) return error_at(tag.position, absl::StrCat("'", tag.text, "' outside a for loop"));
      n.kind = tag.text == "break" ? NodeKind::kBreak : NodeKind::kContinue;
      PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
      return n;
    }
    if (tag.text == "generation") {
      n.kind = NodeKind::kBlock;
      PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
      std::string ended;
      PD_ASSIGN_OR_RETURN(n.body, parse_body({"endgeneration"}, &ended, "generation"));
      PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
      return n;
    }
    static constexpr const char* kEndTags[] = {"endif", "endfor", "endset", "endmacro", "endcall", "elif", "else",
                                               "endgeneration"};
    for (const char* end : kEndTags)
      if (tag.text == end) return error_at(tag.position, absl::StrCat("unexpected '", tag.text, "'"));
    return error_at(tag.position, absl::StrCat("the '", tag.text, "' tag is not supported"));
  }

  StatusOr<Node> parse_if(Node n) {
    n.kind = NodeKind::kIf;
    PD_ASSIGN_OR_RETURN(n.expr, parse_tuple_expression(false));
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    std::string ended;
    PD_ASSIGN_OR_RETURN(n.body, parse_body({"elif", "else", "endif"}, &ended, "if"));
    if (ended == "elif") {
      Node elif;
      elif.position = tokens_[pos_ - 1].position;
      PD_ASSIGN_OR_RETURN(Node nested, parse_if(std::move(elif)));
      n.else_body.push_back(std::move(nested));
      return n;
    }
    if (ended == "else") {
      PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
      PD_ASSIGN_OR_RETURN(n.else_body, parse_body({"endif"}, &ended, "if"));
    }
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    return n;
  }

  // A name or names separated by commas (a tuple target); with `allow_attribute`, name.attr.
  StatusOr<ExprPtr> parse_target(bool allow_attribute) {
    const SourcePosition at = cur().position;
    std::vector<ExprPtr> names;
    do {
      if (!names.empty()) advance();  // The comma.
      auto e = make_expr(ExprKind::kName, cur().position);
      PD_ASSIGN_OR_RETURN(e->name, expect_name());
      if (allow_attribute && names.empty() && is_op(".")) {
        advance();
        auto attr = make_expr(ExprKind::kAttribute, e->position);
        PD_ASSIGN_OR_RETURN(attr->name, expect_name());
        attr->operands.push_back(std::move(e));
        return attr;
      }
      names.push_back(std::move(e));
    } while (is_op(","));
    if (names.size() == 1) return std::move(names[0]);
    auto t = make_expr(ExprKind::kTuple, at);
    t->operands = std::move(names);
    return t;
  }

  StatusOr<Node> parse_for(Node n) {
    n.kind = NodeKind::kFor;
    PD_ASSIGN_OR_RETURN(n.target, parse_target(false));
    if (!is_name("in")) return fail(absl::StrCat("expected 'in' in the for loop, found ", describe(cur())));
    advance();
    PD_ASSIGN_OR_RETURN(n.expr, parse_tuple_expression(false));
    if (is_name("if")) {
      advance();
      PD_ASSIGN_OR_RETURN(n.filter, parse_expression(true));
    }
    if (is_name("recursive")) return fail("recursive for loops are not supported");
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    std::string ended;
    ++loop_depth_;
    auto body = parse_body({"else", "endfor"}, &ended, "for");
    --loop_depth_;
    if (!body.ok()) return body.status();
    n.body = *std::move(body);
    if (ended == "else") {
      PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
      PD_ASSIGN_OR_RETURN(n.else_body, parse_body({"endfor"}, &ended, "for"));
    }
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    return n;
  }

  StatusOr<Node> parse_set(Node n) {
    PD_ASSIGN_OR_RETURN(n.target, parse_target(true));
    if (is_op("=")) {
      n.kind = NodeKind::kSet;
      advance();
      PD_ASSIGN_OR_RETURN(n.expr, parse_tuple_expression(true));
      PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
      return n;
    }
    if (n.target->kind != ExprKind::kName) return fail("a block set assigns one name");
    n.kind = NodeKind::kSetBlock;
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}' or '='"));
    std::string ended;
    PD_ASSIGN_OR_RETURN(n.body, parse_body({"endset"}, &ended, "set"));
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    return n;
  }

  StatusOr<Node> parse_macro(Node n) {
    n.kind = NodeKind::kMacro;
    PD_ASSIGN_OR_RETURN(n.name, expect_name());
    PD_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!n.params.empty()) PD_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      PD_ASSIGN_OR_RETURN(std::string param, expect_name());
      n.params.push_back(param);
      ExprPtr def;
      if (is_op("=")) {
        advance();
        PD_ASSIGN_OR_RETURN(def, parse_expression(true));
      }
      n.defaults.push_back(std::move(def));
    }
    advance();
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    std::string ended;
    const int loops = loop_depth_;
    loop_depth_ = 0;  // A loop around a macro's definition does not make break valid inside it.
    auto body = parse_body({"endmacro"}, &ended, "macro");
    loop_depth_ = loops;
    if (!body.ok()) return body.status();
    n.body = *std::move(body);
    if (cur().kind == TokenKind::kName) advance();  // {% endmacro name %}
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    return n;
  }

  StatusOr<Node> parse_call_block(Node n) {
    n.kind = NodeKind::kCallBlock;
    if (is_op("(")) return fail("call blocks with caller arguments are not supported");
    PD_ASSIGN_OR_RETURN(n.expr, parse_expression(true));
    if (n.expr->kind != ExprKind::kCall) return error_at(n.expr->position, "a call block needs a macro call");
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    std::string ended;
    PD_ASSIGN_OR_RETURN(n.body, parse_body({"endcall"}, &ended, "call"));
    PD_RETURN_IF_ERROR(expect_kind(TokenKind::kBlockEnd, "'%}'"));
    return n;
  }

  // An expression, or several separated by commas (a tuple without parentheses).
  StatusOr<ExprPtr> parse_tuple_expression(bool with_conditional) {
    const SourcePosition at = cur().position;
    PD_ASSIGN_OR_RETURN(ExprPtr first, with_conditional ? parse_expression(true) : parse_or());
    if (!is_op(",")) return first;
    auto t = make_expr(ExprKind::kTuple, at);
    t->operands.push_back(std::move(first));
    while (is_op(",")) {
      advance();
      if (cur().kind == TokenKind::kVariableEnd || cur().kind == TokenKind::kBlockEnd) break;
      PD_ASSIGN_OR_RETURN(ExprPtr next, with_conditional ? parse_expression(true) : parse_or());
      t->operands.push_back(std::move(next));
    }
    return t;
  }

  StatusOr<ExprPtr> parse_expression(bool with_conditional) {
    DepthGuard guard(*this);
    if (guard.too_deep()) return fail("the expression is nested too deeply");
    PD_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
    while (with_conditional && is_name("if")) {
      auto c = make_expr(ExprKind::kConditional, cur().position);
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr cond, parse_or());
      ExprPtr otherwise;
      if (is_name("else")) {
        advance();
        PD_ASSIGN_OR_RETURN(otherwise, parse_expression(true));
      }
      c->operands.push_back(std::move(e));
      c->operands.push_back(std::move(cond));
      c->operands.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  StatusOr<ExprPtr> parse_or() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (is_name("or")) {
      auto e = make_expr(ExprKind::kOr, cur().position);
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      e->operands.push_back(std::move(left));
      e->operands.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_and() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (is_name("and")) {
      auto e = make_expr(ExprKind::kAnd, cur().position);
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      e->operands.push_back(std::move(left));
      e->operands.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      if (guard.too_deep()) return fail("the expression is nested too deeply");
      auto e = make_expr(ExprKind::kNot, cur().position);
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      e->operands.push_back(std::move(operand));
      return e;
    }
    return parse_compare();
  }

  StatusOr<ExprPtr> parse_compare() {
    const SourcePosition at = cur().position;
    PD_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    std::vector<Op> ops;
    std::vector<ExprPtr> operands;
    operands.push_back(std::move(first));
    while (true) {
      Op op;
      if (is_op("==")) op = Op::kEq;
      else if (is_op("!=")) op = Op::kNe;
      else if (is_op("<")) op = Op::kLt;
      else if (is_op("<=")) op = Op::kLe;
      else if (is_op(">")) op = Op::kGt;
      else if (is_op(">=")) op = Op::kGe;
      else if (is_name("in")) op = Op::kIn;
      else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        advance();
        op = Op::kNotIn;
      } else {
        break;
      }
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr next, parse_math1());
      ops.push_back(op);
      operands.push_back(std::move(next));
    }
    if (ops.empty()) return std::move(operands[0]);
    auto e = make_expr(ExprKind::kCompare, at);
    e->compare_ops = std::move(ops);
    e->operands = std::move(operands);
    return e;
  }

  ExprPtr binary(Op op, ExprPtr left, ExprPtr right, SourcePosition at) {
    auto e = make_expr(ExprKind::kBinary, at);
    e->op = op;
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return e;
  }

  StatusOr<ExprPtr> parse_math1() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    while (is_op("+") || is_op("-")) {
      const Op op = is_op("+") ? Op::kAdd : Op::kSub;
      const SourcePosition at = cur().position;
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      left = binary(op, std::move(left), std::move(right), at);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_concat() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, parse_math2());
    while (is_op("~")) {
      const SourcePosition at = cur().position;
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr right, parse_math2());
      left = binary(Op::kConcat, std::move(left), std::move(right), at);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_math2() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Op op = is_op("*") ? Op::kMul : is_op("/") ? Op::kDiv : is_op("//") ? Op::kFloorDiv : Op::kMod;
      const SourcePosition at = cur().position;
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
      left = binary(op, std::move(left), std::move(right), at);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_pow() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
    while (is_op("**")) {
      const SourcePosition at = cur().position;
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
      left = binary(Op::kPow, std::move(left), std::move(right), at);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    if (guard.too_deep()) return fail("the expression is nested too deeply");
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make_expr(ExprKind::kUnary, cur().position);
      e->op = is_op("-") ? Op::kNeg : Op::kPos;
      advance();
      PD_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      e->operands.push_back(std::move(operand));
    } else {
      PD_ASSIGN_OR_RETURN(e, parse_primary());
    }
    PD_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) {
      PD_ASSIGN_OR_RETURN(e, parse_filters_and_tests(std::move(e)));
    }
    return e;
  }

  StatusOr<ExprPtr> parse_primary() {
    const Token& t = cur();
    if (t.kind == TokenKind::kName) {
      auto e = make_expr(ExprKind::kLiteral, t.position);
      if (t.text == "true" || t.text == "True") e->literal = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") e->literal = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") e->literal = Value::none();
      else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      advance();
      return e;
    }
    if (t.kind == TokenKind::kString) {
      auto e = make_expr(ExprKind::kLiteral, t.position);
      std::string s;
      while (cur().kind == TokenKind::kString) {  // Adjacent literals join, as in Python.
        s += cur().text;
        advance();
      }
      e->literal = Value::string(std::move(s));
      return e;
    }
    if (t.kind == TokenKind::kInteger) {
      auto e = make_expr(ExprKind::kLiteral, t.position);
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(t.text.c_str(), &end, 10);
      if (errno == ERANGE) return fail(absl::StrCat("the integer ", t.text, " is out of range"));
      e->literal = Value::integer(int64_t(v));
      advance();
      return e;
    }
    if (t.kind == TokenKind::kFloat) {
      auto e = make_expr(ExprKind::kLiteral, t.position);
      e->literal = Value::number(std::strtod(t.text.c_str(), nullptr));
      advance();
      return e;
    }
    if (is_op("(")) {
      const SourcePosition at = t.position;
      advance();
      if (is_op(")")) {
        advance();
        auto e = make_expr(ExprKind::kTuple, at);
        return e;
      }
      PD_ASSIGN_OR_RETURN(ExprPtr first, parse_expression(true));
      if (is_op(")")) {
        advance();
        return first;
      }
      auto e = make_expr(ExprKind::kTuple, at);
      e->operands.push_back(std::move(first));
      while (is_op(",")) {
        advance();
        if (is_op(")")) break;
        PD_ASSIGN_OR_RETURN(ExprPtr next, parse_expression(true));
        e->operands.push_back(std::move(next));
      }
      PD_RETURN_IF_ERROR(expect_op(")"));
      return e;
    }
    if (is_op("[")) {
      auto e = make_expr(ExprKind::kList, t.position);
      advance();
      while (!is_op("]")) {
        if (!e->operands.empty()) PD_RETURN_IF_ERROR(expect_op(","));
        if (is_op("]")) break;
        PD_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
        e->operands.push_back(std::move(item));
      }
      advance();
      return e;
    }
    if (is_op("{")) {
      auto e = make_expr(ExprKind::kDict, t.position);
      advance();
      while (!is_op("}")) {
        if (!e->operands.empty()) PD_RETURN_IF_ERROR(expect_op(","));
        if (is_op("}")) break;
        PD_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
        PD_RETURN_IF_ERROR(expect_op(":"));
        PD_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        e->operands.push_back(std::move(key));
        e->operands.push_back(std::move(value));
      }
      advance();
      return e;
    }
    return fail(absl::StrCat("unexpected ", describe(t)));
  }

  StatusOr<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        advance();
        if (cur().kind == TokenKind::kInteger) {
          auto s = make_expr(ExprKind::kSubscript, cur().position);
          auto index = make_expr(ExprKind::kLiteral, cur().position);
          index->literal = Value::integer(std::strtoll(cur().text.c_str(), nullptr, 10));
          advance();
          s->operands.push_back(std::move(e));
          s->operands.push_back(std::move(index));
          e = std::move(s);
          continue;
        }
        auto a = make_expr(ExprKind::kAttribute, cur().position);
        PD_ASSIGN_OR_RETURN(a->name, expect_name());
        a->operands.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        PD_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        PD_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> parse_subscript(ExprPtr target) {
    const SourcePosition at = cur().position;
    advance();  // [
    ExprPtr start, stop, step;
    bool slice = false;
    if (!is_op(":")) {
      PD_ASSIGN_OR_RETURN(start, parse_expression(true));
    }
    if (is_op(":")) {
      slice = true;
      advance();
      if (!is_op("]") && !is_op(":")) {
        PD_ASSIGN_OR_RETURN(stop, parse_expression(true));
      }
      if (is_op(":")) {
        advance();
        if (!is_op("]")) {
          PD_ASSIGN_OR_RETURN(step, parse_expression(true));
        }
      }
    }
    PD_RETURN_IF_ERROR(expect_op("]"));
    auto e = make_expr(slice ? ExprKind::kSlice : ExprKind::kSubscript, at);
    e->operands.push_back(std::move(target));
    e->operands.push_back(std::move(start));
    if (slice) {
      e->operands.push_back(std::move(stop));
      e->operands.push_back(std::move(step));
    }
    return e;
  }

  // (args...) into e's operands (after those it has) and keywords.
  Status parse_call_args(Expr& e) {
    PD_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    while (!is_op(")")) {
      if (!first) PD_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) return fail("*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        PD_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        e.keywords.emplace_back(std::move(key), std::move(value));
        continue;
      }
      if (!e.keywords.empty()) return fail("a positional argument follows a keyword argument");
      PD_ASSIGN_OR_RETURN(ExprPtr arg, parse_expression(true));
      e.operands.push_back(std::move(arg));
    }
    advance();
    return absl::OkStatus();
  }

  StatusOr<ExprPtr> parse_call(ExprPtr callee) {
    auto e = make_expr(ExprKind::kCall, callee->position);  // Errors point at what is called.
    e->operands.push_back(std::move(callee));
    PD_RETURN_IF_ERROR(parse_call_args(*e));
    return e;
  }

  StatusOr<ExprPtr> parse_filters_and_tests(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        advance();
        auto f = make_expr(ExprKind::kFilter, cur().position);
        PD_ASSIGN_OR_RETURN(f->name, expect_name());
        if (!is_known_filter(f->name)) return error_at(f->position, absl::StrCat("no filter named '", f->name, "'"));
        f->operands.push_back(std::move(e));
        if (is_op("(")) PD_RETURN_IF_ERROR(parse_call_args(*f));
        e = std::move(f);
      } else if (is_name("is")) {
        advance();
        auto t = make_expr(ExprKind::kTest, cur().position);
        if (is_name("not")) {
          t->negated = true;
          advance();
        }
        PD_ASSIGN_OR_RETURN(t->name, expect_name());
        if (!is_known_test(t->name)) return error_at(t->position, absl::StrCat("no test named '", t->name, "'"));
        t->operands.push_back(std::move(e));
        if (is_op("(")) {
          PD_RETURN_IF_ERROR(parse_call_args(*t));
        } else if ((cur().kind == TokenKind::kName || cur().kind == TokenKind::kString ||
                    cur().kind == TokenKind::kInteger || cur().kind == TokenKind::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          // One argument without parentheses: `is divisibleby 3`, `is sameas none`.
          if (is_name("is")) return fail("tests cannot be chained with 'is'");
          PD_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
          PD_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
          t->operands.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        PD_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

StatusOr<Program> parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).run(); }

}  // namespace pdserve::jinja
