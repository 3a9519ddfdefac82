// The interpreter: walks a Program's syntax tree over Python values, writing
// the output, within the limits ChatTemplate::Limits sets. Its filters and
// tests are in filters.cc and the str/dict/list methods in methods.cc.
#ifndef CHUNKATTN_TEXT_JINJA_INTERPRETER_H_
#define CHUNKATTN_TEXT_JINJA_INTERPRETER_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "text/chat_template.h"
#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace chunkattn {
namespace jinja {

// A scope (the context's variables, a loop iteration, a macro call); names
// not found are looked up in the parent, up to the globals.
struct Frame {
  absl::flat_hash_map<std::string, Value> vars;
  Frame* parent = nullptr;
  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

// How a statement ended: break and continue travel up to their loop.
enum class Flow { kNormal, kBreak, kContinue };

// One render of a Program; not shared between threads.
class Interp {
 public:
  Interp(const ChatTemplate::Limits& limits, Frame* root) : limits_(limits), root_(root) {}

  std::string out;  // what the template has written

  Flow Exec(const Body& body, Frame* frame);
  Value Eval(const Expr& e, Frame* f);
  Value CallValue(const Value& fn, const Args& args);

  Value CallMethod(const Value& obj, const std::string& name, const Args& a);  // methods.cc
  Value Filter(const std::string& name, const Value& v, const Args& a);        // filters.cc
  bool Test(const std::string& name, const Value& v, const Args& a);           // filters.cc

  // obj.name: a method (bound), else a dict's key; Undefined when neither.
  Value GetAttr(const Value& obj, const std::string& name);
  // obj[key], else the attribute named `key`; Undefined when neither.
  Value GetItem(const Value& obj, const Value& key);

  // Output, steps and depth count against the limits; each fails past its own.

  void Write(std::string_view s) {
    if (out.size() + s.size() > limits_.max_output_bytes)
      Fail(absl::StrCat("the output exceeds ", limits_.max_output_bytes, " bytes"));
    out.append(s);
  }

  void Step() {
    if (++steps_ > limits_.max_steps) Fail(absl::StrCat("the template ran over ", limits_.max_steps, " steps"));
  }

  struct Depth {
    explicit Depth(Interp* in) : in_(in) {
      if (++in_->depth_ > in_->limits_.max_depth)
        Fail(absl::StrCat("the template nests deeper than ", in_->limits_.max_depth));
    }
    ~Depth() { --in_->depth_; }
    Interp* in_;
  };

 private:
  Value BoundMethod(const Value& obj, const std::string& name);
  Args EvalArgs(const Expr& e, size_t first, Frame* f);

  Flow ExecNode(const Node& n, Frame* f);
  void Assign(const std::vector<std::string>& targets, const Value& v, Frame* f);
  // A set statement's target: its names, or "ns.attr" on a namespace().
  void Assign(const Node& set, const Value& v, Frame* f);
  Value Arith(const std::string& op, const Value& a, const Value& b);
  Value MakeMacro(const Node& n);

  const ChatTemplate::Limits& limits_;
  Frame* root_;
  long steps_ = 0;
  int depth_ = 0;
};

// jinja2's globals, the sandbox's bounded range, and transformers' two.
void AddGlobals(Frame* globals);

}  // namespace jinja
}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_JINJA_INTERPRETER_H_
