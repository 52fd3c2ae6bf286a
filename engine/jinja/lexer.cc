#include "engine/jinja/lexer.h"

#include <algorithm>

#include "engine/jinja/py_string.h"

namespace pdserve::jinja {
namespace {

// jinja2 normalises every newline sequence to "\n" and, without keep_trailing_newline (as
// transformers renders), drops one trailing newline.
std::string normalize_newlines(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      out += '\n';
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xc0 | (c >> 6));
    out += char(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += char(0xe0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  } else {
    out += char(0xf0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3f));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options) : src_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  StatusOr<std::vector<Token>> run() {
    size_t pos = 0;
    // Whether the text at `pos` starts a line (lstrip_blocks only strips up to a line start).
    bool line_starting = true;
    while (pos <= src_.size()) {
      const size_t tag = next_tag(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? src_.size() : tag) - pos);
      if (tag == std::string::npos) {
        emit_text(std::move(text), pos);
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text = py_strip(text, StripSide::kRight, std::nullopt);
      } else if (sign != '+' && options_.lstrip_blocks && type != '{') {
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          const absl::string_view rest = absl::string_view(text).substr(line_start);
          if (!rest.empty() && leading_space_bytes(rest) == rest.size())
            text.resize(line_start);
        }
      }
      emit_text(std::move(text), pos);
      size_t after = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      bool strip_after = false, keep_newline = false;
      if (type == '#') {
        const size_t end = src_.find("#}", after);
        if (end == std::string::npos) return error_at(position(tag), "unclosed comment ({# without #})");
        strip_after = end > after && src_[end - 1] == '-';
        keep_newline = end > after && src_[end - 1] == '+';
        pos = end + 2;
      } else {
        PD_ASSIGN_OR_RETURN(pos, lex_tag(tag, type == '{', after, &strip_after, &keep_newline));
      }
      line_starting = false;
      if (strip_after) {
        const size_t begin = pos;
        pos += leading_space_bytes(absl::string_view(src_).substr(pos));
        line_starting = pos > begin && src_[pos - 1] == '\n';
      } else if (type != '{' && options_.trim_blocks && !keep_newline && pos < src_.size() && src_[pos] == '\n') {
        ++pos;
        line_starting = true;
      }
      if (pos == src_.size()) break;
    }
    tokens_.push_back({TokenKind::kEnd, "", position(src_.size())});
    return std::move(tokens_);
  }

 private:
  SourcePosition position(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = size_t(it - line_starts_.begin());
    return {int(line), int(offset - line_starts_[line - 1]) + 1};
  }

  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, std::move(text), position(offset)});
  }

  // Lexes the inside of {{ }} or {% %} starting at `pos`; returns the offset after the tag.
  StatusOr<size_t> lex_tag(size_t tag, bool variable, size_t pos, bool* strip_after, bool* keep_newline) {
    tokens_.push_back({variable ? TokenKind::kVariableBegin : TokenKind::kBlockBegin, "", position(tag)});
    const char closer = variable ? '}' : '%';
    int depth = 0;  // Open ( [ {: a "}}" inside a dict literal does not end the tag.
    while (true) {
      while (pos < src_.size() && (src_[pos] == ' ' || src_[pos] == '\t' || src_[pos] == '\n' || src_[pos] == '\r'))
        ++pos;
      if (pos >= src_.size())
        return error_at(position(tag), variable ? "unclosed '{{' (no matching '}}')" : "unclosed '{%' (no matching '%}')");
      const char c = src_[pos];
      auto ends_at = [&](size_t at) { return at + 1 < src_.size() && src_[at] == closer && src_[at + 1] == '}'; };
      if (depth == 0 && (c == '-' || c == '+') && ends_at(pos + 1)) {
        *strip_after = c == '-';
        *keep_newline = c == '+';
        tokens_.push_back({variable ? TokenKind::kVariableEnd : TokenKind::kBlockEnd, "", position(pos)});
        return pos + 3;
      }
      if (depth == 0 && ends_at(pos)) {
        tokens_.push_back({variable ? TokenKind::kVariableEnd : TokenKind::kBlockEnd, "", position(pos)});
        return pos + 2;
      }
      const size_t start = pos;
      if (is_name_start(c)) {
        while (pos < src_.size() && is_name_char(src_[pos])) ++pos;
        tokens_.push_back({TokenKind::kName, src_.substr(start, pos - start), position(start)});
      } else if (is_digit(c)) {
        PD_ASSIGN_OR_RETURN(pos, lex_number(pos));
      } else if (c == '\'' || c == '"') {
        PD_ASSIGN_OR_RETURN(pos, lex_string(pos));
      } else {
        static constexpr const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* two : kTwo)
          if (src_.compare(pos, 2, two) == 0) op = two;
        if (op.size() == 1 && std::string("+-*/%~<>=.,:|()[]{}").find(c) == std::string::npos)
          return error_at(position(pos), absl::StrCat("unexpected character '", std::string(1, c), "'"));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        pos += op.size();
        tokens_.push_back({TokenKind::kOperator, op, position(start)});
      }
    }
  }

  StatusOr<size_t> lex_number(size_t pos) {
    const size_t start = pos;
    auto digits = [&] {
      while (pos < src_.size() && (is_digit(src_[pos]) || (src_[pos] == '_' && pos + 1 < src_.size() && is_digit(src_[pos + 1]))))
        ++pos;
    };
    digits();
    bool is_float = false;
    // After a '.', a number is an attribute index (x.0.1 is x[0][1]), never a float.
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == TokenKind::kOperator && tokens_.back().text == ".";
    if (!after_dot && pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
      ++pos;
      digits();
      is_float = true;
    }
    if (!after_dot && pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t k = pos + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && is_digit(src_[k])) {
        pos = k;
        digits();
        is_float = true;
      }
    }
    std::string text = src_.substr(start, pos - start);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInteger, std::move(text), position(start)});
    return pos;
  }

  // A quoted string with Python's escapes (jinja2 decodes them as "unicode-escape").
  StatusOr<size_t> lex_string(size_t pos) {
    const size_t start = pos;
    const char quote = src_[pos++];
    std::string out;
    while (true) {
      if (pos >= src_.size()) return error_at(position(start), "unclosed string literal");
      const char c = src_[pos++];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= src_.size()) return error_at(position(start), "unclosed string literal");
      const char e = src_[pos++];
      switch (e) {
        case '\n': break;  // A line continuation.
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int i = 0; i < n; ++i) {
            const int h = pos < src_.size() ? hex_value(src_[pos]) : -1;
            if (h < 0) return error_at(position(pos), absl::StrCat("truncated \\", std::string(1, e), " escape in a string"));
            v = v * 16 + uint32_t(h);
            ++pos;
          }
          if (v > 0x10ffff) return error_at(position(pos), "a \\U escape beyond U+10FFFF");
          append_utf8(out, v);
          break;
        }
        case 'N': return error_at(position(pos - 2), "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int i = 0; i < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++i)
              v = v * 8 + uint32_t(src_[pos++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';  // Python keeps an unknown escape as written.
            out += e;
          }
      }
    }
    tokens_.push_back({TokenKind::kString, std::move(out), position(start)});
    return pos;
  }

  std::string src_;
  LexOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> lex(absl::string_view source, const LexOptions& options) {
  return Lexer(normalize_newlines(source), options).run();
}

}  // namespace pdserve::jinja
