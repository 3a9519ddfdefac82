// A structured-output constraint from arbitrary bytes (the first selects the
// kind: JSON Schema, regex, GBNF grammar, choice list, any JSON object; the
// rest is its text): compiling it is refused or succeeds, never a crash or a
// hang, and what compiles behaves: a token its mask allows is accepted, the
// shortest completion completes the output, rollback restores the state.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "text/grammar/compiled_grammar.h"
#include "text/grammar/matcher.h"

namespace {

using chunkattn::fuzz::Fail;
namespace grammar = chunkattn::grammar;

// Every byte as a token, a few multi-byte ones that cross JSON's punctuation,
// and a stop token: small enough that classification is quick.
std::shared_ptr<const grammar::Vocabulary> Vocab() {
  static const auto vocab = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"\": \"", "\",\"", "{\"", "\"}", "true", "false", "null", "  ", "ab", "12", "\\n", "é"}) {
      tokens.emplace_back(t);
    }
    tokens.emplace_back("</s>");
    std::vector<bool> control(tokens.size(), false);
    control.back() = true;
    auto v = grammar::Vocabulary::FromTokens(tokens, control, {static_cast<int32_t>(tokens.size() - 1)});
    if (!v.ok()) Fail("grammar_fuzz", std::string(v.status().message()));
    return *v;
  }();
  return vocab;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  constexpr grammar::ConstraintKind kKinds[] = {grammar::ConstraintKind::kJsonSchema, grammar::ConstraintKind::kRegex,
                                                grammar::ConstraintKind::kGrammar, grammar::ConstraintKind::kChoice,
                                                grammar::ConstraintKind::kJsonObject};
  const grammar::Constraint constraint{kKinds[data[0] % 5], std::string(reinterpret_cast<const char*>(data + 1), size - 1)};
  grammar::Limits limits;
  limits.max_compile_work = 2'000'000;  // a fuzz input must not take seconds
  auto compiled = grammar::CompileConstraint(constraint, Vocab(), grammar::JsonSchemaOptions(), limits);
  if (!compiled.ok()) {
    if (compiled.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("grammar_fuzz", "a refusal other than INVALID_ARGUMENT: " + compiled.status().ToString());
    }
    return 0;
  }
  const grammar::Vocabulary& v = *Vocab();
  grammar::GrammarMatcher m(*compiled);
  std::vector<uint32_t> mask(v.bitmask_words());
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  // A walk of allowed tokens, chosen by the input's hash.
  for (int step = 0; step < 24 && !m.IsTerminated(); ++step) {
    if (!m.FillNextTokenBitmask(absl::MakeSpan(mask)).ok()) Fail("grammar_fuzz", "FillNextTokenBitmask failed");
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < v.vocab_size(); ++t) {
      if ((mask[t / 32] >> (t % 32)) & 1) allowed.push_back(t);
    }
    if (!m.status().ok()) return 0;  // an ambiguous grammar past the stack bound: refused from here on
    if (allowed.empty()) {
      if (m.CanContinue() || m.IsCompleted()) Fail("grammar_fuzz", "no token allowed where the output can go on");
      break;
    }
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    const int32_t token = allowed[(h >> 33) % allowed.size()];
    const int32_t before = m.num_steps();
    if (!m.AcceptToken(token)) Fail("grammar_fuzz", "a token the mask allowed was refused");
    if (step % 5 == 4) {  // rollback, then the same token again
      m.Rollback(1);
      if (m.num_steps() != before) Fail("grammar_fuzz", "rollback did not restore the step count");
      if (!m.AcceptToken(token)) Fail("grammar_fuzz", "a token accepted before a rollback was refused after it");
    }
  }
  if (!m.IsTerminated() && m.status().ok()) {
    const std::string rest = m.ShortestCompletion();
    if (!m.AcceptBytes(rest) || !m.IsCompleted()) Fail("grammar_fuzz", "the shortest completion did not complete");
  }
  return 0;
}
