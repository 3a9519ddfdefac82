#include <algorithm>
#include <cctype>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tool_calls/reasoning_parser.h"
#include "text/tool_calls/tool_parser.h"
#include "text/utf8.h"

namespace chunkattn::tools {

// Found by gtest through ADL, so outside the anonymous namespace.
void PrintTo(const ToolCall& c, std::ostream* os) {
  *os << "{" << c.id << ", " << c.name << ", " << c.arguments << "}";
}

namespace {

using Json = nlohmann::ordered_json;

// std::string: Debian's Abseil has its own absl::string_view, and StrCat
// takes no std::string_view.
const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string kDsCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kDsCallBegin = "<｜tool▁call▁begin｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
const std::string kDsSep = "<｜tool▁sep｜>";

// The ids IdSource(seed) hands out, in order.
std::vector<std::string> Ids(uint64_t seed, size_t n) {
  IdSource ids(seed);
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(ids.Next());
  return out;
}

// Streams `text` in pieces ending at `cuts` (ascending), assembles the
// deltas, and checks the delta protocol on the way.
ParsedOutput Stream(ToolCallFormat format, std::string_view text, const std::vector<size_t>& cuts,
                    uint64_t seed, bool* saw_tool_call = nullptr) {
  IdSource ids(seed);
  StreamingToolParser parser(format, &ids);
  ParsedOutput out;
  const auto take = [&](const std::vector<ToolDelta>& deltas) {
    for (const ToolDelta& d : deltas) {
      if (!d.is_tool_call()) {
        EXPECT_FALSE(d.content.empty());
        EXPECT_TRUE(d.id.empty() && d.name.empty() && d.arguments.empty());
        // Well-formed input gives well-formed deltas, however it was cut.
        if (IsValidUtf8(text)) {
          EXPECT_TRUE(IsValidUtf8(d.content)) << d.content;
        }
        out.content += d.content;
        continue;
      }
      EXPECT_TRUE(d.content.empty());
      ASSERT_LE(static_cast<size_t>(d.index), out.calls.size());
      if (static_cast<size_t>(d.index) == out.calls.size()) {
        EXPECT_FALSE(d.id.empty());
        EXPECT_FALSE(d.name.empty());
        out.calls.push_back({d.id, d.name, d.arguments});
      } else {
        EXPECT_TRUE(d.id.empty() && d.name.empty());
        out.calls[d.index].arguments += d.arguments;
      }
    }
  };
  size_t begin = 0;
  for (size_t cut : cuts) {
    take(parser.Feed(text.substr(begin, cut - begin)));
    begin = cut;
  }
  take(parser.Feed(text.substr(begin)));
  take(parser.Finish());
  EXPECT_TRUE(parser.Finish().empty());
  if (saw_tool_call != nullptr) *saw_tool_call = parser.saw_tool_call();
  return out;
}

std::vector<size_t> EveryByte(size_t n) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < n; ++i) cuts.push_back(i);
  return cuts;
}

// Cut points for a random split: pieces of 1..max_piece bytes, or a few
// cuts anywhere (inside characters and markers alike).
std::vector<size_t> RandomCuts(std::mt19937_64& rng, size_t n, int mode) {
  std::vector<size_t> cuts;
  if (mode == 2) {
    const int k = static_cast<int>(rng() % 6);
    for (int i = 0; i < k && n > 1; ++i) cuts.push_back(1 + rng() % (n - 1));
    std::sort(cuts.begin(), cuts.end());
    return cuts;
  }
  const size_t max_piece = mode == 0 ? 3 : 16;
  for (size_t i = 1 + rng() % max_piece; i < n; i += 1 + rng() % max_piece) cuts.push_back(i);
  return cuts;
}

void ExpectSame(const ParsedOutput& got, const ParsedOutput& want, std::string_view what) {
  EXPECT_EQ(got.content, want.content) << what;
  EXPECT_EQ(got.calls, want.calls) << what;
}

// One-shot, then streamed whole, byte by byte and in random pieces: all must
// give `want`.
void CheckAllSplits(ToolCallFormat format, std::string_view text, const ParsedOutput& want,
                    uint64_t seed = 7) {
  SCOPED_TRACE(absl::StrCat(ToolCallFormatName(format), " text: ", std::string(text)));
  IdSource ids(seed);
  ExpectSame(ParseToolCalls(format, text, &ids), want, "one-shot");
  bool saw = false;
  ExpectSame(Stream(format, text, {}, seed, &saw), want, "one piece");
  EXPECT_EQ(saw, !want.calls.empty());
  ExpectSame(Stream(format, text, EveryByte(text.size()), seed), want, "byte by byte");
  std::mt19937_64 rng(seed);
  for (int mode = 0; mode < 3; ++mode) {
    ExpectSame(Stream(format, text, RandomCuts(rng, text.size(), mode), seed), want, "random");
  }
}

// `want` from content and (name, arguments) pairs, with IdSource(7)'s ids.
ParsedOutput Want(std::string content, std::vector<std::pair<std::string, std::string>> calls) {
  ParsedOutput out{std::move(content), {}};
  const std::vector<std::string> ids = Ids(7, calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    out.calls.push_back({ids[i], calls[i].first, calls[i].second});
  }
  return out;
}

// ---------------------------------------------------------------------------
// Names, detection, ids.

TEST(ToolCallFormatTest, NamesRoundTrip) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                           ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
    const auto parsed = ParseToolCallFormat(ToolCallFormatName(f));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kLlama3Json), "llama3_json");
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kDeepSeekV31), "deepseek_v31");
  EXPECT_EQ(ParseToolCallFormat("deepseek_v3.1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseToolCallFormat("mistral").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseToolCallFormat("Hermes").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseToolCallFormat("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolCallFormatTest, DetectFromChatTemplates) {
  // Qwen2.5 / Qwen3 (Hermes-style) system prompt for tools.
  const std::string qwen = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }})";
  EXPECT_EQ(DetectToolCallFormat(qwen), ToolCallFormat::kHermes);

  // Llama 3.1: built-in tools through <|python_tag|>, JSON with "parameters".
  const std::string llama31 = R"({{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|python_tag|>' + tool_call.name + '.call(' }}
{%- endif %}
{{- "<|eot_id|>" }})";
  EXPECT_EQ(DetectToolCallFormat(llama31), ToolCallFormat::kLlama3Json);

  // Llama 3.2 (1B/3B): the JSON instruction without <|python_tag|>.
  const std::string llama32 = R"({{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }})";
  EXPECT_EQ(DetectToolCallFormat(llama32), ToolCallFormat::kLlama3Json);

  // DeepSeek V3 renders past calls with its special tokens.
  const std::string deepseek = R"({%- for tool in message['tool_calls'] %}
{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}})";
  EXPECT_EQ(DetectToolCallFormat(deepseek), ToolCallFormat::kDeepSeekV3);

  // DeepSeek V3.1 renders them as name, separator, arguments: no type, no fence.
  const std::string deepseek_v31 = R"({%- for tool in message['tool_calls'] -%}
      {%- if not ns.is_first -%}
        {%- if message['content'] is none -%}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
          {%- else -%}{{message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
        {%- endif -%}
        {%- set ns.is_first = true -%}
        {%- else -%}{{'<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}
      {%- endif -%}
    {%- endfor -%}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}
{%- if message['role'] == 'tool' -%}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif -%})";
  EXPECT_EQ(DetectToolCallFormat(deepseek_v31), ToolCallFormat::kDeepSeekV31);
  // The begin marker alone (say, in a system prompt) keeps the V3 default.
  EXPECT_EQ(DetectToolCallFormat("Call tools with <｜tool▁calls▁begin｜>."), ToolCallFormat::kDeepSeekV3);

  // Llama 2 / Mistral style templates have no tool markers.
  EXPECT_EQ(DetectToolCallFormat(
                "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}"),
            ToolCallFormat::kNone);
  // "parameters" alone (a JSON-schema mention) is not Llama 3.
  EXPECT_EQ(DetectToolCallFormat("{{ tool.function.parameters | tojson }} \"parameters\""),
            ToolCallFormat::kNone);
  EXPECT_EQ(DetectToolCallFormat(""), ToolCallFormat::kNone);
}

TEST(IdSourceTest, SeededIdsAreDeterministicAndWellFormed) {
  const std::vector<std::string> a = Ids(42, 50), b = Ids(42, 50), c = Ids(43, 50);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const std::string& id : a) {
    ASSERT_EQ(id.size(), 5u + 24u);
    EXPECT_EQ(id.substr(0, 5), "call_");
    for (char ch : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << id;
  }
  for (size_t i = 1; i < a.size(); ++i) EXPECT_NE(a[i], a[i - 1]);
  IdSource unseeded;
  EXPECT_NE(unseeded.Next(), unseeded.Next());
}

// ---------------------------------------------------------------------------
// Hermes (Qwen2.5 / Qwen3 / Hermes).

TEST(HermesTest, SingleCall) {
  CheckAllSplits(ToolCallFormat::kHermes,
                 "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": "
                 "{\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}}\n</tool_call>",
                 Want("", {{"get_current_temperature",
                            R"({"location":"San Francisco, CA, USA","unit":"celsius"})"}}));
}

TEST(HermesTest, ContentThenSeveralCalls) {
  const std::string text =
      "I'll check both cities.\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"days\": 3}}\n"
      "</tool_call>";
  CheckAllSplits(ToolCallFormat::kHermes, text,
                 Want("I'll check both cities.\n\n", {{"get_weather", R"({"city":"Paris"})"},
                                                       {"get_weather", R"({"city":"Tokyo","days":3})"}}));
}

TEST(HermesTest, NestedArgumentsWithMarkersInsideStrings) {
  const std::string text = R"(<tool_call>
{"name": "run_code", "arguments": {"code": "if (x) { return \"}\"; }", "note": "</tool_call> is the end tag, <tool_call> the start", "nested": {"list": [1, 2.5, -3e2, true, null, {"k": "v"}], "empty": {}, "arr": []}}}
</tool_call>)";
  CheckAllSplits(
      ToolCallFormat::kHermes, text,
      Want("", {{"run_code",
                 R"({"code":"if (x) { return \"}\"; }","note":"</tool_call> is the end tag, <tool_call> the start","nested":{"list":[1,2.5,-300.0,true,null,{"k":"v"}],"empty":{},"arr":[]}})"}}));
}

TEST(HermesTest, UnicodeArgumentsAreKeptAsUtf8) {
  const std::string text =
      "Voilà 😀\n<tool_call>\n{\"name\": \"translate\", \"arguments\": {\"text\": \"Zürich ist schön\", "
      "\"escaped\": \"\\u00e9\\n\\ud83d\\ude00\", \"to\": \"中文\"}}\n</tool_call>";
  CheckAllSplits(ToolCallFormat::kHermes, text,
                 Want("Voilà 😀\n", {{"translate",
                                    R"({"text":"Zürich ist schön","escaped":"é\n😀","to":"中文"})"}}));
}

TEST(HermesTest, KeyOrderAndMissingArguments) {
  CheckAllSplits(ToolCallFormat::kHermes,
                 "<tool_call>{\"arguments\": {\"z\": 1, \"a\": 2}, \"name\": \"f\"}</tool_call>"
                 "<tool_call>{\"name\": \"g\"}</tool_call>",
                 Want("", {{"f", R"({"z":1,"a":2})"}, {"g", "{}"}}));
}

TEST(HermesTest, MalformedBlocksStayContent) {
  const std::vector<std::string> bad = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {'a': 1}}\n</tool_call>",  // not JSON
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                          // no name
      "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",             // name not a string
      "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",          // empty name
      "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",        // args not an object
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 01}}\n</tool_call>",
      "<tool_call>\nget_weather(city=\"Paris\")\n</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}}</tool_call>",  // stray brace
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_cal>",
      "<tool_call></tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"\xff\"}}\n</tool_call>",  // bad UTF-8
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}",                 // unterminated
      "<tool_call>\n{\"name\": \"f\", \"argu",                                    // cut off
      "<tool_call>",
      "<tool_ca",
  };
  for (const std::string& b : bad) {
    CheckAllSplits(ToolCallFormat::kHermes, "Let me try.\n" + b, Want("Let me try.\n" + b, {}));
  }
  // A bad block does not hide a good one after it, nor one inside it.
  const std::string good = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  CheckAllSplits(ToolCallFormat::kHermes, bad[0] + "\n" + good, Want(bad[0] + "\n", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", " + good,
                 Want("<tool_call>\n{\"name\": \"f\", ", {{"f", "{}"}}));
}

TEST(HermesTest, PlainContentAndTextAfterCalls) {
  const std::string plain = "Use <tool> tags, <tool_call or </tool_call> if you like; {\"name\": \"x\"}";
  CheckAllSplits(ToolCallFormat::kHermes, plain, Want(plain, {}));
  CheckAllSplits(ToolCallFormat::kHermes, "  \n", Want("  \n", {}));
  CheckAllSplits(ToolCallFormat::kHermes,
                 "\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nDone.\n",
                 Want("\nDone.\n", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kHermes,
                 "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n\n",
                 Want("", {{"f", "{}"}}));
}

// Qwen3 with thinking: reasoning first, then the tool parser on the content.
TEST(HermesTest, AfterReasoning) {
  const std::string output =
      "<think>\nThe user wants the weather, so I call get_weather.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Berlin\"}}\n</tool_call>";
  const ReasoningParser::Delta split = ReasoningParser::Split(output, false);
  EXPECT_EQ(split.reasoning, "\nThe user wants the weather, so I call get_weather.\n");
  IdSource ids(7);
  const ParsedOutput parsed = ParseToolCalls(ToolCallFormat::kHermes, split.content, &ids);
  ExpectSame(parsed, Want("", {{"get_weather", R"({"city":"Berlin"})"}}), "qwen3");
}

// ---------------------------------------------------------------------------
// Llama 3 JSON.

TEST(Llama3JsonTest, SingleAndSeveralCalls) {
  CheckAllSplits(ToolCallFormat::kLlama3Json,
                 R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}})",
                 Want("", {{"get_weather", R"({"city":"Paris","unit":"celsius"})"}}));
  CheckAllSplits(
      ToolCallFormat::kLlama3Json,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": "
      "{\"x\": [1, {\"y\": \"};{\"}]}};{\"name\": \"c\", \"parameters\": {\"s\": \"ünï\"}}",
      Want("", {{"a", "{}"}, {"b", R"({"x":[1,{"y":"};{"}]})"}, {"c", R"({"s":"ünï"})"}}));
  CheckAllSplits(ToolCallFormat::kLlama3Json,
                 "\n\n  <|python_tag|> {\"name\": \"f\", \"parameters\": {\"n\": 1}}\n",
                 Want("", {{"f", R"({"n":1})"}}));
}

TEST(Llama3JsonTest, ContentThatIsNotACall) {
  for (const std::string text : {
           "The capital of France is Paris.",
           "{\"answer\": 42}",  // JSON output, not a call
           "{\"answer\": 42} and more",
           "<|python_tag|>brave_search.call(query=\"weather in Paris\")",
           "{\"name\": 5, \"parameters\": {}}",
           "{\"name\": \"f\", \"parameters\": [1]}",
           "{\"name\": \"f\", \"parameters\": {\"a\": }}; {\"name\": \"g\", \"parameters\": {}}",
           "{\"name\": \"f\", \"parameters\": {\"a\":",  // cut off
           "  Sure: {\"name\": \"f\", \"parameters\": {}}",
           "<|python_ta",
           " \n ",
           "",
       }) {
    CheckAllSplits(ToolCallFormat::kLlama3Json, text, Want(text, {}));
  }
}

TEST(Llama3JsonTest, TextAfterTheCallsIsContent) {
  const std::string call = R"({"name": "f", "parameters": {}})";
  CheckAllSplits(ToolCallFormat::kLlama3Json, call + " Let me know.", Want(" Let me know.", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kLlama3Json, call + "; {\"name\": 7}", Want("; {\"name\": 7}", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kLlama3Json, call + ";  ", Want(";  ", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kLlama3Json, call + "; {\"name\": \"g\", \"par",
                 Want("; {\"name\": \"g\", \"par", {{"f", "{}"}}));
}

// ---------------------------------------------------------------------------
// DeepSeek V3.

std::string DsCall(const std::string& name, const std::string& json) {
  return absl::StrCat(kDsCallBegin, "function", kDsSep, name, "\n```json\n", json, "\n```", kDsCallEnd);
}

TEST(DeepSeekV3Test, SingleCall) {
  CheckAllSplits(ToolCallFormat::kDeepSeekV3,
                 absl::StrCat(kDsCallsBegin, DsCall("get_weather", R"({"location": "Tokyo"})"),
                              kDsCallsEnd),
                 Want("", {{"get_weather", R"({"location":"Tokyo"})"}}));
}

TEST(DeepSeekV3Test, ContentThenSeveralCalls) {
  const std::string text = absl::StrCat(
      "Let me look both up.", kDsCallsBegin,
      DsCall("get_weather", "{\n  \"location\": \"東京\",\n  \"days\": [1, 2]\n}"), "\n",
      DsCall("search", R"({"q": "a } b ```<｜tool▁call▁end｜>", "n": {"deep": [[]]}})"), kDsCallsEnd);
  CheckAllSplits(ToolCallFormat::kDeepSeekV3, text,
                 Want("Let me look both up.",
                      {{"get_weather", R"({"location":"東京","days":[1,2]})"},
                       {"search", R"({"q":"a } b ```<｜tool▁call▁end｜>","n":{"deep":[[]]}})"}}));
}

TEST(DeepSeekV3Test, MissingSectionEndAndTrailingText) {
  const std::string call = DsCall("f", "{}");
  CheckAllSplits(ToolCallFormat::kDeepSeekV3, absl::StrCat(kDsCallsBegin, call), Want("", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kDeepSeekV3, absl::StrCat(kDsCallsBegin, call, kDsCallsEnd, " ok"),
                 Want(" ok", {{"f", "{}"}}));
  // Cut off inside the second call: the first stands, the rest is content.
  const std::string cut = absl::StrCat("\n", kDsCallBegin, "function", kDsSep, "get_w");
  CheckAllSplits(ToolCallFormat::kDeepSeekV3, absl::StrCat(kDsCallsBegin, call, cut),
                 Want(cut, {{"f", "{}"}}));
}

TEST(DeepSeekV3Test, MalformedCallsStayContent) {
  const std::vector<std::string> bad = {
      absl::StrCat(kDsCallsBegin, DsCall("f", R"({"a": })"), kDsCallsEnd),
      absl::StrCat(kDsCallsBegin, DsCall("f", "[1, 2]"), kDsCallsEnd),
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "fn", kDsSep, "f\n```json\n{}\n```", kDsCallEnd),
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "function", kDsSep, "f```json{}```", kDsCallEnd),
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "function", kDsSep, "f\n```json\n{}\n```\n", kDsCallsEnd),
      absl::StrCat(kDsCallsBegin, kDsCallsEnd),
      absl::StrCat(kDsCallsBegin, "plain text"),
      absl::StrCat(kDsCallsBegin, DsCall(std::string(300, 'n'), "{}")),  // name too long
      std::string(kDsCallsBegin),
      std::string(kDsCallsBegin.substr(0, 9)),  // ends inside a character
  };
  for (const std::string& b : bad) {
    CheckAllSplits(ToolCallFormat::kDeepSeekV3, "Hi." + b, Want("Hi." + b, {}));
  }
  // A bad call after a good one ends the section there.
  const std::string rest = absl::StrCat("\n", DsCall("g", "{oops}"), kDsCallsEnd);
  CheckAllSplits(ToolCallFormat::kDeepSeekV3, absl::StrCat(kDsCallsBegin, DsCall("f", "{}"), rest),
                 Want(rest, {{"f", "{}"}}));
}

// ---------------------------------------------------------------------------
// DeepSeek V3.1.

std::string Ds31Call(const std::string& name, const std::string& json) {
  return absl::StrCat(kDsCallBegin, name, kDsSep, json, kDsCallEnd);
}

TEST(DeepSeekV31Test, SingleCall) {
  CheckAllSplits(ToolCallFormat::kDeepSeekV31,
                 absl::StrCat(kDsCallsBegin, Ds31Call("get_weather", R"({"location": "Tokyo"})"),
                              kDsCallsEnd),
                 Want("", {{"get_weather", R"({"location":"Tokyo"})"}}));
  // Whitespace around the name and the arguments is tolerated.
  CheckAllSplits(ToolCallFormat::kDeepSeekV31,
                 absl::StrCat(kDsCallsBegin, kDsCallBegin, " f\t", kDsSep, "\n{\n  \"a\": 1\n}\n", kDsCallEnd,
                              kDsCallsEnd),
                 Want("", {{"f", R"({"a":1})"}}));
}

TEST(DeepSeekV31Test, ContentThenSeveralCalls) {
  const std::string text = absl::StrCat(
      "Let me look both up.\n\n", kDsCallsBegin,
      Ds31Call("get_weather", R"({"location": "東京", "days": [1, 2]})"),
      Ds31Call("search", R"({"q": "a } b <｜tool▁sep｜><｜tool▁call▁end｜>", "n": {"deep": [[]]}})"), "\n",
      Ds31Call("noop", "{}"), kDsCallsEnd);
  CheckAllSplits(ToolCallFormat::kDeepSeekV31, text,
                 Want("Let me look both up.\n\n",
                      {{"get_weather", R"({"location":"東京","days":[1,2]})"},
                       {"search", R"({"q":"a } b <｜tool▁sep｜><｜tool▁call▁end｜>","n":{"deep":[[]]}})"},
                       {"noop", "{}"}}));
}

TEST(DeepSeekV31Test, MissingSectionEndAndTrailingText) {
  const std::string call = Ds31Call("f", "{}");
  CheckAllSplits(ToolCallFormat::kDeepSeekV31, absl::StrCat(kDsCallsBegin, call), Want("", {{"f", "{}"}}));
  CheckAllSplits(ToolCallFormat::kDeepSeekV31, absl::StrCat(kDsCallsBegin, call, kDsCallsEnd, " ok"),
                 Want(" ok", {{"f", "{}"}}));
  // Cut off inside the second call: the first stands, the rest is content.
  for (const std::string& cut : {absl::StrCat(kDsCallBegin, "get_w"),
                                 absl::StrCat(kDsCallBegin, "get_weather", kDsSep.substr(0, 7)),
                                 absl::StrCat(kDsCallBegin, "g", kDsSep, "{\"a\": [1"),
                                 absl::StrCat(kDsCallBegin, "g", kDsSep, "{}", kDsCallEnd.substr(0, 4))}) {
    CheckAllSplits(ToolCallFormat::kDeepSeekV31, absl::StrCat(kDsCallsBegin, call, cut), Want(cut, {{"f", "{}"}}));
  }
}

TEST(DeepSeekV31Test, MalformedCallsStayContent) {
  const std::vector<std::string> bad = {
      absl::StrCat(kDsCallsBegin, Ds31Call("f", R"({"a": })"), kDsCallsEnd),          // bad JSON
      absl::StrCat(kDsCallsBegin, Ds31Call("f", "{'a': 1}"), kDsCallsEnd),            // not JSON
      absl::StrCat(kDsCallsBegin, Ds31Call("f", "{}}"), kDsCallsEnd),                 // stray brace
      absl::StrCat(kDsCallsBegin, Ds31Call("f", "[1, 2]"), kDsCallsEnd),              // args not an object
      absl::StrCat(kDsCallsBegin, Ds31Call("f", R"("{}")"), kDsCallsEnd),             // args a string
      absl::StrCat(kDsCallsBegin, Ds31Call("f", "```json\n{}\n```"), kDsCallsEnd),   // fenced, as V3
      absl::StrCat(kDsCallsBegin, DsCall("f", "{}"), kDsCallsEnd),                    // V3's call
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "f", kDsSep, "{}", kDsCallsEnd),      // no call end
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "f", kDsSep, "{}"),                   // cut off
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "f", kDsCallEnd),                     // no separator
      absl::StrCat(kDsCallsBegin, Ds31Call("", "{}"), kDsCallsEnd),                   // no name
      absl::StrCat(kDsCallsBegin, Ds31Call(" \t", "{}"), kDsCallsEnd),                // blank name
      absl::StrCat(kDsCallsBegin, Ds31Call("get\nweather", "{}"), kDsCallsEnd),       // name over two lines
      absl::StrCat(kDsCallsBegin, Ds31Call("a<b", "{}"), kDsCallsEnd),                // '<' in the name
      absl::StrCat(kDsCallsBegin, Ds31Call(std::string(300, 'n'), "{}")),             // name too long
      absl::StrCat(kDsCallsBegin, kDsCallsEnd),
      absl::StrCat(kDsCallsBegin, "plain text"),
      absl::StrCat(kDsCallsBegin, kDsCallBegin, "f", kDsSep.substr(0, 10)),          // ends inside the separator
      std::string(kDsCallsBegin),
  };
  for (const std::string& b : bad) {
    CheckAllSplits(ToolCallFormat::kDeepSeekV31, "Hi." + b, Want("Hi." + b, {}));
  }
  // A bad call after a good one ends the section there.
  const std::string rest = absl::StrCat("\n", Ds31Call("g", "{oops}"), Ds31Call("h", "{}"), kDsCallsEnd);
  CheckAllSplits(ToolCallFormat::kDeepSeekV31, absl::StrCat(kDsCallsBegin, Ds31Call("f", "{}"), rest),
                 Want(rest, {{"f", "{}"}}));
  // A V3.1 call is not a V3 one.
  const std::string v31 = absl::StrCat(kDsCallsBegin, Ds31Call("f", "{}"), kDsCallsEnd);
  CheckAllSplits(ToolCallFormat::kDeepSeekV3, v31, Want(v31, {}));
}

TEST(ToolCallFormatTest, NoneIsContentOnly) {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> é";
  CheckAllSplits(ToolCallFormat::kNone, text, Want(text, {}));
}

// ---------------------------------------------------------------------------
// Held-back text: a marker cut across deltas never goes out as content, and
// text that cannot start a marker goes out at once.

std::string ContentOf(const std::vector<ToolDelta>& deltas) {
  std::string s;
  for (const ToolDelta& d : deltas) {
    EXPECT_FALSE(d.is_tool_call());
    s += d.content;
  }
  return s;
}

TEST(StreamingTest, MarkerSplitAcrossDeltasIsHeldBack) {
  IdSource ids(1);
  {
    StreamingToolParser p(ToolCallFormat::kHermes, &ids);
    EXPECT_EQ(ContentOf(p.Feed("Hello wor")), "Hello wor");
    EXPECT_EQ(ContentOf(p.Feed("ld <")), "ld ");
    EXPECT_EQ(ContentOf(p.Feed("tool")), "");
    EXPECT_EQ(ContentOf(p.Feed("_call>\n{\"name\": \"f\", ")), "");
    EXPECT_EQ(ContentOf(p.Feed("\"arguments\": {}}\n</tool_")), "");
    EXPECT_FALSE(p.saw_tool_call());
    const std::vector<ToolDelta> d = p.Feed("call>");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].index, 0);
    EXPECT_EQ(d[0].name, "f");
    EXPECT_EQ(d[0].arguments, "{}");
    EXPECT_TRUE(p.saw_tool_call());
    // "<tool" that turns out to be something else goes out when decided
    // (with the space before it, held as whitespace next to a call).
    EXPECT_EQ(ContentOf(p.Feed(" <tool")), "");
    EXPECT_EQ(ContentOf(p.Feed("s>")), " <tools>");
    EXPECT_EQ(ContentOf(p.Finish()), "");
  }
  {
    StreamingToolParser p(ToolCallFormat::kLlama3Json, &ids);
    EXPECT_EQ(ContentOf(p.Feed("\n<|python_")), "");
    EXPECT_EQ(ContentOf(p.Feed("tag|>{\"name\": \"f\", \"parameters\": {}")), "");
    const std::vector<ToolDelta> d = p.Feed("}");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].name, "f");
  }
  {
    StreamingToolParser p(ToolCallFormat::kLlama3Json, &ids);
    EXPECT_EQ(ContentOf(p.Feed("  ")), "");
    EXPECT_EQ(ContentOf(p.Feed("Paris")), "  Paris");  // decided: not a call
    EXPECT_EQ(ContentOf(p.Feed(" {")), " {");
  }
  {
    StreamingToolParser p(ToolCallFormat::kDeepSeekV3, &ids);
    const std::string begin(kDsCallsBegin);
    EXPECT_EQ(ContentOf(p.Feed("Sure." + begin.substr(0, 3))), "Sure.");  // inside "｜"
    EXPECT_EQ(ContentOf(p.Feed(begin.substr(3) + std::string(kDsCallBegin).substr(0, 5))), "");
    const std::vector<ToolDelta> d =
        p.Feed(DsCall("f", "{\"a\": 1}").substr(5) + std::string(kDsCallsEnd));
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].arguments, R"({"a":1})");
  }
  {
    StreamingToolParser p(ToolCallFormat::kDeepSeekV31, &ids);
    EXPECT_EQ(ContentOf(p.Feed("Sure." + kDsCallsBegin + kDsCallBegin + "get_we")), "Sure.");
    EXPECT_EQ(ContentOf(p.Feed("ather" + kDsSep.substr(0, 6))), "");  // inside the separator
    EXPECT_EQ(ContentOf(p.Feed(kDsSep.substr(6) + "{\"a\": 1}" + kDsCallEnd.substr(0, 2))), "");
    const std::vector<ToolDelta> d = p.Feed(kDsCallEnd.substr(2) + kDsCallsEnd);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].name, "get_weather");
    EXPECT_EQ(d[0].arguments, R"({"a":1})");
    EXPECT_EQ(ContentOf(p.Feed(" Done.")), " Done.");
  }
  {
    StreamingToolParser p(ToolCallFormat::kNone, &ids);
    EXPECT_EQ(ContentOf(p.Feed("caf\xC3")), "caf");  // é cut in two
    EXPECT_EQ(ContentOf(p.Feed("\xA9 <tool_call>")), "\xC3\xA9 <tool_call>");
  }
}

TEST(StreamingTest, ReasoningTagSplitAcrossDeltasIsHeldBack) {
  ReasoningParser p;
  ReasoningParser::Delta d = p.Feed("<thi");
  EXPECT_EQ(d.reasoning + d.content, "");
  d = p.Feed("nk>\nabc</th");
  EXPECT_EQ(d.reasoning, "\nabc");
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(p.in_reasoning());
  d = p.Feed("ink>\n\nAnswer");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "\n\nAnswer");
  EXPECT_FALSE(p.in_reasoning());
  d = p.Finish();
  EXPECT_EQ(d.reasoning + d.content, "");
}

// ---------------------------------------------------------------------------
// Reasoning.

TEST(ReasoningTest, Examples) {
  struct Example {
    std::string text;
    bool starts_in_reasoning;
    std::string reasoning;
    std::string content;
  };
  for (const Example& e : std::vector<Example>{
           {"<think>\nOkay, 2+2.\n</think>\n\nThe answer is 4.", false, "\nOkay, 2+2.\n",
            "\n\nThe answer is 4."},
           {"No thinking here.", false, "", "No thinking here."},
           {"Okay, 2+2.\n</think>\n\n4", true, "Okay, 2+2.\n", "\n\n4"},
           {"<think>\nhmm</think>4", true, "\nhmm", "4"},  // the model repeats <think>
           {"<think>\nstill thinking", false, "\nstill thinking", ""},
           {"still thinking", true, "still thinking", ""},
           {"Before <think>in</think>after <think>x</think>", false, "in",
            "Before after <think>x</think>"},
           {"a </think> b", false, "", "a </think> b"},
           {"<think></think>", false, "", ""},
           {"</thinking> is not a tag", true, "</thinking> is not a tag", ""},
           {"", true, "", ""},
       }) {
    SCOPED_TRACE(e.text);
    const ReasoningParser::Delta d = ReasoningParser::Split(e.text, e.starts_in_reasoning);
    EXPECT_EQ(d.reasoning, e.reasoning);
    EXPECT_EQ(d.content, e.content);
  }
}

// ---------------------------------------------------------------------------
// Randomized differential: random content and calls rendered as each model
// writes them, parsed one-shot and streamed under random splits, against the
// generated ground truth.

// Pieces of content. None contains '>' except whole tags that cannot end a
// marker, so no two of them ever join into a marker; some are markers' proper
// prefixes, some are multi-byte characters.
const std::vector<std::string>& ContentWords() {
  static const auto* words = new std::vector<std::string>{
      "the", "weather", " in ", "Paris", " ", "  ", "\n", "\n\n", "\t", "é", "€", "😀", "中文",
      "｜", "▁", "<", "<tool", "<tool_call", "</tool_call>", "</tool", "tool_call", "{", "}", "[",
      "\"", ";", "`", "```json", "<|python", "<|python_tag", "function", "<｜tool▁call",
      "<｜tool▁calls▁begin", "<｜", "\\", "name", ":", ",", "1", "OK."};
  return *words;
}

// JSON string pieces, including every marker (JSON escapes none of them).
const std::vector<std::string>& StringPieces() {
  static const auto* pieces = new std::vector<std::string>{
      "a", "Zürich", "😀", "中", " ", "}", "{", "]", "\"", "\\", "/", "\n", "\t", "\x01", ";",
      "</tool_call>", "<tool_call>", "<|python_tag|>", "```", "<｜tool▁call▁end｜>",
      "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁calls▁end｜>", "name", "\"name\": \"x\""};
  return *pieces;
}

std::string RandomText(std::mt19937_64& rng, const std::vector<std::string>& pieces, int max) {
  std::string s;
  for (int n = static_cast<int>(rng() % (max + 1)); n > 0; --n) s += pieces[rng() % pieces.size()];
  return s;
}

std::string RandomName(std::mt19937_64& rng) {
  static constexpr std::string_view kFirst = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_";
  static constexpr std::string_view kRest = "abcdefghijklmnopqrstuvwxyz0123456789_.-";
  std::string s(1, kFirst[rng() % kFirst.size()]);
  for (int n = static_cast<int>(rng() % 16); n > 0; --n) s += kRest[rng() % kRest.size()];
  return s;
}

Json RandomValue(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth > 0 ? 8 : 5)) {
    case 0:
      return RandomText(rng, StringPieces(), 5);
    case 1:
      return static_cast<int64_t>(rng() % 2000001) - 1000000;
    case 2: {
      static const double kDoubles[] = {0.5, -2.25, 1e-7, 3.14159, 1e300, -0.0, 12345.678};
      return kDoubles[rng() % 7];
    }
    case 3:
      return rng() % 2 == 0;
    case 4:
      return nullptr;
    case 5:
    case 6: {
      Json obj = Json::object();
      for (int n = static_cast<int>(rng() % 4); n > 0; --n) {
        obj[RandomText(rng, StringPieces(), 2)] = RandomValue(rng, depth - 1);
      }
      return obj;
    }
    default: {
      Json arr = Json::array();
      for (int n = static_cast<int>(rng() % 4); n > 0; --n) arr.push_back(RandomValue(rng, depth - 1));
      return arr;
    }
  }
}

Json RandomArgs(std::mt19937_64& rng) {
  Json args = Json::object();
  for (int n = static_cast<int>(rng() % 5); n > 0; --n) {
    args[RandomName(rng)] = RandomValue(rng, 3);
  }
  return args;
}

// Python's json.dumps(value): ", " and ": " separators, non-ASCII escaped.
std::string PythonDump(const Json& v) {
  if (v.is_object()) {
    std::vector<std::string> items;
    for (const auto& [k, x] : v.items()) {
      items.push_back(Json(k).dump(-1, ' ', true) + ": " + PythonDump(x));
    }
    return "{" + absl::StrJoin(items, ", ") + "}";
  }
  if (v.is_array()) {
    std::vector<std::string> items;
    for (const Json& x : v) items.push_back(PythonDump(x));
    return "[" + absl::StrJoin(items, ", ") + "]";
  }
  return v.dump(-1, ' ', true);
}

// `v` as some model or library might write it.
std::string RenderJson(std::mt19937_64& rng, const Json& v) {
  switch (rng() % 4) {
    case 0:
      return v.dump();
    case 1:
      return v.dump(2);
    case 2:
      return PythonDump(v);
    default:
      return v.dump(-1, ' ', /*ensure_ascii=*/true);
  }
}

// A generated output: pieces of content and calls, in order. Ground truth
// applies the header's rule: with any call, whitespace-only content runs go.
struct Generated {
  std::string text;
  std::vector<std::string> runs;  // content between calls (runs.size() == calls + 1)
  std::vector<std::pair<std::string, std::string>> calls;

  void AddContent(std::string_view s) {
    text += s;
    runs.back() += s;
  }
  void AddCall(std::string_view rendered, std::string name, const Json& args) {
    text += rendered;
    calls.push_back({std::move(name), args.dump()});
    runs.emplace_back();
  }
  ParsedOutput Want(uint64_t seed) const {
    ParsedOutput out;
    for (const std::string& r : runs) {
      if (!calls.empty() && r.find_first_not_of(" \t\r\n") == std::string::npos) continue;
      out.content += r;
    }
    const std::vector<std::string> ids = Ids(seed, calls.size());
    for (size_t i = 0; i < calls.size(); ++i) out.calls.push_back({ids[i], calls[i].first, calls[i].second});
    return out;
  }
};

std::string RandomSpace(std::mt19937_64& rng) {
  static const std::string kSpaces[] = {"", "\n", "\n\n", " ", "\t\n"};
  return kSpaces[rng() % 5];
}

const std::vector<std::string>& BadHermesBlocks() {
  static const auto* blocks = new std::vector<std::string>{
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {'a': 1}}\n</tool_call>",
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
      "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",
      "<tool_call>\nsearch(q=1)\n</tool_call>",
      "<tool_call>{\"name\": \"f\"}}</tool_call>",
      "<tool_call>{\"name\": \"f\"} </tool_cal>",
  };
  return *blocks;
}

Generated RandomHermes(std::mt19937_64& rng) {
  Generated g;
  g.runs.emplace_back();
  const auto content = [&] {
    switch (rng() % 4) {
      case 0:
        return std::string();
      case 1:
        return RandomSpace(rng);
      case 2:
        return RandomText(rng, ContentWords(), 8);
      default:
        return RandomText(rng, ContentWords(), 3) + BadHermesBlocks()[rng() % BadHermesBlocks().size()] +
               RandomText(rng, ContentWords(), 3);
    }
  };
  g.AddContent(content());
  for (int n = static_cast<int>(rng() % 4); n > 0; --n) {
    const std::string name = RandomName(rng);
    const Json args = RandomArgs(rng);
    Json call = Json::object();
    if (rng() % 4 == 0) {  // key order does not matter
      call["arguments"] = args;
      call["name"] = name;
    } else {
      call["name"] = name;
      call["arguments"] = args;
    }
    g.AddCall(absl::StrCat("<tool_call>", RandomSpace(rng), RenderJson(rng, call), RandomSpace(rng),
                           "</tool_call>"),
              name, args);
    g.AddContent(rng() % 4 == 0 ? content() : RandomSpace(rng));
  }
  if (rng() % 5 == 0) {  // cut off inside a last block
    const std::string block = absl::StrCat("<tool_call>\n", RenderJson(rng, Json{{"name", "f"}, {"arguments", RandomArgs(rng)}}),
                                           "\n</tool_call>");
    g.AddContent(block.substr(0, rng() % block.size()));
  }
  return g;
}

Generated RandomLlama3(std::mt19937_64& rng) {
  Generated g;
  g.runs.emplace_back();
  // Words without '{': no valid call can start in them.
  static const std::vector<std::string> kWords = {"Sure", " ", "\n", "ünï", "😀", ";", ".", "call", "<|python"};
  if (rng() % 4 == 0) {  // content only
    static const std::vector<std::string> kNotCalls = {
        "{\"answer\": 42}", "{\"name\": 5, \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": [1]}",
        "{\"function\": \"f\"}", "{\"name\": \"f\", \"parameters\": {\"a\": }}", "<|python_tag|>x.call()"};
    switch (rng() % 3) {
      case 0:
        g.AddContent(RandomText(rng, kWords, 8));
        break;
      case 1:
        g.AddContent(RandomSpace(rng) + kNotCalls[rng() % kNotCalls.size()] + RandomText(rng, kWords, 3));
        break;
      default:
        g.AddContent(RandomSpace(rng) + kNotCalls[rng() % kNotCalls.size()] + "; " +
                     R"({"name": "g", "parameters": {}})");
    }
    return g;
  }
  g.AddContent(RandomSpace(rng));
  if (rng() % 2 == 0) g.AddContent("<|python_tag|>");  // a marker, but in the run's text
  g.runs.back().clear();  // ... dropped with the whitespace, as a call follows
  const int n = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n; ++i) {
    static const std::string kSeparators[] = {"; ", ";", " ; ", ";\n"};
    if (i > 0) g.AddContent(kSeparators[rng() % 4]);
    g.runs.back().clear();  // the separator is not content either
    const std::string name = RandomName(rng);
    const Json args = RandomArgs(rng);
    Json call{{"name", name}, {rng() % 3 == 0 ? "arguments" : "parameters", args}};
    g.AddCall(RenderJson(rng, call), name, args);
  }
  switch (rng() % 5) {
    case 0:
      g.AddContent(RandomText(rng, kWords, 6));
      break;
    case 1:
      g.AddContent("; {\"name\": 7}");
      break;
    case 2: {
      const std::string call = RenderJson(rng, Json{{"name", "g"}, {"parameters", RandomArgs(rng)}});
      g.AddContent("; " + call.substr(0, rng() % call.size()));
      break;
    }
    default:
      g.AddContent(RandomSpace(rng));
  }
  return g;
}

std::string RenderDsCall(std::mt19937_64& rng, ToolCallFormat format, const std::string& name, const Json& args) {
  if (format == ToolCallFormat::kDeepSeekV31) return Ds31Call(name, RenderJson(rng, args));
  return DsCall(name, RenderJson(rng, args));
}

// Calls that end a section: each is not a call, in `format`.
const std::vector<std::string>& BadDsCalls(ToolCallFormat format) {
  static const auto* v3 = new std::vector<std::string>{
      absl::StrCat(kDsCallBegin, "function", kDsSep, "f\n```json\n{\"a\": }\n```", kDsCallEnd),
      absl::StrCat(kDsCallBegin, "fn", kDsSep, "f\n```json\n{}\n```", kDsCallEnd),
      absl::StrCat(kDsCallBegin, "function", kDsSep, "f```json{}```", kDsCallEnd),
      absl::StrCat(kDsCallBegin, "function", kDsSep, "f\n```json\n[1]\n```", kDsCallEnd)};
  static const auto* v31 = new std::vector<std::string>{
      Ds31Call("f", "{\"a\": }"), Ds31Call("f", "[1]"), Ds31Call("f\ng", "{}"), DsCall("f", "{}"),
      absl::StrCat(kDsCallBegin, "f", kDsSep, "{}", kDsCallsEnd)};
  return format == ToolCallFormat::kDeepSeekV31 ? *v31 : *v3;
}

template <ToolCallFormat format>
Generated RandomDeepSeek(std::mt19937_64& rng) {
  Generated g;
  g.runs.emplace_back();
  g.AddContent(RandomText(rng, ContentWords(), 6));
  if (rng() % 5 == 0) return g;  // no section
  // The section: good calls, then maybe a bad one or a cut-off one, each of
  // which ends it (with no good call, the whole section is content).
  std::string section(kDsCallsBegin);
  const int good = static_cast<int>(rng() % 4);
  std::vector<std::pair<std::string, Json>> calls;
  std::vector<std::string> rendered;
  for (int i = 0; i < good; ++i) {
    calls.push_back({RandomName(rng), RandomArgs(rng)});
    const std::string space = i > 0 ? RandomSpace(rng) : "";
    rendered.push_back(space + RenderDsCall(rng, format, calls.back().first, calls.back().second));
  }
  std::string tail;  // text after the good calls
  switch (rng() % 4) {
    case 0: {  // a bad call, then the section's end
      const std::vector<std::string>& bad = BadDsCalls(format);
      tail = absl::StrCat(RandomSpace(rng), bad[rng() % bad.size()], kDsCallsEnd);
      break;
    }
    case 1: {  // cut off inside one more call
      const std::string more = RenderDsCall(rng, format, "g", RandomArgs(rng));
      tail = absl::StrCat(RandomSpace(rng), more.substr(0, rng() % more.size()));
      break;
    }
    case 2:  // no end marker
      break;
    default:
      tail = absl::StrCat(RandomSpace(rng), kDsCallsEnd, rng() % 3 == 0 ? RandomText(rng, ContentWords(), 4) : "");
  }
  const size_t first = tail.find_first_not_of(" \t\r\n");
  const bool ended_by_marker = first != std::string::npos && tail.compare(first, kDsCallsEnd.size(), kDsCallsEnd) == 0;
  if (good == 0) {  // not a section: all content
    g.AddContent(section + tail);
    return g;
  }
  for (int i = 0; i < good; ++i) {
    std::string text = (i == 0 ? section : "") + rendered[i];
    g.AddCall(text, calls[i].first, calls[i].second);
  }
  if (ended_by_marker) {
    // Whitespace and the end marker belong to the section; text after it is content.
    const size_t end = tail.find(kDsCallsEnd) + kDsCallsEnd.size();
    g.text += tail.substr(0, end);
    g.AddContent(tail.substr(end));
  } else {
    g.AddContent(tail);
  }
  return g;
}

void RunDifferential(ToolCallFormat format, Generated (*generate)(std::mt19937_64&), uint64_t seed) {
  std::mt19937_64 rng(seed);
  int with_calls = 0;
  for (int i = 0; i < 400; ++i) {
    const Generated g = generate(rng);
    const uint64_t id_seed = rng();
    const ParsedOutput want = g.Want(id_seed);
    with_calls += !want.calls.empty();
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", g.text));
    IdSource ids(id_seed);
    const ParsedOutput one_shot = ParseToolCalls(format, g.text, &ids);
    ExpectSame(one_shot, want, "one-shot vs ground truth");
    for (int mode = 0; mode < 3; ++mode) {
      ExpectSame(Stream(format, g.text, RandomCuts(rng, g.text.size(), mode), id_seed), one_shot,
                 "streamed vs one-shot");
    }
    if (i % 8 == 0) {
      ExpectSame(Stream(format, g.text, EveryByte(g.text.size()), id_seed), one_shot, "byte by byte");
    }
    if (::testing::Test::HasFailure()) return;  // one case's trace is enough
  }
  EXPECT_GT(with_calls, 150);  // the generator is not degenerate
}

TEST(DifferentialTest, Hermes) { RunDifferential(ToolCallFormat::kHermes, RandomHermes, 101); }
TEST(DifferentialTest, Llama3Json) { RunDifferential(ToolCallFormat::kLlama3Json, RandomLlama3, 202); }
TEST(DifferentialTest, DeepSeekV3) {
  RunDifferential(ToolCallFormat::kDeepSeekV3, RandomDeepSeek<ToolCallFormat::kDeepSeekV3>, 303);
}
TEST(DifferentialTest, DeepSeekV31) {
  RunDifferential(ToolCallFormat::kDeepSeekV31, RandomDeepSeek<ToolCallFormat::kDeepSeekV31>, 304);
}

// Reasoning: text = [pre] <think> R </think> C in its variants.
TEST(DifferentialTest, Reasoning) {
  static const std::vector<std::string> kWords = {
      "ok", " ", "\n", "\n\n", "é", "😀", "<", ">", "<think", "</think", "</thinking>", "think>",
      "<think>", "/", "<tool_call>"};
  std::mt19937_64 rng(404);
  for (int i = 0; i < 500; ++i) {
    const int mode = static_cast<int>(rng() % 5);
    const bool starts = mode >= 3;
    const bool opened = mode == 1 || mode == 2;  // the output writes <think>
    const bool closed = mode != 2 && mode != 4;
    const std::string pre = starts ? "" : RandomText(rng, kWords, 4);
    const std::string reasoning = mode == 0 ? "" : RandomText(rng, kWords, 6);
    const std::string post = RandomText(rng, kWords, 6);
    std::string text;
    ReasoningParser::Delta want;
    if (mode == 0) {
      text = pre + post;
      want.content = text;
      if (text.find("<think>") != std::string::npos) continue;
    } else {
      // The parts must not hold the tag that ends them.
      if (pre.find("<think>") != std::string::npos || reasoning.find("</think>") != std::string::npos) continue;
      if (starts && reasoning.rfind("<think>", 0) == 0) continue;
      const bool write_open = opened || (starts && rng() % 2 == 0);
      text = pre + (write_open ? "<think>" : "") + reasoning + (closed ? "</think>" + post : "");
      want.reasoning = reasoning;
      want.content = pre + (closed ? post : "");
    }
    SCOPED_TRACE(absl::StrCat("case ", i, " mode ", mode, ": ", text));
    const ReasoningParser::Delta one = ReasoningParser::Split(text, starts);
    EXPECT_EQ(one.reasoning, want.reasoning);
    EXPECT_EQ(one.content, want.content);
    for (int split = 0; split < 3; ++split) {
      std::vector<size_t> cuts = split == 0 ? EveryByte(text.size()) : RandomCuts(rng, text.size(), split);
      cuts.push_back(text.size());
      ReasoningParser p(starts);
      ReasoningParser::Delta got;
      size_t begin = 0;
      for (size_t cut : cuts) {
        ReasoningParser::Delta d = p.Feed(std::string_view(text).substr(begin, cut - begin));
        EXPECT_TRUE(IsValidUtf8(d.reasoning) && IsValidUtf8(d.content));
        got.reasoning += d.reasoning;
        got.content += d.content;
        begin = cut;
      }
      ReasoningParser::Delta d = p.Finish();
      got.reasoning += d.reasoning;
      got.content += d.content;
      EXPECT_EQ(got.reasoning, want.reasoning);
      EXPECT_EQ(got.content, want.content);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace chunkattn::tools
