// The interpreter: statements, expressions, Python's arithmetic, attribute
// and item lookup, macros, and the globals a template starts with.
#include "text/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "text/jinja/builtins.h"
#include "text/jinja/py_str.h"
#include "text/jinja/repr.h"
#include "text/utf8.h"

namespace chunkattn {
namespace jinja {

namespace {

// Python's slice.indices() and the slice itself.
Value SliceOf(const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  auto given = [](const Value& v) { return !v.is_undefined() && v.kind != Kind::kNone; };
  const int64_t step = given(step_v) ? AsInt(step_v) : 1;
  if (step == 0) Fail("slice step cannot be zero");
  std::vector<char32_t> cps;
  int64_t n;
  if (obj.kind == Kind::kString) {
    cps = CodePoints(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.kind == Kind::kList) {
    n = static_cast<int64_t>(obj.list->size());
  } else {
    if (obj.is_undefined()) FailUndefined(obj);
    Fail(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t x = AsInt(v);
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) idx.push_back(k);
  if (obj.kind == Kind::kString) {
    std::string out;
    for (int64_t k : idx) AppendUtf8(cps[k], &out);
    return Value::Str(std::move(out));
  }
  List out;
  for (int64_t k : idx) out.push_back((*obj.list)[k]);
  return Value::MakeList(std::move(out), obj.tuple);
}

Value UnsafeAttribute(const Value& obj, const std::string& name) {
  Value u = Value::Undefined(absl::StrCat("access to attribute '", name, "' of '", TypeName(obj),
                                          "' object is unsafe."));
  u.unsafe = true;
  return u;
}

Value MakeCallable(std::string name, std::function<Value(Interp&, const Args&)> fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

}  // namespace

Flow Interp::Exec(const Body& body, Frame* frame) {
  for (const auto& node : body) {
    const Flow flow = ExecNode(*node, frame);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Value Interp::CallValue(const Value& fn, const Args& args) {
  if (fn.kind != Kind::kCallable) {
    if (fn.is_undefined()) FailUndefined(fn);
    Fail(absl::StrCat("'", TypeName(fn), "' object is not callable"));
  }
  Step();
  Depth depth(this);
  return fn.fn->call(*this, args);
}

Value Interp::GetAttr(const Value& obj, const std::string& name) {
  bool unsafe = false;
  if (obj.is_undefined()) FailUndefined(obj);
  if (IsMethod(obj, name, &unsafe)) {
    if (unsafe) return UnsafeAttribute(obj, name);
    return BoundMethod(obj, name);
  }
  if (obj.kind == Kind::kDict) {
    if (const Value* v = obj.dict->Find(name)) return *v;
  }
  return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
}

Value Interp::GetItem(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::kUndefined: FailUndefined(obj);
    case Kind::kList:
    case Kind::kString:
      if (key.kind == Kind::kInt || key.kind == Kind::kBool) {
        int64_t i = AsInt(key);
        if (obj.kind == Kind::kList) {
          const int64_t n = static_cast<int64_t>(obj.list->size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return (*obj.list)[i];
        } else {
          const std::vector<char32_t> cps = CodePoints(obj.str());
          const int64_t n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::Str(FromCodePoints(&cps[i], &cps[i] + 1));
        }
      }
      break;
    case Kind::kDict:
      if (!obj.ns) {
        if (const Value* v = obj.dict->Find(key)) return *v;
      }
      break;
    default: break;
  }
  if (key.kind == Kind::kString) return GetAttr(obj, key.str());
  return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no element ", Repr(key)));
}

Value Interp::BoundMethod(const Value& obj, const std::string& name) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<const Callable>(Callable{
      name, [obj, name](Interp& in, const Args& a) { return in.CallMethod(obj, name, a); }});
  return v;
}

Args Interp::EvalArgs(const Expr& e, size_t first, Frame* f) {
  Args a;
  const size_t n_kw = e.kw_names.size();
  const size_t n_pos = e.kids.size() - first - n_kw;
  for (size_t k = 0; k < n_pos; ++k) a.pos.push_back(Eval(*e.kids[first + k], f));
  for (size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kw_names[k], Eval(*e.kids[first + n_pos + k], f));
  return a;
}

void Interp::Assign(const std::vector<std::string>& targets, const Value& v, Frame* f) {
  if (targets.size() == 1) {
    f->vars[targets[0]] = v;
    return;
  }
  const std::vector<Value> items = Iterate(v);
  if (items.size() != targets.size()) {
    Fail(absl::StrCat(items.size() < targets.size() ? "not enough" : "too many",
                      " values to unpack (expected ", targets.size(), ", got ", items.size(), ")"));
  }
  for (size_t k = 0; k < targets.size(); ++k) f->vars[targets[k]] = items[k];
}

void Interp::Assign(const Node& set, const Value& v, Frame* f) {
  if (!set.attr_target) {
    Assign(set.targets, v, f);
    return;
  }
  const Value* ns = f->Find(set.targets[0]);
  if (ns == nullptr || ns->kind != Kind::kDict || !ns->ns)
    Fail(absl::StrCat("line ", set.line, ": cannot assign attribute on non-namespace object"));
  ns->dict->Set(Value::Str(set.targets[1]), v);
}

Value Interp::MakeMacro(const Node& n) {
  Value v;
  v.kind = Kind::kCallable;
  Frame* root = root_;
  const Node* node = &n;
  v.fn = std::make_shared<const Callable>(Callable{n.macro_name, [node, root](Interp& in, const Args& a) {
    Frame frame;
    frame.parent = root;
    if (a.pos.size() > node->params.size())
      Fail(absl::StrCat("macro '", node->macro_name, "' takes not more than ", node->params.size(),
                        " argument(s)"));
    for (const auto& [k, _] : a.kw) {
      if (std::find(node->params.begin(), node->params.end(), k) == node->params.end())
        Fail(absl::StrCat("macro '", node->macro_name, "' takes no keyword argument '", k, "'"));
    }
    for (size_t p = 0; p < node->params.size(); ++p) {
      Value arg = a.Get(p, node->params[p]);
      if (arg.is_undefined() && p >= a.pos.size()) {
        bool by_kw = false;
        for (const auto& [k, _] : a.kw) by_kw |= k == node->params[p];
        if (!by_kw) {
          arg = node->defaults[p] ? in.Eval(*node->defaults[p], &frame)
                                  : Value::Undefined(absl::StrCat("'", node->params[p], "' is undefined"));
        }
      }
      frame.vars[node->params[p]] = arg;
    }
    std::string saved;
    saved.swap(in.out);
    in.Exec(node->bodies[0], &frame);
    saved.swap(in.out);
    return Value::Str(std::move(saved));
  }});
  return v;
}

Flow Interp::ExecNode(const Node& n, Frame* f) {
  Step();
  switch (n.type) {
    case Node::kText: Write(n.text); return Flow::kNormal;
    case Node::kOutput: {
      const Value v = Eval(*n.expr, f);
      Write(PyStr(v));
      return Flow::kNormal;
    }
    case Node::kIf:
      for (size_t b = 0; b < n.conds.size(); ++b) {
        if (n.conds[b] == nullptr || Truthy(Eval(*n.conds[b], f))) return Exec(n.bodies[b], f);
      }
      if (n.bodies.size() > n.conds.size()) return Exec(n.bodies.back(), f);
      return Flow::kNormal;
    case Node::kFor: {
      std::vector<Value> items = Iterate(Eval(*n.expr, f));
      if (!n.conds.empty()) {
        std::vector<Value> kept;
        for (Value& item : items) {
          Step();
          Frame probe;
          probe.parent = f;
          Assign(n.targets, item, &probe);
          if (Truthy(Eval(*n.conds[0], &probe))) kept.push_back(std::move(item));
        }
        items = std::move(kept);
      }
      if (items.empty()) {
        if (n.bodies.size() > 1) return Exec(n.bodies[1], f);
        return Flow::kNormal;
      }
      const int64_t length = static_cast<int64_t>(items.size());
      Value cycle;
      cycle.kind = Kind::kCallable;
      for (int64_t k = 0; k < length; ++k) {
        Step();
        Frame frame;
        frame.parent = f;
        Assign(n.targets, items[k], &frame);
        Value loop = Value::MakeDict();
        auto set = [&](const char* key, Value v) { loop.dict->items.emplace_back(Value::Str(key), std::move(v)); };
        set("index", Value::Int(k + 1));
        set("index0", Value::Int(k));
        set("revindex", Value::Int(length - k));
        set("revindex0", Value::Int(length - k - 1));
        set("first", Value::Bool(k == 0));
        set("last", Value::Bool(k == length - 1));
        set("length", Value::Int(length));
        set("depth", Value::Int(1));
        set("depth0", Value::Int(0));
        set("previtem", k > 0 ? items[k - 1] : Value::Undefined("there is no previous item"));
        set("nextitem", k + 1 < length ? items[k + 1] : Value::Undefined("there is no next item"));
        cycle.fn = std::make_shared<const Callable>(Callable{"cycle", [k](Interp&, const Args& a) {
          if (a.pos.empty()) Fail("no items for cycling given");
          return a.pos[static_cast<size_t>(k) % a.pos.size()];
        }});
        set("cycle", cycle);
        frame.vars["loop"] = std::move(loop);
        const Flow flow = Exec(n.bodies[0], &frame);
        if (flow == Flow::kBreak) break;
      }
      return Flow::kNormal;
    }
    case Node::kSet: {
      const Value v = Eval(*n.expr, f);
      Assign(n, v, f);
      return Flow::kNormal;
    }
    case Node::kSetBlock: {
      std::string saved;
      saved.swap(out);
      Exec(n.bodies[0], f);
      saved.swap(out);
      Assign(n, Value::Str(std::move(saved)), f);
      return Flow::kNormal;
    }
    case Node::kMacro: f->vars[n.macro_name] = MakeMacro(n); return Flow::kNormal;
    case Node::kBreak: return Flow::kBreak;
    case Node::kContinue: return Flow::kContinue;
  }
  return Flow::kNormal;
}

Value Interp::Arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  const bool ints = (a.kind == Kind::kInt || a.kind == Kind::kBool) && (b.kind == Kind::kInt || b.kind == Kind::kBool);
  const bool nums = a.is_number() && b.is_number();
  auto unsupported = [&]() -> Value {
    Fail(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '", TypeName(b), "'"));
  };
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(AsInt(a), AsInt(b), &r)) Fail("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(AsDouble(a) + AsDouble(b));
    if (a.kind == Kind::kString && b.kind == Kind::kString) {
      if (a.s->size() + b.s->size() > limits_.max_output_bytes) Fail("string too long");
      return Value::Str(a.str() + b.str());
    }
    if (a.kind == Kind::kList && b.kind == Kind::kList && a.tuple == b.tuple) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::MakeList(std::move(items), a.tuple);
    }
    if (a.kind == Kind::kString || b.kind == Kind::kString)
      Fail(absl::StrCat("can only concatenate str (not \"", TypeName(a.kind == Kind::kString ? b : a), "\") to str"));
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(AsInt(a), AsInt(b), &r)) Fail("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(AsDouble(a) - AsDouble(b));
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(AsInt(a), AsInt(b), &r)) Fail("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(AsDouble(a) * AsDouble(b));
    const Value* seq = a.kind == Kind::kString || a.kind == Kind::kList ? &a : &b;
    const Value* times = seq == &a ? &b : &a;
    if ((seq->kind == Kind::kString || seq->kind == Kind::kList) &&
        (times->kind == Kind::kInt || times->kind == Kind::kBool)) {
      const int64_t n = std::max<int64_t>(AsInt(*times), 0);
      const size_t unit = seq->kind == Kind::kString ? seq->s->size() : seq->list->size() * 16;
      if (unit > 0 && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit) Fail("repetition too long");
      if (seq->kind == Kind::kString) {
        std::string r;
        for (int64_t k = 0; k < n; ++k) r += seq->str();
        return Value::Str(std::move(r));
      }
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return Value::MakeList(std::move(items), seq->tuple);
    }
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (AsDouble(b) == 0) Fail("division by zero");
    return Value::Float(AsDouble(a) / AsDouble(b));
  }
  if (op == "//" || op == "%") {
    if (a.kind == Kind::kString && op == "%") Fail("printf-style string formatting is not supported");
    if (!nums) return unsupported();
    if (ints) {
      const int64_t x = AsInt(a), y = AsInt(b);
      if (y == 0) Fail("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) Fail("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::Int(op == "//" ? q : r);
    }
    const double x = AsDouble(a), y = AsDouble(b);
    if (y == 0) Fail("float division by zero");
    if (op == "//") return Value::Float(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Float(r);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && AsInt(b) >= 0) {
      int64_t base = AsInt(a), exp = AsInt(b), r = 1;
      while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(r, base, &r)) Fail("integer overflow");
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) Fail("integer overflow");
      }
      return Value::Int(r);
    }
    return Value::Float(std::pow(AsDouble(a), AsDouble(b)));
  }
  Fail("unknown operator " + op);
}

Value Interp::Eval(const Expr& e, Frame* f) {
  Depth depth(this);
  switch (e.type) {
    case Expr::kConst: return e.value;
    case Expr::kName: {
      if (const Value* v = f->Find(e.name)) return *v;
      return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
    }
    case Expr::kList:
    case Expr::kTuple: {
      List items;
      for (const auto& k : e.kids) items.push_back(Eval(*k, f));
      return Value::MakeList(std::move(items), e.type == Expr::kTuple);
    }
    case Expr::kDict: {
      Value d = Value::MakeDict();
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) d.dict->Set(Eval(*e.kids[k], f), Eval(*e.kids[k + 1], f));
      return d;
    }
    case Expr::kAttr: return GetAttr(Eval(*e.kids[0], f), e.name);
    case Expr::kItem: return GetItem(Eval(*e.kids[0], f), Eval(*e.kids[1], f));
    case Expr::kSlice: {
      const Value obj = Eval(*e.kids[0], f);
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (e.kids[k + 1]) parts[k] = Eval(*e.kids[k + 1], f);
      return SliceOf(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::kCall: {
      const Expr& callee = *e.kids[0];
      if (callee.type == Expr::kAttr) {
        const Value obj = Eval(*callee.kids[0], f);
        bool unsafe = false;
        if (!obj.is_undefined() && IsMethod(obj, callee.name, &unsafe)) {
          if (unsafe) FailUndefined(UnsafeAttribute(obj, callee.name));
          Args a = EvalArgs(e, 1, f);
          Step();
          return CallMethod(obj, callee.name, a);
        }
        const Value fn = GetAttr(obj, callee.name);
        return CallValue(fn, EvalArgs(e, 1, f));
      }
      const Value fn = Eval(callee, f);
      return CallValue(fn, EvalArgs(e, 1, f));
    }
    case Expr::kFilter: {
      const Value v = Eval(*e.kids[0], f);
      Step();
      return Filter(e.name, v, EvalArgs(e, 1, f));
    }
    case Expr::kTest: {
      const Value v = Eval(*e.kids[0], f);
      const bool r = Test(e.name, v, EvalArgs(e, 1, f));
      return Value::Bool(r != e.negate);
    }
    case Expr::kNeg:
    case Expr::kPos: {
      const Value v = Eval(*e.kids[0], f);
      if (v.is_undefined()) FailUndefined(v);
      if (!v.is_number()) Fail(absl::StrCat("bad operand type for unary ", e.type == Expr::kNeg ? "-" : "+", ": '", TypeName(v), "'"));
      if (e.type == Expr::kPos) return v.kind == Kind::kBool ? Value::Int(AsInt(v)) : v;
      if (v.kind == Kind::kFloat) return Value::Float(-v.f);
      if (AsInt(v) == std::numeric_limits<int64_t>::min()) Fail("integer overflow");
      return Value::Int(-AsInt(v));
    }
    case Expr::kNot: return Value::Bool(!Truthy(Eval(*e.kids[0], f)));
    case Expr::kAnd: {
      Value a = Eval(*e.kids[0], f);
      return Truthy(a) ? Eval(*e.kids[1], f) : a;
    }
    case Expr::kOr: {
      Value a = Eval(*e.kids[0], f);
      return Truthy(a) ? a : Eval(*e.kids[1], f);
    }
    case Expr::kBinary: return Arith(e.name, Eval(*e.kids[0], f), Eval(*e.kids[1], f));
    case Expr::kCompare: {
      Value left = Eval(*e.kids[0], f);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = Eval(*e.kids[k + 1], f);
        const std::string& op = e.ops[k];
        bool r;
        if (op == "==") r = Equal(left, right);
        else if (op == "!=") r = !Equal(left, right);
        else if (op == "in") r = Contains(right, left);
        else if (op == "not in") r = !Contains(right, left);
        else {
          const int c = Compare(left, right);
          r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
        }
        if (!r) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case Expr::kCond:
      if (Truthy(Eval(*e.kids[0], f))) return Eval(*e.kids[1], f);
      return e.kids[2] ? Eval(*e.kids[2], f) : Value::Undefined("the conditional expression's else is undefined");
    case Expr::kConcat: {
      std::string s;
      for (const auto& k : e.kids) {
        const Value v = Eval(*k, f);
        s += PyStr(v);
        if (s.size() > limits_.max_output_bytes) Fail("string too long");
      }
      return Value::Str(std::move(s));
    }
  }
  Fail("unknown expression");
}

void AddGlobals(Frame* globals) {
  globals->vars["range"] = MakeCallable("range", [](Interp&, const Args& a) {
    if (a.pos.empty() || a.pos.size() > 3) Fail("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = AsInt(a.pos[0]);
    } else {
      start = AsInt(a.pos[0]);
      stop = AsInt(a.pos[1]);
      if (a.pos.size() == 3) step = AsInt(a.pos[2]);
    }
    if (step == 0) Fail("range() arg 3 must not be zero");
    const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - start) / step));
    if (count > 100000) Fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    List items;
    for (int64_t x = start; step > 0 ? x < stop : x > stop; x += step) items.push_back(Value::Int(x));
    return Value::MakeList(std::move(items));
  });
  globals->vars["dict"] = MakeCallable("dict", [](Interp&, const Args& a) {
    Value d = Value::MakeDict();
    if (!a.pos.empty()) {
      if (a.pos.size() > 1 || a.pos[0].kind != Kind::kDict) Fail("dict() takes a mapping and keywords");
      d.dict->items = a.pos[0].dict->items;
    }
    for (const auto& [k, v] : a.kw) d.dict->Set(Value::Str(k), v);
    return d;
  });
  globals->vars["namespace"] = MakeCallable("namespace", [](Interp&, const Args& a) {
    Value ns = Value::MakeDict();
    ns.ns = true;
    for (const Value& p : a.pos) {
      if (p.kind != Kind::kDict) Fail("namespace() takes mappings and keywords");
      for (const auto& [k, v] : p.dict->items) ns.dict->Set(k, v);
    }
    for (const auto& [k, v] : a.kw) ns.dict->Set(Value::Str(k), v);
    return ns;
  });
  globals->vars["raise_exception"] = MakeCallable("raise_exception", [](Interp&, const Args& a) -> Value {
    throw Error{a.pos.empty() ? std::string() : PyStr(a.pos[0]), true};
  });
  globals->vars["strftime_now"] = MakeCallable("strftime_now", [](Interp&, const Args& a) {
    const Value fmt = a.Get(0, "format");
    if (fmt.kind != Kind::kString) Fail("strftime_now takes a format string");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt.str().c_str(), &local);
    return Value::Str(std::string(buf, n));
  });
}

}  // namespace jinja
}  // namespace chunkattn
