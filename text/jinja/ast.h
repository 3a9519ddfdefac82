// The syntax tree the parser builds and the interpreter walks: expressions,
// statements, and the parsed template (Program). Immutable once parsed.
#ifndef CHUNKATTN_TEXT_JINJA_AST_H_
#define CHUNKATTN_TEXT_JINJA_AST_H_

#include <memory>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace chunkattn {
namespace jinja {

// An expression; what `name`, `kids` and `ops` hold depends on its type.
struct Expr {
  enum Type {
    kConst, kName, kList, kTuple, kDict, kAttr, kItem, kSlice, kCall, kFilter, kTest,
    kNeg, kPos, kNot, kAnd, kOr, kBinary, kCompare, kCond, kConcat
  } type;
  int line = 0;
  Value value;                               // kConst
  std::string name;                          // kName, kAttr, kFilter, kTest, kBinary's op
  std::vector<std::unique_ptr<Expr>> kids;   // operands; for kCall/kFilter/kTest: [obj, args...]
  std::vector<std::string> kw_names;         // names of the trailing keyword arguments
  std::vector<std::string> ops;              // kCompare: the operators between kids
  bool negate = false;                       // kTest: "is not"
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

// Literal text or a statement.
struct Node {
  enum Type { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue } type;
  int line = 0;
  std::string text;                   // kText
  ExprPtr expr;                       // kOutput, kSet value, kFor iterable
  std::vector<ExprPtr> conds;         // kIf: one per branch; kFor: [filter] if any
  std::vector<Body> bodies;           // kIf: per branch (+ else); kFor: body (+ else)
  std::vector<std::string> targets;   // kFor, kSet: names; kSet "ns.attr": {"ns", "attr"} with attr_target
  bool attr_target = false;
  std::string macro_name;             // kMacro
  std::vector<std::string> params;    // kMacro
  std::vector<ExprPtr> defaults;      // kMacro: one per param (null when none)
};

// A parsed template, which ChatTemplate shares between renders.
struct Program {
  Body body;
};

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_AST_H_
