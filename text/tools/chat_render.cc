// chunkattn-chat-render --tokenizer_config tokenizer_config.json [--template F]:
// renders a model's chat template for each JSON line on stdin,
//   {"messages": [...], "tools": [...], "add_generation_prompt": bool, "kwargs": {...}}
// and writes {"text": ...} or {"error": ..., "error_type": ...} per line
// (error_type "raise_exception" for the template's own raise_exception, else
// "Error"), the format of tests/text/chat_reference.py,
// so the two can be compared line by line. A line with "template" renders that
// template with the line's "context" as its variables instead (nothing added).
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "text/chat_template.h"

ABSL_FLAG(std::string, tokenizer_config, "", "tokenizer_config.json (chat_template, special tokens)");
ABSL_FLAG(std::string, template, "", "a chat_template.jinja to use instead of the config's");

nlohmann::ordered_json Result(const absl::StatusOr<std::string>& text) {
  nlohmann::ordered_json out;
  if (text.ok()) {
    out["text"] = *text;
  } else {
    out["error"] = std::string(text.status().message());
    out["error_type"] = chunkattn::ChatTemplate::IsRaisedByTemplate(text.status()) ? "raise_exception" : "Error";
  }
  return out;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Without files, only lines that carry their own template can be rendered.
  const bool has_files = !absl::GetFlag(FLAGS_tokenizer_config).empty() || !absl::GetFlag(FLAGS_template).empty();
  absl::StatusOr<chunkattn::ModelChatTemplate> loaded = absl::FailedPreconditionError(
      "no --tokenizer_config or --template given");
  if (has_files) {
    loaded = chunkattn::LoadChatTemplateFiles(absl::GetFlag(FLAGS_tokenizer_config), absl::GetFlag(FLAGS_template));
  }
  if (has_files && !loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
    return 2;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::ordered_json out;
    const nlohmann::ordered_json in = nlohmann::ordered_json::parse(line, nullptr, false);
    if (in.is_discarded() || !in.is_object()) {
      out["error"] = "input line is not a JSON object";
      out["error_type"] = "Error";
    } else if (in.contains("template")) {
      auto parsed = in["template"].is_string()
                        ? chunkattn::ChatTemplate::Parse(in["template"].get<std::string>())
                        : absl::StatusOr<chunkattn::ChatTemplate>(absl::InvalidArgumentError("template must be a string"));
      auto text = parsed.ok() ? parsed->Render(in.value("context", nlohmann::ordered_json::object()))
                              : absl::StatusOr<std::string>(parsed.status());
      out = Result(text);
    } else if (!loaded.ok()) {
      out = Result(loaded.status());
    } else {
      const nlohmann::ordered_json messages = in.value("messages", nlohmann::ordered_json::array());
      const nlohmann::ordered_json tools = in.contains("tools") ? in["tools"] : nlohmann::ordered_json();
      const nlohmann::ordered_json kwargs = in.value("kwargs", nlohmann::ordered_json::object());
      auto text = loaded->Apply(messages, tools, in.value("add_generation_prompt", false), kwargs);
      out = Result(text);
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  }
  return 0;
}
