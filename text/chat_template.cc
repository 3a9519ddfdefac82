// ChatTemplate and the loading of a model's template: the public API over
// the Jinja engine in text/jinja/ (lexer, parser, interpreter, values).
#include "text/chat_template.h"

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"
#include "text/jinja/value.h"
#include "text/utf8.h"

namespace chunkattn {

namespace {
constexpr char kRaisedPayload[] = "chunkattn.chat_template.raised";
}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  // The engine walks code points; a file from outside may hold any bytes.
  if (!IsValidUtf8(source)) return absl::InvalidArgumentError("chat template: not valid UTF-8");
  try {
    auto program = std::make_shared<jinja::Program>();
    program->body = jinja::Parse(jinja::Lex(std::string(source)));
    return ChatTemplate(std::move(program));
  } catch (const jinja::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.message));
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const Limits& limits) const {
  if (!context.is_object()) return absl::InvalidArgumentError("chat template: the context must be a JSON object");
  try {
    jinja::Frame globals;
    jinja::AddGlobals(&globals);
    jinja::Frame root;
    root.parent = &globals;
    for (auto it = context.begin(); it != context.end(); ++it) root.vars[it.key()] = jinja::FromJson(it.value());
    jinja::Interp interp(limits, &root);
    interp.Exec(program_->body, &root);
    return std::move(interp.out);
  } catch (const jinja::Error& e) {
    absl::Status status = absl::InvalidArgumentError(e.raised ? e.message : absl::StrCat("chat template: ", e.message));
    if (e.raised) status.SetPayload(kRaisedPayload, absl::Cord("1"));
    return status;
  }
}

bool ChatTemplate::IsRaisedByTemplate(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

absl::StatusOr<std::string> ModelChatTemplate::Apply(const nlohmann::ordered_json& messages,
                                                     const nlohmann::ordered_json& tools,
                                                     bool add_generation_prompt,
                                                     const nlohmann::ordered_json& extra,
                                                     const ChatTemplate::Limits& limits) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a list");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) context[it.key()] = it.value();
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  }
  context["messages"] = messages;
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  return (tool_use_template && !tools.is_null() ? *tool_use_template : chat_template).Render(context, limits);
}

namespace {

// base's reader; a read that fails midway is a bad input file, as documented.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (absl::IsDataLoss(text.status())) return absl::InvalidArgumentError(text.status().message());
  return text;
}

}  // namespace

absl::StatusOr<ModelChatTemplate> LoadChatTemplateFiles(const std::string& tokenizer_config_path,
                                                        const std::string& template_path) {
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (!tokenizer_config_path.empty()) {
    absl::StatusOr<std::string> text = ReadFile(tokenizer_config_path);
    if (!text.ok() && !(text.status().code() == absl::StatusCode::kNotFound && !template_path.empty()))
      return text.status();
    if (text.ok()) {
      config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (config.is_discarded() || !config.is_object())
        return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, ": not a JSON object"));
    }
  }
  // The template: the file, the config's string, or its named list's
  // "default" (and "tool_use", which transformers takes when tools are given).
  std::string source, tool_use_source;
  std::string origin = template_path.empty() ? tokenizer_config_path : template_path;
  if (!template_path.empty()) {
    absl::StatusOr<std::string> text = ReadFile(template_path);
    if (!text.ok()) return text.status();
    source = std::move(*text);
  } else {
    const auto it = config.find("chat_template");
    if (it == config.end() || it->is_null())
      return absl::NotFoundError(absl::StrCat(tokenizer_config_path, " has no chat_template"));
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      bool found = false;
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path,
                                                         ": chat_template entries must be {name, template}"));
        if (entry["name"] == "default") {
          source = entry["template"].get<std::string>();
          found = true;
        } else if (entry["name"] == "tool_use") {
          tool_use_source = entry["template"].get<std::string>();
        }
      }
      if (!found)
        return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, ": chat_template has no \"default\" entry"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, ": chat_template must be a string or a list"));
    }
  }
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message()));
  ModelChatTemplate out{std::move(*parsed), std::nullopt, nlohmann::ordered_json::object(),
                        absl::StrCat(source, tool_use_source)};
  if (!tool_use_source.empty()) {
    absl::StatusOr<ChatTemplate> tool_use = ChatTemplate::Parse(tool_use_source);
    if (!tool_use.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, " (tool_use): ", tool_use.status().message()));
    out.tool_use_template = std::move(*tool_use);
  }
  // transformers' special_tokens_map: the named tokens that are set, the
  // additional ones, and extra_special_tokens' entries (Gemma 3's image tokens).
  auto token_text = [](const nlohmann::ordered_json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return "";
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (config.contains(key) && !token_text(config[key]).empty()) out.special_tokens[key] = token_text(config[key]);
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& v : config["additional_special_tokens"]) {
      if (v.is_string() || (v.is_object() && v.contains("content") && v["content"].is_string())) list.push_back(token_text(v));
    }
    if (!list.empty()) out.special_tokens["additional_special_tokens"] = list;
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    const auto& extra = config["extra_special_tokens"];
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (!token_text(it.value()).empty()) out.special_tokens[it.key()] = token_text(it.value());
    }
  }
  return out;
}

absl::StatusOr<ModelChatTemplate> LoadChatTemplate(const std::string& model_dir) {
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  const std::string config_path = model_dir + "/tokenizer_config.json";
  std::error_code ec;
  return LoadChatTemplateFiles(config_path, std::filesystem::exists(jinja_path, ec) ? jinja_path : "");
}

}  // namespace chunkattn
