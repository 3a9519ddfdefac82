// The input processor on the coordinator's own request type: what it
// accepts becomes the engine request the fields ask for, and every refusal
// names its field by RequestField (and element), with a message that names
// no API's field (the fronts do that).
#include "services/coordinator/input_processor.h"

#include <cmath>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

constexpr int kVocab = 300;
constexpr int32_t kBos = 256;
constexpr int32_t kEos = 257;

// One token per byte, BOS and EOS after them: enough to tokenize and
// render, with no model files.
class ByteTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }
  int32_t vocab_size() const override { return kVocab; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  absl::StatusOr<std::string> IdToPiece(int32_t id) const override { return std::string(1, static_cast<char>(id)); }
  absl::StatusOr<std::string> TokenBytes(int32_t id) const override { return IdToPiece(id); }
  bool IsControl(int32_t id) const override { return id >= 256; }
};

ModelConfig Config() {
  ModelConfig config;
  config.vocab_size = kVocab;
  config.max_context = 64;
  config.eos_token_ids = {kEos};
  return config;
}

struct Fixture {
  Fixture() {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(
        "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
        "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}");
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    chat.emplace(ModelChatTemplate{*std::move(parsed), std::nullopt, nlohmann::ordered_json::object()});
    text.tokenizer = &tokenizer;
    text.chat = &*chat;
  }
  ByteTokenizer tokenizer;
  std::optional<ModelChatTemplate> chat;
  PromptText text;
  const ModelConfig config = Config();
};

ClientRequest Tokens(std::vector<int32_t> ids) {
  ClientRequest r;
  r.prompt = TokenPrompt{std::move(ids)};
  return r;
}

ChatPrompt Conversation(std::vector<std::pair<std::string, std::string>> messages) {
  ChatPrompt chat;
  for (auto& [role, content] : messages) {
    ChatMessage& m = chat.messages.emplace_back();
    m.role = role;
    m.content = content;
  }
  return chat;
}

TEST(InputProcessorTest, AcceptedRequestsCarryTheirFields) {
  Fixture f;
  ClientRequest r = Tokens({1, 2, 3});
  r.request_id = "job-1";
  r.owner = "acme";
  r.cache_namespace = "docs";
  r.sampling.temperature = 0.5f;
  r.sampling.top_k = 4;
  r.sampling.seed = 7;
  r.stopping.stop_token_ids = {9};
  r.stopping.stop = {"end"};
  r.stopping.min_tokens = 2;
  r.n = 3;
  r.priority = -5;
  r.return_logprobs = true;
  r.top_logprobs = 2;
  absl::StatusOr<EngineRequest> e = ProcessInput(r, f.config, f.text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->request_id, "job-1");
  EXPECT_EQ(e->owner, "acme");
  EXPECT_EQ(e->spec.cache_namespace, "acme/docs");  // scoped to the owner
  EXPECT_EQ(e->spec.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(e->spec.max_new_tokens, 16);  // the default
  EXPECT_EQ(e->spec.sampling.temperature, 0.5f);
  EXPECT_EQ(e->spec.sampling.top_k, 4);
  EXPECT_EQ(e->spec.sampling.seed, 7u);
  EXPECT_TRUE(e->spec.sampling.return_logprobs);
  EXPECT_EQ(e->spec.sampling.top_logprobs, 2);
  EXPECT_EQ(e->spec.stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(e->stop_strings, (std::vector<std::string>{"end"}));
  EXPECT_EQ(e->spec.min_tokens, 2);
  EXPECT_EQ(e->spec.n, 3);
  EXPECT_EQ(e->spec.priority, -5);

  // Text gets BOS; a conversation is rendered by the template, without it.
  r = ClientRequest();
  r.prompt = TextPrompt{"hi"};
  e = ProcessInput(r, f.config, f.text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->spec.prompt, (std::vector<int32_t>{kBos, 'h', 'i'}));
  r.prompt = Conversation({{"user", "hi"}});
  e = ProcessInput(r, f.config, f.text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(f.tokenizer.Decode(e->spec.prompt).value(), "user: hi\nassistant:");

  // Unset max_new_tokens fills the context with fill_context; one past it is
  // cut with cap_to_context.
  r = Tokens(std::vector<int32_t>(60, 1));
  r.stopping.fill_context = true;
  e = ProcessInput(r, f.config, f.text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->spec.max_new_tokens, 4);
  r.stopping.max_new_tokens = 1000;
  r.stopping.cap_to_context = true;
  e = ProcessInput(r, f.config, f.text);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->spec.max_new_tokens, 4);

  // No seed: a fresh one each time.
  r = Tokens({1});
  EXPECT_NE(ProcessInput(r, f.config, f.text)->spec.sampling.seed, ProcessInput(r, f.config, f.text)->spec.sampling.seed);
}

TEST(InputProcessorTest, EachRefusalNamesItsFieldAndNoApisName) {
  Fixture f;
  struct Case {
    const char* what;
    std::function<void(ClientRequest&)> set;
    RequestField field;
    int index = -1;
  };
  auto chat = [](std::vector<std::pair<std::string, std::string>> messages) {
    return [messages](ClientRequest& r) { r.prompt = Conversation(messages); };
  };
  const Case cases[] = {
      {"long id", [](ClientRequest& r) { r.request_id = std::string(kMaxIdBytes + 1, 'x'); }, RequestField::kRequestId},
      {"long namespace", [](ClientRequest& r) { r.cache_namespace = std::string(kMaxIdBytes + 1, 'x'); },
       RequestField::kCacheNamespace},
      {"empty text", [](ClientRequest& r) { r.prompt = TextPrompt{}; }, RequestField::kPromptText},
      {"long text", [](ClientRequest& r) { r.prompt = TextPrompt{std::string(64 * 32 + 1, 'x')}; },
       RequestField::kPromptText},
      {"no token ids", [](ClientRequest& r) { r.prompt = TokenPrompt{}; }, RequestField::kPromptTokenIds},
      {"token outside", [](ClientRequest& r) { r.prompt = TokenPrompt{{1, 2, kVocab}}; }, RequestField::kPromptTokenIds,
       2},
      {"negative token", [](ClientRequest& r) { r.prompt = TokenPrompt{{-1}}; }, RequestField::kPromptTokenIds, 0},
      {"no messages", chat({}), RequestField::kChatMessages},
      {"empty role", chat({{"user", "a"}, {"", "b"}}), RequestField::kChatMessageRole, 1},
      {"template refuses", chat({{"bad", "a"}}), RequestField::kChat},
      {"too many messages", chat(std::vector<std::pair<std::string, std::string>>(4097, {"user", "a"})),
       RequestField::kChat},
      {"tool calls not an array",
       [](ClientRequest& r) {
         ChatPrompt c = Conversation({{"user", "a"}});
         c.messages[0].tool_calls_json = "{}";
         r.prompt = c;
       },
       RequestField::kChatToolCalls, 0},
      {"tools not JSON",
       [](ClientRequest& r) {
         ChatPrompt c = Conversation({{"user", "a"}});
         c.tools_json = "[";
         r.prompt = c;
       },
       RequestField::kChatTools},
      {"kwargs not an object",
       [](ClientRequest& r) {
         ChatPrompt c = Conversation({{"user", "a"}});
         c.template_kwargs_json = "[]";
         r.prompt = c;
       },
       RequestField::kChatTemplateKwargs},
      {"temperature", [](ClientRequest& r) { r.sampling.temperature = -1; }, RequestField::kTemperature},
      {"temperature nan", [](ClientRequest& r) { r.sampling.temperature = std::nanf(""); }, RequestField::kTemperature},
      {"top_k", [](ClientRequest& r) { r.sampling.top_k = -1; }, RequestField::kTopK},
      {"top_p", [](ClientRequest& r) { r.sampling.top_p = 0; }, RequestField::kTopP},
      {"min_p", [](ClientRequest& r) { r.sampling.min_p = 1.5f; }, RequestField::kMinP},
      {"repetition_penalty", [](ClientRequest& r) { r.sampling.repetition_penalty = 0; },
       RequestField::kRepetitionPenalty},
      {"max_new_tokens 0", [](ClientRequest& r) { r.stopping.max_new_tokens = 0; }, RequestField::kMaxNewTokens},
      {"past the context", [](ClientRequest& r) { r.stopping.max_new_tokens = 62; }, RequestField::kMaxNewTokens},
      {"stop token outside", [](ClientRequest& r) { r.stopping.stop_token_ids = {5, kVocab}; },
       RequestField::kStopTokenIds, 1},
      {"too many stops", [](ClientRequest& r) { r.stopping.stop = std::vector<std::string>(17, "a"); },
       RequestField::kStop},
      {"empty stop", [](ClientRequest& r) { r.stopping.stop = {"a", ""}; }, RequestField::kStop, 1},
      {"min_tokens over max", [](ClientRequest& r) { r.stopping.min_tokens = 17; }, RequestField::kMinTokens},
      {"negative min_tokens", [](ClientRequest& r) { r.stopping.min_tokens = -1; }, RequestField::kMinTokens},
      {"min_tokens with every token a stop",
       [](ClientRequest& r) {
         for (int t = 0; t < kVocab; ++t) r.stopping.stop_token_ids.push_back(t);
         r.stopping.min_tokens = 1;
       },
       RequestField::kMinTokens},
      {"n 0", [](ClientRequest& r) { r.n = 0; }, RequestField::kN},
      {"n 65", [](ClientRequest& r) { r.n = kMaxSamples + 1; }, RequestField::kN},
      {"priority", [](ClientRequest& r) { r.priority = kMaxPriority + 1; }, RequestField::kPriority},
      {"top_logprobs 21",
       [](ClientRequest& r) {
         r.return_logprobs = true;
         r.top_logprobs = kMaxTopLogprobs + 1;
       },
       RequestField::kTopLogprobs},
      {"top_logprobs alone", [](ClientRequest& r) { r.top_logprobs = 2; }, RequestField::kTopLogprobs},
  };
  // Every API's names for the fields: none belongs in the processor's words.
  const char* const kApiNames[] = {
      "prompt.",         "sampling.",   "stopping.",          "sampling_params", "tokenized", "input_ids",
      "token_ids",       "max_tokens",  "max_new_tokens",     "min_tokens",      "stop_token_ids",
      "request_id",      "X-Request-Id", "cache_namespace",   "cache_salt",      "logprobs",  "temperature",
      "top_p",           "top_k",       "min_p",              "repetition_penalty", "priority", "_json",
      "messages[",       "tool_calls",  "chat_template_kwargs", "'",
  };
  for (const Case& c : cases) {
    ClientRequest r = Tokens({1, 2, 3});
    c.set(r);
    const absl::Status status = ProcessInput(r, f.config, f.text).status();
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << status;
    const std::optional<FieldRef> at = ErrorField(status);
    ASSERT_TRUE(at.has_value()) << c.what << ": " << status;
    EXPECT_EQ(at->field, c.field) << c.what << ": " << status;
    EXPECT_EQ(at->index, c.index) << c.what << ": " << status;
    for (const char* name : kApiNames) {
      EXPECT_FALSE(absl::StrContains(status.message(), name)) << c.what << ": " << status.message();
    }
  }
}

TEST(InputProcessorTest, WithoutTokenizerOrTemplateTextAndChatAreRefusedByField) {
  const ModelConfig config = Config();
  ClientRequest r;
  r.prompt = TextPrompt{"hi"};
  EXPECT_EQ(ErrorField(ProcessInput(r, config, PromptText{}).status())->field, RequestField::kPromptText);
  r.prompt = Conversation({{"user", "hi"}});
  PromptText no_chat;
  ByteTokenizer tokenizer;
  no_chat.tokenizer = &tokenizer;
  no_chat.chat_missing = "no chat_template in tokenizer_config.json";
  const absl::Status status = ProcessInput(r, config, no_chat).status();
  EXPECT_EQ(ErrorField(status)->field, RequestField::kChat);
  EXPECT_TRUE(absl::StrContains(status.message(), "no usable chat template")) << status;
  r = Tokens({1});
  r.stopping.stop = {"x"};
  EXPECT_EQ(ErrorField(ProcessInput(r, config, PromptText{}).status())->field, RequestField::kStop);
}

TEST(FieldErrorTest, NamingLeadsTheMessageAndKeepsThePayloads) {
  const absl::Status status = InvalidField({RequestField::kStop, 3}, "must have 1 to 256 bytes");
  EXPECT_EQ(ErrorField(status)->field, RequestField::kStop);
  EXPECT_EQ(ErrorField(status)->index, 3);
  const absl::Status named =
      NameErrorField(status, [](FieldRef at) { return WithIndex("stopping.stop", at.index); });
  EXPECT_EQ(named.message(), "stopping.stop[3] must have 1 to 256 bytes");
  EXPECT_EQ(named.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(named)->field, RequestField::kStop);
  // Statuses that name no field pass as they are.
  const absl::Status other = absl::InvalidArgumentError("prompt is empty");
  EXPECT_FALSE(ErrorField(other).has_value());
  EXPECT_EQ(NameErrorField(other, [](FieldRef) { return std::string("x"); }), other);
  EXPECT_EQ(WithIndex("n", -1), "n");
}

// A constraint compiles on the input side (against the tokenizer's
// vocabulary, EOS as its stop), and the samples get one matcher each; a bad
// one is refused as kConstraint with the compiler's words.
TEST(InputProcessorTest, ConstraintsCompileOrAreRefusedAsTheirField) {
  Fixture f;
  auto vocab = grammar::Vocabulary::Create(f.tokenizer, {kEos});
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  grammar::CompileCache cache(grammar::CompileCache::Options{});
  StructuredOutputs structured{*vocab, &cache};
  ClientRequest r = Tokens({1, 2, 3});
  r.n = 2;
  r.constraint = grammar::Constraint{grammar::ConstraintKind::kRegex, "(yes|no)"};
  // Without a vocabulary (a model served without its tokenizer): refused.
  absl::StatusOr<EngineRequest> e = ProcessInput(r, f.config, f.text);
  ASSERT_EQ(ErrorField(e.status())->field, RequestField::kConstraint);
  f.text.structured = &structured;
  e = ProcessInput(r, f.config, f.text);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_NE(e->spec.constraint, nullptr);
  std::vector<uint32_t> mask(e->spec.constraint->mask_words());
  for (int sample = 0; sample < 2; ++sample) {
    ASSERT_TRUE(e->spec.constraint->FillNextTokenMask(sample, 16, absl::MakeSpan(mask)));
    for (int t = 0; t < kVocab; ++t) {
      EXPECT_EQ((mask[t / 32] >> (t % 32)) & 1, t == 'y' || t == 'n' ? 1u : 0u) << t;
    }
  }
  EXPECT_FALSE(e->spec.constraint->Accept(0, 'y'));
  EXPECT_FALSE(e->spec.constraint->Accept(0, 'e'));
  EXPECT_TRUE(e->spec.constraint->Accept(0, 's'));  // complete, nothing can follow: the sample ends
  EXPECT_FALSE(e->spec.constraint->Accept(1, 'n'));  // sample 1 is its own
  EXPECT_TRUE(e->spec.constraint->Accept(1, 'x'));   // a token the mask did not allow ends it too
  r.constraint = grammar::Constraint{grammar::ConstraintKind::kRegex, std::string(kMaxConstraintBytes + 1, 'a')};
  e = ProcessInput(r, f.config, f.text);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(ErrorField(e.status())->field, RequestField::kConstraint);
  r.constraint = grammar::Constraint{grammar::ConstraintKind::kJsonSchema, R"({"type": "object", "frobnicate": 1})"};
  e = ProcessInput(r, f.config, f.text);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(ErrorField(e.status())->field, RequestField::kConstraint);
  EXPECT_TRUE(absl::StrContains(e.status().message(), "frobnicate")) << e.status();
}

// complete_within_max_tokens: whatever the model draws among the allowed
// tokens (here uniformly, with stop tokens avoided while anything else is
// allowed: the worst case), a budget that holds the shortest match gives a
// complete one, ended by a stop token within the budget.
TEST(InputProcessorTest, CompleteWithinMaxTokensEndsCompleteWithinTheBudget) {
  Fixture f;
  auto vocab = grammar::Vocabulary::Create(f.tokenizer, {kEos});
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  grammar::CompileCache cache(grammar::CompileCache::Options{});
  StructuredOutputs structured{*vocab, &cache};
  f.text.structured = &structured;
  const std::string pattern = R"(\{"a":"[a-z]*","b":\[(0|1)(,(0|1))*\]\})";
  std::mt19937 rng(5);
  int cut = 0;
  // The shortest match, {"a":"","b":[0]}, is 16 tokens (it ends at '}': no stop token needed).
  for (int budget = 16; budget <= 40; ++budget) {
    for (bool complete : {false, true}) {
      ClientRequest r = Tokens({1, 2, 3});
      r.constraint = grammar::Constraint{grammar::ConstraintKind::kRegex, pattern};
      r.complete_within_max_tokens = complete;
      absl::StatusOr<EngineRequest> e = ProcessInput(r, f.config, f.text);
      ASSERT_TRUE(e.ok()) << e.status();
      TokenConstraint& c = *e->spec.constraint;
      std::vector<uint32_t> mask(c.mask_words());
      std::string text;
      bool ended = false;
      for (int used = 0; used < budget && !ended; ++used) {
        ASSERT_TRUE(c.FillNextTokenMask(0, budget - used, absl::MakeSpan(mask)));
        std::vector<int32_t> allowed, text_tokens;
        for (int t = 0; t < kVocab; ++t) {
          if ((mask[t / 32] >> (t % 32)) & 1) (t == kEos ? allowed : text_tokens).push_back(t);
        }
        const std::vector<int32_t>& pick = text_tokens.empty() ? allowed : text_tokens;
        ASSERT_FALSE(pick.empty());
        const int32_t token = pick[rng() % pick.size()];
        if (token != kEos) text.push_back(static_cast<char>(token));
        ended = c.Accept(0, token);
      }
      const bool matches = std::regex_match(text, std::regex(pattern));
      if (complete) {
        EXPECT_TRUE(ended) << "budget " << budget << ": " << text;
        EXPECT_TRUE(matches) << "budget " << budget << ": " << text;
      } else {
        cut += !ended;
      }
    }
  }
  EXPECT_GT(cut, 10);  // the control: without it, the same draws run out of budget
}

}  // namespace
}  // namespace chunkattn
