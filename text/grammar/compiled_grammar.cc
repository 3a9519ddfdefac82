#include "text/grammar/compiled_grammar.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/grammar/gbnf.h"
#include "text/grammar/regex.h"
#include "text/grammar/stack_machine.h"

namespace chunkattn::grammar {
namespace {

// Starting counts [lo, hi] of a chain template's states; empty when lo > hi.
struct Counts {
  int64_t lo;
  int64_t hi;
  bool empty() const { return lo > hi; }
};
constexpr Counts kAllCounts = {-(int64_t{1} << 40), int64_t{1} << 40};
constexpr Counts kNoCounts = {1, 0};

Counts Meet(Counts a, Counts b) { return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }
Counts Hull(Counts a, Counts b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
}
// The starting counts k for which the count after adding `acc` (capped at
// `cap`), min(k + acc, cap), lies in [lo, hi].
Counts Before(int64_t acc, int64_t cap, int64_t lo, int64_t hi) {
  if (lo > hi || cap < lo) return kNoCounts;
  return {lo - acc, cap <= hi ? kAllCounts.hi : hi - acc};
}

// Classifies every token from one position by walking the vocabulary trie
// with the position's element on an empty stack: a path that pops past the
// bottom has finished the position's rule, and whatever bytes are left
// depend on the callers (uncertain).
//
// From a state of a chain template (pda.h) the walk stands for all of the
// template's states at once: it follows the template's moves while inside
// the chain, narrowing the starting counts for which the path is alive, and
// the automaton itself once the path leaves the chain. So it reports, per
// token, the starting counts that accept it and those that leave it
// uncertain, each an interval (the latter widened to one: uncertain tokens
// are checked against the stack at decode time, so more is only slower).
class PositionClassifier {
 public:
  PositionClassifier(const Pda& pda, const Vocabulary& vocab) : pda_(pda), vocab_(vocab), machine_(&pda) {
    at_.resize(MaxDepth() + 1);
  }

  // Ranks accepted and uncertain from `state`, ascending; adds trie steps
  // to `work`.
  void Classify(int32_t state, std::vector<int32_t>* accepted, std::vector<int32_t>* uncertain, int64_t* work) {
    Walk(state, kAllCounts, work, [&](int32_t begin, int32_t end, Counts accepts, Counts uncertain_at) {
      std::vector<int32_t>* out = !accepts.empty() ? accepted : !uncertain_at.empty() ? uncertain : nullptr;
      if (out != nullptr) {
        for (int32_t r = begin; r < end; ++r) out->push_back(r);
      }
    });
  }

  // Calls emit(begin, end, accepts, uncertain_at) for runs of ranks in
  // ascending order: the tokens of ranks [begin, end) are accepted from
  // `state`'s template at the starting counts `accepts` (within `counts`),
  // else uncertain at `uncertain_at`; tokens never emitted are rejected.
  // Without a template, a count set is either empty or not.
  template <typename Emit>
  void Walk(int32_t state, Counts counts, int64_t* work, Emit&& emit) {
    const auto& trie = vocab_.trie();
    const int32_t num_ranks = static_cast<int32_t>(vocab_.sorted_ids().size());
    auto first_rank = [&](int32_t node) {
      return node < static_cast<int32_t>(trie.size()) ? trie[node].first_rank : num_ranks;
    };
    buf_.clear();
    machine_.TruncateFrames(0);
    const int32_t chain = pda_.chain_of(state);
    at_[0] = {chain, 0, chain >= 0 ? counts : kAllCounts, kNoCounts, 0, 0, 0};
    if (chain < 0) {
      buf_.push_back(StackMachine::Element(state, StackMachine::kBottom));
      at_[0].end = 1;
    }
    const int32_t n = static_cast<int32_t>(trie.size());
    for (int32_t i = 1; i < n;) {
      const Vocabulary::TrieNode& node = trie[i];
      const int d = node.depth;
      // First bytes that leave `state` at all: prune the root's children fast.
      if (d == 1 && chain < 0 && pda_.Next(state, node.byte) < 0) {
        i = node.subtree_end;
        continue;
      }
      const Cursor& up = at_[d - 1];
      Cursor& cur = at_[d];
      buf_.resize(up.end);
      machine_.TruncateFrames(up.frames);
      ++*work;
      cur.chain = -1;
      cur.acc = up.acc;
      // Starting counts for which the path reaches here (a token ending
      // here is accepted), finishes the rule on this byte, and may go on.
      Counts reached = kNoCounts, finished = kNoCounts, go_on = kNoCounts;
      bool completed = false, alive = false;
      if (up.chain >= 0) {
        const Pda::ChainTemplate& from = pda_.chain(up.chain);
        const Pda::ChainMove& move = from.moves[pda_.byte_class(node.byte)];
        const Counts live =
            move.to < 0 ? kNoCounts : Meet(up.live, Before(up.acc, from.cap, move.lo, move.hi));
        if (!live.empty() && !move.exit) {
          const Pda::ChainTemplate& to = pda_.chain(move.to);
          cur.chain = move.to;
          cur.acc = up.acc + move.delta;
          reached = go_on = live;
          finished = Meet(live, Before(cur.acc, to.cap, to.final_lo, to.final_hi));
        } else if (!live.empty()) {
          seeds_.assign(1, StackMachine::Element(move.to, StackMachine::kBottom));
          completed = machine_.Close(seeds_, &buf_);
          alive = buf_.size() > up.end;
          cur.live = live;
        }
      } else {
        // Fast path, most of the walk: one element moving to a plain state.
        const uint64_t only = up.end - up.begin == 1 ? buf_[up.begin] : 0;
        const int32_t next = only ? pda_.Next(StackMachine::StateOf(only), node.byte) : -1;
        if (next >= 0 && !pda_.is_final(next) && pda_.calls(next).empty()) {
          buf_.push_back(StackMachine::Element(next, StackMachine::FrameOf(only)));
        } else {
          completed = machine_.Step(&buf_, up.begin, up.end, node.byte);
        }
        alive = buf_.size() > up.end;
        cur.live = up.live;
      }
      if (cur.chain < 0) {
        if (alive || completed) reached = cur.live;
        if (completed) finished = cur.live;
        if (alive) go_on = cur.live;
      }
      if (node.token_begin < node.token_end) emit(node.token_begin, node.token_end, reached, up.escaped);
      const Counts escaped = Hull(up.escaped, finished);
      if (go_on.empty()) {
        const int32_t end = first_rank(node.subtree_end);
        if (node.token_end < end) emit(node.token_end, end, kNoCounts, escaped);
        i = node.subtree_end;
        continue;
      }
      cur.live = go_on;
      cur.escaped = escaped;
      cur.begin = up.end;
      cur.end = buf_.size();
      cur.frames = machine_.num_frames();
      ++i;
    }
  }

 private:
  // The walk after a prefix of the current token.
  struct Cursor {
    int32_t chain;     // the template while inside a chain, else -1 (elements buf_[begin, end))
    int64_t acc;       // count added since the start
    Counts live;       // starting counts for which the prefix is alive
    Counts escaped;    // ... for which the rule finished on an earlier byte
    size_t begin, end, frames;
  };

  size_t MaxDepth() const {
    size_t d = 0;
    for (const auto& node : vocab_.trie()) d = std::max<size_t>(d, node.depth);
    return d;
  }

  const Pda& pda_;
  const Vocabulary& vocab_;
  StackMachine machine_;
  std::vector<uint64_t> buf_, seeds_;
  std::vector<Cursor> at_;
};

int64_t ClassesBytes(const CompiledGrammar::TokenClasses& tc) {
  return static_cast<int64_t>((tc.accepted_ids.size() + tc.accepted_bits.size() + tc.uncertain_ranks.size()) * 4 +
                              sizeof(tc));
}

// A canonical description of everything reachable from a state: states in
// breadth-first order, each with its final flag, byte ranges and targets, and
// calls (the callee's start and the return state, both reachable). Two
// positions with the same description classify every token the same way.
class SignatureBuilder {
 public:
  // Past this many reachable states a position is classified on its own: the
  // description would cost more than it saves.
  static constexpr size_t kMaxStates = 128;

  explicit SignatureBuilder(const Pda& pda) : pda_(pda), index_(pda.num_states(), -1) {
    // Each byte class is a contiguous byte interval (pda.cc); its bounds:
    class_lo_.assign(pda.num_byte_classes(), 256);
    class_hi_.assign(pda.num_byte_classes(), -1);
    for (int b = 0; b < 256; ++b) {
      const int c = pda.byte_class(static_cast<uint8_t>(b));
      class_lo_[c] = std::min(class_lo_[c], b);
      class_hi_[c] = std::max(class_hi_[c], b);
    }
  }

  // "" when too large.
  std::string Of(int32_t state) {
    order_.clear();
    Visit(state);
    std::string out;
    for (size_t i = 0; i < order_.size(); ++i) {
      if (order_.size() > kMaxStates) break;
      const int32_t s = order_[i];
      out += pda_.is_final(s) ? 'F' : 'N';
      int32_t run_target = -1, run_lo = 0;
      auto flush = [&](int32_t hi) {
        if (run_target >= 0) absl::StrAppend(&out, run_lo, "-", hi, ">", Visit(run_target), ",");
      };
      for (int32_t c = 0; c < pda_.num_byte_classes(); ++c) {
        const int32_t t = pda_.NextByClass(s, c);
        if (t != run_target) {
          flush(class_lo_[c] - 1);
          run_target = t;
          run_lo = class_lo_[c];
        }
      }
      flush(255);
      for (const Pda::Call& call : pda_.calls(s)) {
        absl::StrAppend(&out, "C", Visit(pda_.rule_start(call.rule)), ">", Visit(call.ret), ",");
      }
      out += ';';
    }
    const bool too_big = order_.size() > kMaxStates;
    for (int32_t s : order_) index_[s] = -1;
    return too_big ? std::string() : out;
  }

 private:
  int32_t Visit(int32_t s) {
    if (index_[s] < 0) {
      index_[s] = static_cast<int32_t>(order_.size());
      order_.push_back(s);
    }
    return index_[s];
  }

  const Pda& pda_;
  std::vector<int32_t> index_;
  std::vector<int32_t> order_;
  std::vector<int> class_lo_, class_hi_;
};

// For states of rules that call nothing (strings, numbers, regexes), the
// first state of its class under `rounds` rounds of Moore refinement: two
// such states that agree on every byte string of up to rounds - 1 bytes (the
// final flags along the way, and whether a byte may follow) classify every
// token that short the same way, since a walk inside such a rule is one
// deterministic path. This merges the counted states of x{0,N} far from
// either end, which exact minimization must keep apart (those of a chain,
// pda.h, have a better way and map to themselves). Other states map to
// themselves; so does everything when the refinement would cost too much.
std::vector<int32_t> LeafRepresentatives(const Pda& p, int32_t rounds) {
  const int32_t n = p.num_states();
  std::vector<int32_t> rep(n);
  for (int32_t s = 0; s < n; ++s) rep[s] = s;
  std::vector<uint8_t> leaf_rule(p.num_rules(), 1);
  for (int32_t s = 0; s < n; ++s) {
    if (!p.calls(s).empty()) leaf_rule[p.rule_of(s)] = 0;
  }
  std::vector<int32_t> leaves;
  for (int32_t s = 0; s < n; ++s) {
    if (leaf_rule[p.rule_of(s)] && p.chain_of(s) < 0) leaves.push_back(s);
  }
  if (leaves.empty() ||
      static_cast<int64_t>(leaves.size()) * (p.num_byte_classes() + 2) * rounds > (int64_t{24} << 20)) {
    return rep;
  }
  std::vector<int32_t> block(n, -1), next_block(n, -1);
  absl::flat_hash_map<std::vector<int32_t>, int32_t> ids;
  std::vector<int32_t> key;
  int32_t blocks = -1;
  for (int32_t round = 0; round <= rounds; ++round) {
    ids.clear();
    for (int32_t s : leaves) {
      key.assign({p.rule_of(s), p.is_final(s) ? 1 : 0});
      if (round > 0) {
        key.push_back(block[s]);
        for (int32_t c = 0; c < p.num_byte_classes(); ++c) {
          const int32_t t = p.NextByClass(s, c);
          key.push_back(t < 0 ? -1 : p.chain_of(t) >= 0 ? -2 - t : block[t]);  // a chain state: itself
        }
      }
      next_block[s] = ids.try_emplace(key, static_cast<int32_t>(ids.size())).first->second;
    }
    block.swap(next_block);
    if (static_cast<int32_t>(ids.size()) == blocks) break;  // stable: exact from here on
    blocks = static_cast<int32_t>(ids.size());
  }
  std::vector<int32_t> first(blocks, -1);
  for (int32_t s : leaves) {
    if (first[block[s]] < 0) first[block[s]] = s;
    rep[s] = first[block[s]];
  }
  return rep;
}

// Classifications by (vocabulary, signature), shared by all compiles in the
// process. Bounded: past kMaxBytes it starts over (entries in use live on in
// the grammars that hold them).
class PositionCache {
 public:
  static constexpr int64_t kMaxBytes = int64_t{256} << 20;

  std::shared_ptr<const CompiledGrammar::TokenClasses> Find(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void Insert(const std::string& key, std::shared_ptr<const CompiledGrammar::TokenClasses> tc) {
    const int64_t cost = ClassesBytes(*tc) + static_cast<int64_t>(key.size());
    absl::MutexLock lock(&mu_);
    if (bytes_ + cost > kMaxBytes) {
      map_.clear();
      bytes_ = 0;
    }
    if (map_.emplace(key, std::move(tc)).second) bytes_ += cost;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const CompiledGrammar::TokenClasses>> map_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

PositionCache& SharedPositionCache() {
  static auto* cache = new PositionCache();
  return *cache;
}

using TokenClasses = CompiledGrammar::TokenClasses;

// Whether `count` accepted tokens are kept as a list of ids rather than a
// bitmask of `words` words: a list costs 32 bits a token, a bitmask 1 bit a
// vocabulary entry.
bool AcceptedAsList(size_t count, size_t words) { return count < words; }

// Classifies the positions `states` of one chain template from one walk:
// a token's fate at a count is read off the intervals the walk found, so
// counts with no interval end between them share one classification (at
// most a few per token length, whatever the repetition's bound). Appends
// the classifications to `classes` and points `class_of_state` at them.
void ClassifyChain(const std::vector<int32_t>& states, const Pda& pda, const Vocabulary& v,
                   PositionClassifier* classifier, int64_t* work,
                   std::vector<std::shared_ptr<const TokenClasses>>* classes, std::vector<int32_t>* class_of_state,
                   int32_t* computed) {
  Counts range = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  for (int32_t s : states) {
    range.lo = std::min<int64_t>(range.lo, pda.chain_count(s));
    range.hi = std::max<int64_t>(range.hi, pda.chain_count(s));
  }
  struct Run {
    int32_t begin, end;  // ranks
    Counts accepts, uncertain_at;
  };
  std::vector<Run> runs;
  auto same = [](Counts a, Counts b) { return (a.empty() && b.empty()) || (a.lo == b.lo && a.hi == b.hi); };
  classifier->Walk(states[0], range, work, [&](int32_t begin, int32_t end, Counts accepts, Counts uncertain_at) {
    accepts = Meet(accepts, range);
    uncertain_at = Meet(uncertain_at, range);
    if (accepts.empty() && uncertain_at.empty()) return;
    if (!runs.empty() && runs.back().end == begin && same(runs.back().accepts, accepts) &&
        same(runs.back().uncertain_at, uncertain_at)) {
      runs.back().end = end;
    } else {
      runs.push_back({begin, end, accepts, uncertain_at});
    }
  });
  // Segments of counts: cuts[j] up to the next cut.
  std::vector<uint8_t> is_cut(range.hi - range.lo + 1, 0);
  is_cut[0] = 1;
  for (const Run& r : runs) {
    for (Counts c : {r.accepts, r.uncertain_at}) {
      if (c.empty()) continue;
      is_cut[c.lo - range.lo] = 1;
      if (c.hi < range.hi) is_cut[c.hi + 1 - range.lo] = 1;
    }
  }
  std::vector<int64_t> cuts;
  std::vector<int32_t> segment_of(is_cut.size());  // by count - range.lo
  for (size_t i = 0; i < is_cut.size(); ++i) {
    if (is_cut[i]) cuts.push_back(range.lo + static_cast<int64_t>(i));
    segment_of[i] = static_cast<int32_t>(cuts.size()) - 1;
  }
  auto segment = [&](int64_t k) { return segment_of[k - range.lo]; };
  // Accepted runs enter and leave a running bitmask at their ends: flips
  // of rank ranges, ordered by segment.
  struct Flip {
    int32_t begin, end;
    int64_t delta;  // to the count of accepted tokens
  };
  std::vector<int32_t> flip_begin(cuts.size() + 1, 0);
  auto for_each_flip = [&](auto f) {
    for (const Run& r : runs) {
      if (r.accepts.empty()) continue;
      f(segment(r.accepts.lo), Flip{r.begin, r.end, r.end - r.begin});
      if (r.accepts.hi < range.hi) f(segment(r.accepts.hi + 1), Flip{r.begin, r.end, r.begin - r.end});
    }
  };
  for_each_flip([&](size_t j, const Flip&) { ++flip_begin[j + 1]; });
  for (size_t j = 0; j < cuts.size(); ++j) flip_begin[j + 1] += flip_begin[j];
  std::vector<Flip> flips(flip_begin.back());
  std::vector<int32_t> fill(flip_begin.begin(), flip_begin.end() - 1);
  for_each_flip([&](size_t j, const Flip& f) { flips[fill[j]++] = f; });
  std::vector<const Run*> unsure;
  for (const Run& r : runs) {
    if (!r.uncertain_at.empty()) unsure.push_back(&r);
  }
  std::vector<uint32_t> bits(v.bitmask_words(), 0);
  int64_t count = 0;
  std::vector<int32_t> segment_class(cuts.size());
  for (size_t j = 0; j < cuts.size(); ++j) {
    const int64_t k = cuts[j];
    for (int32_t f = flip_begin[j]; f < flip_begin[j + 1]; ++f) {
      for (int32_t rank = flips[f].begin; rank < flips[f].end; ++rank) {
        const int32_t id = v.sorted_ids()[rank];
        bits[id >> 5] ^= 1u << (id & 31);
      }
      count += flips[f].delta;
    }
    std::vector<int32_t> uncertain;
    for (const Run* r : unsure) {
      const bool accepted = k >= r->accepts.lo && k <= r->accepts.hi;
      if (!accepted && k >= r->uncertain_at.lo && k <= r->uncertain_at.hi) {
        for (int32_t rank = r->begin; rank < r->end; ++rank) uncertain.push_back(rank);
      }
    }
    if (j > 0 && flip_begin[j] == flip_begin[j + 1] &&
        (*classes)[segment_class[j - 1]]->uncertain_ranks == uncertain) {
      segment_class[j] = segment_class[j - 1];
      continue;
    }
    auto tc = std::make_shared<TokenClasses>();
    if (AcceptedAsList(static_cast<size_t>(count), bits.size())) {
      for (size_t w = 0; w < bits.size(); ++w) {
        for (uint32_t x = bits[w]; x != 0; x &= x - 1) {
          tc->accepted_ids.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
        }
      }
    } else {
      tc->accepted_bits = bits;
    }
    tc->uncertain_ranks = std::move(uncertain);
    segment_class[j] = static_cast<int32_t>(classes->size());
    classes->push_back(std::move(tc));
    ++*computed;
  }
  for (int32_t s : states) (*class_of_state)[s] = segment_class[segment(pda.chain_count(s))];
}

}  // namespace

const char* ConstraintKindName(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonSchema: return "json_schema";
    case ConstraintKind::kJsonObject: return "json_object";
    case ConstraintKind::kRegex: return "regex";
    case ConstraintKind::kChoice: return "choice";
    case ConstraintKind::kGrammar: return "grammar";
  }
  return "unknown";
}

Constraint ChoiceConstraint(const std::vector<std::string>& choices) {
  nlohmann::json array = nlohmann::json::array();
  for (const std::string& c : choices) array.push_back(c);
  // Wire strings are UTF-8; anything else is replaced here, never thrown.
  return {ConstraintKind::kChoice, array.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

absl::StatusOr<Grammar> ConstraintGrammar(const Constraint& constraint, const JsonSchemaOptions& json_options,
                                          const Limits& limits) {
  switch (constraint.kind) {
    case ConstraintKind::kJsonSchema: return JsonSchemaToGrammar(constraint.text, json_options, limits);
    case ConstraintKind::kJsonObject: return JsonObjectGrammar(json_options);
    case ConstraintKind::kRegex: return RegexToGrammar(constraint.text, limits);
    case ConstraintKind::kGrammar: return ParseGbnf(constraint.text, limits);
    case ConstraintKind::kChoice: {
      if (static_cast<int64_t>(constraint.text.size()) > limits.max_input_bytes) {
        return absl::InvalidArgumentError("choice: too large");
      }
      const nlohmann::json j = nlohmann::json::parse(constraint.text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_array()) return absl::InvalidArgumentError("choice: expected a JSON array of strings");
      std::vector<std::string> choices;
      for (const auto& c : j) {
        if (!c.is_string()) return absl::InvalidArgumentError("choice: expected a JSON array of strings");
        choices.push_back(c.get<std::string>());
      }
      return ChoiceToGrammar(choices, limits);
    }
  }
  return absl::InvalidArgumentError("unknown constraint kind");
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar, std::shared_ptr<const Vocabulary> vocab, const Limits& limits, bool use_shared_cache) {
  const auto start = std::chrono::steady_clock::now();
  auto out = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  ASSIGN_OR_RETURN(out->pda_, Pda::Build(grammar, limits));
  out->vocab_ = std::move(vocab);
  const Pda& pda = *out->pda_;
  Stats& stats = out->stats_;
  stats.states = pda.num_states();
  out->class_of_state_.assign(pda.num_states(), -1);
  for (int32_t s = 0; s < pda.num_states(); ++s) {
    if (pda.has_bytes(s)) ++stats.positions;
  }
  if (out->vocab_ != nullptr) {
    const Vocabulary& v = *out->vocab_;
    PositionClassifier classifier(pda, v);
    auto check_work = [&]() -> absl::Status {
      if (stats.work <= limits.max_compile_work) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrFormat(
          "constraint too expensive to compile: over %d token-trie steps (limit max_compile_work)",
          limits.max_compile_work));
    };
    // Positions in chains: one walk per template.
    std::vector<std::vector<int32_t>> chain_positions(pda.num_chain_templates());
    for (int32_t s = 0; s < pda.num_states(); ++s) {
      if (pda.has_bytes(s) && pda.chain_of(s) >= 0) chain_positions[pda.chain_of(s)].push_back(s);
    }
    for (const std::vector<int32_t>& states : chain_positions) {
      if (states.empty()) continue;
      ClassifyChain(states, pda, v, &classifier, &stats.work, &out->classes_, &out->class_of_state_,
                    &stats.computed_positions);
      RETURN_IF_ERROR(check_work());
    }
    SignatureBuilder signatures(pda);
    const std::string vocab_key = absl::StrCat(v.fingerprint(), ":", v.vocab_size(), ":");
    absl::flat_hash_map<std::string, int32_t> local;  // signature -> index into classes_
    const size_t words = static_cast<size_t>(v.bitmask_words());
    std::vector<int32_t> accepted, uncertain;
    // Counted states outside chains are merged by their behaviour on up to
    // kShortToken bytes; a merged classification is exact for tokens that
    // short, and leaves the longer ones (a few thousand) uncertain: checked
    // against the real stack at decode time.
    constexpr int32_t kShortToken = 16;
    const std::vector<int32_t> rep = LeafRepresentatives(pda, kShortToken + 1);
    std::vector<uint8_t> merged(pda.num_states(), 0);
    for (int32_t s = 0; s < pda.num_states(); ++s) {
      if (rep[s] != s) merged[rep[s]] = 1;
    }
    std::vector<int32_t> long_ranks;
    for (int32_t r = 0; r < static_cast<int32_t>(v.sorted_ids().size()); ++r) {
      if (static_cast<int32_t>(v.token_bytes(v.sorted_ids()[r]).size()) > kShortToken) long_ranks.push_back(r);
    }
    for (int32_t s = 0; s < pda.num_states(); ++s) {
      if (!pda.has_bytes(s) || pda.chain_of(s) >= 0) continue;
      if (rep[s] != s) {
        out->class_of_state_[s] = out->class_of_state_[rep[s]];  // rep[s] < s: done already
        continue;
      }
      std::string key = signatures.Of(s);
      if (!key.empty()) {
        key.insert(0, vocab_key);
        if (merged[s]) key.insert(0, "widened:");
        auto it = local.find(key);
        if (it != local.end()) {
          out->class_of_state_[s] = it->second;
          continue;
        }
        if (use_shared_cache) {
          if (auto cached = SharedPositionCache().Find(key)) {
            local[key] = out->class_of_state_[s] = static_cast<int32_t>(out->classes_.size());
            out->classes_.push_back(std::move(cached));
            continue;
          }
        }
      }
      accepted.clear();
      uncertain.clear();
      classifier.Classify(s, &accepted, &uncertain, &stats.work);
      RETURN_IF_ERROR(check_work());
      if (merged[s]) {
        // Long tokens: uncertain for the whole merged class.
        std::vector<int32_t> widened;
        std::set_union(uncertain.begin(), uncertain.end(), long_ranks.begin(), long_ranks.end(),
                       std::back_inserter(widened));
        uncertain.swap(widened);
        accepted.erase(std::remove_if(accepted.begin(), accepted.end(),
                                      [&](int32_t r) {
                                        return static_cast<int32_t>(v.token_bytes(v.sorted_ids()[r]).size()) >
                                               kShortToken;
                                      }),
                       accepted.end());
      }
      auto tc = std::make_shared<TokenClasses>();
      if (AcceptedAsList(accepted.size(), words)) {
        tc->accepted_ids.reserve(accepted.size());
        for (int32_t r : accepted) tc->accepted_ids.push_back(v.sorted_ids()[r]);
        std::sort(tc->accepted_ids.begin(), tc->accepted_ids.end());
      } else {
        tc->accepted_bits.assign(words, 0);
        for (int32_t r : accepted) {
          const int32_t id = v.sorted_ids()[r];
          tc->accepted_bits[id >> 5] |= 1u << (id & 31);
        }
      }
      tc->uncertain_ranks = uncertain;
      ++stats.computed_positions;
      if (!key.empty()) {
        local[key] = static_cast<int32_t>(out->classes_.size());
        if (use_shared_cache) SharedPositionCache().Insert(key, tc);
      }
      out->class_of_state_[s] = static_cast<int32_t>(out->classes_.size());
      out->classes_.push_back(std::move(tc));
    }
    stats.distinct_positions = static_cast<int32_t>(out->classes_.size());
  }
  stats.memory_bytes = static_cast<int64_t>(pda.num_states()) * (pda.num_byte_classes() * 4 + 16) +
                       static_cast<int64_t>(out->class_of_state_.size()) * 4;
  for (const auto& tc : out->classes_) {
    stats.memory_bytes += ClassesBytes(*tc);
    stats.uncertain_tokens += static_cast<int64_t>(tc->uncertain_ranks.size());
  }
  stats.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(out));
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileConstraint(const Constraint& constraint,
                                                                         std::shared_ptr<const Vocabulary> vocab,
                                                                         const JsonSchemaOptions& json_options,
                                                                         const Limits& limits) {
  ASSIGN_OR_RETURN(Grammar g, ConstraintGrammar(constraint, json_options, limits));
  return CompiledGrammar::Compile(g, std::move(vocab), limits);
}

}  // namespace chunkattn::grammar
