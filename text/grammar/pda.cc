#include "text/grammar/pda.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "text/utf8.h"

namespace chunkattn::grammar {

namespace {

// A rule this small (NFA states, callees inlined) that is not recursive is
// inlined into its callers.
constexpr int64_t kInlineMaxStates = 64;
constexpr int32_t kInlineMaxChain = 16;
// A counted repetition of at least this many copies is tagged as a chain.
constexpr int32_t kMinChainCopies = 8;

struct ByteSeq {
  uint8_t lo[4];
  uint8_t hi[4];
  int len;
};

void EncodeUtf8(uint32_t cp, int n, uint8_t* out) {
  std::string s;
  AppendUtf8(cp, &s);
  for (int i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(s[i]);
}

// Code points [lo, hi] of one encoded length n as byte-range sequences (the
// split that makes each a product of byte ranges).
void SplitSameLength(uint32_t lo, uint32_t hi, int n, std::vector<ByteSeq>* out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitSameLength(lo, lo | m, n, out);
        SplitSameLength((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        SplitSameLength(lo, (hi & ~m) - 1, n, out);
        SplitSameLength(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  ByteSeq seq;
  seq.len = n;
  EncodeUtf8(lo, n, seq.lo);
  EncodeUtf8(hi, n, seq.hi);
  out->push_back(seq);
}

void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteSeq>* out) {
  static constexpr uint32_t kMax[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  uint32_t start = 0;
  for (int n = 1; n <= 4; ++n) {
    const uint32_t a = std::max(lo, start), b = std::min(hi, kMax[n - 1]);
    if (a <= b) SplitSameLength(a, b, n, out);
    start = kMax[n - 1] + 1;
  }
}

struct NfaEdge {
  enum Kind : uint8_t { kEps, kByte, kCall } kind;
  uint8_t lo, hi;
  int32_t rule;
  int32_t to;
};

}  // namespace

class PdaBuilder {
 public:
  PdaBuilder(const Grammar& g, const Limits& limits) : g_(g), limits_(limits) {}

  absl::StatusOr<std::shared_ptr<const Pda>> Build() {
    RETURN_IF_ERROR(g_.Validate(limits_));
    FindInlinable();
    // Rules kept as calls, numbered densely.
    rule_map_.assign(g_.num_rules(), -1);
    std::vector<int32_t> kept;
    for (int32_t r = 0; r < g_.num_rules(); ++r) {
      if (!inline_[r]) {
        rule_map_[r] = static_cast<int32_t>(kept.size());
        kept.push_back(r);
      }
    }
    // Only rules reachable from the root matter; others are built too (cheap)
    // but never entered.
    std::vector<int32_t> nfa_start(kept.size()), nfa_final(kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      nfa_start[i] = NewState();
      ASSIGN_OR_RETURN(int32_t end, BuildExpr(g_.rule(kept[i]).body, nfa_start[i], 0));
      nfa_final[i] = end;
    }
    ComputeByteClasses();
    auto pda = std::shared_ptr<Pda>(new Pda());
    pda_ = pda.get();
    pda_->root_ = rule_map_[g_.root()];
    for (size_t i = 0; i < kept.size(); ++i) pda_->rule_names_.push_back(g_.rule(kept[i]).name);
    RETURN_IF_ERROR(Determinize(nfa_start, nfa_final));
    RETURN_IF_ERROR(TrimAndCompact());
    Minimize();
    RETURN_IF_ERROR(CheckLeftRecursion());
    ComputeShortest();
    CheckChains();
    return std::shared_ptr<const Pda>(std::move(pda));
  }

 private:
  // --- Inlining --------------------------------------------------------------

  void CollectRefs(Grammar::ExprId id, std::vector<int32_t>* out) const {
    const Grammar::Expr& e = g_.expr(id);
    if (e.kind == Grammar::Kind::kRef) out->push_back(e.rule);
    for (Grammar::ExprId c : e.items) CollectRefs(c, out);
  }

  // Estimated NFA states of `id` with inlinable callees expanded; saturates.
  int64_t EstimateSize(Grammar::ExprId id, std::vector<int64_t>* rule_size) const {
    const Grammar::Expr& e = g_.expr(id);
    auto sat = [](int64_t v) { return std::min<int64_t>(v, int64_t{1} << 40); };
    switch (e.kind) {
      case Grammar::Kind::kEmpty: return 0;
      case Grammar::Kind::kLiteral: return static_cast<int64_t>(e.literal.size());
      case Grammar::Kind::kClass: return 4 * static_cast<int64_t>(e.ranges.size()) + 4;
      case Grammar::Kind::kRef:
        return inline_[e.rule] ? (*rule_size)[e.rule] : 1;
      case Grammar::Kind::kSeq:
      case Grammar::Kind::kAlt: {
        int64_t s = 1;
        for (Grammar::ExprId c : e.items) s = sat(s + EstimateSize(c, rule_size));
        return s;
      }
      case Grammar::Kind::kRepeat: {
        const int64_t n = e.max == Grammar::kUnbounded ? std::max(e.min, 1) : std::max(e.max, 1);
        return sat(2 + n * EstimateSize(e.items[0], rule_size));
      }
    }
    return 1;
  }

  void FindInlinable() {
    const int32_t n = g_.num_rules();
    std::vector<std::vector<int32_t>> refs(n);
    for (int32_t r = 0; r < n; ++r) CollectRefs(g_.rule(r).body, &refs[r]);
    // Tarjan's SCCs: a rule in a cycle (or calling itself) is recursive.
    std::vector<int32_t> index(n, -1), low(n, 0), scc(n, -1);
    std::vector<bool> on_stack(n, false);
    std::vector<int32_t> stack;
    int32_t counter = 0, num_scc = 0;
    std::vector<int32_t> scc_size;
    // Iterative to survive long rule chains.
    for (int32_t root = 0; root < n; ++root) {
      if (index[root] >= 0) continue;
      std::vector<std::pair<int32_t, size_t>> work = {{root, 0}};
      index[root] = low[root] = counter++;
      stack.push_back(root);
      on_stack[root] = true;
      while (!work.empty()) {
        auto& [v, i] = work.back();
        if (i < refs[v].size()) {
          const int32_t w = refs[v][i++];
          if (index[w] < 0) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on_stack[w] = true;
            work.push_back({w, 0});
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          int32_t size = 0;
          while (true) {
            const int32_t w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            scc[w] = num_scc;
            ++size;
            if (w == v) break;
          }
          scc_size.push_back(size);
          ++num_scc;
        }
        const int32_t done = v;
        work.pop_back();
        if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[done]);
      }
    }
    inline_.assign(n, false);
    std::vector<int64_t> rule_size(n, 1);
    // Tarjan emits SCCs callees first, so sizes of callees are known in order.
    std::vector<int32_t> order(n);
    for (int32_t r = 0; r < n; ++r) order[r] = r;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scc[a] < scc[b]; });
    // Chains of inlined rules stay short, so that building one (recursively)
    // stays shallow whatever the grammar.
    std::vector<int32_t> chain(n, 0);
    for (int32_t r : order) {
      const bool self = std::find(refs[r].begin(), refs[r].end(), r) != refs[r].end();
      const bool recursive = self || scc_size[scc[r]] > 1;
      for (int32_t callee : refs[r]) {
        if (callee != r && inline_[callee]) chain[r] = std::max(chain[r], chain[callee] + 1);
      }
      rule_size[r] = EstimateSize(g_.rule(r).body, &rule_size);
      inline_[r] = !recursive && !g_.rule(r).no_inline && r != g_.root() && rule_size[r] <= kInlineMaxStates &&
                   chain[r] < kInlineMaxChain;
    }
  }

  // --- Thompson NFA ----------------------------------------------------------

  int32_t NewState() {
    edges_.emplace_back();
    return static_cast<int32_t>(edges_.size() - 1);
  }
  void AddEdge(int32_t from, NfaEdge e) { edges_[from].push_back(e); }
  void Eps(int32_t from, int32_t to) { AddEdge(from, {NfaEdge::kEps, 0, 0, -1, to}); }

  absl::Status TooBig() const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "grammar automaton too large: over %d states (a repetition {m,n}, maxLength or maxItems, or the "
        "grammar itself, is too big)",
        limits_.max_nfa_states));
  }

  // Builds `id` starting at `from`; returns the state where it ends.
  absl::StatusOr<int32_t> BuildExpr(Grammar::ExprId id, int32_t from, int depth) {
    if (static_cast<int64_t>(edges_.size()) > limits_.max_nfa_states) return TooBig();
    if (depth > (kInlineMaxChain + 1) * (4 * limits_.max_nesting_depth + 64)) {
      return absl::InvalidArgumentError("grammar nested too deeply");
    }
    const Grammar::Expr& e = g_.expr(id);
    switch (e.kind) {
      case Grammar::Kind::kEmpty:
        return from;
      case Grammar::Kind::kLiteral: {
        int32_t cur = from;
        for (char c : e.literal) {
          const int32_t next = NewState();
          const uint8_t b = static_cast<uint8_t>(c);
          AddEdge(cur, {NfaEdge::kByte, b, b, -1, next});
          cur = next;
        }
        return cur;
      }
      case Grammar::Kind::kClass: {
        const int32_t to = NewState();
        std::vector<ByteSeq> seqs;
        for (const CodepointRange& r : e.ranges) SplitUtf8(r.lo, r.hi, &seqs);
        for (const ByteSeq& s : seqs) {
          int32_t cur = from;
          for (int i = 0; i < s.len; ++i) {
            const int32_t next = i + 1 == s.len ? to : NewState();
            AddEdge(cur, {NfaEdge::kByte, s.lo[i], s.hi[i], -1, next});
            cur = next;
          }
        }
        return to;
      }
      case Grammar::Kind::kRef: {
        if (inline_[e.rule]) return BuildExpr(g_.rule(e.rule).body, from, depth + 1);
        const int32_t to = NewState();
        AddEdge(from, {NfaEdge::kCall, 0, 0, rule_map_[e.rule], to});
        return to;
      }
      case Grammar::Kind::kSeq: {
        int32_t cur = from;
        for (Grammar::ExprId c : e.items) {
          ASSIGN_OR_RETURN(cur, BuildExpr(c, cur, depth + 1));
        }
        return cur;
      }
      case Grammar::Kind::kAlt: {
        const int32_t to = NewState();
        for (Grammar::ExprId c : e.items) {
          // A fresh entry per branch keeps one branch's loops out of another's.
          const int32_t entry = NewState();
          Eps(from, entry);
          ASSIGN_OR_RETURN(int32_t end, BuildExpr(c, entry, depth + 1));
          Eps(end, to);
        }
        return to;
      }
      case Grammar::Kind::kRepeat: {
        // The outermost long repetition is a chain; repetitions inside one
        // of its copies are part of the copy.
        const bool bounded = e.max != Grammar::kUnbounded;
        int32_t rep = -1;
        if (!in_chain_ && (bounded ? e.max : e.min) >= kMinChainCopies) {
          rep = static_cast<int32_t>(reps_.size());
          reps_.push_back({bounded ? std::numeric_limits<int32_t>::max() : e.min});
          in_chain_ = true;
        }
        // One copy of the item after `prev`, the `count`th; returns its end.
        auto copy = [&](int32_t prev, int32_t count) -> absl::StatusOr<int32_t> {
          const int32_t entry = NewState();
          Eps(prev, entry);
          ASSIGN_OR_RETURN(int32_t end, BuildExpr(e.items[0], entry, depth + 1));
          if (rep >= 0) TagCopy(rep, count, entry, end);
          return end;
        };
        int32_t cur = from;
        for (int32_t i = 0; i < e.min; ++i) {
          ASSIGN_OR_RETURN(cur, copy(cur, i));
        }
        int32_t out;
        if (!bounded) {
          out = NewState();  // the loop's head
          Eps(cur, out);
          ASSIGN_OR_RETURN(int32_t end, copy(out, e.min));
          Eps(end, out);
        } else {
          out = NewState();
          for (int32_t i = e.min; i < e.max; ++i) {
            Eps(cur, out);
            ASSIGN_OR_RETURN(cur, copy(cur, i));
          }
          Eps(cur, out);
        }
        if (rep >= 0) in_chain_ = false;
        return out;
      }
    }
    return from;
  }

  // Tags the NFA states of copy `count` of repetition `rep`, [entry, the
  // states built since): states reached from the entry without a byte are
  // the boundary before the copy (count copies done), its end the boundary
  // after it; other states with a byte edge keep their offset in the copy,
  // the same in every copy.
  void TagCopy(int32_t rep, int32_t count, int32_t entry, int32_t end) {
    Repetition& r = reps_[rep];
    const int32_t size = static_cast<int32_t>(edges_.size()) - entry;
    if (r.copy_size >= 0 && r.copy_size != size) r.valid = false;
    r.copy_size = size;
    tags_.resize(edges_.size());
    for (int32_t s = entry; s < entry + size; ++s) {
      for (const NfaEdge& x : edges_[s]) {
        if (x.kind == NfaEdge::kByte) {
          tags_[s] = {rep, count, s - entry};
          break;
        }
      }
    }
    std::vector<int32_t> work = {entry};
    tags_[entry] = {rep, count, kBoundary};
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      if (s == end) r.valid = false;  // the item matches "": counts are ambiguous
      for (const NfaEdge& x : edges_[s]) {
        if (x.kind == NfaEdge::kEps && x.to >= entry && x.to < entry + size && tags_[x.to].code != kBoundary) {
          tags_[x.to] = {rep, count, kBoundary};
          work.push_back(x.to);
        }
      }
    }
    if (end >= entry && end < entry + size) {
      tags_[end] = {rep, std::min(count + 1, r.cap), kBoundary};
    } else {
      r.valid = false;
    }
  }

  // The chain template (interned) and count of a deterministic state's NFA
  // set: its tagged states, all of one repetition, relative to the lowest
  // count among them; {-1, 0} when it has none or several repetitions.
  std::pair<int32_t, int32_t> ChainOf(const std::vector<int32_t>& set) {
    int32_t rep = -1, low = std::numeric_limits<int32_t>::max();
    for (int32_t s : set) {
      if (s >= static_cast<int32_t>(tags_.size()) || tags_[s].rep < 0) continue;
      if (rep >= 0 && tags_[s].rep != rep) return {-1, 0};
      rep = tags_[s].rep;
      low = std::min(low, tags_[s].count);
    }
    if (rep < 0 || !reps_[rep].valid) return {-1, 0};
    std::vector<std::pair<int32_t, int32_t>> shape;
    for (int32_t s : set) {
      if (s < static_cast<int32_t>(tags_.size()) && tags_[s].rep == rep) {
        shape.push_back({tags_[s].count - low, tags_[s].code});
      }
    }
    std::sort(shape.begin(), shape.end());
    shape.erase(std::unique(shape.begin(), shape.end()), shape.end());
    std::vector<int32_t> key = {rep};
    for (const auto& [dc, code] : shape) {
      key.push_back(dc);
      key.push_back(code);
    }
    auto [it, inserted] = template_ids_.try_emplace(std::move(key), static_cast<int32_t>(template_rep_.size()));
    if (inserted) template_rep_.push_back(rep);
    return {it->second, low};
  }

  void ComputeByteClasses() {
    bool boundary[257] = {};
    for (const auto& list : edges_) {
      for (const NfaEdge& e : list) {
        if (e.kind != NfaEdge::kByte) continue;
        boundary[e.lo] = true;
        boundary[e.hi + 1] = true;
      }
    }
    int32_t cls = -1;
    for (int b = 0; b < 256; ++b) {
      if (b == 0 || boundary[b]) ++cls;
      pda_byte_class_[b] = static_cast<uint8_t>(cls);
    }
    num_classes_ = cls + 1;
  }

  // --- Subset construction per rule -------------------------------------------

  void Closure(std::vector<int32_t>* set) {
    ++stamp_;
    if (mark_.size() < edges_.size()) mark_.resize(edges_.size(), 0);
    std::vector<int32_t> work = *set;
    for (int32_t s : *set) mark_[s] = stamp_;
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      for (const NfaEdge& e : edges_[s]) {
        if (e.kind == NfaEdge::kEps && mark_[e.to] != stamp_) {
          mark_[e.to] = stamp_;
          set->push_back(e.to);
          work.push_back(e.to);
        }
      }
    }
    std::sort(set->begin(), set->end());
  }

  absl::Status Determinize(const std::vector<int32_t>& nfa_start, const std::vector<int32_t>& nfa_final) {
    Pda& p = *pda_;
    p.num_classes_ = num_classes_;
    std::copy(pda_byte_class_, pda_byte_class_ + 256, p.byte_class_);
    struct RawState {
      int32_t rule;
      bool final;
      std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, target)
    };
    std::vector<RawState> raw;
    std::vector<int32_t> next;  // raw transitions
    std::vector<std::vector<int32_t>> bucket(num_classes_);
    absl::flat_hash_map<int32_t, std::vector<int32_t>> call_bucket;
    for (size_t r = 0; r < nfa_start.size(); ++r) {
      absl::flat_hash_map<std::vector<int32_t>, int32_t> ids;
      std::vector<std::vector<int32_t>> sets;
      std::vector<int32_t> start = {nfa_start[r]};
      Closure(&start);
      auto intern = [&](std::vector<int32_t> set) -> int32_t {
        auto it = ids.find(set);
        if (it != ids.end()) return it->second;
        const int32_t id = static_cast<int32_t>(raw.size());
        const bool is_final = std::binary_search(set.begin(), set.end(), nfa_final[r]);
        raw.push_back(RawState{static_cast<int32_t>(r), is_final, {}});
        const auto [chain, count] = ChainOf(set);
        raw_chain_.push_back(chain);
        raw_chain_count_.push_back(count);
        next.resize(next.size() + num_classes_, -1);
        ids.emplace(set, id);
        sets.push_back(std::move(set));
        return id;
      };
      const int32_t first = intern(std::move(start));
      p.rule_start_.push_back(first);
      for (size_t done = 0; first + done < raw.size(); ++done) {
        const int32_t id = first + static_cast<int32_t>(done);
        if (static_cast<int64_t>(raw.size()) > limits_.max_dfa_states) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "grammar automaton too large: over %d deterministic states (limit max_dfa_states)",
              limits_.max_dfa_states));
        }
        for (auto& b : bucket) b.clear();
        call_bucket.clear();
        for (int32_t s : sets[done]) {
          for (const NfaEdge& e : edges_[s]) {
            if (e.kind == NfaEdge::kByte) {
              for (int c = pda_byte_class_[e.lo]; c <= pda_byte_class_[e.hi]; ++c) bucket[c].push_back(e.to);
            } else if (e.kind == NfaEdge::kCall) {
              call_bucket[e.rule].push_back(e.to);
            }
          }
        }
        for (int32_t c = 0; c < num_classes_; ++c) {
          if (bucket[c].empty()) continue;
          std::vector<int32_t> set = bucket[c];
          std::sort(set.begin(), set.end());
          set.erase(std::unique(set.begin(), set.end()), set.end());
          Closure(&set);
          const int32_t target = intern(std::move(set));
          next[static_cast<size_t>(id) * num_classes_ + c] = target;
        }
        std::vector<std::pair<int32_t, int32_t>> calls;
        for (auto& [rule, targets] : call_bucket) {
          std::vector<int32_t> set = targets;
          std::sort(set.begin(), set.end());
          set.erase(std::unique(set.begin(), set.end()), set.end());
          Closure(&set);
          calls.push_back({rule, intern(std::move(set))});
        }
        std::sort(calls.begin(), calls.end());
        raw[id].calls = std::move(calls);
      }
    }
    raw_rule_.clear();
    raw_final_.clear();
    raw_calls_.clear();
    for (RawState& s : raw) {
      raw_rule_.push_back(s.rule);
      raw_final_.push_back(s.final);
      raw_calls_.push_back(std::move(s.calls));
    }
    raw_next_ = std::move(next);
    return absl::OkStatus();
  }

  // Drops states from which their rule cannot finish (and calls to rules that
  // never finish), then renumbers the live states reachable from rule starts.
  absl::Status TrimAndCompact() {
    Pda& p = *pda_;
    const int32_t n = static_cast<int32_t>(raw_final_.size());
    const int32_t num_rules = static_cast<int32_t>(p.rule_start_.size());
    std::vector<uint8_t> alive(n, 0);
    for (int32_t s = 0; s < n; ++s) alive[s] = raw_final_[s];
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t s = n; s-- > 0;) {
        if (alive[s]) continue;
        bool ok = false;
        for (int32_t c = 0; c < num_classes_ && !ok; ++c) {
          const int32_t t = raw_next_[static_cast<size_t>(s) * num_classes_ + c];
          ok = t >= 0 && alive[t];
        }
        for (const auto& [rule, ret] : raw_calls_[s]) {
          if (ok) break;
          ok = alive[p.rule_start_[rule]] && alive[ret];
        }
        if (ok) {
          alive[s] = 1;
          changed = true;
        }
      }
    }
    if (!alive[p.rule_start_[p.root_]]) return absl::InvalidArgumentError("the grammar matches no string");
    // Renumber: BFS from the root's start over live edges, entering callees.
    std::vector<int32_t> id(n, -1);
    std::vector<int32_t> order;
    auto visit = [&](int32_t s) {
      if (id[s] < 0) {
        id[s] = static_cast<int32_t>(order.size());
        order.push_back(s);
      }
    };
    visit(p.rule_start_[p.root_]);
    for (size_t i = 0; i < order.size(); ++i) {
      const int32_t s = order[i];
      for (int32_t c = 0; c < num_classes_; ++c) {
        const int32_t t = raw_next_[static_cast<size_t>(s) * num_classes_ + c];
        if (t >= 0 && alive[t]) visit(t);
      }
      for (const auto& [rule, ret] : raw_calls_[s]) {
        if (alive[p.rule_start_[rule]] && alive[ret]) {
          visit(p.rule_start_[rule]);
          visit(ret);
        }
      }
    }
    const int32_t m = static_cast<int32_t>(order.size());
    p.next_.assign(static_cast<size_t>(m) * num_classes_, -1);
    p.final_.assign(m, 0);
    p.has_bytes_.assign(m, 0);
    p.rule_of_.assign(m, 0);
    p.call_begin_.assign(m + 1, 0);
    p.calls_.clear();
    p.chain_of_.assign(m, -1);
    p.chain_count_.assign(m, 0);
    for (int32_t i = 0; i < m; ++i) {
      const int32_t s = order[i];
      p.final_[i] = raw_final_[s];
      p.rule_of_[i] = raw_rule_[s];
      p.chain_of_[i] = raw_chain_[s];
      p.chain_count_[i] = raw_chain_count_[s];
      for (int32_t c = 0; c < num_classes_; ++c) {
        const int32_t t = raw_next_[static_cast<size_t>(s) * num_classes_ + c];
        if (t >= 0 && alive[t]) {
          p.next_[static_cast<size_t>(i) * num_classes_ + c] = id[t];
          p.has_bytes_[i] = 1;
          ++p.num_transitions_;
        }
      }
      p.call_begin_[i] = static_cast<int32_t>(p.calls_.size());
      for (const auto& [rule, ret] : raw_calls_[s]) {
        if (alive[p.rule_start_[rule]] && alive[ret]) {
          p.calls_.push_back({rule, id[ret]});
          ++p.num_transitions_;
        }
      }
    }
    p.call_begin_[m] = static_cast<int32_t>(p.calls_.size());
    for (int32_t r = 0; r < num_rules; ++r) {
      // Rules never entered keep a start of -1... but calls only target
      // visited ones; give unvisited rules a harmless start.
      const int32_t s = p.rule_start_[r];
      p.rule_start_[r] = id[s];
    }
    return absl::OkStatus();
  }

  // Merges states of a rule that behave alike (Moore's partition refinement,
  // calls as symbols): fewer positions to classify and to keep per mask. A
  // string rule's "after the quote", "after a character" and "after an
  // escape" states become one. States of a chain start apart by template and
  // count: counts differ only on strings as long as the rest of the
  // repetition, which would take as many rounds to tell (states alike across
  // counts then stay apart: a few more states, never a wrong merge).
  // Skipped, leaving the automaton as it is, when refinement would take too
  // long.
  void Minimize() {
    Pda& p = *pda_;
    const int32_t n = p.num_states();
    const int64_t budget = int64_t{40} << 20;  // state-symbol visits
    std::vector<int32_t> block(n), next_block(n);
    absl::flat_hash_map<std::vector<int32_t>, int32_t> ids;
    std::vector<int32_t> key;
    auto refine = [&](const std::vector<int32_t>& cur, std::vector<int32_t>* out, bool initial) {
      ids.clear();
      for (int32_t s = 0; s < n; ++s) {
        key.clear();
        key.push_back(p.rule_of_[s]);
        key.push_back(p.final_[s]);
        key.push_back(p.chain_of_[s]);
        key.push_back(p.chain_count_[s]);
        if (!initial) {
          key.push_back(cur[s]);
          for (int32_t c = 0; c < num_classes_; ++c) {
            const int32_t t = p.NextByClass(s, c);
            key.push_back(t < 0 ? -1 : cur[t]);
          }
          for (const Pda::Call& call : p.calls(s)) {
            key.push_back(call.rule);
            key.push_back(cur[call.ret]);
          }
        }
        auto [it, inserted] = ids.try_emplace(key, static_cast<int32_t>(ids.size()));
        (*out)[s] = it->second;
      }
      return static_cast<int32_t>(ids.size());
    };
    int32_t blocks = refine(block, &block, /*initial=*/true);
    int64_t work = 0;
    while (true) {
      work += static_cast<int64_t>(n) * (num_classes_ + 4);
      if (work > budget) return;
      const int32_t refined = refine(block, &next_block, /*initial=*/false);
      block.swap(next_block);
      if (refined == blocks) break;
      blocks = refined;
    }
    if (blocks == n) return;
    // One representative per block; transitions through blocks.
    std::vector<int32_t> rep(blocks, -1);
    for (int32_t s = 0; s < n; ++s) {
      if (rep[block[s]] < 0) rep[block[s]] = s;
    }
    std::vector<int32_t> next(static_cast<size_t>(blocks) * num_classes_, -1);
    std::vector<uint8_t> final(blocks), has_bytes(blocks);
    std::vector<int32_t> rule_of(blocks), call_begin(blocks + 1), chain_of(blocks), chain_count(blocks);
    std::vector<Pda::Call> calls;
    int64_t transitions = 0;
    for (int32_t b = 0; b < blocks; ++b) {
      const int32_t s = rep[b];
      final[b] = p.final_[s];
      has_bytes[b] = p.has_bytes_[s];
      rule_of[b] = p.rule_of_[s];
      chain_of[b] = p.chain_of_[s];
      chain_count[b] = p.chain_count_[s];
      for (int32_t c = 0; c < num_classes_; ++c) {
        const int32_t t = p.NextByClass(s, c);
        if (t >= 0) {
          next[static_cast<size_t>(b) * num_classes_ + c] = block[t];
          ++transitions;
        }
      }
      call_begin[b] = static_cast<int32_t>(calls.size());
      for (const Pda::Call& call : p.calls(s)) {
        calls.push_back({call.rule, block[call.ret]});
        ++transitions;
      }
    }
    call_begin[blocks] = static_cast<int32_t>(calls.size());
    for (int32_t& start : p.rule_start_) {
      if (start >= 0) start = block[start];
    }
    p.next_ = std::move(next);
    p.final_ = std::move(final);
    p.has_bytes_ = std::move(has_bytes);
    p.rule_of_ = std::move(rule_of);
    p.chain_of_ = std::move(chain_of);
    p.chain_count_ = std::move(chain_count);
    p.call_begin_ = std::move(call_begin);
    p.calls_ = std::move(calls);
    p.num_transitions_ = transitions;
  }

  absl::Status CheckLeftRecursion() {
    Pda& p = *pda_;
    const int32_t num_rules = p.num_rules();
    // Nullable rules: those whose start reaches a final state without bytes.
    std::vector<uint8_t> nullable(num_rules, 0);
    auto zero_reach = [&](int32_t start, std::vector<int32_t>* out) {
      std::vector<int32_t> work = {start};
      std::vector<int32_t> seen = {start};
      while (!work.empty()) {
        const int32_t s = work.back();
        work.pop_back();
        out->push_back(s);
        for (const Pda::Call& c : p.calls(s)) {
          if (!nullable[c.rule]) continue;
          if (std::find(seen.begin(), seen.end(), c.ret) == seen.end()) {
            seen.push_back(c.ret);
            work.push_back(c.ret);
          }
        }
      }
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t r = 0; r < num_rules; ++r) {
        if (nullable[r] || p.rule_start_[r] < 0) continue;
        std::vector<int32_t> reach;
        zero_reach(p.rule_start_[r], &reach);
        for (int32_t s : reach) {
          if (p.is_final(s)) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Left-call graph: r -> q when r can call q before consuming a byte.
    std::vector<std::vector<int32_t>> left(num_rules);
    for (int32_t r = 0; r < num_rules; ++r) {
      if (p.rule_start_[r] < 0) continue;
      std::vector<int32_t> reach;
      zero_reach(p.rule_start_[r], &reach);
      for (int32_t s : reach) {
        for (const Pda::Call& c : p.calls(s)) left[r].push_back(c.rule);
      }
    }
    std::vector<uint8_t> color(num_rules, 0);  // 0 new, 1 on path, 2 done
    for (int32_t r = 0; r < num_rules; ++r) {
      if (color[r]) continue;
      std::vector<std::pair<int32_t, size_t>> work = {{r, 0}};
      color[r] = 1;
      while (!work.empty()) {
        auto& [v, i] = work.back();
        if (i < left[v].size()) {
          const int32_t w = left[v][i++];
          if (color[w] == 1) {
            return absl::InvalidArgumentError(
                absl::StrCat("left recursion through rule '", p.rule_names_[w],
                             "': a rule reaches itself without consuming input (rewrite it right-recursively)"));
          }
          if (color[w] == 0) {
            color[w] = 1;
            work.push_back({w, 0});
          }
          continue;
        }
        color[v] = 2;
        work.pop_back();
      }
    }
    return absl::OkStatus();
  }

  // Fewest bytes (then fewest moves, so that following the best moves always
  // terminates) from each state to the end of its rule.
  void ComputeShortest() {
    Pda& p = *pda_;
    const int32_t n = p.num_states();
    constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
    constexpr int64_t kStep = 1;
    constexpr int64_t kByte = int64_t{1} << 32;  // bytes dominate moves
    std::vector<int64_t> cost(n, kInf);
    p.best_move_.assign(n, -1);
    std::vector<int32_t> rep(num_classes_, -1);
    for (int b = 255; b >= 0; --b) rep[p.byte_class_[b]] = b;  // smallest byte of each class
    for (int32_t s = 0; s < n; ++s) {
      if (p.is_final(s)) cost[s] = 0;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t s = n; s-- > 0;) {
        if (cost[s] == 0) continue;
        int64_t best = cost[s];
        int32_t move = p.best_move_[s];
        for (int32_t c = 0; c < num_classes_; ++c) {
          const int32_t t = p.NextByClass(s, c);
          if (t < 0 || cost[t] >= kInf) continue;
          const int64_t v = kByte + kStep + cost[t];
          if (v < best) {
            best = v;
            move = rep[c];
          }
        }
        for (int32_t k = p.call_begin_[s]; k < p.call_begin_[s + 1]; ++k) {
          const Pda::Call& c = p.calls_[k];
          const int64_t callee = cost[p.rule_start_[c.rule]];
          if (callee >= kInf || cost[c.ret] >= kInf) continue;
          const int64_t v = callee + kStep + cost[c.ret];
          if (v < best) {
            best = v;
            move = -2 - k;
          }
        }
        if (best < cost[s]) {
          cost[s] = best;
          p.best_move_[s] = move;
          changed = true;
        }
      }
    }
    p.min_bytes_.resize(n);
    for (int32_t s = 0; s < n; ++s) p.min_bytes_[s] = static_cast<int32_t>(cost[s] / kByte);
  }

  // Keeps the chain templates whose states behave as Pda::ChainTemplate
  // describes (the tags only propose them), renumbered densely; a
  // repetition with one template that does not is ungrouped entirely.
  void CheckChains() {
    Pda& p = *pda_;
    const int32_t n = p.num_states();
    const int32_t num_templates = static_cast<int32_t>(template_rep_.size());
    std::vector<uint8_t> leaf(p.num_rules(), 1);
    for (int32_t s = 0; s < n; ++s) {
      if (!p.calls(s).empty()) leaf[p.rule_of(s)] = 0;
    }
    std::vector<std::vector<int32_t>> members(num_templates);
    for (int32_t s = 0; s < n; ++s) {
      if (p.chain_of_[s] >= 0) members[p.chain_of_[s]].push_back(s);
    }
    std::vector<uint8_t> bad(reps_.size(), 0);
    std::vector<Pda::ChainTemplate> tables(num_templates);
    for (int32_t tp = 0; tp < num_templates; ++tp) {
      const std::vector<int32_t>& states = members[tp];
      if (states.empty()) continue;
      const int32_t rep = template_rep_[tp];
      Pda::ChainTemplate& table = tables[tp];
      table.cap = reps_[rep].cap;
      bool ok = true;
      for (int32_t s : states) ok = ok && leaf[p.rule_of(s)];
      // The counts of the states where `holds` is true, when they are all
      // the template's counts in an interval.
      auto interval = [&](auto holds, int32_t* lo, int32_t* hi) {
        *lo = std::numeric_limits<int32_t>::max();
        *hi = std::numeric_limits<int32_t>::min();
        for (int32_t s : states) {
          if (!holds(s)) continue;
          *lo = std::min(*lo, p.chain_count_[s]);
          *hi = std::max(*hi, p.chain_count_[s]);
        }
        for (int32_t s : states) {
          if (!holds(s) && p.chain_count_[s] >= *lo && p.chain_count_[s] <= *hi) return false;
        }
        return true;
      };
      ok = ok && interval([&](int32_t s) { return p.is_final(s); }, &table.final_lo, &table.final_hi);
      table.moves.resize(num_classes_);
      for (int32_t c = 0; ok && c < num_classes_; ++c) {
        Pda::ChainMove& mv = table.moves[c];
        int64_t delta = -1, saturating = 0;
        for (int32_t s : states) {
          const int32_t t = p.NextByClass(s, c);
          if (t < 0) continue;
          const bool exit = p.chain_of_[t] < 0 || template_rep_[p.chain_of_[t]] != rep;
          const int32_t to = exit ? t : p.chain_of_[t];
          if (mv.to < 0) {
            mv.to = to;
            mv.exit = exit;
          }
          if (mv.to != to || mv.exit != exit) ok = false;
          if (exit) continue;
          const int64_t from_count = p.chain_count_[s], to_count = p.chain_count_[t];
          if (to_count < table.cap) {
            if (to_count < from_count || (delta >= 0 && delta != to_count - from_count)) ok = false;
            delta = to_count - from_count;
          } else {
            saturating = std::max(saturating, table.cap - from_count);
          }
        }
        if (!ok || mv.to < 0) continue;
        if (!mv.exit) {
          mv.delta = static_cast<int32_t>(delta >= 0 ? delta : saturating);
          for (int32_t s : states) {
            const int32_t t = p.NextByClass(s, c);
            if (t >= 0 && p.chain_count_[t] != std::min<int64_t>(p.chain_count_[s] + int64_t{mv.delta}, table.cap)) {
              ok = false;
            }
          }
        }
        ok = ok && interval([&](int32_t s) { return p.NextByClass(s, c) >= 0; }, &mv.lo, &mv.hi);
      }
      if (!ok) bad[rep] = 1;
    }
    std::vector<int32_t> id(num_templates, -1);
    for (int32_t tp = 0; tp < num_templates; ++tp) {
      if (members[tp].empty() || bad[template_rep_[tp]]) continue;
      id[tp] = static_cast<int32_t>(p.chains_.size());
      p.chains_.push_back(std::move(tables[tp]));
    }
    for (Pda::ChainTemplate& table : p.chains_) {
      for (Pda::ChainMove& mv : table.moves) {
        if (mv.to >= 0 && !mv.exit) mv.to = id[mv.to];
      }
    }
    for (int32_t s = 0; s < n; ++s) {
      if (p.chain_of_[s] < 0) continue;
      p.chain_of_[s] = id[p.chain_of_[s]];
      if (p.chain_of_[s] < 0) p.chain_count_[s] = 0;
    }
  }

  // Counted repetitions expanded copy by copy (chains).
  struct Repetition {
    int32_t cap;  // counts saturate here (the loop of x{m,}: m); else INT32_MAX
    int32_t copy_size = -1;  // NFA states of one copy, the same in every copy
    bool valid = true;
  };
  static constexpr int32_t kBoundary = -1;
  // Where an NFA state sits in a repetition: its copy and its offset there,
  // or kBoundary between two copies (count: the copies done).
  struct NfaTag {
    int32_t rep = -1;
    int32_t count = 0;
    int32_t code = 0;
  };

  const Grammar& g_;
  const Limits& limits_;
  std::vector<bool> inline_;
  std::vector<int32_t> rule_map_;
  std::vector<std::vector<NfaEdge>> edges_;
  uint8_t pda_byte_class_[256] = {};
  int32_t num_classes_ = 0;
  std::vector<int32_t> mark_;
  int32_t stamp_ = 0;
  Pda* pda_ = nullptr;
  std::vector<int32_t> raw_rule_;
  std::vector<uint8_t> raw_final_;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> raw_calls_;
  std::vector<int32_t> raw_next_;
  std::vector<int32_t> raw_chain_, raw_chain_count_;
  std::vector<Repetition> reps_;
  std::vector<NfaTag> tags_;  // by NFA state; untagged past its end
  bool in_chain_ = false;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> template_ids_;
  std::vector<int32_t> template_rep_;  // by template id
};

absl::StatusOr<std::shared_ptr<const Pda>> Pda::Build(const Grammar& grammar, const Limits& limits) {
  return PdaBuilder(grammar, limits).Build();
}

void Pda::AppendShortestFinish(int32_t state, std::string* out) const {
  int32_t s = state;
  while (best_move_[s] != -1) {
    const int32_t move = best_move_[s];
    if (move >= 0) {
      out->push_back(static_cast<char>(move));
      s = Next(s, static_cast<uint8_t>(move));
    } else {
      const Call& c = calls_[-2 - move];
      AppendShortestFinish(rule_start_[c.rule], out);
      s = c.ret;
    }
  }
}

}  // namespace chunkattn::grammar
