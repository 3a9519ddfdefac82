// The parser: a recursive-descent expression parser over one tag's tokens,
// and a statement parser over the segments that nests bodies up to their end
// tags.
#include "text/jinja/parser.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "text/jinja/builtins.h"

namespace chunkattn {
namespace jinja {
namespace {

// Recursion in the parsers is bounded: a hostile template of a million "("
// or nested ifs is an error, not a stack overflow.
constexpr int kMaxParseNesting = 256;

struct NestingGuard {
  NestingGuard(int* depth, int line) : depth_(depth) {
    if (++*depth_ > kMaxParseNesting) {
      Fail(absl::StrCat("line ", line, ": nested deeper than ", kMaxParseNesting));
    }
  }
  ~NestingGuard() { --*depth_; }
  int* depth_;
};

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, size_t pos) : t_(tokens), pos_(pos) {}
  size_t pos() const { return pos_; }
  const Token& cur() const { return t_[pos_]; }
  bool AtEnd() const { return cur().type == Tok::kEnd; }
  bool IsOp(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool IsName(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  [[noreturn]] void Unexpected() const {
    Fail(absl::StrCat("line ", cur().line, ": unexpected ",
                      AtEnd() ? std::string("end of tag") : "'" + cur().text + "'"));
  }
  void Expect(const char* op) {
    if (!IsOp(op)) {
      Fail(absl::StrCat("line ", cur().line, ": expected '", op, "', got ",
                        AtEnd() ? std::string("end of tag") : "'" + cur().text + "'"));
    }
    ++pos_;
  }
  std::string ExpectName() {
    if (cur().type != Tok::kName) Unexpected();
    return t_[pos_++].text;
  }

  ExprPtr Make(Expr::Type type) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = cur().line;
    return e;
  }

  // A tuple without parentheses where jinja allows one ({% set %}, {% for %}).
  // with_cond false: the elements take no "x if c else y" (a for loop's
  // iterable, whose "if" is the loop's filter).
  ExprPtr ParseTuple(bool with_cond = true) {
    auto element = [&]() { return with_cond ? ParseExpression() : ParseOr(); };
    ExprPtr first = element();
    if (!IsOp(",")) return first;
    ExprPtr tuple = Make(Expr::kTuple);
    tuple->kids.push_back(std::move(first));
    while (IsOp(",")) {
      ++pos_;
      if (AtEnd() || IsName("if")) break;
      tuple->kids.push_back(element());
    }
    return tuple;
  }

  ExprPtr ParseExpression() {
    const NestingGuard guard(&depth_, cur().line);
    ExprPtr e = ParseOr();
    if (IsName("if")) {
      ++pos_;
      ExprPtr cond = ParseOr();
      ExprPtr other;
      if (IsName("else")) {
        ++pos_;
        other = ParseExpression();
      }
      ExprPtr c = Make(Expr::kCond);
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(other));  // null: undefined
      return c;
    }
    return e;
  }

 private:
  ExprPtr Binary(Expr::Type type, ExprPtr a, ExprPtr b, std::string op = "") {
    ExprPtr e = Make(type);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      ++pos_;
      e = Binary(Expr::kOr, std::move(e), ParseAnd());
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      ++pos_;
      e = Binary(Expr::kAnd, std::move(e), ParseNot());
    }
    return e;
  }
  ExprPtr ParseNot() {
    const NestingGuard guard(&depth_, cur().line);
    if (IsName("not")) {
      ExprPtr e = Make(Expr::kNot);
      ++pos_;
      e->kids.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && t_[pos_ + 1].type == Tok::kName && t_[pos_ + 1].text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::kCompare);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = t_[pos_++].text;
      e = Binary(Expr::kBinary, std::move(e), ParseConcat(), op);
    }
    return e;
  }
  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    if (!IsOp("~")) return e;
    ExprPtr c = Make(Expr::kConcat);
    c->kids.push_back(std::move(e));
    while (IsOp("~")) {
      ++pos_;
      c->kids.push_back(ParseMath2());
    }
    return c;
  }
  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = t_[pos_++].text;
      e = Binary(Expr::kBinary, std::move(e), ParsePow(), op);
    }
    return e;
  }
  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      ++pos_;
      e = Binary(Expr::kBinary, std::move(e), ParseUnary(true), "**");
    }
    return e;
  }
  ExprPtr ParseUnary(bool with_filter) {
    const NestingGuard guard(&depth_, cur().line);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(IsOp("-") ? Expr::kNeg : Expr::kPos);
      ++pos_;
      e->kids.push_back(ParseUnary(false));
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        ++pos_;
        if (t.text == "true" || t.text == "True") return Const(Value::Bool(true), t.line);
        if (t.text == "false" || t.text == "False") return Const(Value::Bool(false), t.line);
        if (t.text == "none" || t.text == "None") return Const(Value::None(), t.line);
        ExprPtr e = Make(Expr::kName);
        e->line = t.line;
        e->name = t.text;
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (cur().type == Tok::kString) s += t_[pos_++].text;  // adjacent literals join
        return Const(Value::Str(std::move(s)), t.line);
      }
      case Tok::kInt: ++pos_; return Const(Value::Int(t.i), t.line);
      case Tok::kFloat: ++pos_; return Const(Value::Float(t.f), t.line);
      case Tok::kOp:
        if (t.text == "(") {
          ++pos_;
          if (IsOp(")")) {
            ++pos_;
            return Make(Expr::kTuple);
          }
          ExprPtr e = ParseExpression();
          if (IsOp(",")) {
            ExprPtr tuple = Make(Expr::kTuple);
            tuple->kids.push_back(std::move(e));
            while (IsOp(",")) {
              ++pos_;
              if (IsOp(")")) break;
              tuple->kids.push_back(ParseExpression());
            }
            e = std::move(tuple);
          }
          Expect(")");
          return e;
        }
        if (t.text == "[") {
          ++pos_;
          ExprPtr e = Make(Expr::kList);
          while (!IsOp("]")) {
            e->kids.push_back(ParseExpression());
            if (!IsOp(",")) break;
            ++pos_;
          }
          Expect("]");
          return e;
        }
        if (t.text == "{") {
          ++pos_;
          ExprPtr e = Make(Expr::kDict);
          while (!IsOp("}")) {
            e->kids.push_back(ParseExpression());
            Expect(":");
            e->kids.push_back(ParseExpression());
            if (!IsOp(",")) break;
            ++pos_;
          }
          Expect("}");
          return e;
        }
        Unexpected();
      default:
        Unexpected();
    }
  }

  ExprPtr Const(Value v, int line) {
    ExprPtr e = Make(Expr::kConst);
    e->line = line;
    e->value = std::move(v);
    return e;
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        ++pos_;
        ExprPtr a;
        if (cur().type == Tok::kInt) {  // foo.0 is foo[0]
          a = Make(Expr::kItem);
          a->kids.push_back(std::move(e));
          a->kids.push_back(Const(Value::Int(cur().i), cur().line));
          ++pos_;
        } else {
          a = Make(Expr::kAttr);
          a->name = ExpectName();
          a->kids.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        ++pos_;
        e = ParseSubscript(std::move(e));
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e), Expr::kCall, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr obj) {
    ExprPtr parts[3];
    int colons = 0;
    bool any = false;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        if (++colons > 2) Unexpected();
        ++pos_;
        continue;
      }
      if (parts[colons]) Unexpected();
      parts[colons] = ParseExpression();
      any = true;
    }
    ++pos_;
    if (colons == 0) {
      if (!any) Unexpected();
      ExprPtr e = Make(Expr::kItem);
      e->kids.push_back(std::move(obj));
      e->kids.push_back(std::move(parts[0]));
      return e;
    }
    ExprPtr e = Make(Expr::kSlice);
    e->kids.push_back(std::move(obj));
    for (ExprPtr& p : parts) e->kids.push_back(std::move(p));
    return e;
  }

  // "(args)" after a callee, filter or test; positional before keyword.
  ExprPtr ParseCall(ExprPtr obj, Expr::Type type, std::string name) {
    ExprPtr e = Make(type);
    e->name = std::move(name);
    e->kids.push_back(std::move(obj));
    Expect("(");
    while (!IsOp(")")) {
      if (cur().type == Tok::kName && t_[pos_ + 1].type == Tok::kOp && t_[pos_ + 1].text == "=") {
        e->kw_names.push_back(cur().text);
        pos_ += 2;
        e->kids.push_back(ParseExpression());
      } else {
        if (!e->kw_names.empty()) Fail(absl::StrCat("line ", cur().line, ": positional argument after keyword"));
        e->kids.push_back(ParseExpression());
      }
      if (!IsOp(",")) break;
      ++pos_;
    }
    Expect(")");
    return e;
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ++pos_;
        std::string name = ExpectName();
        while (IsOp(".")) {  // dotted filter names
          ++pos_;
          name += "." + ExpectName();
        }
        if (!IsFilter(name))
          Fail(absl::StrCat("line ", cur().line, ": no filter named '", name, "'"));
        if (IsOp("(")) {
          e = ParseCall(std::move(e), Expr::kFilter, name);
        } else {
          ExprPtr f = Make(Expr::kFilter);
          f->name = name;
          f->kids.push_back(std::move(e));
          e = std::move(f);
        }
      } else if (IsName("is")) {
        ++pos_;
        bool negate = false;
        if (IsName("not")) {
          negate = true;
          ++pos_;
        }
        std::string name;
        if (cur().type == Tok::kName) {
          name = ExpectName();
        } else if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                              cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
          name = t_[pos_++].text;
        } else {
          Unexpected();
        }
        if (!IsTest(name))
          Fail(absl::StrCat("line ", cur().line, ": no test named '", name, "'"));
        ExprPtr test;
        if (IsOp("(")) {
          test = ParseCall(std::move(e), Expr::kTest, name);
        } else {
          test = Make(Expr::kTest);
          test->name = name;
          test->kids.push_back(std::move(e));
          const Token& next = cur();
          const bool starts_arg =
              next.type == Tok::kString || next.type == Tok::kInt || next.type == Tok::kFloat ||
              (next.type == Tok::kName && next.text != "else" && next.text != "or" && next.text != "and") ||
              (next.type == Tok::kOp && (next.text == "(" || next.text == "[" || next.text == "{"));
          if (starts_arg) test->kids.push_back(ParsePostfix(ParsePrimary()));
        }
        test->negate = negate;
        e = std::move(test);
      } else if (IsOp("(")) {
        e = ParseCall(std::move(e), Expr::kCall, "");
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_;
  int depth_ = 0;
};

// Statements.
class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segs_(std::move(segments)) {}

  Body ParseAll() {
    std::string end_tag;
    Body body = ParseBody({}, &end_tag);
    return body;
  }

 private:
  // Nodes up to one of `ends` (a statement tag's first word); *end_tag gets it.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end_tag) {
    Body body;
    while (i_ < segs_.size()) {
      Segment& s = segs_[i_];
      if (s.type == Segment::kText) {
        auto n = std::make_unique<Node>();
        n->type = Node::kText;
        n->text = std::move(s.text);
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      if (s.type == Segment::kExpr) {
        ExprParser p(s.tokens, 0);
        auto n = std::make_unique<Node>();
        n->type = Node::kOutput;
        n->line = s.line;
        n->expr = p.ParseTuple();
        if (!p.AtEnd()) p.Unexpected();
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      if (s.tokens[0].type != Tok::kName) Fail(absl::StrCat("line ", s.line, ": expected a tag name"));
      const std::string word = s.tokens[0].text;
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        *end_tag = word;
        return body;
      }
      body.push_back(ParseStatement(word));
    }
    if (!ends.empty()) Fail(absl::StrCat("unexpected end of template: missing '", ends.back(), "'"));
    return body;
  }

  std::unique_ptr<Node> ParseStatement(const std::string& word) {
    Segment& s = segs_[i_];
    const int line = s.line;
    const NestingGuard guard(&nesting_, line);
    ExprParser p(s.tokens, 1);
    auto n = std::make_unique<Node>();
    n->line = line;
    auto finish_tag = [&]() {
      if (!p.AtEnd()) p.Unexpected();
      ++i_;
    };
    // An end tag (else, endif, ...): nothing may follow its name.
    auto closing = [&]() {
      ExprParser c(segs_[i_].tokens, 1);
      if (!c.AtEnd()) c.Unexpected();
      ++i_;
    };
    std::string end;
    if (word == "if") {
      n->type = Node::kIf;
      n->conds.push_back(p.ParseTuple());
      finish_tag();
      while (true) {
        n->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          ExprParser c(segs_[i_].tokens, 1);
          n->conds.push_back(c.ParseTuple());
          if (!c.AtEnd()) c.Unexpected();
          ++i_;
        } else if (end == "else") {
          closing();
          n->bodies.push_back(ParseBody({"endif"}, &end));
          closing();
          break;
        } else {
          closing();
          break;
        }
      }
    } else if (word == "for") {
      n->type = Node::kFor;
      n->targets.push_back(p.ExpectName());
      while (p.IsOp(",")) {
        p.Expect(",");
        n->targets.push_back(p.ExpectName());
      }
      if (!p.IsName("in")) p.Unexpected();
      p.ExpectName();
      // The iterable: an expression without its own "if" (that is the filter).
      n->expr = p.ParseTuple(/*with_cond=*/false);
      if (p.IsName("if")) {
        p.ExpectName();
        n->conds.push_back(p.ParseExpression());
      }
      if (p.IsName("recursive")) Fail(absl::StrCat("line ", line, ": recursive loops are not supported"));
      finish_tag();
      ++loop_depth_;
      n->bodies.push_back(ParseBody({"else", "endfor"}, &end));
      --loop_depth_;
      if (end == "else") {
        closing();
        n->bodies.push_back(ParseBody({"endfor"}, &end));
      }
      closing();
    } else if (word == "set") {
      std::string first = p.ExpectName();
      n->targets.push_back(first);
      if (p.IsOp(".")) {
        p.Expect(".");
        n->targets.push_back(p.ExpectName());
        n->attr_target = true;
      } else {
        while (p.IsOp(",")) {
          p.Expect(",");
          n->targets.push_back(p.ExpectName());
        }
      }
      if (p.IsOp("=")) {
        p.Expect("=");
        n->type = Node::kSet;
        n->expr = p.ParseTuple();
        finish_tag();
      } else {
        if (n->targets.size() > 1 && !n->attr_target)
          Fail(absl::StrCat("line ", line, ": a block set takes one name"));
        n->type = Node::kSetBlock;
        finish_tag();
        n->bodies.push_back(ParseBody({"endset"}, &end));
        closing();
      }
    } else if (word == "macro") {
      n->type = Node::kMacro;
      n->macro_name = p.ExpectName();
      p.Expect("(");
      while (!p.IsOp(")")) {
        n->params.push_back(p.ExpectName());
        if (p.IsOp("=")) {
          p.Expect("=");
          n->defaults.push_back(p.ParseExpression());
        } else {
          n->defaults.push_back(nullptr);
        }
        if (!p.IsOp(",")) break;
        p.Expect(",");
      }
      p.Expect(")");
      finish_tag();
      n->bodies.push_back(ParseBody({"endmacro"}, &end));
      closing();
    } else if (word == "break" || word == "continue") {
      if (loop_depth_ == 0) Fail(absl::StrCat("line ", line, ": '", word, "' outside a loop"));
      n->type = word == "break" ? Node::kBreak : Node::kContinue;
      finish_tag();
    } else if (word == "generation") {
      // transformers' assistant-mask marker: rendered as its body.
      finish_tag();
      Body inner = ParseBody({"endgeneration"}, &end);
      closing();
      n->type = Node::kIf;
      n->conds.push_back(nullptr);  // always
      n->bodies.push_back(std::move(inner));
    } else {
      Fail(absl::StrCat("line ", line, ": unknown or unsupported tag '", word, "'"));
    }
    return n;
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

Body Parse(std::vector<Segment> segments) { return Parser(std::move(segments)).ParseAll(); }

}  // namespace jinja
}  // namespace chunkattn
