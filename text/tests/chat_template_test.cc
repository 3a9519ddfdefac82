// The engine's contract beyond rendering (which tests/text/test_chat_templates.py
// and test_jinja_constructs.py check against Python's jinja2): statuses, limits
// on hostile templates, and loading a model folder's template.
#include "text/chat_template.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace chunkattn {
namespace {

std::string Render(const std::string& source, const nlohmann::ordered_json& context = {},
                   const ChatTemplate::Limits& limits = {}) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return "parse error: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(context.is_null() ? nlohmann::ordered_json::object() : context, limits);
  if (!out.ok()) return "render error: " + std::string(out.status().message());
  return *out;
}

TEST(ChatTemplateTest, RendersTheConstructsTemplatesUse) {
  const nlohmann::ordered_json ctx = {
      {"messages", {{{"role", "system"}, {"content", " Be brief. "}}, {{"role", "user"}, {"content", "Hi"}}}}};
  EXPECT_EQ(Render("{% for m in messages %}<{{ m.role }}>{{ m['content'] | trim }}{% if not loop.last %}|{% endif %}"
                   "{% endfor %}",
                   ctx),
            "<system>Be brief.|<user>Hi");
  EXPECT_EQ(Render("{%- set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
                   "{{ ns.n }}",
                   ctx),
            "2");
  EXPECT_EQ(Render("{{ messages[::-1][0].content }}|{{ messages[-1]['role'] }}|{{ (messages | length) / 4 }}", ctx),
            "Hi|user|0.5");
  EXPECT_EQ(Render("{% macro tag(x, y='!') %}[{{ x }}{{ y }}]{% endmacro %}{{ tag('a') }}{{ tag('b', y='?') }}"),
            "[a!][b?]");
  EXPECT_EQ(Render("{{ {'b': [1, 2.5, none, true], 'a': 'é\"'} | tojson }}"),
            "{\"b\": [1, 2.5, null, true], \"a\": \"é\\\"\"}");
  EXPECT_EQ(Render("{{ [1, 'x', none] }}{{ 'a' ~ 1 ~ none }}{{ 1e20 }}{{ 0.1 + 0.2 }}"),
            "[1, 'x', None]a1None1e+200.30000000000000004");
}

TEST(ChatTemplateTest, WhitespaceControlFollowsTransformersSettings) {
  // trim_blocks drops the newline after a tag; lstrip_blocks the indent before.
  EXPECT_EQ(Render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  EXPECT_EQ(Render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(Render("x{# note #}\ny"), "xy");
}

TEST(ChatTemplateTest, RaiseExceptionIsMarkedAndKeepsItsMessage) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("{{ raise_exception('Roles must alternate') }}");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = t->Render(nlohmann::ordered_json::object());
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate");
  EXPECT_TRUE(ChatTemplate::IsRaisedByTemplate(out.status()));

  t = ChatTemplate::Parse("{{ messages[0].content.upper() }}");
  ASSERT_TRUE(t.ok());
  out = t->Render(nlohmann::ordered_json::object());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ChatTemplate::IsRaisedByTemplate(out.status()));
}

TEST(ChatTemplateTest, BadTemplatesAreInvalidArgumentNamingTheProblem) {
  for (const auto& [source, expected] : std::vector<std::pair<std::string, std::string>>{
           {"{% include 'x' %}", "unsupported tag 'include'"},
           {"{{ x | no_such_filter }}", "no filter named 'no_such_filter'"},
           {"{% if x is no_such_test %}{% endif %}", "no test named 'no_such_test'"},
           {"{% for x in y %}", "missing 'endfor'"},
           {"{{ 'unterminated }}", "unterminated string"},
           {"{% break %}", "outside a loop"},
           {"line one\n{{ (1 }}", "line 2"},
           {"{{ 'ok' }}\xFF", "not valid UTF-8"}}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
    ASSERT_FALSE(t.ok()) << source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_NE(t.status().message().find(expected), std::string::npos) << t.status().message();
  }
}

TEST(ChatTemplateTest, HostileTemplatesStopAtTheLimits) {
  ChatTemplate::Limits small;
  small.max_output_bytes = 1 << 16;
  small.max_steps = 100000;
  small.max_depth = 50;
  // Output, repetition, loop steps, recursion, and the sandbox's range bound.
  EXPECT_NE(Render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {}, small).find("exceeds 65536 bytes"),
            std::string::npos);
  EXPECT_NE(Render("{{ 'x' * 100000000000 }}", {}, small).find("too long"), std::string::npos);
  EXPECT_NE(Render("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", {}, small)
                .find("steps"),
            std::string::npos);
  EXPECT_NE(Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, small).find("nests deeper"),
            std::string::npos);
  EXPECT_NE(Render("{{ range(1000000) | length }}").find("MAX_RANGE"), std::string::npos);
  EXPECT_NE(Render("{{ [].append(1) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(Render("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

class ChatTemplateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/chunkattn-chat-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string dir_;
};

TEST_F(ChatTemplateFilesTest, ReadsTheConfigsTemplateAndSpecialTokens) {
  Write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
            "add_bos_token": true, "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  absl::StatusOr<ModelChatTemplate> t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->special_tokens, nlohmann::ordered_json({{"bos_token", "<s>"}, {"eos_token", "</s>"}}));
  absl::StatusOr<std::string> out =
      t->Apply(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])"), nullptr, false, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s>hi</s>");

  // chat_template.jinja wins, as in transformers.
  Write("chat_template.jinja", "[{{ messages | length }}{{ add_generation_prompt }}]\n");
  t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  out = t->Apply(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])"), nullptr, true, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "[1True]");
}

TEST_F(ChatTemplateFilesTest, NamedTemplatesTakeTheDefault) {
  Write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  absl::StatusOr<ModelChatTemplate> t = LoadChatTemplate(dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Apply(nlohmann::ordered_json::array(), nullptr, false, {}), "D");
}

TEST_F(ChatTemplateFilesTest, MissingOrBrokenFilesAreClearErrors) {
  EXPECT_EQ(LoadChatTemplate(dir_).status().code(), absl::StatusCode::kNotFound);
  Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_EQ(LoadChatTemplate(dir_).status().code(), absl::StatusCode::kNotFound);
  Write("tokenizer_config.json", "{not json");
  absl::Status s = LoadChatTemplate(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer_config.json"), std::string::npos) << s;
  Write("tokenizer_config.json", R"({"chat_template": "{% for %}"})");
  s = LoadChatTemplate(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer_config.json"), std::string::npos) << s;
}

}  // namespace
}  // namespace chunkattn
